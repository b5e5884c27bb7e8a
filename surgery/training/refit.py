"""Least-squares refit of the output projections after surgery: recovery in a few forward passes, no training.

Removing attention heads or FFN neurons removes input columns of the layer's output projection (the
attention output ``o`` and the FFN ``down`` projection): the kept columns still carry the weights that
were learnt next to the removed ones. A refit re-solves each shrunken projection so that, on
calibration text, it reproduces what the model before surgery (the teacher) computed there:

``W', b' = argmin Σ_tokens ‖W' x_s + b' − (y_t + r_t − r_s)‖² + λ‖W'‖²``

with ``x_s`` the student's input to the projection, ``y_t`` the teacher's output of the same
projection on the same tokens (padding excluded), and ``r_t``, ``r_s`` the residual streams that output
is added to in the teacher and in the student (:func:`residual_sums`): the solved projection makes the
student's sum ``r_s + W' x_s + b'`` reproduce the teacher's, so it also makes up what cuts below changed in
the stream. ``residual=False`` drops ``r_t − r_s`` (the projection's own output as the target).
This is the layer-wise reconstruction step of
post-training pruning (Kwon et al., *A Fast Post-Training Pruning Framework for Transformers*,
NeurIPS 2022, tune the kept units' scales the same way; here the whole projection is solved, which
the closed form makes as cheap). Layers are refitted in order, each from a forward pass of the student
as already refitted below it, so a later layer also corrects what earlier cuts changed in its input.

The solve needs no correspondence between units: only the anatomy's projections and a layer map,
so it serves every family and every strategy that changes widths (``head-prune``, ``ffn-prune``,
after ``layer-drop`` through the map). Weights change, never shapes: the saved model still
rebuilds by replaying its plans.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.manifest import steps_of
from surgery.training.blockwise import record_calls
from surgery.training.distill import default_layer_map

#: The projections a refit solves, by the anatomy's names: attention output, then FFN down.
PROJECTIONS = ("o", "down")
#: Tokens whose normal equations are formed at once (bounded memory; the sums are the same).
CHUNK_TOKENS = 4096


class RefitResult(BaseModel):
    """What a refit did: the projections it solved and their error before and after (relative MSE).

    ``error`` maps ``"layer:projection"`` to ``[before, after]``: ``‖W x_s + b − y_t‖² / ‖y_t − ȳ_t‖²``
    over the calibration tokens, so 0 is an exact reproduction and 1 is no better than the mean.
    """

    projections: list[str] = Field(default_factory=list)
    error: dict[str, list[float]] = Field(default_factory=dict)
    tokens: int = 0
    seconds: float = 0.0


def task_calibration_batches(data: Any, batches: int, *,
                             batch_size: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The first ``batches`` batches of ``data``'s training split (seeded shuffle), as a re-iterable list.

    Example:
        >>> import datasets
        >>> from surgery.data.task_data import TaskData
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3]] * 5, "labels": [0] * 5})
        >>> [len(b["input_ids"]) for b in task_calibration_batches(TaskData(rows, None, ["a"]), 2, batch_size=2)]
        [2, 2]
    """
    loader = data.loader("train", batch_size=batch_size, shuffle=True, seed=0)
    return [batch for batch, _ in zip(loader, range(batches), strict=False)]


def projection(model: nn.Module, layer: int, name: str) -> nn.Linear | None:
    """Layer ``layer``'s attention output (``"o"``) or FFN down projection (``"down"``), if it has one."""
    parts = adapter_for(model).layer(layer)
    if name == "o":
        return parts.attention.output if parts.attention is not None else None
    return parts.ffn.down if parts.ffn is not None else None


