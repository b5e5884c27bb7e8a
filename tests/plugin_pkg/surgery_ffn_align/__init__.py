"""surgery-ffn-align: a third-party surgery strategy, registered only through an entry point.

``ffn-align`` rounds the FFN width of every layer down to a multiple of ``multiple``. Matrix kernels
run best when the inner dimension is a multiple of 8, 64 or 128, and pruning by a global ratio
leaves widths such as 1187; aligning them costs a few of the weakest neurons per layer.

Example:
    >>> import surgery
    >>> from surgery.testing import TinySpec, tiny_model
    >>> model = tiny_model(TinySpec("bert", ffn=37))
    >>> report = surgery.convert(model, FFNAlignStrategy(multiple=8))
    >>> [(c.before, c.after) for c in report.changes]
    [(37, 32), (37, 32)]
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from surgery import LayerChange, PlanError, RunContext, Strategy, StrategyConfig, adapter_for
from surgery.anatomy.slicing import check_indices, complement

__all__ = ["FFNAlignConfig", "FFNAlignStrategy"]
__version__ = "0.1.0"


class FFNAlignConfig(StrategyConfig):
    """Settings of ``ffn-align`` (unknown fields are rejected; instances are frozen).

    Example:
        >>> FFNAlignConfig(multiple=8).layers is None
        True
    """

    multiple: int = Field(default=64, ge=1, description="round each FFN width down to a multiple of this")
    layers: list[int] | None = Field(default=None, description="layers to align (default: all)")


class FFNAlignStrategy(Strategy):
    """Round every FFN width down to a multiple of ``multiple``, removing the weakest neurons.

    A neuron's strength is the L2 norm of its column of the down-projection (how much it can write
    into the residual stream). Layers already aligned, narrower than ``multiple``, or whose FFN a
    strategy replaced, are left alone.
    """

    name = "ffn-align"
    config_class = FFNAlignConfig
    plan_version = 1
    config: FFNAlignConfig

    def plan(self, model: nn.Module, data: Any = None, context: RunContext | None = None) -> dict[str, Any]:
        """Choose, per layer, the ``width % multiple`` neurons with the weakest down-projection columns.

        Reads weights only (``data`` is not needed) and never changes the model; a figure for the
        report goes to the run's ``context``.
        """
        adapter = adapter_for(model)
        layers = self.config.layers if self.config.layers is not None else range(adapter.num_layers)
        layers = check_indices(list(layers), adapter.num_layers, "ffn-align: layers")
        multiple = self.config.multiple
        removal: dict[str, list[int]] = {}
        for index in layers:
            ffn = adapter.layer(index).ffn
            if ffn is None or ffn.width < multiple or ffn.width % multiple == 0:
                continue
            strength = ffn.down.weight.detach().float().norm(dim=0)
            # A stable sort breaks ties by index, so the same weights always give the same plan.
            order = torch.sort(strength, stable=True).indices.tolist()
            removal[str(index)] = sorted(order[: ffn.width % multiple])
        if context is not None:
            context.metrics["aligned_layers"] = len(removal)
        # JSON keys are strings: this is exactly the form apply() receives when a saved model reloads.
        return {"neurons": removal}

    def apply(self, model: nn.Module, plan: dict[str, Any]) -> list[LayerChange]:
        """Remove the planned neurons. Deterministic, needs no data, accepts the plan as parsed from JSON."""
        if not isinstance(plan.get("neurons"), dict):
            raise PlanError("ffn-align: the plan needs a 'neurons' mapping of layer -> neurons to remove")
        adapter = adapter_for(model)
        # Check every layer before cutting any, so a rejected plan leaves the model unchanged.
        cuts = []
        for key, neurons in sorted(plan["neurons"].items(), key=lambda item: int(item[0])):
            index = int(key)
            ffn = adapter.layer(index).ffn
            if ffn is None:
                raise PlanError(f"ffn-align: layer {index} has no standard FFN (a strategy replaced it)")
            remove = check_indices(neurons, ffn.width, f"ffn-align: neurons of layer {index}")
            cuts.append((index, ffn.width, complement(remove, ffn.width)))
        for index, _, keep in cuts:
            adapter.keep_neurons(index, keep)
        return [LayerChange(layer=index, component="neurons", before=before, after=len(keep),
                            note=f"aligned to {self.config.multiple}") for index, before, keep in cuts]
