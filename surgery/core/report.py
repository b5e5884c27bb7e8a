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


class StepCheck(BaseModel):
    """The guard's record of one structural step: evaluation accuracy before and after, and any recovery.

    Accuracies are fractions; ``drop`` and ``remaining_drop`` are accuracy points (percentage
    points). ``exceeded`` is True when the loss left after recovery is above ``max_drop``.
    """

    step: int
    strategy: str
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    drop: float | None = None
    recovery: dict[str, Any] | None = None
    accuracy_final: float | None = None
    remaining_drop: float | None = None
    max_drop: float | None = None
    trained_after: bool = False
    exceeded: bool = False

    def warning(self) -> str | None:
        """One line for a step whose loss remains above ``max_drop``, else None."""
        if not self.exceeded:
            return None
        recovered = (f"; {self.remaining_drop:.1f} remain after {self.recovery['epochs']} recovery epoch(s)"
                     if self.recovery else "; no recovery ran")
        return (f"step {self.step} ({self.strategy}) lost {self.drop:.1f} accuracy points, more than max_drop "
                f"{self.max_drop:g}{recovered}")


#: How a report names the default reference: a copy of the model before each step.
INPUT_MODEL = "input model"


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
    #: The guard's per-step accuracy checks (empty when nothing was measured).
    checks: list[StepCheck] = Field(default_factory=list)
    #: What recovery distilled from and accuracy or fidelity was measured against: "input model" (a
    #: copy before each step), or the original model's directory or name (``teacher=``, ``--teacher``).
    reference: str = INPUT_MODEL
    #: In-memory results of the run that are not figures (DoE's task expert, a tuned prompt): the run
    #: context's artefacts. Never serialised (``--report`` files hold figures only).
    artefacts: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @property
    def warnings(self) -> list[str]:
        """One line per step whose accuracy loss remains above ``max_drop``."""
        return [w for w in (c.warning() for c in self.checks) if w is not None]

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
