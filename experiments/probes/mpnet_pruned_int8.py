"""Does NNCF int8 treat a head-pruned MPNet differently from the unchanged one? (BERT alongside, as a control.)

A random MPNet (4 layers, 8 heads of 16, FFN 256) unchanged and with every layer cut to 6 heads by the anatomy
adapter (which slices MPNet's shared relative-position bias per layer): each exported to OpenVINO and quantized by
NNCF through the library (``write_openvino(int8=True)``), then the op types fed by a FakeQuantize node counted and
each IR's output compared with its own PyTorch fp32 (mean cosine of the last hidden state). Random weights: this
checks the graph NNCF quantizes, not a real model's fidelity. Run from the repository root::

    nice python experiments/probes/mpnet_pruned_int8.py > experiments/probes/results/mpnet_pruned_int8.txt
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import openvino as ov
import torch

from surgery.anatomy import adapter_for
from surgery.runtimes.openvino.openvino_ir import write_openvino
from surgery.testing import TinySpec, tiny_model


def fake_quantize_consumers(xml: Path) -> dict[str, int]:
    """Op types that read a FakeQuantize node's output, counted."""
    kinds: collections.Counter[str] = collections.Counter()
    for op in ov.Core().read_model(xml).get_ops():
        if op.get_type_name() == "FakeQuantize":
            for out in op.outputs():
                for target in out.get_target_inputs():
                    kinds[target.get_node().get_type_name()] += 1
    return dict(kinds)


def main() -> None:
    torch.manual_seed(0)
    calibration = [{"input_ids": torch.randint(5, 90, (8, 48)), "attention_mask": torch.ones(8, 48, dtype=torch.long)}
                   for _ in range(8)]
    test = {"input_ids": torch.randint(5, 90, (16, 48)), "attention_mask": torch.ones(16, 48, dtype=torch.long)}
    for family in ("mpnet", "bert"):
        for label in ("unchanged", "pruned"):
            model = tiny_model(TinySpec(family, heads=8, head_dim=16, layers=4, ffn=256))
            if label == "pruned":
                adapter = adapter_for(model)
                for i in range(4):
                    adapter.keep_heads(i, [0, 2, 3, 5, 6, 7])
            with torch.no_grad():
                reference = model(**test).last_hidden_state
            with tempfile.TemporaryDirectory() as tmp:
                write_openvino(model, Path(tmp) / "ir", int8=True, calibration=calibration)
                xml = next((Path(tmp) / "ir").glob("*.xml"))
                compiled = ov.Core().compile_model(str(xml), "CPU")
                names = {name for port in compiled.inputs for name in port.get_names()}
                feed = {k: v.numpy() for k, v in test.items()}
                if "token_type_ids" in names:  # BERT's graph takes it; MPNet's has none
                    feed["token_type_ids"] = torch.zeros_like(test["input_ids"]).numpy()
                out = torch.from_numpy(next(iter(compiled(feed).values())))
                cosine = torch.nn.functional.cosine_similarity(out.flatten(1), reference.flatten(1)).mean().item()
                print(f"{family} {label}: FakeQuantize feeds {fake_quantize_consumers(xml)}; int8 against its own "
                      f"fp32: mean cosine {cosine:.5f}", flush=True)


if __name__ == "__main__":
    main()
