"""A latency table whose times follow a model's shape, for tests and examples of the compress search.

It lives here, not in :mod:`surgery.testing`, because it is built from compress's own types and
``surgery.testing`` sits below compress in the layer order (docs/architecture.md).

Example:
    >>> from surgery.testing import TinySpec, tiny_model
    >>> table = shape_latency_table(tiny_model(TinySpec("bert")))
    >>> table.attention_ms[4], round(table.ffn_ms[37], 2)
    (2.4, 2.96)
"""

from __future__ import annotations

from torch import nn

from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import Structure


def shape_latency_table(model: nn.Module, runtime: str = "torch", *, scale: float = 1.0) -> LatencyTable:
    """A :class:`~surgery.compress.latency_table.LatencyTable` whose times follow the model's shape.

    A fixed part, a cost per kept layer, one per head and one per FFN neuron (times ``scale``): the
    shape of a measured table without this machine's timing noise, for tests of the search.
    """
    kept = Structure.from_model(model).kept
    heads, width = max(s.heads for s in kept), max(s.ffn_width for s in kept)
    return LatencyTable(runtime=runtime, batch_size=4, seq_len=8, model_key=f"shape-{heads}-{width}",
                        base_ms=0.5 * scale, overhead_ms=0.3 * scale,
                        attention_ms={h: 0.6 * h * scale for h in range(1, heads + 1)},
                        ffn_ms={w: 0.08 * w * scale for w in range(1, width + 1)})
