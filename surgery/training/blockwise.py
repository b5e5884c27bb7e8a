"""Block-wise reconstruction: each layer of the cut model trained to reproduce the original layer's output.

The tier between the least-squares refit (one projection, closed form) and end-to-end distillation
(every weight, through the whole model, every step). As in BRECQ (Li et al., ICLR 2021) and the
post-training literature before it (AdaRound), each encoder layer is a small problem of its own:

``min_θ  Σ_tokens ‖layer_s(x_s; θ) − y_t‖²``

with ``x_s`` the **cut model's own input** to layer ``s`` (its layers below already reconstructed)
and ``y_t`` the **original's output** of the layer it maps to (through any ``layer-drop`` steps).
Why the cut model's input and not the original's: BRECQ and AdaRound both reconstruct against the
inputs the compressed network actually produces (AdaRound §4 "asymmetric reconstruction"; BRECQ's code
``asym=True``), so a layer also corrects what the cuts below it changed in its input, which the
original's input would hide; the refit (:mod:`surgery.training.refit`) makes the same choice. The cost
is order: layers are solved bottom-up, each after the one below, not in parallel.

Memory stays bounded: the original's inputs and outputs are never held for every layer at once. One
pass of each model records each layer's call (the masks and position terms the encoder hands every
layer, which do not depend on the hidden states) and the hidden states entering the first layer; then
both models are walked up layer by layer, holding only the current layer's input (cut model) and
target (original) for the calibration batches.

Why a plain torch loop and not the HF Trainer (which end-to-end distillation uses): the unit of data
is a cached, already-batched layer call in the family's own shapes (4-D masks, rotary tables, MPNet's
relative bias, DeBERTa's relative positions), which no collator can re-batch into rows; there are no
labels, no evaluation, no checkpoints and no data parallelism; and a Trainer's setup per layer
(accelerator, scheduler, callbacks) costs as much as the few hundred small steps it would run. Like the
refit's least squares, it is a numerical solve local to one layer. Mixed precision is the same as the
Trainer's: ``torch.autocast`` to bf16 over fp32 weights, only where the caller says the device has it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.devices import synchronize
from surgery.core.manifest import steps_of
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.training.distill import default_layer_map


class BlockwiseConfig(BaseModel):
    """Settings of a block-wise reconstruction.

    Example:
        >>> BlockwiseConfig().steps, BlockwiseConfig(bf16=True).bf16
        (200, True)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=200, ge=1, description="Adam steps per layer")
    learning_rate: float = Field(default=1e-4, gt=0.0, description="Adam's learning rate (linear decay to 0)")
    bf16: bool = Field(default=False, description="bf16 autocast over fp32 weights (only where the device has it)")
    layers: list[int] | None = Field(default=None, description="student layers to train; None: every layer")
    max_seconds: float | None = Field(default=None, ge=0.0, description="wall-clock seconds the reconstruction may "
                                      "take from its start: past them a layer's training ends at its next step and "
                                      "the layers above are not trained; None: no limit")
    seed: int = 0


class BlockwiseResult(BaseModel):
    """What a reconstruction did: per layer, the MSE of its output against the original's, before and after.

    ``error`` maps a student layer (as a string) to ``[before, after]``: mean squared error per hidden
    unit over the calibration tokens (padding excluded). A layer whose training did not lower it keeps
    its weights (``kept``).
    """

    layers: list[int] = Field(default_factory=list)
    kept: list[int] = Field(default_factory=list)
    error: dict[str, list[float]] = Field(default_factory=dict)
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    time_limit_reached: bool = False  # ``max_seconds`` ended the training early


class _Stop(Exception):
    """Raised by a hook once what it records is in hand, to end that forward pass early."""


