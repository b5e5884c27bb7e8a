"""Built-in methods, one package per method. They register through the ``surgery.strategies`` entry points.

* :mod:`.pruning`: the baselines (``head-prune``, ``ffn-prune``, ``layer-drop``);
* :mod:`.shrp`: SHRP / Expert Attention (``expert-attention``, ``top1-prune``, the ``shrp`` pipeline);
* :mod:`.doe`: DoE (``soft-prompt``, ``zero-recovery-prune``, unplugging, the ``doe`` pipeline).

The modules' earlier flat paths (``surgery.strategies.head_prune`` ...) stay importable: each is the
same module object as its new home (see ``_MOVED``), so code written against them keeps working.
"""

from __future__ import annotations

import sys
from importlib import import_module

from surgery.strategies.doe import DoEConfig, DoEResult, DoEStrategy, build_runtime, run_doe
from surgery.strategies.doe.soft_prompt import SoftPromptConfig, SoftPromptStrategy
from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
from surgery.strategies.doe.zero_recovery import (
    ModulePruningConfig,
    ModulePruningStrategy,
    ZeroRecoveryPruningConfig,
    ZeroRecoveryPruningStrategy,
)
from surgery.strategies.pruning.ffn import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.pruning.heads import HeadPruningConfig, HeadPruningStrategy
from surgery.strategies.pruning.layers import LayerDropConfig, LayerDropStrategy
from surgery.strategies.shrp import ShrpConfig, ShrpStrategy, ShrpTrainer
from surgery.strategies.shrp.expert_attention import (
    ExpertAttentionConfig,
    ExpertAttentionLayer,
    ExpertAttentionStrategy,
)
from surgery.strategies.shrp.top1 import Top1PruningConfig, Top1PruningStrategy

__all__ = [
    "DoEConfig",
    "DoEResult",
    "DoEStrategy",
    "ExpertAttentionConfig",
    "ExpertAttentionLayer",
    "ExpertAttentionStrategy",
    "FFNPruningConfig",
    "FFNPruningStrategy",
    "HeadPruningConfig",
    "HeadPruningStrategy",
    "LayerDropConfig",
    "LayerDropStrategy",
    "ModulePruningConfig",
    "ModulePruningStrategy",
    "ShrpConfig",
    "ShrpStrategy",
    "ShrpTrainer",
    "SoftPromptConfig",
    "SoftPromptStrategy",
    "TaskExpert",
    "Top1PruningConfig",
    "Top1PruningStrategy",
    "UnplugRuntime",
    "ZeroRecoveryPruningConfig",
    "ZeroRecoveryPruningStrategy",
    "build_runtime",
    "run_doe",
]

#: Earlier flat module paths -> their home in a method package (aliases, not copies).
_MOVED = {
    "unit_prune": "pruning.units", "head_prune": "pruning.heads", "ffn_prune": "pruning.ffn",
    "layer_drop": "pruning.layers", "expert_attention": "shrp.expert_attention", "top1_prune": "shrp.top1",
    "soft_prompt": "doe.soft_prompt", "prompt_tuning": "doe.prompt_tuning", "module_prune": "doe.zero_recovery",
    "unplug": "doe.unplug",
}
for _old, _new in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = import_module(f"{__name__}.{_new}")
