"""``ffn-prune``: remove FFN intermediate neurons physically.

This is the one name of the FFN-neuron cut. ``zero-recovery-prune`` with module set ``ffn`` makes
the same cut (the removal engine's ``neurons`` group) and scores neurons with the same
:func:`neuron_scores`; it remains for DoE's plans (see :mod:`surgery.strategies.doe.zero_recovery_prune`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from surgery.anatomy import EncoderAdapter
from surgery.core.errors import ConfigError
from surgery.core.strategy import Data
from surgery.scoring.importance import (
    Forward,
    Objective,
    ScoreKind,
    TokenMask,
    gold_logit_objective,
    linear_input_scores,
    objective_for,
)
from surgery.strategies.pruning.units import UnitPruningConfig, UnitPruningStrategy


class FFNPruningConfig(UnitPruningConfig):
    """Settings of ``ffn-prune``.

    Example:
        >>> FFNPruningConfig(ratio=0.5, importance="random").scope
        'global'
    """

    neurons: dict[int, list[int]] | None = Field(default=None, description="layer -> neurons to remove")
    importance: Literal["magnitude", "activation", "gradient", "attribution", "random"] = Field(
        default="magnitude",
        description="magnitude (weights only), activation |h|, gradient |dP/dh|, attribution |h dP/dh|, random",
    )
    explicit_field: ClassVar[str] = "neurons"


class FFNPruningStrategy(UnitPruningStrategy):
    """Remove FFN intermediate neurons, given explicitly or by importance and a ratio.

    Removing neuron ``j`` takes row ``j`` of the up-projection (both GeGLU halves for ModernBERT)
    and column ``j`` of the down-projection. Because the activation of a zero pre-activation row
    never reaches the output once its down column is gone, removal equals masking exactly.

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))  # 2 layers, 4 heads, FFN width 37
        >>> _ = surgery.convert(model, FFNPruningStrategy(neurons={0: [0, 1, 2]}))
        >>> [layer.ffn_width for layer in surgery.inspect(model).layers]
        [34, 37]
    """

    name = "ffn-prune"
    config_class = FFNPruningConfig
    unit = "neurons"
    config: FFNPruningConfig


    def scores(self, model: nn.Module, adapter: EncoderAdapter, layers: list[int], data: Data | None,
               metrics: dict[str, Any]) -> dict[int, torch.Tensor]:
        kind = self.config.importance
        layers = [i for i in layers if adapter.layer(i).ffn is not None]
        if kind == "random":
            gen = torch.Generator().manual_seed(self.config.seed)
            return {i: torch.rand(adapter.layer(i).ffn.width, generator=gen) for i in layers}
        if kind == "magnitude":
            out = {}
            for i in layers:
                ffn = adapter.layer(i).ffn
                up = ffn.up.weight.detach().view(ffn.halves, ffn.width, -1)  # a GeGLU neuron owns a row per half
                out[i] = (up.norm(dim=-1).prod(0) * ffn.down.weight.detach().norm(dim=0)).float()
            return out
        if data is None:
            raise ConfigError(f"ffn-prune importance={kind!r} needs data; pass data or use 'magnitude'")
        objective = gold_logit_objective if kind == "attribution" else objective_for(data)
        return neuron_scores(model, adapter, layers, data, kind=kind, objective=objective,
                             max_batches=self.config.max_batches)


def neuron_scores(model: nn.Module, adapter: EncoderAdapter, layers: list[int], data: Data, *, kind: ScoreKind,
                  objective: Objective, max_batches: int | None, forward: Forward | None = None,
                  token_mask: TokenMask | None = None) -> dict[int, torch.Tensor]:
    """Data-driven importance of every FFN neuron of ``layers``, keyed by layer; higher = keep.

    Read on the input of the down-projection (DoE's h); ``kind`` is ``activation``, ``gradient``
    or ``attribution`` (:func:`surgery.scoring.importance.linear_input_scores`). ``ffn-prune`` and
    ``zero-recovery-prune`` both score neurons here.

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2, ffn=37))
        >>> scores = neuron_scores(model, adapter_for(model), [1], [tiny_inputs(TinySpec("bert"))],
        ...                        kind="activation", objective=gold_logit_objective, max_batches=1)
        >>> list(scores), scores[1].shape
        ([1], torch.Size([37]))
    """
    downs = {i: adapter.layer(i).require_ffn().down for i in layers}
    return linear_input_scores(model, downs, data, kind=kind, objective=objective, max_batches=max_batches,
                               forward=forward, token_mask=token_mask)