def changed_projections(student: nn.Module, teacher: nn.Module, layer_map: Mapping[int, int]) -> list[tuple[int, str]]:
    """(student layer, projection) pairs whose input width differs from the teacher's: what surgery cut.

    Example:
        >>> from surgery.testing import TinySpec, tiny_cut_pair
        >>> teacher, student = tiny_cut_pair(TinySpec("bert", layers=2, heads=4), 1, {"heads": [0], "neurons": [2, 3]})
        >>> changed_projections(student, teacher, {0: 0, 1: 1})
        [(1, 'o'), (1, 'down')]
    """
    pairs = []
    for s, t in sorted(layer_map.items()):
        for name in PROJECTIONS:
            mine, theirs = projection(student, s, name), projection(teacher, t, name)
            if mine is not None and theirs is not None and mine.in_features != theirs.in_features:
                pairs.append((s, name))
    return pairs


def projection_name(model: nn.Module, layer: int, name: str) -> str:
    """The qualified module name of layer ``layer``'s projection ``name`` (``"o"`` or ``"down"``) in ``model``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> projection_name(tiny_model(TinySpec("bert", layers=2)), 1, "down")
        'encoder.layer.1.output.dense'
    """
    linear = projection(model, layer, name)
    found = next((n for n, m in model.named_modules() if m is linear), None) if linear is not None else None
    if found is None:
        raise ValueError(f"refit: layer {layer} of this model has no {name!r} projection")
    return found


def refit_targets(student: nn.Module, teacher: nn.Module, *, layer_map: Mapping[int, int] | None = None,
                  only_changed: bool = True) -> tuple[dict[int, int], list[tuple[int, str]]]:
    """The layer map (default: through any dropped layers) and the (layer, projection) pairs a refit solves.

    Example:
        >>> from surgery.testing import TinySpec, tiny_cut_pair
        >>> teacher, student = tiny_cut_pair(TinySpec("bert", layers=2), 0, {"neurons": [1]})
        >>> refit_targets(student, teacher)
        ({0: 0, 1: 1}, [(0, 'down')])
    """
    layer_map = dict(layer_map) if layer_map is not None else default_layer_map(
        adapter_for(student).num_layers, adapter_for(teacher).num_layers, steps_of(student)[len(steps_of(teacher)):])
    targets = changed_projections(student, teacher, layer_map) if only_changed else [
        (s, n) for s in sorted(layer_map) for n in PROJECTIONS
        if projection(student, s, n) is not None and projection(teacher, layer_map[s], n) is not None]
    return layer_map, targets


#: What a quantization-aware refit reads: a batch -> the inputs the quantized model feeds each projection,
#: by the student's qualified module name (``[batch, seq, in_features]``).
ProductInputs = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


#: Where a projection's output joins the residual stream: the module whose input is that sum, or the layer's own
#: output (:data:`LAYER_OUTPUT`), by projection name (:func:`residual_sums`).
LAYER_OUTPUT = "layer output"


def residual_sums(model: nn.Module, layer: int) -> dict[str, nn.Module | str]:
    """Where each projection of layer ``layer`` is added to the residual stream, as its next module sees the sum.

    A post-LN layer (BERT, DistilBERT, MPNet, DeBERTa-v2: its call closes with a norm) norms each sum at once:
    the attention output's in the attention norm, the FFN down's in the FFN norm. A pre-LN layer (ModernBERT) adds
    the attention output to the stream that its FFN norm then reads, and the FFN down's sum is the layer's output.
    A layer a strategy replaced (SHRP's routed layer: no norms of the family's own) gives no sums, and a projection
    whose sum is not found is left out: its refit keeps the plain target.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> {n: type(m).__name__ for n, m in residual_sums(tiny_model(TinySpec("bert")), 0).items()}
        {'o': 'LayerNorm', 'down': 'LayerNorm'}
        >>> residual_sums(tiny_model(TinySpec("modernbert")), 1)["down"]
        'layer output'
    """
    adapter = adapter_for(model)
    parts = adapter.layer(layer)
    attention, ffn = parts.norms.get("attention"), parts.norms.get("ffn")
    if attention is None or ffn is None:  # not the family's own layer: where its sums are is not known
        return {}
    # A post-LN layer's call closes with its FFN norm; a pre-LN one's with the residual add itself.
    post = adapter.calling_convention(parts.module).output_norm is ffn
    return {"o": attention, "down": ffn} if post else {"o": ffn, "down": LAYER_OUTPUT}


