"""What each structure carries: the estimated increase of the user's objective when it is removed.

Heads and FFN neurons (Kwon et al., NeurIPS 2022): a mask ``m`` multiplies each unit's output; the
loss increase of removing a set of units is ``½ Δmᵀ F Δm`` with ``F`` the empirical Fisher of the
loss with respect to the mask, here its diagonal: ``F_u = Σ_n (∂ℓ_n/∂m_u)²`` over the calibration
examples (per-example gradients, read off one backward pass of a summed objective). Removing unit
``u`` (``Δm_u = 1``) is estimated to raise the mean loss by ``½ F_u / N``, and a set of units by the
sum of theirs.

* Task objective: ``ℓ_n`` is the model's own loss on example n's label.
* Embedding objective: ``ℓ_n = ⟨r_n, e(x_n)⟩`` with a fresh Gaussian ``r_n``
  (:func:`surgery.embedding.sensitivity.embedding_sensitivity`); ``E_r (∂ℓ/∂m)² = ‖∂e/∂m‖²``, which
  is the squared displacement of the sentence embedding when the unit goes, to first order. So the
  embedding estimate is ``F_u / N`` in units of ``‖Δe‖²`` (no ½: the squared distance is the loss).

Whole layers: the second-order estimate of a unit does not extend to a whole layer (the residual
stream carries it past the layer, which a sum over its units ignores), so a layer's cost is
measured: the same objective (mean task loss, or mean ``‖Δe‖²``) with the layer skipped, minus the
full model's, on a few batches. Both estimates are per example in the same units, so a head, a
group of neurons and a layer compete in one search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import DataError, PlanError
from surgery.scoring.importance import batches_on, linear_input_scores, loss_objective, model_device

ObjectiveName = Literal["task", "embedding"]

#: Bytes of activations one backward pass of compress may keep: the Fisher's and the distillation tier's batches
#: are split into rows that fit (:func:`rows_within`). A BERT-base batch of 32 x 512 tokens kept about 25 GB whole;
#: a distillation step on it, timed whole, took a 2-core, 24 GB machine's compress to the OOM killer (session 14).
#: The Fisher is a sum over examples, so its split changes no figure; distillation accumulates the micro-batches'
#: gradients into one optimiser step (the HF Trainer's gradient accumulation).
BACKWARD_ACTIVATION_BYTES = 2 * 2**30

#: Batches each layer's removal is measured on (fewer where a budget says so: see job_estimate).
LAYER_BATCHES = 4


def backward_bytes_per_row(model: nn.Module, seq_len: int) -> int:
    """Bytes one sequence of ``seq_len`` tokens keeps for a backward pass through ``model`` (fp32, an estimate).

    Per layer and token: about a dozen hidden-size vectors (projections, norms, residuals), three
    FFN-width ones (up projection, activation, its gradient) and three rows of attention scores.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> backward_bytes_per_row(tiny_model(TinySpec("bert")), 8)
        37824
    """
    adapter = adapter_for(model)
    hidden = int(getattr(model.config, "hidden_size", 0) or getattr(model.config, "dim", 0) or 0)
    total = 0
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        total += seq_len * (12 * hidden + 3 * parts.count("neurons") + 3 * parts.count("heads") * seq_len)
    return 4 * total


def rows_within(model: nn.Module, seq_len: int, limit: int | None = None) -> int:
    """Rows of ``seq_len`` tokens one backward pass through ``model`` may take at once within ``limit`` bytes
    (default :data:`BACKWARD_ACTIVATION_BYTES`), at least one.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows_within(tiny_model(TinySpec("bert")), 8), rows_within(tiny_model(TinySpec("bert")), 8, limit=1)
        (56775, 1)
    """
    per_row = backward_bytes_per_row(model, seq_len)
    return max(1, (BACKWARD_ACTIVATION_BYTES if limit is None else limit) // max(per_row, 1))


def micro_batches(batches: Sequence[Mapping[str, Any]], rows: int) -> list[dict[str, Any]]:
    """``batches`` split into batches of at most ``rows`` examples, trailing padding columns cut off.

    Example:
        >>> batch = {"input_ids": torch.ones(5, 6, dtype=torch.long),
        ...          "attention_mask": torch.tensor([[1] * 6] + [[1, 1, 0, 0, 0, 0]] * 4), "labels": torch.arange(5)}
        >>> [tuple(b["input_ids"].shape) for b in micro_batches([batch], 2)]
        [(2, 6), (2, 2), (1, 2)]
    """
    out: list[dict[str, Any]] = []
    for batch in batches:
        size = int(batch["input_ids"].shape[0])
        for start in range(0, size, max(rows, 1)):
            part = {k: v[start:start + rows] if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == size else v
                    for k, v in batch.items()}
            mask = part.get("attention_mask")
            if torch.is_tensor(mask) and mask.dim() == 2 and mask.shape[1] > 0:
                used = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else mask.shape[1]
                width = mask.shape[1]
                part = {k: v[:, :used] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[:2] == (mask.shape[0], width)
                        else v for k, v in part.items()}
            out.append(part)
    return out


def summed_task_loss(outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The task loss summed over the batch's examples (HF models return the mean), so per-example
    gradients come out of one backward pass.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> out = tiny_model(spec)(**batch)
        >>> bool(torch.isclose(summed_task_loss(out, batch), out.loss * 3))
        True
    """
    return loss_objective(outputs, batch) * batch["input_ids"].shape[0]


