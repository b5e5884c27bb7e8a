"""Labelled text data for strategies that train or calibrate: load, tokenize, split, batch.

Files go through ``datasets.load_dataset`` (CSV, JSON/JSONL, parquet). :class:`TaskData` carries
the tokenized train and evaluation splits; iterating it yields padded training batches, so it also
works wherever a plain ``data`` iterable of model inputs is accepted.
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from surgery.core.errors import DataError
from surgery.data.data_diagnosis import TABLE_SUFFIXES, DataWarning, check_json_data, data_suffix, diagnose
from surgery.persist.assets import DATASETS, resolve_data_path
from surgery.persist.config_values import SENTENCE_CONFIG

_BUILDERS = dict(zip(TABLE_SUFFIXES, ("csv", "csv", "json", "json", "parquet"), strict=True))
MODEL_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "labels")


def _builder(path: Path) -> tuple[str, dict[str, Any]]:
    suffix = data_suffix(path)
    kind = _BUILDERS.get(suffix)
    if kind is None:
        raise DataError(f"data file {path}: unsupported format; use .csv, .tsv, .json, .jsonl or .parquet")
    return kind, ({"delimiter": "\t"} if suffix == ".tsv" else {})


def read_table(name_or_path: str | Path) -> datasets.Dataset:
    """Read a data file (or an embedded dataset name) into a ``datasets.Dataset``.

    ``rotten-tomatoes`` becomes columns ``text`` and ``label`` (``fresh``/``rotten``), with plot
    synopses and duplicate texts dropped.
    """
    path = resolve_data_path(name_or_path)
    kind, extra = _builder(path)
    check_json_data(path)  # a file nested 100,000 deep would end in RecursionError inside datasets' parser
    # datasets logs its own "Failed to read file" line before raising; the DataError below says it in one line.
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        table = datasets.load_dataset(kind, data_files=str(path), split="train", **extra)
    except Exception as exc:  # datasets raises many types for unreadable files
        raise DataError(diagnose(path, exc)) from None
    finally:
        log.setLevel(level)
    if str(name_or_path) == "rotten-tomatoes" or path == DATASETS["rotten-tomatoes"].locate():
        table = _rotten_tomatoes(table)
    return table


def _rotten_tomatoes(table: datasets.Dataset) -> datasets.Dataset:
    table = table.filter(lambda row: row["category"] in ("fresh", "rotten") and bool(row["text"]))
    seen: set[str] = set()
    keep = []
    for i, text in enumerate(table["text"]):
        if text not in seen:
            seen.add(text)
            keep.append(i)
    table = table.select(keep)
    return table.rename_column("category", "label").select_columns(["text", "label"])


def _check_columns(table: datasets.Dataset, columns: list[str], where: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(
            f"{where}: missing column(s) {missing}; available: {table.column_names}. "
            "Name them with --text-column/--text-pair-column/--label-column"
        )


def _is_empty(value: Any) -> bool:
    if isinstance(value, float):
        return value != value  # NaN: an empty cell in a numeric column
    return value is None or (isinstance(value, str) and not value.strip())


def label_text(value: Any) -> str:
    """A label's name: integral floats (a column read as float) are shown as integers.

    Example:
        >>> label_text(1.0), label_text("pos"), label_text(2), label_text(0.5)
        ('1', 'pos', '2', '0.5')
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number(value: Any) -> float | None:
    """``value`` as a number when it is one (an int, a float, or text such as ``"2"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def fresh_label_names(values: Iterable[Any]) -> list[str]:
    """The distinct labels of data for a new head, in id order: numerically when all are numbers, else as text.

    Sorting ``0..11`` as text would give ``0, 1, 10, 11, 2, ...``: a head trained on that order
    and saved would name its ids in an order nobody expects.

    Example:
        >>> fresh_label_names([2, 10, 1.0, 0, 11])
        ['0', '1', '2', '10', '11']
        >>> fresh_label_names(["pos", "neg", "pos"])
        ['neg', 'pos']
    """
    names = {label_text(v): v for v in values}
    numbers = {name: _number(v) for name, v in names.items()}
    if all(n is not None and math.isfinite(n) for n in numbers.values()):
        return sorted(names, key=lambda name: (numbers[name], name))
    return sorted(names)


def head_label_names(config: Any) -> list[str]:
    """The label names of a classification head, in id order (``config.id2label``; ``LABEL_i`` where unnamed).

    Example:
        >>> from transformers import BertConfig
        >>> head_label_names(BertConfig(id2label={0: "positive", 1: "negative"}))
        ['positive', 'negative']
        >>> head_label_names(BertConfig(num_labels=3))
        ['LABEL_0', 'LABEL_1', 'LABEL_2']
    """
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    count = int(getattr(config, "num_labels", None) or len(id2label))
    return [id2label.get(i, f"LABEL_{i}") for i in range(count)]


def _shown(names: Sequence[str], most: int = 12) -> str:
    listed = ", ".join(repr(n) for n in names[:most])
    return listed + (f" and {len(names) - most} more" if len(names) > most else "")


def head_label_ids(values: Sequence[Any], head: Sequence[str], where: str) -> list[int]:
    """The class ids a classification head with labels ``head`` (in id order) reads for data labels ``values``.

    A label that is one of the head's names is that name's id; otherwise an integer label (``1``,
    ``1.0`` or ``"1"``) is the id itself, when the head has it. Where the head's own names are
    numbers, a number that is not one of them is refused rather than read as an id: ``5`` on a head
    named ``1..5`` could be either. Anything else is refused, naming the label, ``where`` (the file)
    and the head's labels: a label the head does not have would be scored as always wrong, or trained
    toward a class that means something else.

    Example:
        >>> head_label_ids(["negative", "positive"], ["positive", "negative"], "d.csv")
        [1, 0]
        >>> head_label_ids([0, 11, 2.0, "3"], [f"LABEL_{i}" for i in range(12)], "d.csv")
        [0, 11, 2, 3]
        >>> head_label_ids([0, 7], ["neg", "pos"], "d.csv")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: d.csv: label '7' (1 row) is not a label of the model's classification head, ...
    """
    by_name = {name: i for i, name in enumerate(head)}
    numeric_names = any(_number(name) is not None for name in head)
    ids: list[int] = []
    unknown: dict[str, int] = {}
    for value in values:
        name = label_text(value)
        index = by_name.get(name)
        if index is None and not numeric_names:
            number = _number(value)
            if number is not None and number.is_integer() and 0 <= number < len(head):
                index = int(number)
        if index is None:
            unknown[name] = unknown.get(name, 0) + 1
            continue
        ids.append(index)
    if unknown:
        names = list(unknown)
        rows = sum(unknown.values())
        what = f"label {names[0]!r}" if len(names) == 1 else f"labels {_shown(names, 5)}"
        raise DataError(
            f"{where}: {what} ({rows} row{'s' if rows != 1 else ''}) "
            f"{'is not a label' if len(names) == 1 else 'are not labels'} of the model's classification head, "
            f"which has {len(head)}: {_shown(head)} (ids 0-{len(head) - 1}); relabel the data with these names "
            "or ids, or start from the bare encoder to train a new head"
        )
    return ids


def check_label_order(config: Any, label_names: Sequence[str], where: str = "the data") -> None:
    """Refuse labels numbered in another order than a classification head reads them (``config.id2label``).

    For data loaded without ``head_labels`` and handed to a classifier from Python: the same label
    names as the head's in another order (``negative, positive`` for a head ``{0: positive, 1:
    negative}``), or integer labels whose ids are not themselves (``0, 1, 10, 11, 2, ...`` on a head
    without names) would score every right answer as wrong. Other names (a new head's) pass.

    Example:
        >>> from transformers import BertConfig
        >>> check_label_order(BertConfig(id2label={0: "positive", 1: "negative"}), ["negative", "positive"])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: the data numbers its labels negative, positive but ... positive, negative; ...
        >>> check_label_order(BertConfig(num_labels=3), ["a", "b", "c"])  # names the head does not have: a new head
    """
    head = head_label_names(config)
    names = [str(n) for n in label_names]
    defaults = head == [f"LABEL_{i}" for i in range(len(head))]
    swapped = sorted(names) == sorted(head) and names != head
    renumbered = defaults and all(_number(n) is not None for n in names) and names != [str(i) for i in
                                                                                          range(len(names))]
    if swapped or renumbered:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        reads = ", ".join(head[:12]) + (", ..." if len(head) > 12 else "")
        raise DataError(f"{where} numbers its labels {shown} but the model's classification head reads {reads}; "
                        "load it with load_task_data(..., head_labels=head_label_names(model.config))")


def check_cells(table: datasets.Dataset, text_columns: list[str], label_column: str, where: str) -> None:
    """Refuse empty labels, empty or non-text text columns, naming the column, the row count and the first row.

    Empty labels are an error rather than rows dropped quietly: a missing label is usually a broken
    export, and dropping it would change the data without anyone noticing. A text column whose every
    cell is empty is refused; some empty texts are a :class:`DataWarning` with their count. Rows are
    numbered from 1 after the header.
    """
    empty = [i for i, v in enumerate(table[label_column]) if _is_empty(v)]
    if empty:
        raise DataError(f"{where}: {len(empty)} of {len(table)} rows have an empty label in column {label_column!r} "
                        f"(first: row {empty[0] + 1}); fill in or delete those rows")
    for column in text_columns:
        blank = [i for i, v in enumerate(table[column]) if _is_empty(v)]
        if blank and len(blank) == len(table):
            # Checked before the type: a column of empty cells is read as float64 (all NaN), which is not the news.
            raise DataError(f"{where}: column {column!r} is empty (all {len(table)} texts are empty); put the texts "
                            "in it, or name the text column with --text-column/--text-pair-column")
        feature = table.features[column]
        dtype = getattr(feature, "dtype", None)
        if dtype not in ("string", "large_string"):
            raise DataError(f"{where}: column {column!r} holds {dtype or type(feature).__name__} values, not text; "
                            "name the text column with --text-column/--text-pair-column")
        if blank:
            warnings.warn(f"{where}: {len(blank)} of {len(table)} texts in column {column!r} are empty (first: row "
                          f"{blank[0] + 1}); they tell the model nothing and are scored as empty input: fill in or "
                          "delete those rows", DataWarning, stacklevel=3)


#: Texts tokenized to choose the default max length: a stable 99th percentile, at a few seconds at most.
LENGTH_SAMPLE = 2000
LENGTH_PERCENTILE = 99
#: The chosen length is rounded up to a multiple of this (padded shapes kernels like).
LENGTH_MULTIPLE = 8
#: A tokenizer's ``model_max_length`` above this is transformers' "no limit recorded" (1e30), not a limit.
SANE_TOKENIZER_LIMIT = 100_000


@dataclass(frozen=True)
class TextLength:
    """The token length texts are cut to, and why: returned as data so reports and the CLI can say it.

    Example:
        >>> TextLength(tokens=128, why="given (--max-length)").as_dict()["tokens"]
        128
    """

    tokens: int
    why: str
    model_limit: int | None = None
    model_limit_source: str | None = None
    data_percentile_tokens: int | None = None
    sampled_texts: int = 0
    truncated_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_text_limit(tokenizer: Any, model_dir: str | Path | None = None, config: Any = None
                     ) -> tuple[int | None, str | None]:
    """The most tokens the model is meant to read, and where that figure comes from (None, None: unknown).

    sentence-transformers' ``max_seq_length`` (``sentence_bert_config.json``) is what the model is
    served at, so it comes first; then the tokenizer's ``model_max_length`` when it is a real limit
    (transformers writes 1e30 when none was recorded); always capped by the positions the config
    has (``max_position_embeddings``, less RoBERTa's offset), which is also the fallback.
    ``model_dir`` defaults to the directory the tokenizer was loaded from, ``config`` to its config.json.

    Example:
        >>> from types import SimpleNamespace
        >>> model_text_limit(SimpleNamespace(model_max_length=512), config=SimpleNamespace(max_position_embeddings=128))
        (128, 'config max_position_embeddings')
        >>> model_text_limit(SimpleNamespace(model_max_length=int(1e30)), config=None)
        (None, None)
    """
    from surgery.persist.config_values import sentence_max_seq_length, usable_positions
    from surgery.persist.untrusted import check_links_inside, read_json_file

    where = Path(model_dir) if model_dir is not None else Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    is_dir = str(where) not in ("", ".") and where.is_dir()
    if is_dir:
        check_links_inside(where)
    limit = sentence_max_seq_length(where) if is_dir else None
    source = f"sentence-transformers max_seq_length in {SENTENCE_CONFIG}" if limit else None
    if limit is None:
        own = _positive_int(getattr(tokenizer, "model_max_length", None))
        if own is not None and own <= SANE_TOKENIZER_LIMIT:
            limit, source = own, "the tokenizer's model_max_length"
    if config is None and is_dir and (where / "config.json").is_file():
        raw = read_json_file(where / "config.json", what="config.json")
        config = SimpleNamespace(**raw) if isinstance(raw, dict) else None
    positions = usable_positions(config) if config is not None else None
    if positions is not None and (limit is None or positions < limit):
        limit, source = positions, "config max_position_embeddings"
    return limit, source


def choose_text_length(tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                       model_dir: str | Path | None = None, config: Any = None, seed: int = 0) -> TextLength:
    """The default max length: the model's own limit, capped by what the data needs.

    What the data needs is the 99th percentile of the token lengths of (a seeded sample of at most
    ``LENGTH_SAMPLE``) ``texts``, rounded up to a multiple of 8: short texts are not padded to 512,
    and long ones are read as far as the model is served (a fixed 64 cut news articles short, and
    judged and timed the model at a length it is not served at).

    Example:
        >>> from transformers import BertTokenizer
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])})
        >>> tok.model_max_length = 16
        >>> choose_text_length(tok, ["a a a", "a"]).tokens  # 5 tokens with [CLS]/[SEP], rounded up to 8
        8
        >>> length = choose_text_length(tok, ["a " * 40])
        >>> length.tokens, length.why.split(";")[0]
        (16, "16 tokens, the model's limit (the tokenizer's model_max_length)")
    """
    limit, source = model_text_limit(tokenizer, model_dir, config)
    chosen = list(range(len(texts)))
    if len(chosen) > LENGTH_SAMPLE:
        chosen = sorted(random.Random(seed).sample(chosen, LENGTH_SAMPLE))
    sample = [str(texts[i] or "") for i in chosen]
    sample_pairs = [str(pairs[i] or "") for i in chosen] if pairs is not None else None
    if not sample:
        raise DataError("the data holds no texts to choose a max length from")
    # No truncation here: the full lengths are what the choice is about (verbose=False: no long-text warning).
    encoded = tokenizer(sample, sample_pairs, truncation=False, verbose=False)["input_ids"]
    lengths = sorted(len(ids) for ids in encoded)
    rank = max(0, math.ceil(len(lengths) * LENGTH_PERCENTILE / 100) - 1)
    percentile = lengths[rank]
    needed = max(LENGTH_MULTIPLE, math.ceil(percentile / LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    sampled = f"{len(lengths):,} {'sampled ' if len(texts) > len(lengths) else ''}texts"
    if limit is not None and limit <= needed:
        tokens = limit
        share = sum(n > tokens for n in lengths) / len(lengths)
        why = (f"{tokens} tokens, the model's limit ({source}); {share:.1%} of {sampled} are longer and are "
               "truncated")
    else:
        tokens = needed
        share = sum(n > tokens for n in lengths) / len(lengths)
        cap = f"under the model's limit of {limit} ({source})" if limit is not None else "the model records no limit"
        why = (f"{tokens} tokens, what the data needs: {LENGTH_PERCENTILE}% of {sampled} fit in {percentile}, "
               f"rounded up to a multiple of {LENGTH_MULTIPLE}; {cap}")
    return TextLength(tokens=tokens, why=why, model_limit=limit, model_limit_source=source,
                      data_percentile_tokens=percentile, sampled_texts=len(lengths), truncated_share=share)


@dataclass
class TaskData:
    """Tokenized train and evaluation splits of a text-classification task.

    Example:
        >>> import datasets
        >>> from surgery.data.task_data import TaskData
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 7, 8, 3]], "labels": [0, 1]})
        >>> data = TaskData(train=rows, eval=None, label_names=["neg", "pos"])
        >>> next(iter(data.loader("train", batch_size=2)))["input_ids"].shape
        torch.Size([2, 4])
    """

    train: datasets.Dataset
    eval: datasets.Dataset | None
    label_names: list[str]
    tokenizer: PreTrainedTokenizerBase | None = None
    batch_size: int = 32
    split_seed: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def loader(self, split: str = "train", *, batch_size: int | None = None, shuffle: bool = False,
               seed: int = 0) -> DataLoader:
        """A DataLoader of padded model-input batches for ``split`` (``"train"`` or ``"eval"``)."""
        table = self.train if split == "train" else self.eval
        if table is None:
            raise DataError(f"no {split!r} split; pass evaluation data or an eval fraction")
        table = table.select_columns([c for c in MODEL_COLUMNS if c in table.column_names])
        table = table.with_format("torch")
        collate = PaddingCollator(self.tokenizer)
        gen = torch.Generator().manual_seed(seed)
        return DataLoader(table, batch_size=batch_size or self.batch_size, shuffle=shuffle, collate_fn=collate,
                          generator=gen)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.loader("train"))


class PaddingCollator:
    """Pad a list of rows into a batch: with the tokenizer's collator, or with zeros when there is no tokenizer.

    Example:
        >>> PaddingCollator(None)([{"input_ids": [2, 5]}, {"input_ids": [2]}])["attention_mask"].tolist()
        [[1, 1], [1, 0]]
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.inner = DataCollatorWithPadding(tokenizer) if tokenizer is not None else None

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.inner is not None:
            return dict(self.inner([{k: v.tolist() if torch.is_tensor(v) else v for k, v in r.items()}
                                    for r in rows]))
        width = max(len(r["input_ids"]) for r in rows)
        out: dict[str, torch.Tensor] = {}
        for key in rows[0]:
            if key == "labels":
                out[key] = torch.stack([torch.as_tensor(r[key]) for r in rows])
                continue
            out[key] = torch.stack([torch.nn.functional.pad(torch.as_tensor(r[key]), (0, width - len(r[key])))
                                    for r in rows])
        if "attention_mask" not in out:
            out["attention_mask"] = torch.stack([
                torch.nn.functional.pad(torch.ones(len(r["input_ids"]), dtype=torch.long),
                                        (0, width - len(r["input_ids"]))) for r in rows])
        return out


