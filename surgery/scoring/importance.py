"""Data-driven importance of the input features of Linear layers (heads, FFN neurons).

Every score here is computed from the input ``h`` of a Linear (the attention output projection for
heads, the FFN down-projection for neurons) and the gradient ``g`` of an objective with respect to
it, captured with forward pre-hooks and one backward pass per batch:

* ``activation``: mean over tokens of ``|h_j|``;
* ``gradient``: mean over tokens of ``|g_j|``;
* ``attribution``: mean over tokens of ``|h_j * g_j|`` (DoE, Yang et al. 2025, eq. 2-3);
* ``gate``: ``|sum over tokens and the group's features of h * g|``, the derivative of the
  objective with respect to a multiplicative gate on the whole group (Michel et al. 2019);
* ``fisher``: the square of that derivative per instance, summed: the diagonal of the empirical
  Fisher of a mask on the group (Kwon et al. 2022). It needs an objective that sums per-instance
  terms (per-instance gradients are then read off one backward pass; a batch-mean loss would
  scale them by ``1/batch``).

Scores are summed over instances; features are grouped (``group_size = head_dim`` for heads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import torch
from torch import nn

from surgery.core.errors import DataError

ScoreKind = Literal["activation", "gradient", "attribution", "gate", "fisher"]
Objective = Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]
#: How to run the model on a batch (default ``model(**batch)``), and which tokens to average over.
Forward = Callable[[nn.Module, Mapping[str, torch.Tensor]], Any]
TokenMask = Callable[[Mapping[str, torch.Tensor]], torch.Tensor | None]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless module)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def batches_on(data: Iterable[Mapping[str, Any]], device: torch.device, max_batches: int | None = None):
    """Yield input dicts from ``data`` with tensors moved to ``device``; at most ``max_batches``."""
    for number, batch in enumerate(data):
        if max_batches is not None and number >= max_batches:
            return
        if not isinstance(batch, Mapping) or ("input_ids" not in batch and "inputs_embeds" not in batch):
            raise DataError("each data item must be a dict of model inputs with at least 'input_ids'")
        yield {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def loss_objective(outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The model's own task loss (needs ``labels`` in the batch)."""
    loss = getattr(outputs, "loss", None)
    if loss is None:
        raise DataError("importance needs a task loss: use a task model (e.g. ...ForSequenceClassification) "
                        "and data with a 'labels' column")
    return loss


def objective_for(data: Any) -> Objective:
    """The objective importance scores use on ``data``: the data's own (unlabelled sentence-embedding
    texts bring a label-free one, :class:`surgery.embedding.TextData`), else the task loss.

    Example:
        >>> objective_for([{"input_ids": torch.tensor([[2, 3]])}]) is loss_objective
        True
    """
    own = getattr(data, "importance_objective", None)
    return own() if callable(own) else loss_objective


def gold_logit_objective(outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Sum over instances of the gold label's logit P(y|x) (DoE's attribution target)."""
    logits = getattr(outputs, "logits", None)
    labels = batch.get("labels")
    if logits is None or labels is None or logits.dim() != 2:
        raise DataError("attribution needs a sequence classifier's logits and data with a 'labels' column")
    return logits.gather(1, labels.view(-1, 1)).sum()


def linear_input_scores(
    model: nn.Module,
    linears: Mapping[int, nn.Linear],
    data: Iterable[Mapping[str, Any]],
    *,
    kind: ScoreKind,
    group_size: int | Mapping[Any, int] = 1,
    objective: Objective = loss_objective,
    max_batches: int | None = None,
    forward: Forward | None = None,
    side: Literal["input", "output"] = "input",
    token_mask: TokenMask | None = None,
) -> dict[Any, torch.Tensor]:
    """Score the input features of each Linear in ``linears`` (keyed by layer) over ``data``.

    Returns, per key, a float tensor of ``in_features // group_size`` scores (higher = more important);
    ``group_size`` may be one size for every key or a size per key (heads and neurons in one pass).
    With ``side="output"`` the Linear's output features are scored instead (forward hooks on its
    output; used for output rows that feed the residual stream or the attention product).
    ``token_mask(batch)`` gives the ``[B, T]`` mask of the tokens to average over when the model
    sees more tokens than the batch holds (a soft prompt); by default the batch's attention mask.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> model = BertForSequenceClassification(cfg)
        >>> batch = {"input_ids": torch.randint(0, 99, (2, 5)), "labels": torch.tensor([0, 1])}
        >>> s = linear_input_scores(model, {0: model.bert.encoder.layer[0].output.dense}, [batch],
        ...                         kind="attribution")
        >>> s[0].shape
        torch.Size([37])
    """
    needs_grad = kind != "activation"
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    anchor = torch.zeros((), requires_grad=True)

    def capture(key: Any, h: torch.Tensor) -> torch.Tensor:
        if needs_grad:
            # Adding a zero that requires grad puts h in the graph even when every parameter
            # is frozen, without cutting the gradient path to earlier layers.
            h = h + anchor.to(h.dtype)
        captured[key] = h
        return h

    def make_hook(key: Any):
        def hook(_module: nn.Module, args: tuple[Any, ...]):
            return (capture(key, args[0]), *args[1:])

        return hook

    def make_output_hook(key: Any):
        def hook(_module: nn.Module, _args: tuple[Any, ...], output: torch.Tensor):
            return capture(key, output)

        return hook

    for key, linear in linears.items():
        if side == "output":
            hooks.append(linear.register_forward_hook(make_output_hook(key)))
        else:
            hooks.append(linear.register_forward_pre_hook(make_hook(key)))
    width = {key: lin.out_features if side == "output" else lin.in_features for key, lin in linears.items()}
    groups = {key: group_size[key] if isinstance(group_size, Mapping) else group_size for key in linears}
    totals = {key: torch.zeros(width[key] // groups[key], dtype=torch.float64) for key in linears}
    was_training = model.training
    model.eval()
    run = forward or (lambda m, b: m(**b))
    seen = 0
    try:
        for batch in batches_on(data, model_device(model), max_batches):
            captured.clear()
            with torch.set_grad_enabled(needs_grad):
                outputs = run(model, batch)
                if needs_grad:
                    keys = list(captured)
                    grads = torch.autograd.grad(objective(outputs, batch), [captured[k] for k in keys],
                                                allow_unused=True)
                    grad_of = dict(zip(keys, grads, strict=True))
            mask = token_mask(batch) if token_mask is not None else batch.get("attention_mask")
            for key, h in captured.items():
                h = h.detach().double()
                g = grad_of[key].double() if needs_grad and grad_of[key] is not None else torch.zeros_like(h)
                tok = (mask if mask is not None and mask.shape == h.shape[:2] else torch.ones(h.shape[:2]))
                tok = tok.to(h.device).double().unsqueeze(-1)  # [B, T, 1]
                count = tok.sum(dim=1).clamp_min(1)  # [B, 1]
                if kind in ("gate", "fisher"):
                    per = (h * g * tok).sum(dim=1)  # [B, F]: d objective / d gate, per instance
                    per = per.view(per.shape[0], -1, groups[key]).sum(-1)
                    per = per.abs() if kind == "gate" else per.square()
                else:
                    value = {"activation": h.abs(), "gradient": g.abs(), "attribution": (h * g).abs()}[kind]
                    per = (value * tok).sum(dim=1) / count
                    per = per.view(per.shape[0], -1, groups[key]).sum(-1)
                totals[key] += per.sum(0).cpu()
            seen += 1
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    if seen == 0:
        raise DataError("the data yielded no batches; pass at least one batch of model inputs")
    return {key: value.float() for key, value in totals.items()}
