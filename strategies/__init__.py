"""Built-in methods, one package per method. They register through the ``surgery.strategies`` entry points.

* :mod:`.pruning`: the baselines (``head-prune``, ``ffn-prune``, ``layer-drop``);
* :mod:`.shrp`: SHRP / Expert Attention (``expert-attention``, ``top1-prune``, the ``shrp`` pipeline);
* :mod:`.doe`: DoE (``soft-prompt``, ``zero-recovery-prune``, unplugging, the ``doe`` pipeline, and its
  ``surgery experts`` command).

Here: every registered method's strategy (or pipeline) and config class, and DoE's multi-task entry
points. The pieces of one method (SHRP's trainer and callbacks, DoE's unplug runtime) are in its
package's ``__all__``. A registered method's module carries its registered name (``head-prune`` in
``pruning/head_prune.py``). The names below are imported on first use, so that importing one method
does not pay for the others. A method's command (``surgery experts``) is a CLI plugin in
:mod:`surgery.cli.experts`: no method imports ``surgery.cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from surgery.strategies.doe.doe import DoEConfig, DoEPipeline, DoEResult, build_runtime, run_doe
    from surgery.strategies.doe.soft_prompt import SoftPromptConfig, SoftPromptStrategy
    from surgery.strategies.doe.zero_recovery_prune import (
        ZeroRecoveryPruningConfig,
        ZeroRecoveryPruningStrategy,
    )
    from surgery.strategies.pruning.ffn_prune import FFNPruningConfig, FFNPruningStrategy
    from surgery.strategies.pruning.head_prune import HeadPruningConfig, HeadPruningStrategy
    from surgery.strategies.pruning.layer_drop import LayerDropConfig, LayerDropStrategy
    from surgery.strategies.shrp.config import ShrpConfig
    from surgery.strategies.shrp.expert_attention import (
        ExpertAttentionConfig,
        ExpertAttentionStrategy,
    )
    from surgery.strategies.shrp.shrp import ShrpPipeline
    from surgery.strategies.shrp.top1_prune import Top1PruningConfig, Top1PruningStrategy

_LAZY = {
    "DoEConfig": "surgery.strategies.doe.doe",
    "DoEResult": "surgery.strategies.doe.doe",
    "DoEPipeline": "surgery.strategies.doe.doe",
    "ExpertAttentionConfig": "surgery.strategies.shrp.expert_attention",
    "ExpertAttentionStrategy": "surgery.strategies.shrp.expert_attention",
    "FFNPruningConfig": "surgery.strategies.pruning.ffn_prune",
    "FFNPruningStrategy": "surgery.strategies.pruning.ffn_prune",
    "HeadPruningConfig": "surgery.strategies.pruning.head_prune",
    "HeadPruningStrategy": "surgery.strategies.pruning.head_prune",
    "LayerDropConfig": "surgery.strategies.pruning.layer_drop",
    "LayerDropStrategy": "surgery.strategies.pruning.layer_drop",
    "ZeroRecoveryPruningConfig": "surgery.strategies.doe.zero_recovery_prune",
    "ZeroRecoveryPruningStrategy": "surgery.strategies.doe.zero_recovery_prune",
    "ShrpConfig": "surgery.strategies.shrp.config",
    "ShrpPipeline": "surgery.strategies.shrp.shrp",
    "SoftPromptConfig": "surgery.strategies.doe.soft_prompt",
    "SoftPromptStrategy": "surgery.strategies.doe.soft_prompt",
    "Top1PruningConfig": "surgery.strategies.shrp.top1_prune",
    "Top1PruningStrategy": "surgery.strategies.shrp.top1_prune",
    "build_runtime": "surgery.strategies.doe.doe",
    "run_doe": "surgery.strategies.doe.doe",
}

__all__ = [
    "DoEConfig",
    "DoEPipeline",
    "DoEResult",
    "ExpertAttentionConfig",
    "ExpertAttentionStrategy",
    "FFNPruningConfig",
    "FFNPruningStrategy",
    "HeadPruningConfig",
    "HeadPruningStrategy",
    "LayerDropConfig",
    "LayerDropStrategy",
    "ShrpConfig",
    "ShrpPipeline",
    "SoftPromptConfig",
    "SoftPromptStrategy",
    "Top1PruningConfig",
    "Top1PruningStrategy",
    "ZeroRecoveryPruningConfig",
    "ZeroRecoveryPruningStrategy",
    "build_runtime",
    "run_doe",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
