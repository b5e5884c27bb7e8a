"""The uniform parts of one encoder layer, and their row maps.

An adapter hands out these views; nothing else in surgery needs a family's module names. The row
maps say which output rows of which projection belong to a head, to one of the query/key/value
parts, or to an FFN neuron. They are the only place that knows a fused layout: ModernBERT's
``Wqkv`` (rows ``[q heads | k heads | v heads]``) and its GeGLU ``Wi`` (rows ``[input | gate]``).
Everything that cuts, copies or scores rows (:mod:`surgery.anatomy.removal`, head magnitudes, Expert
Attention's initialisation) asks these maps instead of deriving offsets itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from surgery.anatomy.slicing import head_rows
from surgery.core.errors import PlanError

#: The three per-head parts of attention, in the order a fused projection stacks them.
QKV = ("q", "k", "v")


@dataclass
class AttentionParts:
    """One layer's self-attention, seen uniformly.

    ``qkv`` is set instead of ``query``/``key``/``value`` for families that fuse the three
    projections into one Linear whose rows are laid out ``[q heads | k heads | v heads]``.
    ``per_head_rows`` lists further projections whose output rows are split per head exactly like
    the query (DeBERTa-v2's separate position projections when keys are not shared).

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> att = adapter_for(tiny_model(TinySpec("modernbert", heads=2, head_dim=4))).layer(0).attention
        >>> [(type(lin).__name__, rows) for lin, rows in att.rows_of_heads([1])]
        [('Linear', [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23])]
    """

    module: nn.Module
    output: nn.Linear
    num_heads: int
    head_dim: int
    query: nn.Linear | None = None
    key: nn.Linear | None = None
    value: nn.Linear | None = None
    qkv: nn.Linear | None = None
    per_head_rows: tuple[nn.Linear, ...] = ()

    @property
    def projections(self) -> tuple[nn.Linear, ...]:
        """Every Linear whose output rows are per head (q, k, v or qkv, plus ``per_head_rows``)."""
        own = (self.qkv,) if self.qkv is not None else (self.query, self.key, self.value)
        return tuple(p for p in own if p is not None) + self.per_head_rows

    @property
    def width(self) -> int:
        """Rows of each of the query, key and value parts: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    def projection_of(self, part: str) -> tuple[nn.Linear, int]:
        """The Linear computing ``part`` (``"q"``, ``"k"`` or ``"v"``) and the row offset of that part in it.

        Example:
            >>> from surgery.anatomy import adapter_for
            >>> from surgery.testing import TinySpec, tiny_model
            >>> att = adapter_for(tiny_model(TinySpec("modernbert", heads=2, head_dim=4))).layer(0).attention
            >>> att.projection_of("v")[1]
            16
        """
        if part not in QKV:
            raise PlanError(f"attention part {part!r} is unknown; choose one of {', '.join(QKV)}")
        if self.qkv is not None:
            return self.qkv, QKV.index(part) * self.width
        linear = {"q": self.query, "k": self.key, "v": self.value}[part]
        if linear is None:
            raise PlanError(f"this attention has no {part} projection")
        return linear, 0

    def rows_of_part(self, part: str, dims: Sequence[int]) -> tuple[nn.Linear, list[int]]:
        """The Linear computing ``part`` and its output rows of the part's dimensions ``dims`` (0..width-1)."""
        linear, offset = self.projection_of(part)
        return linear, [offset + d for d in dims]

    def rows_of_parts(self, dims: Mapping[str, Sequence[int]]) -> list[tuple[nn.Linear, list[int]]]:
        """The output rows of the given dimensions of each part in ``dims``, per Linear computing any of them.

        ``dims`` maps ``"q"``/``"k"``/``"v"`` to dimensions of that part (0..width-1). A Linear that
        also computes a part missing from ``dims`` (a fused ``qkv``) keeps all of that part's rows;
        a Linear computing none of them is not listed.

        Example:
            >>> from surgery.anatomy import adapter_for
            >>> from surgery.testing import TinySpec, tiny_model
            >>> att = adapter_for(tiny_model(TinySpec("modernbert", heads=1, head_dim=2))).layer(0).attention
            >>> [rows for _, rows in att.rows_of_parts({"v": [1]})]
            [[0, 1, 2, 3, 5]]
        """
        found: dict[int, tuple[nn.Linear, dict[str, int]]] = {}
        for part in QKV:
            linear, offset = self.projection_of(part)
            found.setdefault(id(linear), (linear, {}))[1][part] = offset
        everything = range(self.width)
        return [(linear, [offset + d for part, offset in offsets.items() for d in dims.get(part, everything)])
                for linear, offsets in found.values() if dims.keys() & offsets.keys()]

    def rows_of_heads(self, heads: Sequence[int]) -> list[tuple[nn.Linear, list[int]]]:
        """Every per-head projection with its output rows that belong to ``heads``, each Linear once.

        A fused ``qkv`` appears once with its q, k and v rows (in that order); ``per_head_rows``
        projections follow with the heads' rows.
        """
        dims = head_rows(heads, self.head_dim)
        return [*self.rows_of_parts(dict.fromkeys(QKV, dims)), *((linear, list(dims)) for linear in self.per_head_rows)]

    def columns_of_heads(self, heads: Sequence[int]) -> list[int]:
        """The output projection's input columns fed by ``heads``."""
        return head_rows(heads, self.head_dim)


@dataclass
class FFNParts:
    """One layer's feed-forward block.

    With ``gated=True`` (ModernBERT's GeGLU) ``up`` has ``2 * width`` rows: rows ``j`` and
    ``j + width`` both belong to neuron ``j`` (see :meth:`rows_of_neurons`).

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> ffn = adapter_for(tiny_model(TinySpec("modernbert", ffn=10))).layer(0).ffn
        >>> ffn.halves, ffn.rows_of_neurons([2, 7])
        (2, [2, 7, 12, 17])
    """

    up: nn.Linear
    down: nn.Linear
    act: nn.Module | Callable[..., Any]
    gated: bool = False

    @property
    def width(self) -> int:
        """Number of intermediate neurons."""
        return self.down.in_features

    @property
    def halves(self) -> int:
        """Blocks of ``width`` rows in ``up``: 2 for a gated FFN (``[input | gate]``), else 1."""
        return 2 if self.gated else 1

    def rows_of_neurons(self, neurons: Sequence[int]) -> list[int]:
        """The rows of ``up`` that belong to ``neurons``, one block per half (their ``down`` columns: ``neurons``)."""
        return [half * self.width + j for half in range(self.halves) for j in neurons]


@dataclass
class LayerParts:
    """One encoder layer: its module, attention, FFN and norms (by role name)."""

    index: int
    module: nn.Module
    attention: AttentionParts | None
    ffn: FFNParts | None
    norms: dict[str, nn.Module] = field(default_factory=dict)

    def count(self, group: str) -> int:
        """How many ``heads`` or ``neurons`` the layer has now (0 where a strategy replaced the part).

        Example:
            >>> from surgery.anatomy import adapter_for
            >>> from surgery.testing import TinySpec, tiny_model
            >>> parts = adapter_for(tiny_model(TinySpec("bert"))).layer(0)
            >>> parts.count("heads"), parts.count("neurons")
            (4, 37)
        """
        if group == "heads":
            return self.attention.num_heads if self.attention is not None else 0
        if group == "neurons":
            return self.ffn.width if self.ffn is not None else 0
        raise ValueError(f"unknown unit group {group!r}; known: heads, neurons")

    def require_attention(self) -> AttentionParts:
        """The standard attention, or a PlanError if a strategy has replaced it."""
        if self.attention is None:
            raise PlanError(f"layer {self.index} has no standard attention any more (a strategy replaced it)")
        return self.attention

    def require_ffn(self) -> FFNParts:
        """The standard FFN, or a PlanError if a strategy has replaced it."""
        if self.ffn is None:
            raise PlanError(f"layer {self.index} has no standard FFN any more (a strategy replaced it)")
        return self.ffn
