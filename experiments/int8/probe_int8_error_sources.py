"""Where dynamic int8 loses fidelity on all-MiniLM-L6-v2: weights or activations, and which products.

Simulates ONNX Runtime's dynamic quantization in PyTorch (weights: symmetric int8, one scale per
output channel; activations: asymmetric uint8, one scale per tensor, range including 0) on every
Linear of the encoder layers, one source at a time, and reports the mean cosine of the mean-pooled
embeddings to fp32 on 512 corpus texts. Also reports, per product, how uneven its input channels
are (the largest channel peak over the median channel peak) and the largest input-column peak of
its weight over the median column: what ``surgery export --calibration`` (SmoothQuant) works on.

    python experiments/int8/probe_int8_error_sources.py --out experiments/int8/results/int8_error_sources.json
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer

import surgery
from surgery.persist.assets import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts


def quantize_weight(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    return (w / scale).round().clamp(-127, 127) * scale


def quantize_activation(x: torch.Tensor) -> torch.Tensor:
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    step = (high - low) / 255 or 1.0
    zero = round(-low / step)
    return ((x / step).round() + zero).clamp(0, 255).sub(zero) * step


class FakeQuantized(nn.Module):
    def __init__(self, linear: nn.Linear, weights: bool, activations: bool) -> None:
        super().__init__()
        self.linear, self.activations = copy.deepcopy(linear), activations
        if weights:
            self.linear.weight.data = quantize_weight(self.linear.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(quantize_activation(x) if self.activations else x)


PARTS: dict[str, Callable[[str], bool]] = {
    "every product": lambda n: True,
    "q, k, v": lambda n: ".attention.self." in n,
    "attention output": lambda n: ".attention.output." in n,
    "ffn up": lambda n: ".intermediate." in n,
    "ffn down": lambda n: n.endswith(".output.dense") and ".attention." not in n,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("experiments/int8/results/int8_error_sources.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = surgery.from_pretrained(path).eval()
    texts = corpus_texts()
    random.Random(0).shuffle(texts)
    batches = [tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt")
               for i in range(0, args.texts, 32)]
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".layer." in n}

    def embed(m: nn.Module) -> torch.Tensor:
        rows = []
        with torch.no_grad():
            for b in batches:
                h, mask = m(**b).last_hidden_state, b["attention_mask"].unsqueeze(-1).float()
                rows.append(torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1))
        return torch.cat(rows)

    peaks: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda _m, i, _o, n=n: peaks.__setitem__(n, torch.maximum(
        peaks.get(n, torch.zeros(i[0].shape[-1])), i[0].reshape(-1, i[0].shape[-1]).abs().amax(0))))
        for n, m in linears.items()]
    reference = embed(model)
    for h in hooks:
        h.remove()

    def cosine(weights: bool, activations: bool, part: Callable[[str], bool]) -> float:
        m = copy.deepcopy(model)
        for name, linear in linears.items():
            if part(name):
                parent, _, child = name.rpartition(".")
                setattr(m.get_submodule(parent), child, FakeQuantized(linear, weights, activations))
        return float((embed(m) * reference).sum(-1).mean())

    results = {"texts": args.texts, "model": "all-MiniLM-L6-v2", "mean_cosine_to_fp32": {
        part: {"weights only": cosine(True, False, rule), "activations only": cosine(False, True, rule),
               **({"both": cosine(True, True, rule)} if part == "every product" else {})}
        for part, rule in PARTS.items()}}
    results["products"] = {}
    for name, linear in linears.items():
        peak, column = peaks[name], linear.weight.detach().abs().amax(0)
        results["products"][name] = {
            "activation_peak_over_median": float(peak.max() / peak.median()),
            "top_channels": peak.topk(3).indices.tolist(),
            "weight_column_peak_over_median": float(column.max() / column.median())}
        print(name, {k: v for k, v in results["products"][name].items()})
    print(json.dumps(results["mean_cosine_to_fp32"], indent=1))
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
