"""Labelled text data for strategies that train or calibrate: load, tokenize, split, batch.

Files go through ``datasets.load_dataset`` (CSV, JSON/JSONL, parquet). :class:`TaskData` carries
the tokenized train and evaluation splits; iterating it yields padded training batches, so it also
works wherever a plain ``data`` iterable of model inputs is accepted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from surgery.core.errors import DataError
from surgery.data.data_diagnosis import diagnose
from surgery.persist.assets import DATASETS, resolve_data_path

_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
MODEL_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "labels")


def _builder(path: Path) -> tuple[str, dict[str, Any]]:
    suffixes = [s for s in path.suffixes if s not in (".bz2", ".gz", ".xz", ".zst")]
    kind = _BUILDERS.get(suffixes[-1] if suffixes else "")
    if kind is None:
        raise DataError(f"data file {path}: unsupported format; use .csv, .tsv, .json, .jsonl or .parquet")
    return kind, ({"delimiter": "\t"} if suffixes[-1] == ".tsv" else {})


def read_table(name_or_path: str | Path) -> datasets.Dataset:
    """Read a data file (or an embedded dataset name) into a ``datasets.Dataset``.

    ``rotten-tomatoes`` becomes columns ``text`` and ``label`` (``fresh``/``rotten``), with plot
    synopses and duplicate texts dropped.
    """
    path = resolve_data_path(name_or_path)
    kind, extra = _builder(path)
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


def check_cells(table: datasets.Dataset, text_columns: list[str], label_column: str, where: str) -> None:
    """Refuse empty labels and non-text text columns, naming the column, the row count and the first row.

    Empty labels are an error rather than rows dropped quietly: a missing label is usually a broken
    export, and dropping it would change the data without anyone noticing. Rows are numbered from 1
    after the header.
    """
    empty = [i for i, v in enumerate(table[label_column]) if _is_empty(v)]
    if empty:
        raise DataError(f"{where}: {len(empty)} of {len(table)} rows have an empty label in column {label_column!r} "
                        f"(first: row {empty[0] + 1}); fill in or delete those rows")
    for column in text_columns:
        feature = table.features[column]
        dtype = getattr(feature, "dtype", None)
        if dtype not in ("string", "large_string"):
            raise DataError(f"{where}: column {column!r} holds {dtype or type(feature).__name__} values, not text; "
                            "name the text column with --text-column/--text-pair-column")


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

    Example:
        >>> check_split([0, 0, 1], ["neg", "pos"], 0.1, "train.csv")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: train.csv: label 'pos' has only 1 example; ...
    """
    counts = [0] * len(label_names)
    for label in labels:
        counts[label] += 1
    rare = min(range(len(counts)), key=counts.__getitem__)
    if counts[rare] < 2:
        raise DataError(f"{where}: label {label_names[rare]!r} has only {counts[rare]} example"
                        f"{'' if counts[rare] == 1 else 's'}; a stratified evaluation split needs at least 2 per "
                        "label: add examples, or pass separate evaluation data (--eval-data)")
    held_out = math.ceil(len(labels) * eval_fraction)
    if held_out < len(label_names) or len(labels) - held_out < len(label_names):
        raise DataError(f"{where}: {len(labels)} rows are too few to hold out {eval_fraction:.0%} with every one of "
                        f"the {len(label_names)} labels on both sides; add rows, or pass --eval-data")


def load_task_data(
    train: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    eval_data: str | Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    max_length: int = 64,
    eval_fraction: float = 0.1,
    seed: int = 0,
    max_train: int | None = None,
    max_eval: int | None = None,
    batch_size: int = 32,
) -> TaskData:
    """Read, tokenize and split labelled text data.

    Without ``eval_data`` a seeded, stratified ``eval_fraction`` of the training file is held out
    (the seed is recorded in ``TaskData.split_seed``). Labels may be strings or integers; their
    sorted distinct values become ``label_names`` (taken from the training split). A row with an
    empty label is an error (:func:`check_cells`), and so is a text column that does not hold text.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise DataError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    columns = [text_column, label_column] + ([text_pair_column] if text_pair_column else [])
    table = read_table(train)
    _check_columns(table, columns, f"training data {train}")
    check_cells(table, columns[:1] + columns[2:], label_column, f"training data {train}")
    label_names = sorted({label_text(v) for v in table[label_column]})
    if len(label_names) < 2:
        raise DataError(f"training data {train}: column {label_column!r} has fewer than two distinct labels")
    eval_table = None
    if eval_data is not None:
        eval_table = read_table(eval_data)
        _check_columns(eval_table, columns, f"evaluation data {eval_data}")
        check_cells(eval_table, columns[:1] + columns[2:], label_column, f"evaluation data {eval_data}")
        unknown = sorted({label_text(v) for v in eval_table[label_column]} - set(label_names))
        if unknown:
            raise DataError(f"evaluation data {eval_data}: labels {unknown[:5]} do not occur in the training data")
    index = {name: i for i, name in enumerate(label_names)}

    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        pair = batch[text_pair_column] if text_pair_column else None
        enc = tokenizer(batch[text_column], pair, truncation=True, max_length=max_length)
        enc["labels"] = [index[label_text(v)] for v in batch[label_column]]
        return enc

    def prepare(t: datasets.Dataset) -> datasets.Dataset:
        t = t.filter(lambda row: row[text_column] is not None and row[label_column] is not None)
        return t.map(encode, batched=True, remove_columns=t.column_names)

    train_table = prepare(table)
    split_seed = None
    if eval_table is None:
        check_split(train_table["labels"], label_names, eval_fraction, f"training data {train}")
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
              "train_size": len(train_table), "eval_size": len(eval_prepared), "max_length": max_length},
    )
