"""A random 12x768 MPNet: heads cut by the anatomy adapter against the same heads zeroed in the output projection.

Cutting a head must equal masking it (its columns of the attention output projection set to zero), also
with MPNet's relative-position bias shared by every layer. Each layer's cut is done in two steps, as the
removal path does (the second step indexes the heads the first left). Run from the repository root::

    nice python experiments/probes/mpnet_heads_check.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from transformers import MPNetConfig, MPNetModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from surgery.anatomy import adapter_for

HEADS, HEAD_DIM = 12, 64


def main() -> None:
    torch.manual_seed(0)
    config = MPNetConfig(vocab_size=30522, hidden_size=HEADS * HEAD_DIM, num_hidden_layers=12,
                         num_attention_heads=HEADS, intermediate_size=3072)
    model = MPNetModel(config).eval()
    ids = torch.randint(5, 30000, (4, 32))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    g = torch.Generator().manual_seed(1)
    plan = {i: sorted(torch.randperm(HEADS, generator=g)[: int(torch.randint(1, 11, (1,), generator=g))].tolist())
            for i in range(12)}
    masked = copy.deepcopy(model)
    for i, heads in plan.items():
        output = adapter_for(masked).layer(i).attention.output
        with torch.no_grad():
            for h in heads:
                output.weight[:, h * HEAD_DIM:(h + 1) * HEAD_DIM] = 0
    cut = copy.deepcopy(model)
    for i, heads in plan.items():
        first = heads[: len(heads) // 2]
        adapter_for(cut).remove_units(i, {"heads": first})
        left = [h for h in range(HEADS) if h not in first]
        adapter_for(cut).remove_units(i, {"heads": [left.index(h) for h in heads[len(heads) // 2:]]})
    with torch.no_grad():
        a = masked(input_ids=ids, attention_mask=mask).last_hidden_state
        b = cut(input_ids=ids, attention_mask=mask).last_hidden_state
        full = model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    print("heads cut per layer", {i: len(h) for i, h in plan.items()})
    print("max |cut - zero-masked|", float((a - b)[real].abs().max()),
          "  max |full - masked|", float((a - full)[real].abs().max()))


if __name__ == "__main__":
    main()
