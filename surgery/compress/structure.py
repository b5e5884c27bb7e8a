"""The shape of an encoder that compression searches over: heads and FFN width per layer, or no layer.

A ``Structure`` is the one currency shared by the latency table (which predicts how long a structure
takes on a runtime) and the search (which chooses one). It is plain data: indices refer to the layers
of the model the search started from, and a removed layer is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from surgery.anatomy import adapter_for


@dataclass(frozen=True)
class LayerShape:
    """One kept layer: how many attention heads and FFN neurons it has.

    Example:
        >>> LayerShape(heads=12, ffn_width=3072).heads
        12
    """

    heads: int
    ffn_width: int

    def __post_init__(self) -> None:
        if self.heads < 0 or self.ffn_width < 0:
            raise ValueError(f"a layer needs heads >= 0 and ffn_width >= 0, got {self.heads} and {self.ffn_width}")


@dataclass(frozen=True)
class Structure:
    """Per layer of the starting model: its ``LayerShape``, or ``None`` where the layer is removed.

    Example:
        >>> s = Structure((LayerShape(4, 37), None, LayerShape(2, 10)))
        >>> [layer.heads for layer in s.kept], s.removed
        ([4, 2], [1])
        >>> Structure.from_json(s.to_json()) == s
        True
    """

    layers: tuple[LayerShape | None, ...]

    @property
    def kept(self) -> list[LayerShape]:
        """The shapes of the layers that remain, bottom to top."""
        return [layer for layer in self.layers if layer is not None]

    @property
    def removed(self) -> list[int]:
        """Indices (into the starting model's layers) of the removed layers."""
        return [i for i, layer in enumerate(self.layers) if layer is None]

    @classmethod
    def from_model(cls, model: nn.Module) -> Structure:
        """The structure a model has now, every layer kept.

        Example:
            >>> from surgery.testing import TinySpec, tiny_model
            >>> Structure.from_model(tiny_model(TinySpec("bert"))).kept[0]
            LayerShape(heads=4, ffn_width=37)
        """
        adapter = adapter_for(model)
        return cls(tuple(LayerShape(adapter.layer(i).count("heads"), adapter.layer(i).count("neurons"))
                         for i in range(adapter.num_layers)))

    def to_json(self) -> list[dict[str, int] | None]:
        """Plain JSON: a list with ``{"heads", "ffn_width"}`` per kept layer and ``null`` per removed one."""
        return [None if layer is None else {"heads": layer.heads, "ffn_width": layer.ffn_width}
                for layer in self.layers]

    @classmethod
    def from_json(cls, value: Any) -> Structure:
        """Inverse of ``to_json``; a ``ValueError`` names the entry that is not a layer shape."""
        if not isinstance(value, list):
            raise ValueError(f"a structure is a list of layer shapes, got {type(value).__name__}")
        layers: list[LayerShape | None] = []
        for i, entry in enumerate(value):
            if entry is None:
                layers.append(None)
            elif isinstance(entry, dict) and set(entry) == {"heads", "ffn_width"} and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in entry.values()):
                layers.append(LayerShape(entry["heads"], entry["ffn_width"]))
            else:
                raise ValueError(f"structure entry {i}: expected null or {{'heads': int, 'ffn_width': int}}, "
                                 f"got {entry!r:.80}")
        return cls(tuple(layers))
