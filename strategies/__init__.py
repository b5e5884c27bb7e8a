"""Built-in strategies. They register through the ``surgery.strategies`` entry points like any plugin."""

from __future__ import annotations

from surgery.strategies.expert_attention import ExpertAttentionConfig, ExpertAttentionLayer, ExpertAttentionStrategy
from surgery.strategies.ffn_prune import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.head_prune import HeadPruningConfig, HeadPruningStrategy
from surgery.strategies.shrp import ShrpConfig, ShrpStrategy, ShrpTrainer
from surgery.strategies.top1_prune import Top1PruningConfig, Top1PruningStrategy

__all__ = [
    "ExpertAttentionConfig",
    "ExpertAttentionLayer",
    "ExpertAttentionStrategy",
    "FFNPruningConfig",
    "FFNPruningStrategy",
    "HeadPruningConfig",
    "HeadPruningStrategy",
    "ShrpConfig",
    "ShrpStrategy",
    "ShrpTrainer",
    "Top1PruningConfig",
    "Top1PruningStrategy",
]
