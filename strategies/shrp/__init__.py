"""SHRP / Expert Attention: heads become Top-1-routed experts, trained progressively, pruned by usage.

* :mod:`.expert_attention`: the Expert Attention layer (router, experts, shared Expander) and the
  ``expert-attention`` step that converts layers;
* :mod:`.top1_prune`: ``top1-prune``, usage calibration and the cut to the most used expert(s);
* :mod:`.shrp`, :mod:`.config`, :mod:`.shrp_training`: the ``shrp`` pipeline, its settings and its
  Trainer pieces (balance loss, progressive conversion, expert dropping, distillation's teacher);
* :mod:`.embedding_shrp`: the same pipeline with the sentence-embedding objective.
"""

from surgery.strategies.shrp.config import ExpertDropping, ShrpConfig
from surgery.strategies.shrp.shrp import ShrpPipeline, finetune, finetune_after_cut
from surgery.strategies.shrp.shrp_training import (
    ProgressiveConversion,
    ProgressiveExpertDropping,
    ShrpTrainer,
    ShrpTrainingState,
    TeacherSnapshot,
    halving_sizes,
    prepare_progressive,
    shrp_training_arguments,
)

__all__ = ["ExpertDropping", "ProgressiveConversion", "ProgressiveExpertDropping", "ShrpConfig", "ShrpPipeline",
           "ShrpTrainer", "ShrpTrainingState", "TeacherSnapshot", "finetune", "finetune_after_cut",
           "halving_sizes", "prepare_progressive", "shrp_training_arguments"]
