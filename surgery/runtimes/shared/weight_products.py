"""The weight products of every encoder layer, by part, as int8 export sees them.

One walk over the family's anatomy adapter serves both mixed precision (``--int8-fp32 PART`` keeps a
part's products in fp32) and activation smoothing (products that read the same input share a
scale), so the two can never disagree about what "the FFN down projection" is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import nn

from surgery.core.errors import ConfigError

#: Parts of every encoder layer that ``int8_fp32`` can keep in fp32.
INT8_FP32_PARTS = ("attention", "ffn", "ffn-up", "ffn-down")
#: Which :data:`INT8_FP32_PARTS` names select a product group's part.
_SELECTED_BY = {"attention": {"attention"}, "ffn-up": {"ffn", "ffn-up"}, "ffn-down": {"ffn", "ffn-down"}}


class ProductGroup(NamedTuple):
    """Linear modules of one layer part that read the same input (q, k and v together; others alone)."""

    part: str  # "attention", "ffn-up" or "ffn-down"
    names: tuple[str, ...]  # qualified module names under the walked root


def product_groups(root: nn.Module) -> list[ProductGroup]:
    """Every layer's Linear products, grouped by shared input, found through the family's anatomy adapter.

    A layer's query, key and value projections read the same hidden states and form one group;
    position projections (DeBERTa-v2), the attention output and each FFN projection are groups of
    their own. Parts a strategy replaced (a routed expert layer) contribute nothing.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> [(g.part, len(g.names)) for g in product_groups(tiny_model(TinySpec("bert", layers=1)))]
        [('attention', 3), ('attention', 1), ('ffn-up', 1), ('ffn-down', 1)]
    """
    from surgery.anatomy import adapter_for

    names = {id(m): name for name, m in root.named_modules()}
    adapter = adapter_for(root)
    groups: list[tuple[str, list[nn.Module]]] = []
    for index in range(adapter.num_layers):
        layer = adapter.layer(index)
        if layer.attention is not None:
            attention = layer.attention
            shared = (attention.qkv,) if attention.qkv is not None else (attention.query, attention.key,
                                                                          attention.value)
            groups.append(("attention", [m for m in shared if m is not None]))
            groups += [("attention", [m]) for m in attention.per_head_rows]  # read position embeddings
            groups.append(("attention", [attention.output]))
        if layer.ffn is not None:
            groups += [("ffn-up", [layer.ffn.up]), ("ffn-down", [layer.ffn.down])]
    return [ProductGroup(part, tuple(names[id(m)] for m in group)) for part, group in groups
            if group and all(isinstance(m, nn.Linear) and id(m) in names for m in group)]


def part_modules(root: nn.Module, parts: Sequence[str]) -> set[str]:
    """Qualified names (under ``root``) of the Linear modules of ``parts`` in every layer.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> sorted(part_modules(tiny_model(TinySpec("bert", layers=1)), ["ffn-down"]))
        ['encoder.layer.0.output.dense']
    """
    if not parts:
        return set()
    return {name for group in product_groups(root) if _SELECTED_BY[group.part] & set(parts) for name in group.names}


#: The parts of a layer an int8 precision map names (a layer's attention projections, its FFN up, its FFN down).
PRECISION_PARTS = ("attention", "ffn-up", "ffn-down")
#: The op group of the task head's products (pooler and classifier): outside every layer.
CLASSIFIER_GROUP = "classifier"


def split_group(group: str) -> tuple[int | None, str]:
    """A precision map's op group as (layer index, part): ``layer.N.part`` or the layer-less ``classifier``.

    The one parser of the names :func:`precision_groups` gives; everything that reads a group's layer
    or part goes through it.

    Example:
        >>> split_group("layer.3.ffn-up"), split_group("classifier")
        ((3, 'ffn-up'), (None, 'classifier'))
    """
    if not group.startswith("layer."):
        return None, group
    _, index, part = group.split(".", 2)
    return int(index), part


def precision_groups(root: nn.Module) -> dict[str, tuple[str, ...]]:
    """The op groups an int8 precision map chooses between int8 and float, with their Linear modules.

    One group per layer part (``layer.{i}.attention``: query, key, value, position and output
    projections; ``layer.{i}.ffn-up``; ``layer.{i}.ffn-down``), found through
    :func:`product_groups`, and ``classifier``: every other Linear product outside the embeddings (the
    pooler and the task head), when the model has one.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> groups = precision_groups(tiny_model(TinySpec("bert", layers=1, task="seq-cls")))
        >>> {name: len(modules) for name, modules in groups.items()}
        {'layer.0.attention': 4, 'layer.0.ffn-up': 1, 'layer.0.ffn-down': 1, 'classifier': 2}
    """
    from surgery.anatomy import adapter_for

    layers = adapter_for(root).layers()
    layer_of = {id(m): index for index, layer in enumerate(layers) for m in layer.modules()}
    modules = dict(root.named_modules())
    found: dict[str, list[str]] = {}
    for group in product_groups(root):
        found.setdefault(f"layer.{layer_of[id(modules[group.names[0]])]}.{group.part}", []).extend(group.names)
    head = [name for name, m in root.named_modules() if isinstance(m, nn.Linear) and id(m) not in layer_of
            and "embeddings" not in name.split(".")]
    if head:
        found[CLASSIFIER_GROUP] = head
    return {name: tuple(members) for name, members in found.items()}


def float_group_modules(module: nn.Module, groups: Sequence[str]) -> list[str]:
    """The Linear modules of the precision map's float ``groups`` in ``module`` (refused in one line if unknown).

    A ``classifier`` group is ignored when ``module`` has no head (a bare encoder without a pooler).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> float_group_modules(tiny_model(TinySpec("bert", layers=2)), ["layer.1.ffn-down", "classifier"])
        ['encoder.layer.1.output.dense', 'pooler.dense']
    """
    known = precision_groups(module)
    unknown = [g for g in groups if g not in known and g != CLASSIFIER_GROUP]
    if unknown:
        raise ConfigError(f"export: the int8 precision map names {unknown[0]!r}, which this model does not have (its "
                          f"groups: {', '.join(list(known)[:4])}, ...); record the map again for this model")
    return [name for g in groups for name in known.get(g, ())]
