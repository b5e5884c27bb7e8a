"""Built-in strategies. They register through the ``surgery.strategies`` entry points like any plugin."""

from __future__ import annotations

from surgery.strategies.doe import DoEConfig, DoEResult, DoEStrategy, build_runtime, run_doe
from surgery.strategies.expert_attention import ExpertAttentionConfig, ExpertAttentionLayer, ExpertAttentionStrategy
from surgery.strategies.ffn_prune import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.head_prune import HeadPruningConfig, HeadPruningStrategy
from surgery.strategies.layer_drop import LayerDropConfig, LayerDropStrategy
from surgery.strategies.module_prune import (
    ModulePruningConfig,
    ModulePruningStrategy,
    ZeroRecoveryPruningConfig,
    ZeroRecoveryPruningStrategy,
)
from surgery.strategies.shrp import ShrpConfig, ShrpStrategy, ShrpTrainer
from surgery.strategies.soft_prompt import SoftPromptConfig, SoftPromptStrategy
from surgery.strategies.top1_prune import Top1PruningConfig, Top1PruningStrategy
from surgery.strategies.unplug import TaskExpert, UnplugRuntime

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
