"""Reports returned by the library: plain pydantic data the CLI renders."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ParamCount(BaseModel):
    """Parameter counts; ``without_embeddings`` excludes every ``nn.Embedding`` (as the papers do)."""

    total: int
    without_embeddings: int


class LayerChange(BaseModel):
    """What a strategy did to one component of one layer."""

    layer: int
    component: str
    before: int | None = None
    after: int | None = None
    note: str = ""


class SurgeryReport(BaseModel):
    """What ``convert`` did: the plan, per-layer changes and parameter counts before and after."""

    strategy: str
    config: dict[str, Any]
    plan: dict[str, Any]
    changes: list[LayerChange]
    params_before: ParamCount
    params_after: ParamCount
    metrics: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0

    @property
    def reduction(self) -> float:
        """Fraction of parameters (without embeddings) removed."""
        before = self.params_before.without_embeddings
        return 1.0 - self.params_after.without_embeddings / before if before else 0.0


class LayerAnatomy(BaseModel):
    """One layer as ``inspect`` sees it."""

    index: int
    kind: str = "standard"
    heads: int | None = None
    head_dim: int | None = None
    ffn_width: int | None = None
    params: int
    details: dict[str, Any] = Field(default_factory=dict)


class StepSummary(BaseModel):
    """One recorded surgery step."""

    strategy: str
    config: dict[str, Any]


class ModelAnatomy(BaseModel):
    """The uniform anatomy of a model, returned by :func:`surgery.inspect`."""

    model_type: str
    model_class: str
    hidden_size: int
    num_layers: int
    layers: list[LayerAnatomy]
    params: ParamCount
    steps: list[StepSummary]
