"""The pruning baselines: remove attention heads, FFN neurons or whole layers.

* :mod:`.units`: what head and neuron pruning share (importance → lowest units → the removal engine);
* :mod:`.head_prune`: ``head-prune``; :mod:`.ffn_prune`: ``ffn-prune`` (the canonical FFN-neuron cut);
* :mod:`.layer_drop`: ``layer-drop``.

Recovery after any of them is :func:`surgery.training.recover` (distillation from the model before).
"""

from surgery.strategies.pruning.ffn_prune import FFNPruningConfig, FFNPruningStrategy
from surgery.strategies.pruning.head_prune import HeadPruningConfig, HeadPruningStrategy
from surgery.strategies.pruning.layer_drop import LayerDropConfig, LayerDropStrategy

__all__ = ["FFNPruningConfig", "FFNPruningStrategy", "HeadPruningConfig", "HeadPruningStrategy", "LayerDropConfig",
           "LayerDropStrategy"]
