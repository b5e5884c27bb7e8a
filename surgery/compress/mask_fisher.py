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
               layer_batches: int = 4, max_seconds: float | None = None) -> UnitCosts:
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
    heads, neurons, examples = mask_fisher(model, batches[:1], objective=objective,
                                           importance_objective=importance_objective)
    first = time.perf_counter() - start
    more = len(batches) - 1
    if max_seconds is not None:
        more = min(more, int(max(max_seconds - first, 0.0) / max(first, 1e-9)))
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
                     seconds=time.perf_counter() - start)
