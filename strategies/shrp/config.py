"""Settings of the ``shrp`` pipeline (:class:`ShrpConfig`)."""


from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from surgery.core.strategy import StrategyConfig
from surgery.strategies.shrp.expert_attention import (
    ExpanderInit,
    ExpanderKind,
    RouterGrad,
    RouterInput,
)

ExpertDropping = Literal["off", "halve"]

#: Settings a deep conversion (more than half the encoder's layers) uses unless the user sets them.
#: On the suite's 3 tasks x 3 seeds at 2,000 examples, SHRP-5/6 with them gained 5.5 to 24 dev points in
#: 9 of 9 runs (and 9 of 9 at 600); at 3/6 the same settings were level within noise at 2,000 examples
#: and lost up to 12 points at 600 (docs/results.md#suite-on-a-gpu-with-2000-and-5000-training-examples).
DEEP_CONVERSION_SETTINGS: dict[str, float] = {"distill_alpha": 0.5, "distill_hidden_weight": 1.0,
                                              "expander_gain": 0.1}


class ShrpConfig(StrategyConfig):
    """Settings of the ``shrp`` pipeline.

    Example:
        >>> ShrpConfig(layers=[5, 4, 3]).extra_epochs
        2
    """

    layers: list[int] | None = Field(default=None, description="layers to convert, in conversion order")
    num_layers: int | None = Field(default=None, ge=1, description="how many layers (when 'layers' is not given)")
    order: Literal["top-down", "bottom-up"] = Field(default="top-down",
                                                    description="conversion order when 'layers' is not given")
    finetune_epochs: int = Field(default=0, ge=0,
                                 description="plain fine-tuning epochs before the first conversion (stage 0), for "
                                             "an encoder not yet fine-tuned on the task, e.g. with a new head")
    extra_epochs: int = Field(default=2, ge=0, description="epochs after the last conversion (stage 2)")
    balance_weight: float = Field(default=0.1, ge=0.0, description="λ of the load-balance loss in stage 1")
    keep: int = Field(default=1, ge=1, description="experts kept per layer by Top-1 pruning")
    # "halve" makes the cut exact by construction (docs/shrp.md#safe-top-1-pruning); provisional until the
    # multi-task comparison (docs/results.md, experiments/top1_mechanisms/compare_top1.py) has all its runs.
    expert_dropping: ExpertDropping = Field(
        default="halve", description="stage 2: 'halve' masks out the less-used half of each layer's experts step by "
                                     "step (running usage) until `keep` remain, so the cut changes nothing; 'off': "
                                     "the cut takes the most-used experts after training (needs extra_epochs >= 1)")
    dropping_end: float = Field(default=0.5, gt=0.0, le=1.0,
                                description="fraction of stage 2 after which only `keep` experts per layer are left")
    concentration_weight: float = Field(default=0.0, ge=0.0,
                                        description="stage 2: weight of the entropy of the batch-mean router "
                                                    "distribution (pushes each layer onto one expert)")
    recover_epochs: int = Field(default=0, ge=0,
                                description="epochs of distillation recovery after the Top-1 cut (teacher: the "
                                            "routed model just before the cut)")
    # Off by default up to half the layers: there, across the suite's 3 tasks x 3 seeds, neither distillation nor
    # it plus expander_gain=0.1 won on every task (docs/results.md). Deeper conversions use DEEP_CONVERSION_SETTINGS.
    distill_alpha: float = Field(default=0.0, ge=0.0, le=1.0,
                                 description="stages 1-2: weight of the logit distillation (T²·KL) from the model as "
                                             "it was when conversion began; 1 - alpha weights the labels' CE (0: off; "
                                             "default 0.5 when more than half the layers are converted)")
    distill_temperature: float = Field(default=2.0, gt=0.0, description="temperature of that distillation")
    distill_hidden_weight: float = Field(default=0.0, ge=0.0,
                                         description="weight of the per-layer hidden-state MSE to the same teacher "
                                                     "(default 1.0 when more than half the layers are converted)")
    recover_learning_rate: float | None = Field(default=None, gt=0.0,
                                                description="learning rate of the recovery (default: learning_rate)")
    router_input: RouterInput = "cls"
    router_grad: RouterGrad = "straight-through"
    top_k: int = Field(default=1, ge=1)
    expander: ExpanderKind = "linear"
    expander_init: ExpanderInit = "output"
    expander_gain: float = Field(default=1.0, ge=0.0, description="initial γ of the Expander's LayerNorm "
                                 "(expert-attention's option; 0.1 by default for the embedding objective and when "
                                 "more than half the layers are converted)")
    reinit_on_activate: bool = Field(default=True,
                                     description="initialise experts from the layer's fine-tuned heads at its epoch")
    learning_rate: float = Field(default=5e-5, gt=0.0)
    weight_decay: float = Field(default=0.01, ge=0.0)
    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    batch_size: int = Field(default=32, ge=1)
    seed: int = 0
    eval_each_epoch: bool = Field(default=True, description="evaluation accuracy after every epoch")
    bench: bool = Field(default=True, description="measure params/FLOPs/throughput against the input model")
    bench_batch_size: int = Field(default=32, ge=1)
    bench_seq_len: int = Field(default=64, ge=1)
    bench_repeats: int = Field(default=5, ge=1)

    def for_depth(self, converted: int, total: int) -> ShrpConfig:
        """These settings for converting ``converted`` of ``total`` layers (task objective).

        A conversion of more than half the layers takes :data:`DEEP_CONVERSION_SETTINGS` for every
        one of them the user did not set; otherwise the settings are returned unchanged.

        Example:
            >>> ShrpConfig().for_depth(5, 6).distill_alpha, ShrpConfig().for_depth(3, 6).distill_alpha
            (0.5, 0.0)
            >>> ShrpConfig(expander_gain=1.0).for_depth(5, 6).expander_gain
            1.0
        """
        if 2 * converted <= total:
            return self
        unset = {k: v for k, v in DEEP_CONVERSION_SETTINGS.items() if k not in self.model_fields_set}
        return self.model_copy(update=unset) if unset else self

    @model_validator(mode="after")
    def _stage2_needs_epochs(self) -> ShrpConfig:
        # Expert dropping is on by default; with no stage 2 it has nowhere to run and the cut is taken as before.
        if self.extra_epochs == 0 and self.concentration_weight > 0:
            raise ValueError("concentration_weight acts in stage 2; set extra_epochs >= 1")
        return self