@dataclass
class _Call:
    """One recorded layer call without its hidden states: ``layer(*args, **kwargs)`` with ``args[0]`` or
    ``kwargs["hidden_states"]`` replaced by whatever hidden states are passed to :meth:`run`."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    positional: bool

    def run(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.positional:
            output = layer(hidden, *self.args, **self.kwargs)
        else:
            output = layer(*self.args, hidden_states=hidden, **self.kwargs)
        return output[0] if isinstance(output, tuple | list) else output


def _features(batch: Mapping[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items() if k != "labels" and torch.is_tensor(v)}


def record_calls(model: nn.Module, batch: Mapping[str, Any]) -> tuple[torch.Tensor, list[_Call]]:
    """One forward of ``model``: the hidden states entering its first layer and every layer's call.

    The calls keep the masks and position terms the encoder hands each layer (they differ by layer in
    some families: ModernBERT's local and global attention), not the hidden states, so a layer can be
    called again on other hidden states (:meth:`_Call.run`). The pass stops after the last layer.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2)).eval()
        >>> hidden, calls = record_calls(model, tiny_inputs(TinySpec("bert")))
        >>> len(calls), hidden.dim()
        (2, 3)
    """
    layers = adapter_for(model).layers()
    calls: list[_Call | None] = [None] * len(layers)
    first: dict[str, torch.Tensor] = {}

    def recorder(index: int) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            positional = bool(args)
            hidden = args[0] if positional else kwargs["hidden_states"]
            rest = dict(kwargs) if positional else {k: v for k, v in kwargs.items() if k != "hidden_states"}
            calls[index] = _Call(tuple(args[1:]) if positional else tuple(args), rest, positional)
            if index == 0:
                first["hidden"] = hidden.detach()
            if index == len(layers) - 1:
                raise _Stop
        return hook

    handles = [layer.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad(), contextlib.suppress(_Stop):
            model(**_features(batch, next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
    assert all(c is not None for c in calls) and "hidden" in first, "the model's forward skipped a layer"
    return first["hidden"], calls  # type: ignore[return-value]


def _masked_mse(output: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error per hidden unit over the real tokens (``mask == 1``) of ``[B, L, H]`` tensors."""
    diff = (output.float() - target.float()).pow(2).mean(-1)
    if mask is None or mask.shape != diff.shape:
        return diff.mean()
    weight = mask.to(diff.dtype)
    return (diff * weight).sum() / weight.sum().clamp(min=1.0)


def _mean_error(layer: nn.Module, calls: Sequence[_Call], inputs: Sequence[torch.Tensor],
                targets: Sequence[torch.Tensor], masks: Sequence[torch.Tensor | None]) -> float:
    with torch.no_grad():
        errors = [float(_masked_mse(c.run(layer, x), y, m)) for c, x, y, m in zip(calls, inputs, targets, masks,
                                                                                 strict=True)]
    return sum(errors) / len(errors)