class _Normal:
    """Running normal equations ``[x, 1]ᵀ[x, 1]`` and ``[x, 1]ᵀ y`` of one projection, in float64."""

    def __init__(self) -> None:
        self.gram: torch.Tensor | None = None
        self.cross: torch.Tensor | None = None
        self.y_sum: torch.Tensor | None = None
        self.y_sq = 0.0
        self.tokens = 0

    def add(self, x: torch.Tensor, y: torch.Tensor, bias: bool) -> None:
        # A few thousand tokens at a time: the copies below (float, the bias column) of a whole long batch
        # (32 x 512 tokens x an FFN of 3072) held several hundred MB at once.
        for start in range(0, len(x), CHUNK_TOKENS):
            self._add(x[start:start + CHUNK_TOKENS], y[start:start + CHUNK_TOKENS], bias)

    def _add(self, x: torch.Tensor, y: torch.Tensor, bias: bool) -> None:
        # One chunk's products in float32 (a float64 product of a 1537-wide Gram costs 4x more on a
        # CPU), summed across chunks in float64, where the rounding of a long sum would build up.
        x, y = x.float(), y.float()
        if bias:
            x = torch.cat([x, x.new_ones(len(x), 1)], dim=1)
        gram, cross = (x.T @ x).double(), (x.T @ y).double()
        self.gram = gram if self.gram is None else self.gram + gram
        self.cross = cross if self.cross is None else self.cross + cross
        y_sum = y.double().sum(0)
        self.y_sum = y_sum if self.y_sum is None else self.y_sum + y_sum
        self.y_sq += float((y.double() ** 2).sum())
        self.tokens += len(x)

    def error(self, weight: torch.Tensor) -> float:
        """Relative squared error of ``x̃ weightᵀ`` against y, from the accumulated moments alone."""
        assert self.gram is not None and self.cross is not None and self.y_sum is not None
        w = weight.double()
        sse = float((w @ self.gram * w).sum() - 2 * (w * self.cross.T).sum() + self.y_sq)
        centred = self.y_sq - float((self.y_sum ** 2).sum()) / max(self.tokens, 1)
        return max(sse, 0.0) / max(centred, 1e-12)

    def solve(self, ridge: float) -> torch.Tensor:
        assert self.gram is not None and self.cross is not None
        scale = float(self.gram.diagonal().mean()) or 1.0
        eye = torch.eye(len(self.gram), dtype=self.gram.dtype, device=self.gram.device)
        return torch.linalg.solve(self.gram + ridge * scale * eye, self.cross).T


class _Reached(Exception):
    """Raised by a hook once the projection's activations are in hand, to end that forward pass."""


