"""How long ``fill_slack`` takes on a path of BERT-base's size, and which cut it returns.

A greedy removal path (``search_path``) over a synthetic BERT-base structure (12 layers x 12 heads x 3,072
neurons, 16 neuron groups a layer: 192 neurons a step), random unit costs (seed 0) and a latency table
linear in heads and width; the point first reaching 8x, filled to 7.8x. Prints the path's length, the point,
the seconds ``fill_slack`` took, and a digest of the cut it returned, so two trees can be compared::

    PYTHONPATH=. python experiments/probes/fill_slack_speed.py
    mkdir /tmp/before && git archive c94b1b4 surgery | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python experiments/probes/fill_slack_speed.py   # the tree before the bisection
"""

from __future__ import annotations

import hashlib
import json
import time

import torch

from surgery.compress.latency_table import LatencyTable
from surgery.compress.mask_fisher import UnitCosts
from surgery.compress.removal_path import fill_slack, search_path
from surgery.compress.structure import LayerShape, Structure

LAYERS, HEADS, WIDTH = 12, 12, 3072


def main() -> None:
    start = Structure(tuple(LayerShape(HEADS, WIDTH) for _ in range(LAYERS)))
    table = LatencyTable(runtime="openvino-int8", batch_size=32, seq_len=512, model_key="probe", base_ms=10.0,
                         overhead_ms=1.0, attention_ms={h: 20.0 * h for h in range(1, HEADS + 1)},
                         ffn_ms={w: 0.08 * w for w in range(1, WIDTH + 1)})
    g = torch.Generator().manual_seed(0)
    costs = UnitCosts("embedding", 8, heads={i: torch.rand(HEADS, generator=g) for i in range(LAYERS)},
                      neurons={i: torch.rand(WIDTH, generator=g) * 0.01 for i in range(LAYERS)},
                      layers={i: float(torch.rand(1, generator=g)) * 40 for i in range(LAYERS)})
    path = search_path(costs, table, start, stop_speedup=9.0)
    k = path.first_reaching(8.0)
    assert k is not None
    since = time.perf_counter()
    removal, back = fill_slack(path, k, table, path.reference_ms / 7.8)
    seconds = time.perf_counter() - since
    digest = hashlib.sha256(removal.model_dump_json().encode()).hexdigest()[:12]
    print(json.dumps({"path_steps": len(path.steps), "point": k, "fill_seconds": round(seconds, 3),
                      "units_given_back": sum(map(len, back.values())), "cut_sha256": digest}))


if __name__ == "__main__":
    main()
