"""``layer-drop``: remove whole encoder layers physically (the cheap strong baseline: drop, then distil).

The plan lists the layers to drop (indices into the current layer list); ``apply`` deletes them
from the encoder's ``ModuleList``, so the state dict renumbers the kept layers and a reload that
replays the plan on the original config rebuilds exactly the saved shapes. The HF config keeps its
original ``num_hidden_layers`` on purpose: it describes the model the replay starts from.

Given a ``count`` instead of explicit layers, a rule picks them:

* ``every-other``: keep evenly spaced layers starting at the bottom (6 of 12: 0, 2, ..., 10), the
  sentence-transformers recipe;
* ``keep-ends``: drop a block from the middle, keeping the bottom and top layers;
* ``top`` / ``bottom``: drop the highest / lowest layers.

Follow it with recovery (distillation from the model before the drop): ``surgery.convert(model,
LayerDropStrategy(count=3), data=task, recovery=RecoveryConfig(epochs=1))``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.anatomy.slicing import check_indices
from surgery.core.errors import PlanError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext, count_parameters
from surgery.core.strategy import Data, Plan, Strategy
from surgery.strategies.pruning.units import OneSourceConfig

Rule = Literal["every-other", "keep-ends", "top", "bottom"]


class LayerDropConfig(OneSourceConfig):
    """Settings of ``layer-drop``: explicit ``layers`` or a ``count`` with a ``rule``.

    Example:
        >>> LayerDropConfig(count=3).rule
        'every-other'
    """

    layers: list[int] | None = Field(default=None, description="layers to drop (indices into the current layers)")
    count: int | None = Field(default=None, ge=0, description="how many layers to drop (with 'rule')")
    rule: Rule = Field(default="every-other", description="which layers a count drops: every-other, keep-ends, "
                                                          "top or bottom")

    explicit_field: ClassVar[str] = "layers"
    derived_field: ClassVar[str] = "count"
    explicit_hint: ClassVar[str] = "explicit"
    derived_hint: ClassVar[str] = " (with 'rule')"


def layers_to_drop(num_layers: int, count: int, rule: Rule) -> list[int]:
    """The ``count`` layers of ``num_layers`` that ``rule`` drops (sorted).

    Example:
        >>> layers_to_drop(6, 3, "every-other"), layers_to_drop(6, 3, "keep-ends"), layers_to_drop(6, 2, "top")
        ([1, 3, 5], [2, 3, 4], [4, 5])
    """
    if not 0 <= count < num_layers:
        raise PlanError(f"layer-drop: count={count} but the model has {num_layers} layers; keep at least one "
                        f"(count 0..{num_layers - 1})")
    keep_n = num_layers - count
    if rule == "every-other":
        keep = {(i * num_layers) // keep_n for i in range(keep_n)}
    elif rule == "keep-ends":
        bottom = (keep_n + 1) // 2
        keep = set(range(bottom)) | set(range(num_layers - (keep_n - bottom), num_layers))
    elif rule == "top":
        keep = set(range(keep_n))
    else:
        keep = set(range(count, num_layers))
    return [i for i in range(num_layers) if i not in keep]


class LayerDropStrategy(Strategy):
    """Remove whole encoder layers, given explicitly or by a count and a rule.

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=4))
        >>> report = surgery.convert(model, LayerDropStrategy(count=2, rule="keep-ends"))
        >>> report.plan["drop"], surgery.inspect(model).num_layers
        ([1, 2], 2)
    """

    name = "layer-drop"
    objectives = ("task", "embedding")  # recovery distils embeddings on unlabelled texts
    config_class = LayerDropConfig
    config: LayerDropConfig

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        n = adapter_for(model).num_layers
        if self.config.layers is not None:
            drop = check_indices(self.config.layers, n, f"{self.name}: layers")
        else:
            drop = layers_to_drop(n, int(self.config.count or 0), self.config.rule)
        self._check(model, drop, n)
        return {"drop": drop, "layers_before": n}

    def _check(self, model: nn.Module, drop: list[int], n: int) -> None:
        if len(drop) >= n:
            raise PlanError(f"{self.name}: dropping all {n} layers is not supported; keep at least one layer")
        # DeBERTa-v2 checkpoints with a convolution apply it after layer 0 only; another layer 0
        # would change what it sees, so the first layer stays there.
        encoder = getattr(adapter_for(model).base, "encoder", None)
        if 0 in drop and getattr(encoder, "conv", None) is not None:
            raise PlanError(f"{self.name}: this model applies a convolution after layer 0; keep layer 0")

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        raw: Any = plan.get("drop")
        if not isinstance(raw, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
            raise PlanError(f"{self.name}: the plan needs 'drop': a list of integer layer indices, got {raw!r:.60}")
        layers = adapter_for(model).layers()
        drop = check_indices(raw, len(layers), f"{self.name}: drop")
        self._check(model, drop, len(layers))
        changes = [LayerChange(layer=i, component="layer", before=count_parameters(layers[i]), after=0,
                               note="dropped") for i in drop]
        for i in reversed(drop):
            del layers[i]
        return changes
