"""Padding a batch to a sequence length the runtime's kernels run fast, where that is measured to pay.

A graph runtime's int8 kernels can work on the sequence in blocks. On an AVX-512 VNNI CPU (AMD Zen 5),
OpenVINO int8 ran all-MiniLM-L6-v2 at batch 32 in 88 ms at 63 tokens and 76 ms at 64, with the same
sawtooth every 16 tokens from 40 to 80 (experiments/probes/int8_seq_length.py): a batch one token short of a
block ran 16% slower than the full block. Padding is exact for an encoder (the padded positions are masked out of
attention and trimmed from per-token outputs), so a served graph may pad a batch up to a multiple of a
block, but only where it was measured to pay on this machine: :func:`measure_alignment` times the batch
as it is against its padded lengths, side by side, and :class:`Alignment` records the multiple it found
(or none). The served model (:class:`~surgery.runtimes.openvino.openvino_ir.OpenVinoModel`,
:class:`~surgery.runtimes.onnx.onnx_session.OnnxRuntimeModel`) reads that multiple from its export record
and pads each batch by :func:`padded_length`, which never adds more than :data:`MAX_PAD_SHARE` of a
batch's length, so a length the kernels do not care about costs at most that.

Example:
    >>> import torch
    >>> batch = {"input_ids": torch.ones(2, 63, dtype=torch.long), "attention_mask": torch.ones(2, 63)}
    >>> padded, length = pad_batch(batch, 16)
    >>> padded["input_ids"].shape[1], length, int(padded["attention_mask"][0].sum())
    (64, 63, 63)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

#: The block sizes tried (a multiple of each is a length the kernels may run fast).
MULTIPLES = (8, 16, 32, 64)
#: A batch is padded by at most this share of its own length: where the kernels gain nothing from a
#: whole block, padding then costs at most this much.
MAX_PAD_SHARE = 0.125
#: Timed rounds of the batch as it is against its padded lengths (a round is a few forward passes).
ALIGN_REPEATS = 8
#: A padded length is taken only where the low end of its measured speedup's 95% interval clears this.
MIN_GAIN = 1.03


def padded_length(length: int, multiple: int | None) -> int:
    """``length`` rounded up to a multiple of ``multiple`` where that adds at most :data:`MAX_PAD_SHARE` of it;
    else ``length`` (and always where ``multiple`` is None).

    Example:
        >>> padded_length(63, 16), padded_length(57, 16), padded_length(49, 16), padded_length(64, 16)
        (64, 64, 49, 64)
        >>> padded_length(500, 64), padded_length(63, None)
        (512, 63)
    """
    if not multiple or multiple <= 1 or length <= 0:
        return length
    up = -(-length // multiple) * multiple
    return up if up - length <= MAX_PAD_SHARE * length else length


def pad_batch(batch: Mapping[str, torch.Tensor | None], multiple: int | None
              ) -> tuple[dict[str, torch.Tensor | None], int]:
    """``batch`` padded on the right to :func:`padded_length` (masked out: mask, ids and types 0), and its own
    length, to trim per-token outputs back to (:func:`trim`). A missing mask becomes all ones before the
    padding, so the padding is masked whatever the caller passed."""
    ids = batch["input_ids"]
    assert ids is not None
    length = int(ids.shape[1])
    target = padded_length(length, multiple)
    if target == length:
        return dict(batch), length
    out: dict[str, torch.Tensor | None] = {}
    extra = target - length
    for name, value in batch.items():
        if value is None or value.dim() < 2 or value.shape[1] != length:
            out[name] = value
            continue
        out[name] = torch.nn.functional.pad(value, (0, extra), value=0)
    if out.get("attention_mask") is None:
        mask = torch.zeros(ids.shape[0], target, dtype=ids.dtype, device=ids.device)
        mask[:, :length] = 1
        out["attention_mask"] = mask
    return out, length


def trim(tensor: torch.Tensor, length: int, per_token: bool) -> torch.Tensor:
    """A per-token output (``[batch, sequence, ...]``) cut back to the batch's own ``length``; others as they are.

    Example:
        >>> import torch
        >>> trim(torch.zeros(2, 64, 8), 63, True).shape, trim(torch.zeros(2, 64), 63, False).shape
        (torch.Size([2, 63, 8]), torch.Size([2, 64]))
    """
    if per_token and tensor.dim() >= 2 and tensor.shape[1] > length:
        return tensor[:, :length]
    return tensor


def per_token_output(output: str, task: str | None) -> bool:
    """Whether a graph's ``output`` has a value per token (hidden states, MLM logits), to be trimmed after padding.

    Example:
        >>> per_token_output("last_hidden_state", "base"), per_token_output("logits", "mlm")
        (True, True)
        >>> per_token_output("logits", "seq-cls")
        False
    """
    return output == "last_hidden_state" or task == "mlm"


class Alignment(BaseModel):
    """What padding to a block was measured to give one served model at one batch shape.

    Example:
        >>> Alignment(seq_len=63, multiple=16, padded_len=64, speedups={64: 1.19}).why()
        'padded from 63 to 64 tokens (a multiple of 16): measured 1.19x faster'
    """

    seq_len: int = Field(description="the batch length as the data gives it")
    multiple: int | None = Field(default=None, description="the block the served model pads to; None: no padding")
    padded_len: int = Field(description="what a batch of seq_len is run at (seq_len where no padding)")
    speedups: dict[int, float] = Field(default_factory=dict, description="padded length -> measured speedup over "
                                       "seq_len (paired median)")
    intervals: dict[int, tuple[float, float]] = Field(default_factory=dict, description="their 95% intervals")
    seconds: float = Field(default=0.0, description="what measuring it took")

    def why(self) -> str:
        if self.multiple is None:
            tried = ", ".join(f"{n}: {s:.2f}x" for n, s in sorted(self.speedups.items()))
            return (f"no padding: {self.seq_len} tokens " + (f"ran as fast as padded ({tried})" if tried else
                                                             "is already a block multiple, or none is near"))
        return (f"padded from {self.seq_len} to {self.padded_len} tokens (a multiple of {self.multiple}): measured "
                f"{self.speedups[self.padded_len]:.2f}x faster")


def padded(served: nn.Module, multiple: int | None) -> nn.Module:
    """``served`` calling itself on each batch padded to ``multiple`` (:func:`pad_batch`): a served model timed as
    it runs when its artefact records that multiple; ``served`` itself where ``multiple`` is None.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> padded(model, None) is model, padded(model, 16).config is model.config
        (True, True)
        >>> tuple(padded(model, 16)(**tiny_inputs(TinySpec("bert"), batch=2, seq=15)).last_hidden_state.shape)[:2]
        (2, 16)
    """
    return served if not multiple else _Padded(served, multiple)


class _Padded(nn.Module):
    """What :func:`padded` returns: ``served`` called on each batch padded to ``multiple``."""

    def __init__(self, served: nn.Module, multiple: int) -> None:
        super().__init__()
        self.served, self.multiple, self.config = served, multiple, getattr(served, "config", None)

    def forward(self, **inputs: Any) -> Any:
        return self.served(**pad_batch(inputs, self.multiple)[0])

    def release_memory(self) -> None:  # what timing at long inputs calls on a runtime's model, if it has it
        release = getattr(self.served, "release_memory", None)
        if release is not None:
            release()


def measure_alignment(served: nn.Module, *, vocab_size: int, batch_size: int, seq_len: int, threads: int | None,
                      repeats: int = ALIGN_REPEATS) -> Alignment:
    """Time ``served`` on a ``batch_size`` x ``seq_len`` batch as it is and padded to each length of
    :data:`MULTIPLES` within :data:`MAX_PAD_SHARE`, side by side (:func:`surgery.measure.timing.time_models`);
    the multiple whose padded length ran fastest, where its interval's low end clears :data:`MIN_GAIN`.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> found = measure_alignment(tiny_model(TinySpec("bert")), vocab_size=99, batch_size=2, seq_len=15,
        ...                           threads=1, repeats=2)
        >>> found.seq_len, sorted(found.speedups), found.padded_len in (15, 16)
        (15, [16], True)
    """
    import time

    from surgery.measure.timing import make_inputs, time_models

    started = time.perf_counter()
    # padded length -> the largest multiple giving it: one measured length cannot tell a kernel's block of 16
    # from one of 64 (63 tokens pad to 64 by any of them), and a multiple of the largest is a multiple of each,
    # so the served model then pads only to lengths at least as aligned as the one measured.
    lengths: dict[int, int] = {}
    for multiple in MULTIPLES:
        target = padded_length(seq_len, multiple)
        if target != seq_len:
            lengths[target] = multiple
    if not lengths:
        return Alignment(seq_len=seq_len, padded_len=seq_len)

    batch = make_inputs(vocab_size, batch_size=batch_size, seq_len=seq_len)
    models: dict[str, Any] = {"as is": served}
    models.update({str(target): padded(served, multiple) for target, multiple in lengths.items()})
    timing = time_models(models, [batch], repeats=repeats, warmup=1, threads=threads)
    speedups, intervals = {}, {}
    for target in lengths:
        ratio, interval = timing.speedup(str(target))
        speedups[target], intervals[target] = round(ratio, 4), (round(interval.low, 4), round(interval.high, 4))
    best = max(speedups, key=lambda t: speedups[t])
    take = intervals[best][0] >= MIN_GAIN
    return Alignment(seq_len=seq_len, multiple=lengths[best] if take else None,
                     padded_len=best if take else seq_len, speedups=speedups, intervals=intervals,
                     seconds=round(time.perf_counter() - started, 3))


def serving_shape(batches: list[Mapping[str, Any]]) -> tuple[int, int]:
    """``(batch_size, seq_len)`` a runtime serves ``batches`` at: the largest batch, and the mean of the batches'
    padded lengths rounded (compress times at the mean padded length of the data's batches the same way).

    Example:
        >>> def batch(n, length): return {"input_ids": torch.ones(n, length, dtype=torch.long)}
        >>> serving_shape([batch(32, 60), batch(32, 66), batch(7, 20)])
        (32, 49)
    """
    if not batches:
        raise ValueError("serving_shape needs at least one batch")
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    return max(n for n, _ in shapes), round(sum(length for _, length in shapes) / len(shapes))


def align_artefact(runtime: Any, directory: Any, model: nn.Module, pad_to_multiple_of: int | str, *,
                   batches: list[Mapping[str, Any]] | None, threads: int | None) -> dict[str, Any]:
    """Record in the artefact at ``directory`` (written by ``runtime``) the multiple its served model pads to.

    ``pad_to_multiple_of`` is a multiple (recorded as given) or ``"auto"``: the artefact is loaded and timed at
    the shape of ``batches`` (the user's calibration texts or data: :func:`serving_shape`) as it is and padded
    (:func:`measure_alignment`), and the multiple is recorded only where padding was measured to pay. Returns
    what was recorded and why (``surgery export``'s report).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from surgery.runtimes import get_runtime
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model, onnx = tiny_model(TinySpec("bert")), get_runtime("onnxruntime")
        >>> art = onnx.write_artefact(model, Path(tempfile.mkdtemp()) / "a", seq=8)
        >>> align_artefact(onnx, art.directory, model, 16, batches=None, threads=1)
        {'pad_to_multiple_of': 16, 'why': 'padded to a multiple of 16 tokens, as asked (not measured)'}
        >>> onnx.read_record(art.directory).pad_to_multiple_of
        16
    """
    from surgery.core.errors import ConfigError

    if (refused := runtime.padding_refused()) is not None:
        raise ConfigError(refused)
    if pad_to_multiple_of != "auto":
        multiple = int(pad_to_multiple_of)
        why = f"padded to a multiple of {multiple} tokens, as asked (not measured)"
        runtime.align(directory, multiple, why)
        return {"pad_to_multiple_of": multiple, "why": why}
    if not batches:
        raise ConfigError("pad_to_multiple_of auto times the artefact at your texts' length: give calibration texts "
                          "(--calibration) or labelled data (--data), or a multiple (--pad-to-multiple-of 16)")
    batch_size, seq_len = serving_shape(batches)
    served = runtime.load(directory, config=model.config, threads=threads)
    found = measure_alignment(served, vocab_size=int(model.config.vocab_size), batch_size=batch_size,
                              seq_len=seq_len, threads=threads)
    why = f"measured at a batch of {batch_size} x {seq_len} tokens: {found.why()}"
    runtime.align(directory, found.multiple, why)
    return {"pad_to_multiple_of": found.multiple, "why": why, "alignment": found.model_dump(mode="json")}
