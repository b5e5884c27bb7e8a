"""The shape a service runs a model at: batch size, threads, and the lengths of the texts it is sent.

A benchmark at batch 32 x one padded length says little about an online service that answers one
request at a time on a couple of threads: small batches spend their time in fixed costs (the embedding
lookup, the layers' launch), and texts of many lengths make each batch as long as its own longest.
:class:`ServingShape` names the shape; :func:`serving_batches` makes the batches to time it on:

* ``lengths="fixed"``: one full-length random batch of ``batch_size`` x ``seq_len`` (no padding), as
  before;
* ``lengths="data"``: ``count`` batches of the user's own tokenized texts, drawn at random (seeded)
  from the data and each padded to its own longest, as a server pads what it was sent. Their length
  distribution is recorded (:class:`LengthSummary`) beside every figure measured on them.

Every caller then times on those batches through :func:`surgery.measure.timing.time_models`.

Example:
    >>> shape = ServingShape(batch_size=1, threads=2, lengths="fixed", seq_len=16)
    >>> [tuple(b["input_ids"].shape) for b in serving_batches(shape, vocab_size=99)]
    [(1, 16)]
    >>> shape.describe()
    'batch 1 x 16 tokens, 2 thread(s)'
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from surgery.core.errors import ConfigError, DataError
from surgery.measure.timing import Batch, batch_length, make_inputs, percentile

#: Batches drawn from the data when the caller does not say (rounds cycle through them).
DATA_BATCHES = 32
#: Inputs a model reads; labels and anything else a data loader carries are left out.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class LengthSummary(BaseModel):
    """The lengths of batches drawn from data: padded tokens per batch, and real tokens per text.

    Example:
        >>> mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0]])
        >>> summary = LengthSummary.of([{"input_ids": torch.ones(2, 5), "attention_mask": mask}])
        >>> summary.padded_max, summary.text_mean, summary.text_p95
        (5, 3.5, 4.85)
    """

    model_config = ConfigDict(frozen=True)

    batches: int
    texts: int
    padded_mean: float = Field(description="mean padded length per batch (tokens, each batch its own longest)")
    padded_p50: float
    padded_p95: float
    padded_max: int
    text_mean: float = Field(description="mean real tokens per text")
    text_p50: float
    text_p95: float

    @classmethod
    def of(cls, batches: Sequence[Batch]) -> LengthSummary:
        """The summary of ``batches`` (each with ``input_ids`` and ``attention_mask``)."""
        padded = [batch_length(b) for b in batches]
        texts = [int(n) for b in batches for n in b["attention_mask"].sum(dim=1).tolist()]
        return cls(batches=len(batches), texts=len(texts), padded_mean=round(statistics.fmean(padded), 2),
                   padded_p50=percentile(padded, 50), padded_p95=percentile(padded, 95), padded_max=max(padded),
                   text_mean=round(statistics.fmean(texts), 2), text_p50=percentile(texts, 50),
                   text_p95=percentile(texts, 95))


class ServingShape(BaseModel):
    """What a service runs: sequences per batch, threads, and how long the sequences are.

    Example:
        >>> ServingShape(batch_size=32, lengths="data", seq_len=128).describe()
        'batch 32 of texts drawn from the data (each batch padded to its longest, at most 128 tokens), default threads'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(ge=1, description="sequences per batch")
    threads: int | None = Field(default=None, ge=1, description="CPU threads (None: torch's current count)")
    lengths: Literal["fixed", "data"] = Field(default="fixed", description="fixed: every sequence seq_len tokens; "
                                              "data: texts drawn from the user's data, each batch padded to its "
                                              "own longest")
    seq_len: int | None = Field(default=None, ge=1, description="fixed: tokens per sequence; data: the longest a "
                                "text is cut at (None: the data's own)")
    summary: LengthSummary | None = Field(default=None, description="data: the drawn batches' lengths")

    def describe(self) -> str:
        """The shape in a few words, for reports and messages."""
        threads = f"{self.threads} thread(s)" if self.threads else "default threads"
        if self.lengths == "fixed":
            return f"batch {self.batch_size} x {self.seq_len} tokens, {threads}"
        cut = f", at most {self.seq_len} tokens" if self.seq_len else ""
        drawn = f"; padded length p50 {self.summary.padded_p50:g}, p95 {self.summary.padded_p95:g}" \
            if self.summary is not None else ""
        return (f"batch {self.batch_size} of texts drawn from the data (each batch padded to its longest{cut}), "
                f"{threads}{drawn}")


def data_batches(data: Any, *, batch_size: int, count: int = DATA_BATCHES, seed: int = 0, split: str = "train"
                 ) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of ``batch_size`` texts drawn at random (seeded) from ``data``'s ``split``, model inputs only.

    ``data`` is a :class:`surgery.data.task_data.TaskData` (an embedding objective's texts too): its
    loader pads each batch to its own longest. A split with fewer texts gives fewer batches; an empty
    one is refused in one line.

    Example:
        >>> import datasets
        >>> from surgery.data.task_data import TaskData
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 5, 6, 7, 3], [2, 3]], "labels": [0, 1, 0]})
        >>> drawn = data_batches(TaskData(rows, rows, ["a", "b"]), batch_size=1, count=3)
        >>> sorted(batch_length(b) for b in drawn), sorted(drawn[0])
        ([2, 3, 5], ['attention_mask', 'input_ids'])
    """
    batches = []
    for batch in data.loader(split, batch_size=batch_size, shuffle=True, seed=seed):
        batches.append({k: v for k, v in batch.items() if k in MODEL_INPUTS})
        if len(batches) == count:
            break
    if not batches:
        raise DataError(f"--lengths data: the data's {split} split holds no texts to draw batches from")
    return batches


def serving_batches(shape: ServingShape, *, vocab_size: int | None = None, data: Any = None,
                    count: int = DATA_BATCHES, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """The batches to time ``shape`` on: one random full-length batch (``fixed``, of ``vocab_size`` ids), or
    ``count`` batches drawn from ``data`` (``data``).

    Example:
        >>> len(serving_batches(ServingShape(batch_size=2, seq_len=4), vocab_size=50))
        1
    """
    if shape.lengths == "data":
        if data is None:
            raise ConfigError("--lengths data draws texts from --data; pass --data (or use --lengths fixed)")
        return data_batches(data, batch_size=shape.batch_size, count=count, seed=seed)
    if vocab_size is None or shape.seq_len is None:
        raise ConfigError("fixed lengths need a vocabulary size and --seq-len")
    return [make_inputs(vocab_size, batch_size=shape.batch_size, seq_len=shape.seq_len, seed=seed)]


def measured_shape(shape: ServingShape, batches: Sequence[Batch]) -> ServingShape:
    """``shape`` with the drawn ``batches``' lengths recorded (``data``); a fixed shape is returned as it is.

    Example:
        >>> shape = ServingShape(batch_size=1, lengths="data")
        >>> batch = {"input_ids": torch.ones(1, 7), "attention_mask": torch.ones(1, 7)}
        >>> measured_shape(shape, [batch]).summary.padded_max
        7
    """
    if shape.lengths != "data":
        return shape
    return shape.model_copy(update={"summary": LengthSummary.of(batches)})
