"""The removal engine: one layer's removal map becomes cuts, committed for good or reversibly.

A removal map names, per unit group, the units of one layer to remove:

* ``heads``: attention heads, cut physically (their rows in q, k, v, fused or not, and in further
  per-head projections; their input columns of the output projection);
* ``neurons``: FFN intermediate neurons, cut physically (their rows of the up-projection, both
  GeGLU halves, and their columns of the down-projection), so layers end up with uneven widths;
* ``qk``: dimensions of the query and key parts, cut *together* (the attention score is a sum over
  them, so a dimension only goes from both);
* ``v``: dimensions of the value part;
* ``o``: output rows of the attention output projection (they feed the residual stream).

``qk``, ``v`` and ``o`` keep their Linear's output width: it is replaced by a
:class:`~surgery.anatomy.slicing.ZeroRecoveryLinear` that computes only the kept rows and scatters them into
zeros, so the head reshape and the residual addition see the shapes they expect (exactly like masking
those rows).

:func:`layer_cuts` is the one place that turns a removal map into :class:`Cut` s; which rows belong
to what comes from the parts' row maps (:mod:`surgery.anatomy.parts`). Permanent pruning
(``head-prune``, ``ffn-prune``, ``zero-recovery-prune``) commits the cuts with :func:`commit`, through
:meth:`~surgery.anatomy.base.EncoderAdapter.remove_units`, which also updates the family's head
bookkeeping. DoE's unplug runtime commits them with :func:`commit_reversibly` and puts the original
modules back with :func:`restore`.

Example:
    >>> from surgery.anatomy import adapter_for
    >>> from surgery.testing import TinySpec, tiny_model
    >>> parts = adapter_for(tiny_model(TinySpec("bert", ffn=10))).layer(0)
    >>> [(c.rows, c.columns) for c in layer_cuts(parts, {"neurons": [0, 2, 3, 4, 5, 6, 7, 9]})]
    [([1, 8], None), (None, [1, 8])]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from surgery.anatomy.parts import LayerParts
from surgery.anatomy.slicing import (
    ZeroRecoveryLinear,
    check_indices,
    complement,
    keep_linear_inputs_,
    keep_linear_outputs_,
    owner_of,
    replace_module,
    sliced_linear,
)
from surgery.core.errors import PlanError

#: Every unit group a removal map may name.
GROUPS = ("heads", "neurons", "qk", "v", "o")
#: The groups of DoE's module sets; these are the ones :func:`commit_reversibly` can take (removing
#: heads also changes the attention's head count, which only a permanent removal updates).
MODULE_GROUPS = ("qk", "v", "o", "neurons")
#: The attention parts whose dimensions each zero-recovered group cuts (q and k go together).
GROUP_PARTS = {"qk": ("q", "k"), "v": ("v",)}

#: Undo records of a reversible commit: ``(owner, attribute, original)``; ``None`` means "absent before".
Undo = list[tuple[nn.Module, str, Any]]


@dataclass(frozen=True)
class Cut:
    """One Linear's share of a removal: the output rows and input columns it keeps (``None`` = all).

    With ``zero_recover`` the Linear keeps its output width: only ``rows`` are computed, the others
    are exact zeros.
    """

    linear: nn.Module
    rows: list[int] | None = None
    columns: list[int] | None = None
    zero_recover: bool = False

    @property
    def keeps_all(self) -> bool:
        """True when the cut removes nothing."""
        return ((self.rows is None or len(self.rows) == self.linear.out_features)
                and (self.columns is None or len(self.columns) == self.linear.in_features))

    def replacement(self) -> nn.Module:
        """A new module doing what the cut Linear would do; the Linear itself is left untouched."""
        if self.zero_recover:
            return ZeroRecoveryLinear.from_linear(self.linear, self.rows)
        return sliced_linear(self.linear, outputs=self.rows, inputs=self.columns)

    def commit_(self, root: nn.Module) -> None:
        """Carry the cut out for good inside ``root``: slice the Linear in place, or swap in its zero-recovered form.

        A zero-recovering cut that keeps everything leaves the plain Linear (exactly the identity).
        """
        if self.zero_recover:
            if not self.keeps_all:
                replace_module(root, self.linear, self.replacement())
            return
        if self.rows is not None:
            keep_linear_outputs_(self.linear, self.rows)
        if self.columns is not None:
            keep_linear_inputs_(self.linear, self.columns)


def units_of(parts: LayerParts, group: str) -> int:
    """Number of units of ``group`` in one layer.

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> parts = adapter_for(tiny_model(TinySpec("bert", heads=4, head_dim=8))).layer(0)
        >>> [units_of(parts, g) for g in GROUPS]
        [4, 37, 32, 32, 32]
    """
    if group not in GROUPS:
        raise PlanError(f"unit group {group!r} is unknown; choose one of {', '.join(GROUPS)}")
    if group == "neurons":
        return parts.require_ffn().width
    attention = parts.require_attention()
    if group == "heads":
        return attention.num_heads
    return attention.output.out_features if group == "o" else attention.width


def layer_cuts(parts: LayerParts, removal: Mapping[str, Sequence[int]], who: str = "") -> list[Cut]:
    """The cuts that remove ``removal`` (group -> units to remove) from one layer; nothing is changed yet.

    Indices are checked against the layer's current units. A group that removes nothing still gives
    its cuts (a permanent commit of a slice is then the identity; a reversible one skips it).
    """
    prefix = f"{who}: " if who else ""
    unknown = sorted(set(removal) - set(GROUPS))
    if unknown:
        raise PlanError(f"{prefix}unit groups {unknown} are unknown; choose among {', '.join(GROUPS)}")
    if "heads" in removal and removal.keys() & {"qk", "v"}:
        raise PlanError(f"{prefix}layer {parts.index}: 'heads' and 'qk'/'v' cut the same rows; remove them in "
                        "two steps")
    kept = {}
    for group, units in removal.items():
        width = units_of(parts, group)
        kept[group] = complement(check_indices(units, width, f"{prefix}{group} of layer {parts.index}"), width)
    cuts: list[Cut] = []
    if "heads" in kept:
        attention = parts.require_attention()
        if not kept["heads"]:
            raise PlanError(
                f"{prefix}layer {parts.index}: removing all {attention.num_heads} heads is not supported; keep at "
                "least one head (or convert the layer with a strategy that replaces attention)"
            )
        cuts += [Cut(linear, rows=rows) for linear, rows in attention.rows_of_heads(kept["heads"])]
        cuts.append(Cut(attention.output, columns=attention.columns_of_heads(kept["heads"])))
    if "neurons" in kept:
        ffn = parts.require_ffn()
        cuts += [Cut(ffn.up, rows=ffn.rows_of_neurons(kept["neurons"])), Cut(ffn.down, columns=kept["neurons"])]
    dims = {part: kept[group] for group, parts_of in GROUP_PARTS.items() if group in kept for part in parts_of}
    if dims:
        cuts += [_zero_recovered(linear, rows) for linear, rows in parts.require_attention().rows_of_parts(dims)]
    if "o" in kept:
        cuts.append(_zero_recovered(parts.require_attention().output, kept["o"]))
    return cuts


def commit(root: nn.Module, cuts: Iterable[Cut]) -> None:
    """Carry ``cuts`` out for good inside ``root`` (one layer module): see :meth:`Cut.commit_`."""
    for cut in cuts:
        cut.commit_(root)


def commit_reversibly(root: nn.Module, cuts: Iterable[Cut], undo: Undo) -> None:
    """Swap a new module in for every cut Linear inside ``root``, recording in ``undo`` how to put it back.

    The originals are never modified, so :func:`restore` gives back the very same module and parameter
    objects (state dict and outputs bit-identical). Cuts that remove nothing are skipped. Only the
    :data:`MODULE_GROUPS` cuts are reversible this way: removing heads also changes the attention's
    head count.
    """
    for cut in cuts:
        if cut.keeps_all:
            continue
        owner, attr = owner_of(root, replace_module(root, cut.linear, cut.replacement()))
        undo.append((owner, attr, cut.linear))


def restore(undo: Undo) -> None:
    """Undo reversible changes, newest first: put each original back (or delete what was absent).

    Example:
        >>> layer = nn.Sequential(nn.Linear(4, 3))
        >>> original, undo = layer[0], []
        >>> commit_reversibly(layer, [Cut(original, rows=[0, 2], zero_recover=True)], undo)
        >>> type(layer[0]).__name__
        'ZeroRecoveryLinear'
        >>> restore(undo)
        >>> layer[0] is original
        True
    """
    for owner, attr, original in reversed(undo):
        if original is None:
            if hasattr(owner, attr):
                delattr(owner, attr)
        else:
            setattr(owner, attr, original)


def _zero_recovered(linear: nn.Module, kept: list[int]) -> Cut:
    if isinstance(linear, ZeroRecoveryLinear):
        raise PlanError("a projection is already zero-recovered; prune each module set once, on the full model")
    return Cut(linear, rows=kept, zero_recover=True)