@dataclass
class UnitCosts:
    """Estimated objective increase (per example) of removing each head, each FFN neuron, each layer.

    Keys are the layers of the model scored (its current indices); a layer that cannot be removed
    (DeBERTa's layer 0 with a convolution) has no entry in ``layers``.
    """

    objective: ObjectiveName
    examples: int
    heads: dict[int, torch.Tensor] = field(default_factory=dict)
    neurons: dict[int, torch.Tensor] = field(default_factory=dict)
    layers: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Per-layer totals for the report (the per-unit figures are too many to keep)."""
        return {"objective": self.objective, "examples": self.examples, "seconds": round(self.seconds, 3),
                "layer_removal": {str(k): round(v, 6) for k, v in sorted(self.layers.items())},
                "heads_total": {str(k): round(float(v.sum()), 6) for k, v in sorted(self.heads.items())},
                "neurons_total": {str(k): round(float(v.sum()), 6) for k, v in sorted(self.neurons.items())}}


def mask_fisher(model: nn.Module, batches: Sequence[Mapping[str, Any]], *, objective: ObjectiveName,
                importance_objective: Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
                ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], int]:
    """Diagonal mask Fisher of every head and FFN neuron, as estimated loss increases per example.

    ``importance_objective`` is the embedding objective (it already sums per-example terms); the task
    objective is :func:`summed_task_loss`. Returns ``(heads, neurons, examples)``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> heads, neurons, n = mask_fisher(tiny_model(spec), [batch], objective="task")
        >>> heads[0].shape, neurons[1].shape, n, bool((heads[0] >= 0).all())
        (torch.Size([4]), torch.Size([37]), 3, True)
    """
    adapter = adapter_for(model)
    linears: dict[Any, nn.Linear] = {}
    groups: dict[Any, int] = {}
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        if parts.attention is not None:
            linears[("heads", i)] = parts.attention.output
            groups[("heads", i)] = parts.attention.head_dim
        if parts.ffn is not None and parts.ffn.width > 0:
            linears[("neurons", i)] = parts.ffn.down
            groups[("neurons", i)] = 1
    examples = sum(int(b["input_ids"].shape[0]) for b in batches)
    if batches:  # bounded memory: the backward of a long batch is taken a few rows at a time
        longest = max(int(b["input_ids"].shape[1]) for b in batches)
        batches = micro_batches(batches, rows_within(model, longest))
    if examples == 0:
        raise DataError("compress: the calibration data holds no examples; pass training data")
    chosen = importance_objective if objective == "embedding" else summed_task_loss
    if chosen is None:
        raise DataError("compress: the embedding objective needs unlabelled text data (it brings its objective)")
    with torch.enable_grad():
        fisher = linear_input_scores(model, linears, batches, kind="fisher", group_size=groups, objective=chosen)
    scale = (0.5 if objective == "task" else 1.0) / examples
    heads = {i: fisher[k].double() * scale for k in fisher if k[0] == "heads" for i in [k[1]]}
    neurons = {i: fisher[k].double() * scale for k in fisher if k[0] == "neurons" for i in [k[1]]}
    return heads, neurons, examples


@torch.no_grad()
def objective_value(model: nn.Module, batches: Sequence[Mapping[str, Any]], objective: ObjectiveName,
                    pooled: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None,
                    reference: list[torch.Tensor] | None) -> tuple[float, list[torch.Tensor]]:
    """Mean task loss per example, or mean ``‖e − e_ref‖²``; also the pooled embeddings (for the reference).

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> objective_value(tiny_model(spec), [batch], "task", None, None)[0] > 0
        True
    """
    total, count, embeddings = 0.0, 0, []
    for n, batch in enumerate(batches_on(batches, model_device(model))):
        size = int(batch["input_ids"].shape[0])
        if objective == "task":
            total += float(loss_objective(model(**batch), batch)) * size
        else:
            assert pooled is not None
            emb = pooled(model, batch).double()
            embeddings.append(emb)
            if reference is not None:
                total += float((emb - reference[n]).square().sum())
        count += size
    return total / max(count, 1), embeddings


def layer_removal_costs(model: nn.Module, batches: Sequence[Mapping[str, Any]], *, objective: ObjectiveName,
                        pooled: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
                        ) -> dict[int, float]:
    """Measured objective increase per example when each layer alone is skipped (removable layers only).

    The layer is taken out of the encoder's layer list for the measurement and put back, exactly as
    ``layer-drop`` would remove it. ``pooled(model, batch)`` gives sentence embeddings (embedding objective).

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls", layers=3)
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> sorted(layer_removal_costs(tiny_model(spec), [batch], objective="task"))
        [0, 1, 2]
    """
    from surgery.strategies.pruning.layer_drop import LayerDropStrategy

    was_training = model.training
    model.eval()
    adapter = adapter_for(model)
    layers = adapter.layers()
    try:
        full, reference = objective_value(model, batches, objective, pooled, None)
        base = 0.0 if objective == "embedding" else full
        costs: dict[int, float] = {}
        for i in range(len(layers)):
            try:
                LayerDropStrategy(layers=[i]).plan(model)  # the strategy's own rules (one layer stays, conv)
            except PlanError:
                continue
            removed = layers[i]
            del layers[i]
            try:
                value, _ = objective_value(model, batches, objective, pooled, reference)
            finally:
                layers.insert(i, removed)
            costs[i] = max(value - base, 0.0)
    finally:
        model.train(was_training)
    return costs


def unit_costs(model: nn.Module, batches: Sequence[Mapping[str, Any]], *, objective: ObjectiveName,
               importance_objective: Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
               pooled: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
               layer_batches: int = LAYER_BATCHES, max_seconds: float | None = None, max_batches: int | None = None,
               first: FisherBatch | None = None) -> UnitCosts:
    """Every structure's estimated cost: mask Fisher of heads and neurons, measured layer removal.

    With ``max_seconds`` the Fisher reads only as many of ``batches`` as its first batch's time says
    fit (at least one): the Fisher is a sum over examples, so fewer examples give the same
    estimate with more noise, never a different quantity.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> costs = unit_costs(tiny_model(spec), [batch, batch], objective="task", max_seconds=0.0)
        >>> sorted(costs.heads), sorted(costs.layers), costs.examples
        ([0, 1], [0, 1], 3)
    """
    start = time.perf_counter()
    batches = list(batches)
    if not batches:
        raise DataError("compress: the calibration data holds no examples; pass training data")
    earlier = 0.0 if first is None else first.seconds  # timed by the estimate, before this phase's clock
    if first is None:
        first = fisher_batch(model, batches[0], objective=objective, importance_objective=importance_objective)
    heads, neurons, examples = first.heads, first.neurons, first.examples
    more = len(batches) - 1 if max_batches is None else min(len(batches), max(max_batches, 1)) - 1
    if max_seconds is not None:
        more = min(more, int(max(max_seconds - first.seconds, 0.0) / max(first.seconds, 1e-9)))
    if more > 0:
        rest_heads, rest_neurons, rest = mask_fisher(model, batches[1:1 + more], objective=objective,
                                                     importance_objective=importance_objective)
        # Both parts are per-example means: weigh them by their examples.
        total = examples + rest
        heads = {i: (heads[i] * examples + rest_heads[i] * rest) / total for i in heads}
        neurons = {i: (neurons[i] * examples + rest_neurons[i] * rest) / total for i in neurons}
        examples = total
    layers = layer_removal_costs(model, batches[:layer_batches], objective=objective, pooled=pooled)
    return UnitCosts(objective=objective, examples=examples, heads=heads, neurons=neurons, layers=layers,
                     seconds=time.perf_counter() - start + earlier)


@dataclass
class FisherBatch:
    """The mask Fisher of one batch and the seconds it took: the importance phase's first step, timed
    by the job's estimate and then reused rather than computed twice."""

    heads: dict[int, torch.Tensor]
    neurons: dict[int, torch.Tensor]
    examples: int
    seconds: float


def fisher_batch(model: nn.Module, batch: Mapping[str, Any], *, objective: ObjectiveName,
                 importance_objective: Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
                 ) -> FisherBatch:
    """The mask Fisher of one batch, timed (the estimate's probe of the importance phase).

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> step = fisher_batch(tiny_model(spec), {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])},
        ...                     objective="task")
        >>> step.examples, step.seconds > 0
        (3, True)
    """
    start = time.perf_counter()
    heads, neurons, examples = mask_fisher(model, [batch], objective=objective,
                                           importance_objective=importance_objective)
    return FisherBatch(heads, neurons, examples, time.perf_counter() - start)