def check_split(labels: list[int], label_names: list[str], eval_fraction: float, where: str) -> None:
    """Refuse data too small for a stratified ``eval_fraction`` split, before ``datasets`` fails on it.

    Only the labels the data has count: a classifier's head may know labels a data set lacks.

    Example:
        >>> check_split([0, 0, 1], ["neg", "pos"], 0.1, "train.csv")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: train.csv: label 'pos' has only 1 example; ...
    """
    counts: dict[int, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    rare = min(counts, key=counts.__getitem__)
    if counts[rare] < 2:
        raise DataError(f"{where}: label {label_names[rare]!r} has only {counts[rare]} example"
                        f"{'' if counts[rare] == 1 else 's'}; a stratified evaluation split needs at least 2 per "
                        "label: add examples, or pass separate evaluation data (--eval-data)")
    held_out = math.ceil(len(labels) * eval_fraction)
    if held_out < len(counts) or len(labels) - held_out < len(counts):
        raise DataError(f"{where}: {len(labels)} rows are too few to hold out {eval_fraction:.0%} with every one of "
                        f"the {len(counts)} labels on both sides; add rows, or pass --eval-data")


def load_task_data(
    train: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    eval_data: str | Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    max_length: int | None = None,
    eval_fraction: float = 0.1,
    seed: int = 0,
    max_train: int | None = None,
    max_eval: int | None = None,
    batch_size: int = 32,
    head_labels: Sequence[str] | None = None,
    model_config: Any = None,
) -> TaskData:
    """Read, tokenize and split labelled text data.

    Without ``eval_data`` a seeded, stratified ``eval_fraction`` of the training file is held out
    (the seed is recorded in ``TaskData.split_seed``). A row with an empty label is an error
    (:func:`check_cells`), and so is a text column that does not hold text.

    Labels become the class ids the model reads:

    * ``head_labels``: the label names of the model's classification head, in id order
      (:func:`head_label_names` of its config). Data labels are read through them
      (:func:`head_label_ids`: names as names, integers as ids) and a label the head does not have
      is refused; ``label_names`` are the head's.
    * None (a new head): the data's distinct labels, sorted numerically when they are all numbers
      (:func:`fresh_label_names`), else as text, taken from the training split.

    ``max_length`` None chooses the length from the model and the data (:func:`choose_text_length`;
    ``model_config`` is the model's config, default: the tokenizer directory's config.json). The
    length and why are in ``info["max_length"]`` and ``info["text_length"]``.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise DataError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    columns = [text_column, label_column] + ([text_pair_column] if text_pair_column else [])
    where = f"training data {train}"
    table = read_table(train)
    _check_columns(table, columns, where)
    check_cells(table, columns[:1] + columns[2:], label_column, where)
    if head_labels is not None:
        label_names = [str(name) for name in head_labels]
        head_label_ids(table[label_column], label_names, where)  # refuses unknown labels before any work
        if len(label_names) < 2:
            raise DataError(f"the model's classification head has {len(label_names)} label(s); a classifier needs 2")
    else:
        label_names = fresh_label_names(table[label_column])
    if len({label_text(v) for v in table[label_column]}) < 2:
        raise DataError(f"{where}: column {label_column!r} has fewer than two distinct labels")
    eval_table = None
    if eval_data is not None:
        eval_where = f"evaluation data {eval_data}"
        eval_table = read_table(eval_data)
        _check_columns(eval_table, columns, eval_where)
        check_cells(eval_table, columns[:1] + columns[2:], label_column, eval_where)
        if head_labels is not None:
            head_label_ids(eval_table[label_column], label_names, eval_where)
        else:
            unknown = sorted({label_text(v) for v in eval_table[label_column]} - set(label_names))
            if unknown:
                raise DataError(f"{eval_where}: labels {unknown[:5]} do not occur in the training data")
    if max_length is None:
        length = choose_text_length(tokenizer, table[text_column],
                                    table[text_pair_column] if text_pair_column else None,
                                    config=model_config, seed=seed)
    else:
        length = TextLength(tokens=max_length, why=f"{max_length} tokens, as given")
    if head_labels is not None:
        def ids(values: list[Any]) -> list[int]:
            return head_label_ids(values, label_names, where)
    else:
        index = {name: i for i, name in enumerate(label_names)}

        def ids(values: list[Any]) -> list[int]:
            return [index[label_text(v)] for v in values]

    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        pair = batch[text_pair_column] if text_pair_column else None
        enc = tokenizer(batch[text_column], pair, truncation=True, max_length=length.tokens)
        enc["labels"] = ids(batch[label_column])
        return enc

    def prepare(t: datasets.Dataset) -> datasets.Dataset:
        t = t.filter(lambda row: row[text_column] is not None and row[label_column] is not None)
        return t.map(encode, batched=True, remove_columns=t.column_names)

    train_table = prepare(table)
    split_seed = None
    if eval_table is None:
        check_split(train_table["labels"], label_names, eval_fraction, where)
        train_table = train_table.cast_column("labels", datasets.ClassLabel(names=label_names))
        parts = train_table.train_test_split(test_size=eval_fraction, seed=seed, stratify_by_column="labels")
        train_table, eval_prepared = parts["train"], parts["test"]
        split_seed = seed
    else:
        eval_prepared = prepare(eval_table)
    if max_train is not None:
        train_table = train_table.shuffle(seed=seed).select(range(min(max_train, len(train_table))))
    if max_eval is not None:
        eval_prepared = eval_prepared.select(range(min(max_eval, len(eval_prepared))))
    return TaskData(
        train=train_table,
        eval=eval_prepared,
        label_names=label_names,
        tokenizer=tokenizer,
        batch_size=batch_size,
        split_seed=split_seed,
        info={"train_file": str(train), "eval_file": str(eval_data) if eval_data else None,
              "eval_fraction": None if eval_data else eval_fraction, "seed": seed,
              "train_size": len(train_table), "eval_size": len(eval_prepared), "max_length": length.tokens,
              "text_length": length.as_dict(),
              "labels_from": "the model's classification head" if head_labels is not None else "the data"},
    )
