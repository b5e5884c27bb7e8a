"""Distillation losses: logit KL at a temperature (Hinton et al.) and mapped hidden-state MSE (CoFi).

The teacher is the model before surgery. Both losses are plain functions of tensors, so they are
tested against hand computations and reused by every trainer in :mod:`surgery.training.trainer`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError


class DistillConfig(BaseModel):
    """How a student learns from its teacher.

    The training loss is ``(1 - alpha) * CE(student, labels) + alpha * T² · KL(p_T^teacher ‖ p_T^student)
    + hidden_weight * MSE(mapped hidden states)``.

    Example:
        >>> DistillConfig().temperature, DistillConfig().alpha
        (2.0, 0.5)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=2.0, gt=0.0, description="softmax temperature T of the logit KL")
    alpha: float = Field(default=0.5, ge=0.0, le=1.0, description="weight of the logit KL; 1 - alpha weights CE")
    hidden_weight: float = Field(default=0.0, ge=0.0, description="weight of the hidden-state MSE (0: off)")
    layer_map: dict[int, int] | None = Field(
        default=None, description="student layer -> teacher layer for the hidden-state MSE; default: derived")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · KL(softmax(teacher/T) ‖ softmax(student/T))``, averaged over the batch.

    The T² factor keeps the gradient scale of the soft targets independent of T (Hinton et al.).

    Example:
        >>> logits = torch.tensor([[1.0, 2.0, 0.5]])
        >>> float(distillation_loss(logits, logits, 2.0))
        0.0
    """
    t = float(temperature)
    log_student = F.log_softmax(student_logits.float() / t, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    # F.kl_div(input=log q, target=log p, log_target=True) is KL(p ‖ q): here p is the teacher.
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * (t * t)


def hidden_state_loss(student_layers: Sequence[torch.Tensor], teacher_layers: Sequence[torch.Tensor],
                      layer_map: Mapping[int, int] | None = None, attention_mask: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Mean over mapped layers of the MSE between student layer ``s`` and teacher layer ``layer_map[s]``.

    ``*_layers[i]`` is the output hidden state of layer ``i`` (see :func:`recording_layer_outputs`);
    ``layer_map=None`` pairs every student layer with the teacher layer of the same index. Padding
    positions (``attention_mask == 0``) do not count.

    Example:
        >>> h = (torch.ones(1, 2, 3),)
        >>> float(hidden_state_loss(h, (torch.zeros(1, 2, 3),), {0: 0}))
        1.0
    """
    if layer_map is None:
        layer_map = {i: i for i in range(len(student_layers))}
    if not layer_map:
        raise ConfigError("hidden-state distillation needs a non-empty layer_map (student layer -> teacher layer)")
    for side, layers, wanted in (("student", student_layers, layer_map.keys()),
                                 ("teacher", teacher_layers, layer_map.values())):
        missing = sorted(i for i in wanted if i >= len(layers) or layers[i] is None)
        if missing:
            raise ConfigError(f"hidden-state distillation: the {side} has no output for layers {missing} "
                              f"(it has {len(layers)} layers); fix layer_map")
    total = torch.zeros((), device=student_layers[next(iter(layer_map))].device)
    for s, t in layer_map.items():
        diff = (student_layers[s].float() - teacher_layers[t].float()).pow(2).mean(-1)  # [B, L]
        if attention_mask is not None and attention_mask.shape == diff.shape:
            mask = attention_mask.to(diff.dtype)
            total = total + (diff * mask).sum() / mask.sum().clamp(min=1.0)
        else:
            total = total + diff.mean()
    return total / len(layer_map)


@contextmanager
def recording_layer_outputs(model: nn.Module) -> Iterator[list[torch.Tensor | None]]:
    """Inside the block, a forward of ``model`` fills the list with each encoder layer's output, in order.

    Forward hooks on the anatomy's layers rather than ``output_hidden_states``: transformers 5
    records hidden states by hooking its own layer classes, so a layer that surgery replaced (an
    Expert Attention layer) is missing from ``hidden_states``, and a layer map over that tuple would
    pair the wrong layers or none. A DDP-wrapped model is unwrapped.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2))
        >>> with recording_layer_outputs(model) as layers:
        ...     last = model(**tiny_inputs(TinySpec("bert"))).last_hidden_state
        >>> len(layers), bool(torch.equal(layers[-1], last))
        (2, True)
    """
    modules = adapter_for(getattr(model, "module", model)).layers()
    outputs: list[torch.Tensor | None] = [None] * len(modules)

    def recorder(index: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            outputs[index] = output[0] if isinstance(output, tuple | list) else output
        return hook

    handles = [module.register_forward_hook(recorder(i)) for i, module in enumerate(modules)]
    try:
        yield outputs  # type: ignore[misc]  # filled by the forward run inside the block
    finally:
        for handle in handles:
            handle.remove()


def default_layer_map(student_layers: int, teacher_layers: int, steps: Sequence[Mapping[str, object]] = ()
                      ) -> dict[int, int]:
    """Student layer -> teacher layer: identity, or through the ``layer-drop`` steps taken since the teacher.

    ``steps`` are the manifest steps the student went through after the teacher's copy was taken
    (``steps_of(student)[len(steps_of(teacher)):]``); each ``layer-drop`` plan ``{"drop": [...]}``
    removes its layers from the map, so a kept layer is matched with the layer it was.

    Example:
        >>> default_layer_map(3, 6, [{"strategy": "layer-drop", "plan": {"drop": [1, 3, 5]}}])
        {0: 0, 1: 2, 2: 4}
    """
    origin = list(range(teacher_layers))
    for step in steps:
        plan = step.get("plan")
        if step.get("strategy") == "layer-drop" and isinstance(plan, Mapping):
            dropped = {int(i) for i in plan.get("drop", [])}  # type: ignore[union-attr]
            origin = [o for i, o in enumerate(origin) if i not in dropped]
    if len(origin) != student_layers:
        raise ConfigError(f"cannot map {student_layers} student layers onto {teacher_layers} teacher layers; "
                          "pass layer_map={student: teacher, ...}")
    return dict(enumerate(origin))
