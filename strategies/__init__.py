"""Built-in strategies. They register through the ``surgery.strategies`` entry points like any plugin."""

from __future__ import annotations

from surgery.strategies.ffn_prune import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.head_prune import HeadPruningConfig, HeadPruningStrategy

__all__ = ["FFNPruningConfig", "FFNPruningStrategy", "HeadPruningConfig", "HeadPruningStrategy"]
