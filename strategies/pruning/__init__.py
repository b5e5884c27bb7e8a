"""The pruning baselines: remove attention heads, FFN neurons or whole layers.

* :mod:`.units`: what head and neuron pruning share (importance → lowest units → the removal engine);
* :mod:`.heads`: ``head-prune``; :mod:`.ffn`: ``ffn-prune`` (the canonical FFN-neuron cut);
* :mod:`.layers`: ``layer-drop``.

Recovery after any of them is :func:`surgery.training.recover` (distillation from the model before).
"""

from surgery.strategies.pruning.ffn import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.pruning.heads import HeadPruningConfig, HeadPruningStrategy
from surgery.strategies.pruning.layers import LayerDropConfig, LayerDropStrategy

__all__ = ["FFNPruningConfig", "FFNPruningStrategy", "HeadPruningConfig", "HeadPruningStrategy", "LayerDropConfig",
           "LayerDropStrategy"]
