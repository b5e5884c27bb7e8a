"""Unlabelled text for the embedding objective: read, de-duplicate, hold out, tokenize.

A ``.txt`` file holds one text per line; any file :func:`surgery.data.task_data.read_table` reads (CSV, TSV,
JSON/JSONL, parquet, or an embedded name such as ``rotten-tomatoes``) gives its text column, and
its labels, if any, are ignored. :func:`load_text_data` returns a :class:`TextData`: a
:class:`~surgery.data.task_data.TaskData` without labels whose held-out split is large enough for the
retrieval-agreement metric (at least 2,000 texts when the data allows it).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import datasets
from transformers import PreTrainedTokenizerBase

from surgery.core.errors import DataError
from surgery.core.requirements import describe_data
from surgery.data.data_diagnosis import TEXT_SUFFIXES
from surgery.data.task_data import TaskData, TextLength, choose_text_length, read_table
from surgery.embedding.pooling import SentenceConfig
from surgery.persist.assets import resolve_data_path

if TYPE_CHECKING:
    from torch import nn

    from surgery.core.progress import ProgressCallback

MIN_HELD_OUT = 2000  # retrieval agreement (recall@10) needs a corpus of this size to mean much


def read_texts(name_or_path: str | os.PathLike[str], *, text_column: str = "text") -> list[str]:
    """Non-empty, distinct texts of a ``.txt`` file (one per line) or of a table's text column.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "corpus.txt"
        >>> _ = f.write_text("a cat\\n\\nA dog \\na cat\\n")
        >>> read_texts(f)
        ['a cat', 'A dog']
    """
    path = resolve_data_path(name_or_path)
    if path.name.endswith(TEXT_SUFFIXES):
        texts = _read_lines(path)
    else:
        table = read_table(name_or_path)
        if text_column not in table.column_names:
            raise DataError(f"data {name_or_path}: no column {text_column!r}; available: {table.column_names}. "
                            "Name it with --text-column")
        texts = [str(t) for t in table[text_column] if t is not None]
    unique = list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))
    if not unique:
        raise DataError(f"data {name_or_path}: no non-empty texts found")
    return unique


def _read_lines(path: Path) -> list[str]:
    import bz2
    import gzip

    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read text file {path}: {' '.join(str(exc).split())[:160]}; "
                        "it must be UTF-8 text with one text per line") from None


def held_out_size(n: int, fraction: float) -> int:
    """How many of ``n`` texts to hold out: ``fraction`` of them, at least 2,000, at most half.

    Example:
        >>> held_out_size(20_000, 0.1), held_out_size(12_000, 0.1), held_out_size(300, 0.1)
        (2000, 2000, 150)
    """
    return max(1, min(max(int(n * fraction), MIN_HELD_OUT), n // 2))


@dataclass
class TextData(TaskData):
    """Tokenized unlabelled texts: a training split and a held-out split (texts kept for evaluation).

    Iterating yields padded batches of ``input_ids``/``attention_mask`` (no ``labels``).

    Example:
        >>> import datasets
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 7, 8, 3]]})
        >>> data = TextData(train=rows, eval=rows, label_names=[], train_texts=["a", "b"], eval_texts=["a", "b"])
        >>> sorted(next(iter(data)))
        ['attention_mask', 'input_ids']
    """

    train_texts: list[str] = field(default_factory=list)
    eval_texts: list[str] = field(default_factory=list)
    sentence_config: SentenceConfig | None = None  # how the objective pools; None: masked mean
    # The data decides the objective: code that trains or scores importance on data asks it, so the
    # training stack needs no import of this package.
    objective: ClassVar[str] = "embedding"

    def recover(self, model: nn.Module, teacher: nn.Module, config: Any, *,
                progress: ProgressCallback | None = None) -> Any:
        """Recovery with the embedding objective (:func:`~surgery.embedding.objective.recover_embeddings`)."""
        from surgery.embedding.objective import recover_embeddings

        return recover_embeddings(model, teacher, self, config, progress=progress)

    def importance_objective(self) -> Any:
        """The label-free importance objective (:func:`~surgery.embedding.sensitivity.embedding_sensitivity`)."""
        from surgery.embedding.sensitivity import embedding_sensitivity

        return embedding_sensitivity(self.sentence_config or SentenceConfig(), seed=self.split_seed or 0)


def load_text_data(
    train: str | os.PathLike[str] | list[str],
    tokenizer: PreTrainedTokenizerBase,
    *,
    eval_data: str | os.PathLike[str] | list[str] | None = None,
    text_column: str = "text",
    max_length: int | None = None,
    eval_fraction: float = 0.1,
    seed: int = 0,
    max_train: int | None = None,
    max_eval: int | None = None,
    batch_size: int = 32,
    sentence_config: SentenceConfig | None = None,
) -> TextData:
    """Read, de-duplicate, split and tokenize unlabelled texts.

    Without ``eval_data`` a seeded random :func:`held_out_size` share is held out; with it, texts
    that also occur in ``eval_data`` are removed from training, so held-out texts stay unseen.
    ``sentence_config`` is the pooling the objective uses (:func:`read_sentence_config` of the model).

    Example:
        >>> from transformers import BertTokenizer
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])})
        >>> data = load_text_data([f"a b {i}" for i in range(10)], tok)
        >>> data.info["train_size"], data.info["eval_size"]
        (5, 5)
    """
    if not 0.0 < eval_fraction < 1.0:
        raise DataError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    texts = _texts(train, text_column)
    if eval_data is None:
        if len(texts) < 2:
            raise DataError(f"data {train}: needs at least 2 distinct texts to hold some out for evaluation")
        order = list(range(len(texts)))
        random.Random(seed).shuffle(order)
        n_eval = held_out_size(len(texts), eval_fraction)
        eval_texts = [texts[i] for i in order[:n_eval]]
        train_texts = [texts[i] for i in order[n_eval:]]
    else:
        eval_texts = _texts(eval_data, text_column)
        held = set(eval_texts)
        train_texts = [t for t in texts if t not in held]
        if not train_texts:
            raise DataError(f"data {train}: every text also occurs in the evaluation data {eval_data}")
    if max_train is not None:
        train_texts = train_texts[:max_train]
    if max_eval is not None:
        eval_texts = eval_texts[:max_eval]
    # None: the model's own limit, capped by what the texts need (as for labelled data).
    length = choose_text_length(tokenizer, texts, seed=seed) if max_length is None else TextLength(
        tokens=max_length, why=f"{max_length} tokens, as given")

    def encode(rows: list[str]) -> datasets.Dataset:
        enc = tokenizer(rows, truncation=True, max_length=length.tokens)
        return datasets.Dataset.from_dict({k: list(v) for k, v in enc.items()})

    return TextData(
        train=encode(train_texts), eval=encode(eval_texts), label_names=[], tokenizer=tokenizer,
        batch_size=batch_size, split_seed=seed if eval_data is None else None, train_texts=train_texts,
        eval_texts=eval_texts, sentence_config=sentence_config,
        info={"train_file": _name(train), "eval_file": _name(eval_data) if eval_data is not None else None,
              "seed": seed, "train_size": len(train_texts), "eval_size": len(eval_texts), "max_length": length.tokens,
              "text_length": length.as_dict(), "objective": "embedding"},
    )


def _texts(source: str | os.PathLike[str] | list[str], text_column: str) -> list[str]:
    if isinstance(source, list):
        return list(dict.fromkeys(t.strip() for t in source if t and t.strip()))
    return read_texts(source, text_column=text_column)


def _name(source: str | os.PathLike[str] | list[str] | None) -> str | None:
    return f"<{len(source)} texts>" if isinstance(source, list) else (str(source) if source is not None else None)


def require_text_data(data: Any, who: str) -> TextData:
    """``data`` as unlabelled :class:`TextData` with a pooling config, or a one-line DataError."""
    if not isinstance(data, TextData):
        raise DataError(f"{who} with the embedding objective needs unlabelled texts (surgery.embedding.TextData, "
                        f"e.g. --data corpus.txt); got {describe_data(data)}")
    return data