def _token_rows(tensor: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[batch, seq, d]`` activations as ``[tokens, d]``, padding positions left out."""
    if mask is None or tensor.dim() != 3 or mask.shape != tensor.shape[:2]:
        return tensor.reshape(-1, tensor.shape[-1])
    return tensor[mask.bool()]


class _Layers:
    """One model's encoder layers run batch by batch from cached hidden states, not from the embeddings.

    A refit solves projections in layer order, and the layers below the one it solves are fixed by
    then: their outputs are computed once (:meth:`advance`), not again in a forward from the
    embeddings for every projection (on MiniLM-L6, eleven cut projections cost six full forwards of the
    original and six of the cut model that way). Each batch's layer calls (masks, position terms) are
    recorded once (:func:`surgery.training.blockwise.record_calls`) and replayed as the encoder makes
    them, so every activation is the one a full forward computes.
    """

    def __init__(self, model: nn.Module, batches: Sequence[Mapping[str, Any]]) -> None:
        self.layers = adapter_for(model).layers()
        recorded = [record_calls(model, batch) for batch in batches]
        self.first = [hidden for hidden, _ in recorded]  # what enters layer 0: a layer map going back starts again
        self.hidden = list(self.first)
        self.calls = [calls for _, calls in recorded]
        self.at = 0  # the layer the cached hidden states enter

    def advance(self, to: int) -> None:
        """Run layers ``at`` to ``to - 1`` on every batch: the cached hidden states then enter layer ``to``."""
        if to < self.at:  # a layer map that is not increasing: from the embeddings again
            self.hidden, self.at = list(self.first), 0
        with torch.no_grad():
            for index in range(self.at, to):
                self.hidden = [calls[index].run(self.layers[index], hidden)
                               for calls, hidden in zip(self.calls, self.hidden, strict=True)]
        self.at = max(self.at, to)

    def run(self, batch: int) -> torch.Tensor | None:
        """Layer ``at`` on batch ``batch``'s cached hidden states, for its hooks (one may end it early: then None),
        returning what the layer outputs."""
        with torch.no_grad(), contextlib.suppress(_Reached):
            return self.calls[batch][self.at].run(self.layers[self.at], self.hidden[batch])
        return None

    def outputs(self, index: int, modules: Mapping[str, nn.Module], masks: Sequence[torch.Tensor | None],
                sums: Mapping[str, nn.Module | str] | None = None) -> dict[str, list[torch.Tensor]]:
        """What each of ``modules`` (inside layer ``index``) outputs on every batch, real tokens only; the whole
        layer runs once, and the cached hidden states then enter layer ``index + 1``. ``sums`` adds, under
        ``"<name>+"``, the residual sum each of them is added into (:func:`residual_sums`)."""
        self.advance(index)
        sums = sums or {}
        found: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
        found.update({f"{name}+": [] for name in sums})
        current: list[torch.Tensor | None] = [None]

        def keeper(name: str) -> Callable[..., None]:
            def keep(_m: nn.Module, _args: Any, output: Any) -> None:
                found[name].append(_token_rows(output.detach(), current[0]))
            return keep

        def sum_keeper(name: str) -> Callable[..., None]:
            def keep(_m: nn.Module, args: Any) -> None:
                found[name].append(_token_rows(args[0].detach(), current[0]))
            return keep

        handles = [module.register_forward_hook(keeper(name)) for name, module in modules.items()]
        handles += [where.register_forward_pre_hook(sum_keeper(f"{name}+")) for name, where in sums.items()
                    if isinstance(where, nn.Module)]
        try:
            with torch.no_grad():
                for b, mask in enumerate(masks):
                    current[0] = mask
                    self.hidden[b] = self.calls[b][index].run(self.layers[index], self.hidden[b])
                    for name, where in sums.items():
                        if where == LAYER_OUTPUT:
                            found[f"{name}+"].append(_token_rows(self.hidden[b], mask))
        finally:
            for handle in handles:
                handle.remove()
        self.at = index + 1
        if any(len(rows) != len(masks) for rows in found.values()):
            raise RuntimeError(f"refit: a projection of layer {index} was not run by its layer's call")
        return found


class TeacherOutputs:
    """The original's outputs a refit solves for, layer by layer, kept for the next refit of the same original on the
    same batches.

    A refit reads the teacher's output of each projection it solves (and, with ``residual``, the residual sums
    they are added into) on every calibration batch. They do not depend on the cut: compress refits a dozen or
    more cuts of one original on one set of batches, and without this each refit ran the original's layers again
    (on MiniLM-L6, a third of a refit's seconds: experiments/compress_cost). Layers are kept in the order a refit
    first asks for them until ``max_bytes`` of tensors are held; a layer past that is computed each time, as
    without a cache. What a refit solves is the same either way, bit for bit.

    Example:
        >>> from surgery.testing import TinySpec, tiny_cut_pair, tiny_inputs
        >>> spec = TinySpec("bert", layers=2, heads=4, ffn=37)
        >>> teacher, student = tiny_cut_pair(spec, 0, {"neurons": list(range(10))})
        >>> batches = [tiny_inputs(spec, batch=16)]
        >>> kept = TeacherOutputs(teacher, batches)
        >>> _ = refit_projections(student, teacher, batches, teacher_outputs=kept)
        >>> kept.layers, kept.misses, kept.nbytes > 0
        ([0], 1, True)
    """

    def __init__(self, teacher: nn.Module, batches: Sequence[Mapping[str, Any]], *,
                 max_bytes: int = 512 * 2**20) -> None:
        self.teacher = teacher
        self.batches = list(batches)
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._kept: dict[tuple[int, tuple[str, ...], tuple[str, ...]], dict[str, list[torch.Tensor]]] = {}

    @property
    def layers(self) -> list[int]:
        """The teacher layers whose outputs are held."""
        return sorted({key[0] for key in self._kept})

    def serves(self, teacher: nn.Module, batches: Sequence[Mapping[str, Any]]) -> bool:
        """Whether these are ``teacher``'s outputs on exactly ``batches`` (the same tensors, in the same order)."""
        if teacher is not self.teacher or len(batches) != len(self.batches):
            return False
        return all(set(a) == set(b) and all(a[k] is b[k] for k in a)
                   for a, b in zip(batches, self.batches, strict=True))

    def outputs(self, layer: int, modules: Sequence[str], sums: Sequence[str],
                compute: Callable[[], dict[str, list[torch.Tensor]]]) -> dict[str, list[torch.Tensor]]:
        """Layer ``layer``'s outputs of ``modules`` and ``sums`` (as :meth:`_Layers.outputs` gives them), from the
        cache or from ``compute``."""
        key = (layer, tuple(modules), tuple(sums))
        if key in self._kept:
            self.hits += 1
            return self._kept[key]
        self.misses += 1
        found = compute()
        size = sum(t.numel() * t.element_size() for rows in found.values() for t in rows)
        if self.nbytes + size <= self.max_bytes:
            self._kept[key] = found
            self.nbytes += size
        return found


def _accumulate(student: _Layers, teacher: list[torch.Tensor], mine: nn.Linear, layer: int,
                masks: Sequence[torch.Tensor | None], teacher_sums: list[torch.Tensor] | None = None,
                where: nn.Module | str | None = None) -> _Normal:
    """One pass of the student's layer ``layer`` over the batches: its input to ``mine`` against ``teacher``
    (the original's output of the same projection, per batch, real tokens).

    With ``teacher_sums`` (the original's residual sum that output is added into) and ``where`` (the student's
    same sum, :func:`residual_sums`), the target is the original's sum less the student's own residual: the
    projection then also makes up what the cuts below changed in the stream it is added to, not only in its input.
    """
    normal, box = _Normal(), {}
    residual = teacher_sums is not None and where is not None

    def take_input(_m: nn.Module, args: Any) -> None:
        box["x"] = args[0].detach()
        if not residual:  # the student's pass stops at the projection: nothing above it is needed
            raise _Reached

    def take_output(_m: nn.Module, _args: Any, output: Any) -> None:
        box["y"] = output.detach()

    def take_sum(_m: nn.Module, args: Any) -> None:
        box["sum"] = args[0].detach()
        raise _Reached

    student.advance(layer)
    handles = [mine.register_forward_pre_hook(take_input)]
    if residual:
        handles.append(mine.register_forward_hook(take_output))
        if isinstance(where, nn.Module):
            handles.append(where.register_forward_pre_hook(take_sum))
    try:
        for b, mask in enumerate(masks):
            box.clear()
            output = student.run(b)
            if "x" not in box:
                raise RuntimeError(f"refit: layer {layer}'s call did not reach the projection it solves")
            target = teacher[b]
            if residual:
                summed = box.get("sum", output if where == LAYER_OUTPUT else None)
                if summed is None or "y" not in box:
                    raise RuntimeError(f"refit: layer {layer}'s call did not reach the residual sum it solves for")
                # the original's sum less the student's residual (its sum less its own output of the projection)
                assert teacher_sums is not None
                target = teacher_sums[b] - _token_rows(summed - box["y"], mask)
            normal.add(_token_rows(box["x"], mask), target, bias=mine.bias is not None)
    finally:
        for handle in handles:
            handle.remove()
    return normal


def _accumulate_given(student: nn.Module, teacher: nn.Module, batches: Iterable[Mapping[str, Any]],
                      targets: list[tuple[int, str]], layer_map: Mapping[int, int],
                      inputs: ProductInputs) -> dict[tuple[int, str], _Normal]:
    """One pass over ``batches``: each target's input as ``inputs`` gives it, against the teacher's output."""
    names = {target: projection_name(student, *target) for target in targets}
    normals = {target: _Normal() for target in targets}
    outputs: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for layer, name in targets:
        theirs = projection(teacher, layer_map[layer], name)
        assert theirs is not None

        def keep(_m: nn.Module, _args: Any, output: Any, key: tuple[int, str] = (layer, name)) -> None:
            outputs[key] = output.detach()

        handles.append(theirs.register_forward_hook(keep))
    device = next(teacher.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                features = {k: v.to(device) for k, v in batch.items() if k != "labels" and torch.is_tensor(v)}
                teacher(**features)
                given = inputs(features)
                mask = features.get("attention_mask")
                for target in targets:
                    linear = projection(student, *target)
                    assert linear is not None
                    normals[target].add(_token_rows(given[names[target]].to(device), mask),
                                        _token_rows(outputs[target], mask), bias=linear.bias is not None)
    finally:
        for handle in handles:
            handle.remove()
    return normals


def refit_projections(student: nn.Module, teacher: nn.Module, batches: Iterable[Mapping[str, Any]], *,
                      layer_map: Mapping[int, int] | None = None, only_changed: bool = True,
                      ridge: float = 1e-2, quantized_inputs: ProductInputs | None = None,
                      residual: bool = True, teacher_outputs: TeacherOutputs | None = None) -> RefitResult:
    """Re-solve ``student``'s output projections so they reproduce ``teacher``'s on ``batches``, in place.

    ``batches`` holds model inputs (``input_ids``, ``attention_mask``, ...) and must be re-iterable
    (a list or a DataLoader, not a generator): every refitted projection reads them once.
    ``only_changed`` (default) solves the projections whose input width surgery changed; with False
    every projection is refitted. ``ridge`` is λ relative to the mean diagonal of the Gram
    matrix. A projection whose solve would not lower the calibration error keeps its weights.

    ``quantized_inputs`` makes it quantization-aware (GPTQ-style): each projection is solved against
    the inputs the int8 model actually feeds it
    (:func:`surgery.runtimes.openvino.quantized_refit.quantization_aware_refit` reads them off the quantized
    OpenVINO IR), so the cut's error and the int8 error upstream are compensated together; all projections
    are then solved from one pass (the inputs are fixed).

    ``residual`` (default) solves each projection for the original's residual sum it is added into
    (:func:`residual_sums`), less the student's own residual there, instead of the original's output of the
    projection alone: a cut below changes the residual stream too, and the projection is the last place in the
    layer that can make that up. On the suite's fine-tuned MiniLM-L6 classifiers the two targets score alike on
    shallow cuts and the residual one holds up where cuts are deep (experiments/refit, ``probe_residual.py``).
    ``quantized_inputs`` reads no residual stream off the int8 model, so with it every solve keeps the plain target.

    ``teacher_outputs`` (a :class:`TeacherOutputs` of this ``teacher`` on these ``batches``) keeps what the teacher's
    layers output for the next refit of another cut of it; the solves are the same with or without it.

    Example:
        >>> from surgery.testing import TinySpec, tiny_cut_pair, tiny_inputs
        >>> spec = TinySpec("bert", layers=2, heads=4, ffn=37)
        >>> teacher, student = tiny_cut_pair(spec, 0, {"neurons": list(range(10))})
        >>> result = refit_projections(student, teacher, [tiny_inputs(spec, batch=16)])
        >>> result.projections, result.error["0:down"][1] < result.error["0:down"][0]
        (['0:down'], True)
    """
    start = time.perf_counter()
    residual = residual and quantized_inputs is None
    student_was, teacher_was = student.training, teacher.training
    student.eval()
    teacher.eval()
    layer_map, targets = refit_targets(student, teacher, layer_map=layer_map, only_changed=only_changed)
    result = RefitResult()
    try:
        # A projection with no inputs left (an emptied FFN's down) has only its bias to solve: from the
        # teacher's outputs alone, as the plain refit does (the int8 model has no product there to read).
        fed = [t for t in targets if (linear := projection(student, *t)) is not None and linear.in_features > 0]
        given = _accumulate_given(student, teacher, batches, fed, layer_map, quantized_inputs) \
            if quantized_inputs is not None and fed else {}
        if teacher_outputs is not None:
            if not teacher_outputs.serves(teacher, batches := list(batches)):
                raise ValueError("refit: teacher_outputs were kept for another teacher or other batches")
            batches = teacher_outputs.batches
        passes: list[_Layers | None] = [None, None]  # the student's and the teacher's, each made when first needed
        masks: list[torch.Tensor | None] = []
        outputs: tuple[int, dict[str, list[torch.Tensor]]] | None = None  # one teacher layer's projection outputs
        for layer, name in targets:  # in layer order: each pass sees the layers below as already refitted
            linear = projection(student, layer, name)
            assert linear is not None
            normal = given.get((layer, name))
            if normal is None:
                if passes[0] is None:
                    batches = list(batches)
                    device = next(student.parameters()).device
                    masks = [batch["attention_mask"].to(device) if torch.is_tensor(batch.get("attention_mask"))
                             else None for batch in batches]
                    passes[0] = _Layers(student, batches)
                if outputs is None or outputs[0] != layer_map[layer]:  # both projections of a teacher layer at once
                    index = layer_map[layer]
                    modules = {n: m for n in PROJECTIONS if (m := projection(teacher, index, n)) is not None}
                    sums = {n: w for n, w in residual_sums(teacher, index).items() if n in modules} if residual else {}

                    def run_teacher(index: int = index, modules: dict[str, nn.Module] = modules,
                                    sums: dict[str, nn.Module | str] = sums, batches: list[Any] = batches,
                                    masks: list[torch.Tensor | None] = masks) -> dict[str, list[torch.Tensor]]:
                        if passes[1] is None:
                            passes[1] = _Layers(teacher, batches)
                        return passes[1].outputs(index, modules, masks, sums)

                    found = run_teacher() if teacher_outputs is None else \
                        teacher_outputs.outputs(index, list(modules), list(sums), run_teacher)
                    outputs = index, found
                where = residual_sums(student, layer).get(name) if residual else None
                theirs = outputs[1].get(f"{name}+") if where is not None else None
                assert passes[0] is not None
                normal = _accumulate(passes[0], outputs[1][name], linear, layer, masks, theirs,
                                     where if theirs is not None else None)
            current = linear.weight.detach().double()
            if linear.bias is not None:
                current = torch.cat([current, linear.bias.detach().double()[:, None]], dim=1)
            solved = normal.solve(ridge)
            before, after = normal.error(current), normal.error(solved)
            key = f"{layer}:{name}"
            result.error[key] = [round(before, 6), round(after, 6)]
            result.tokens = normal.tokens
            if after < before:
                with torch.no_grad():
                    linear.weight.copy_(solved[:, : linear.in_features].to(linear.weight.dtype))
                    if linear.bias is not None:
                        linear.bias.copy_(solved[:, -1].to(linear.bias.dtype))
                result.projections.append(key)
    finally:
        student.train(student_was)
        teacher.train(teacher_was)
    result.seconds = time.perf_counter() - start
    return result