def layer_step_seconds(model: nn.Module, batch: Mapping[str, Any], *, bf16: bool = False) -> list[float]:
    """Seconds of one training step (forward, backward) of each layer of ``model`` on ``batch``, timed.

    What :func:`reconstruct_layers` spends per step on each layer; the second of two steps is timed
    (the first pays for allocations). Gradients are cleared after; weights do not change.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> len(layer_step_seconds(tiny_model(TinySpec("bert", layers=2)).eval(), tiny_inputs(TinySpec("bert"))))
        2
    """
    hidden, calls = record_calls(model, batch)
    device = hidden.device
    seconds = []
    for layer, call in zip(adapter_for(model).layers(), calls, strict=True):
        elapsed = 0.0
        for _ in range(2):
            synchronize(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = call.run(layer, hidden)
            out.float().square().mean().backward()
            synchronize(device)
            elapsed = time.perf_counter() - start
        layer.zero_grad(set_to_none=True)
        seconds.append(elapsed)
    return seconds


def reconstruct_layers(student: nn.Module, teacher: nn.Module, batches: Iterable[Mapping[str, Any]],
                       config: BlockwiseConfig | None = None, *, layer_map: Mapping[int, int] | None = None,
                       progress: ProgressCallback | None = None) -> BlockwiseResult:
    """Train each layer of ``student`` to reproduce ``teacher``'s mapped layer output, bottom-up, in place.

    ``batches`` (model inputs, a list) are the calibration data; every layer trains ``config.steps``
    Adam steps, one batch per step in a seeded cycle. Layers are found through the anatomy adapter,
    so every family works; shapes never change, so a saved model still rebuilds by replay.

    Example:
        >>> from surgery.testing import TinySpec, tiny_cut_pair, tiny_inputs
        >>> spec = TinySpec("bert", layers=2, heads=4, ffn=37)
        >>> teacher, student = tiny_cut_pair(spec, 0, {"neurons": list(range(20))})
        >>> result = reconstruct_layers(student, teacher, [tiny_inputs(spec, batch=8)], BlockwiseConfig(steps=30))
        >>> result.error["0"][1] < result.error["0"][0]
        True
    """
    cfg = config or BlockwiseConfig()
    emit = progress or no_progress
    start = time.perf_counter()
    deadline = math.inf if cfg.max_seconds is None else start + cfg.max_seconds
    batches = list(batches)
    layer_map = dict(layer_map) if layer_map is not None else default_layer_map(
        adapter_for(student).num_layers, adapter_for(teacher).num_layers, steps_of(student)[len(steps_of(teacher)):])
    chosen = sorted(layer_map) if cfg.layers is None else sorted(set(cfg.layers) & set(layer_map))
    s_layers, t_layers = adapter_for(student).layers(), adapter_for(teacher).layers()
    device = next(student.parameters()).device
    student_was, teacher_was = student.training, teacher.training
    # Dropout off: the targets are the original's deterministic outputs (see the embedding trainer).
    student.eval()
    teacher.eval()
    masks = [b["attention_mask"].to(device) if torch.is_tensor(b.get("attention_mask")) else None for b in batches]
    s_in, s_calls, t_hidden, t_calls = [], [], [], []
    for batch in batches:
        hidden, calls = record_calls(student, batch)
        s_in.append(hidden)
        s_calls.append(calls)
        hidden, calls = record_calls(teacher, batch)
        t_hidden.append(hidden)
        t_calls.append(calls)
    result = BlockwiseResult(tokens=int(sum(m.sum() if m is not None else 0 for m in masks)))
    generator = torch.Generator().manual_seed(cfg.seed)
    t_done = 0  # teacher layers applied to t_hidden so far
    try:
        for s in range(max(layer_map) + 1 if layer_map else 0):
            layer = s_layers[s]
            calls = [c[s] for c in s_calls]
            if s in layer_map:
                while t_done <= layer_map[s]:  # walk the original up to the output of the layer s maps to
                    with torch.no_grad():
                        t_hidden = [c[t_done].run(t_layers[t_done], h) for c, h in zip(t_calls, t_hidden,
                                                                                      strict=True)]
                    t_done += 1
            if s in chosen and time.perf_counter() >= deadline:
                result.time_limit_reached = True  # the layers above keep their (refit) weights
            elif s in chosen:
                emit(ProgressEvent("block-wise reconstruction", chosen.index(s), len(chosen), {"layer": s}))
                before = _mean_error(layer, calls, s_in, t_hidden, masks)
                saved = {k: v.detach().clone() for k, v in layer.state_dict().items()}
                steps = _train_layer(layer, calls, s_in, t_hidden, masks, cfg, generator, deadline)
                after = _mean_error(layer, calls, s_in, t_hidden, masks)
                result.steps += steps
                result.time_limit_reached |= steps < cfg.steps
                result.error[str(s)] = [round(before, 8), round(after, 8)]
                if after < before:
                    result.layers.append(s)
                else:  # training did not help this layer: its weights stay as they were
                    layer.load_state_dict(saved)
                    result.kept.append(s)
            with torch.no_grad():  # the next layer's input: this layer's output, as it now is
                s_in = [c.run(layer, x) for c, x in zip(calls, s_in, strict=True)]
    finally:
        student.train(student_was)
        teacher.train(teacher_was)
    result.seconds = round(time.perf_counter() - start, 3)
    emit(ProgressEvent("block-wise reconstruction", len(chosen), len(chosen), {"seconds": result.seconds}))
    return result


def _train_layer(layer: nn.Module, calls: Sequence[_Call], inputs: Sequence[torch.Tensor],
                 targets: Sequence[torch.Tensor], masks: Sequence[torch.Tensor | None], cfg: BlockwiseConfig,
                 generator: torch.Generator, deadline: float = math.inf) -> int:
    """``cfg.steps`` Adam steps on one layer, one cached batch per step (seeded cycle), linear decay; fewer where
    ``deadline`` (``time.perf_counter()``) passes first. Returns the steps taken."""
    params = list(layer.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / cfg.steps))
    device = inputs[0].device
    order: list[int] = []
    taken = 0
    try:
        for _ in range(cfg.steps):
            if taken and time.perf_counter() >= deadline:
                break
            if not order:
                order = torch.randperm(len(inputs), generator=generator).tolist()
            i = order.pop()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                out = calls[i].run(layer, inputs[i])
            loss = _masked_mse(out, targets[i], masks[i])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            taken += 1
    finally:
        optimizer.zero_grad(set_to_none=True)
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
    return taken


def output_errors(student: nn.Module, teacher: nn.Module, batches: Iterable[Mapping[str, Any]], *,
                  layer_map: Mapping[int, int] | None = None) -> dict[int, float]:
    """Per student layer, the MSE of its output against the mapped original layer's, end to end (no reconstruction).

    Both models run their own full forward: the error a student layer shows here includes what every
    layer below it changed. Padding excluded.

    Example:
        >>> import copy
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2)).eval()
        >>> output_errors(model, copy.deepcopy(model), [tiny_inputs(TinySpec("bert"))])
        {0: 0.0, 1: 0.0}
    """
    from surgery.training.distill import recording_layer_outputs

    layer_map = dict(layer_map) if layer_map is not None else default_layer_map(
        adapter_for(student).num_layers, adapter_for(teacher).num_layers, steps_of(student)[len(steps_of(teacher)):])
    totals = dict.fromkeys(layer_map, 0.0)
    count = 0
    device = next(student.parameters()).device
    with torch.no_grad():
        for batch in batches:
            features = _features(batch, device)
            with recording_layer_outputs(student) as s_out:
                student(**features)
            with recording_layer_outputs(teacher) as t_out:
                teacher(**features)
            for s, t in layer_map.items():
                totals[s] += float(_masked_mse(s_out[s], t_out[t], features.get("attention_mask")))  # type: ignore[arg-type]
            count += 1
    return {s: round(v / max(count, 1), 8) for s, v in totals.items()}

