"""Every family at its real base size: paired speedup of three surgeries against the FLOP bound.

For each family the model is built from a config at the public base checkpoint's size, with random
weights (speed needs no trained weights), and three surgeries of it are benchmarked side by side
with the original in one process (``surgery.measure.bench.bench_models``: same inputs, interleaved rounds
whose order rotates):

* ``head+ffn 0.5``: half the attention heads and half the FFN neurons of every layer removed
  (``head-prune`` + ``ffn-prune``, ``scope=layer``, weight magnitude);
* ``shrp half``: the top half of the layers converted to Expert Attention and Top-1 pruned
  (``expert-attention`` + ``top1-prune keep=1``; expert usage from one calibration batch, no
  training: the converted layer's cost does not depend on its weights);
* ``doe ffn 0.65``: 65% of all FFN neurons removed with DoE's ``zero-recovery-prune`` (module set
  ``ffn``, activation importance from one calibration batch, ranked globally, so layers end uneven).

Each speedup is the median over rounds of the same-round throughput ratio, with a 95% bootstrap
interval over rounds (``surgery.measure.stats``). When any interval is wider than +-5% the family gets more
rounds (``--more-rounds``), pooled with the first ones. The share of the FLOP bound is the paired
speedup over ``reference FLOPs / model FLOPs``.

Vocabulary: every family keeps its real vocabulary except XLM-R, whose 250k-token embedding matrix
(730 MiB per copy, four copies) is shrunk to RoBERTa's 50,265. The bare encoder has no output
projection over the vocabulary, so the embedding lookup is the only thing that touches it and the
counted encoder FLOPs are identical (the JSON records ``vocab_size`` and ``real_vocab_size``).

Runs per family and merges into ``experiments/families/results/families.json`` (a family measured again replaces its
entry), so it can be run one family at a time on a shared machine. Then
``python experiments/render.py`` renders the table in ``docs/results.md``::

    nice -n 5 python experiments/families/bench_families.py --families deberta-v2,modernbert --threads 2
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import surgery
from surgery.measure.bench import BenchReport, bench_models
from surgery.measure.stats import bootstrap_median, rounds_for
from surgery.measure.timing import make_inputs
from surgery.strategies import (
    ExpertAttentionStrategy,
    FFNPruningStrategy,
    HeadPruningStrategy,
    Top1PruningStrategy,
    ZeroRecoveryPruningStrategy,
)
from surgery.testing import FAMILIES

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py
RESULTS = ROOT / "experiments" / "families" / "results" / "families.json"
METHODS = ("head+ffn 0.5", "shrp half", "doe ffn 0.65")
#: Operators that do the counted matrix multiplications (self time, so wrappers such as aten::linear add nothing).
MATMUL_OPS = {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::_mkldnn_linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
              "aten::einsum", "aten::mkldnn_linear"}

#: The public base checkpoint each config reproduces, and the config (transformers defaults fill the rest).
BASE_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("bert-base-uncased", "BertConfig", {}),
    "roberta": ("roberta-base", "RobertaConfig", dict(
        vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, layer_norm_eps=1e-5)),
    "xlm-roberta": ("xlm-roberta-base", "XLMRobertaConfig", dict(
        vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, layer_norm_eps=1e-5)),
    "distilbert": ("distilbert-base-uncased", "DistilBertConfig", {}),
    "electra": ("google/electra-base-discriminator", "ElectraConfig", dict(
        embedding_size=768, hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    "mpnet": ("microsoft/mpnet-base", "MPNetConfig", {}),
    "deberta-v2": ("microsoft/deberta-v3-base", "DebertaV2Config", dict(
        vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        relative_attention=True, position_buckets=256, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
        position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0,
        layer_norm_eps=1e-7)),
    "modernbert": ("answerdotai/ModernBERT-base", "ModernBertConfig", {}),
}
#: Vocabularies shrunk to save memory; the bare encoder's FLOPs do not depend on the vocabulary.
SHRUNK_VOCAB = {"xlm-roberta": 50265}


def base_config(family: str) -> tuple[transformers.PretrainedConfig, int]:
    """The family's base-size config (vocabulary possibly shrunk) and its real vocabulary size."""
    _, cls_name, kwargs = BASE_CONFIGS[family]
    config = getattr(transformers, cls_name)(**kwargs)
    real_vocab = int(config.vocab_size)
    if family in SHRUNK_VOCAB:
        config.vocab_size = SHRUNK_VOCAB[family]
    return config, real_vocab


def base_model(config: transformers.PretrainedConfig, seed: int) -> torch.nn.Module:
    """A bare encoder with random weights (the family's own initialisation), in eval mode."""
    torch.manual_seed(seed)
    return transformers.AutoModel.from_config(config).eval()


def num_layers(model: torch.nn.Module) -> int:
    return len(surgery.inspect(model).layers)


def variants(config: transformers.PretrainedConfig, calibration: list[dict[str, torch.Tensor]], seed: int
             ) -> dict[str, torch.nn.Module]:
    """The original and the three surgeries of it, each built from the same random weights."""
    models = {"original": base_model(config, seed)}
    layers = num_layers(models["original"])
    steps: dict[str, list[tuple[surgery.Strategy, Any]]] = {
        "head+ffn 0.5": [(HeadPruningStrategy(ratio=0.5, scope="layer", importance="magnitude"), None),
                         (FFNPruningStrategy(ratio=0.5, scope="layer", importance="magnitude"), None)],
        "shrp half": [(ExpertAttentionStrategy(layers=list(range(layers - layers // 2, layers))), None),
                      (Top1PruningStrategy(keep=1), calibration)],
        "doe ffn 0.65": [(ZeroRecoveryPruningStrategy(module_set="ffn", ratio=0.65, importance="activation"),
                          calibration)],
    }
    for name, plan in steps.items():
        model = copy.deepcopy(models["original"])  # a copy: initialising a base model takes minutes here
        for strategy, data in plan:
            surgery.convert(model, strategy, data=data)
        models[name] = model.eval()
    return models


def op_profile(model: torch.nn.Module, inputs: dict[str, torch.Tensor], threads: int, top: int = 8
               ) -> dict[str, Any]:
    """Self CPU time per operator over one forward (torch.profiler), the ``top`` operators listed.

    ``matmul_ms`` sums the matrix-multiplication operators, whose time follows the counted FLOPs;
    the rest (softmax, GELU, LayerNorm, copies, index arithmetic) is what a FLOP bound leaves out.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(**inputs)
    finally:
        torch.set_num_threads(previous)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1000
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1000
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"total_ms": total, "matmul_ms": matmul,
            "ops": [{"op": e.key, "ms": e.self_cpu_time_total / 1000, "calls": e.count} for e in ranked]}


def pooled(reports: list[BenchReport], name: str) -> list[float]:
    """Same-round throughput ratios of ``name`` against the reference, over every report."""
    out: list[float] = []
    for report in reports:
        ref, model = report.models[0], report.model(name)
        out += [a / b for a, b in zip(model.throughput_rounds, ref.throughput_rounds, strict=True)]
    return out


def measure_family(family: str, *, rounds: int, more_rounds: int, threads: int, batch: int, seq: int,
                   seed: int, profile: bool) -> dict[str, Any]:
    """Build, benchmark (in one process, interleaved) and summarise one family."""
    started = time.time()
    config, real_vocab = base_config(family)
    calibration = [make_inputs(config.vocab_size, batch_size=8, seq_len=seq, seed=seed + 1)]
    models = variants(config, calibration, seed)
    anatomy = {name: [{"kind": layer.kind, "heads": layer.heads, "ffn": layer.ffn_width}
                      for layer in surgery.inspect(m).layers] for name, m in models.items()}
    reports = [bench_models(models, batch_size=batch, seq_len=seq, repeats=rounds, warmup=1, threads=threads,
                            seed=seed)]
    intervals = {name: bootstrap_median(pooled(reports, name)) for name in METHODS}
    wide = [n for n, ci in intervals.items() if ci.wide]
    if wide and more_rounds:
        extra = min(more_rounds, max(rounds_for(intervals[n]) for n in wide) - rounds)
        if extra > 0:
            reports.append(bench_models(models, batch_size=batch, seq_len=seq, repeats=extra, warmup=1,
                                        threads=threads, seed=seed))
            intervals = {name: bootstrap_median(pooled(reports, name)) for name in METHODS}
    first = reports[0]
    ref = first.models[0]
    inputs = make_inputs(config.vocab_size, batch_size=batch, seq_len=seq, seed=seed)
    profiles = {name: op_profile(m, inputs, threads) for name, m in models.items()} if profile else {}
    methods = {}
    for name in METHODS:
        m, c, ci = first.model(name), next(c for c in first.comparisons if c.name == name), intervals[name]
        methods[name] = {
            "params": m.params.model_dump(), "flops_per_batch": m.flops_per_batch,
            "flop_bound_speedup": c.flop_bound_speedup,
            "paired_speedup": ci.estimate, "ci95": [ci.low, ci.high], "half_width": ci.half_width,
            "rounds": ci.rounds, "share_of_bound": ci.estimate / c.flop_bound_speedup,
            "share_ci95": [ci.low / c.flop_bound_speedup, ci.high / c.flop_bound_speedup],
            "speedup_of_medians": c.speedup, "attention": m.attention,
        }
    return {
        "family": family, "checkpoint_size_of": BASE_CONFIGS[family][0], "model_class": ref.model_class,
        "attention": ref.attention, "vocab_size": int(config.vocab_size), "real_vocab_size": real_vocab,
        "layers": num_layers(models["original"]), "hidden_size": surgery.inspect(models["original"]).hidden_size,
        "original": {"params": ref.params.model_dump(), "flops_per_batch": ref.flops_per_batch,
                     "throughput": ref.throughput},
        "methods": methods, "anatomy": anatomy, "profiles": profiles,
        "settings": [r.settings.model_dump() for r in reports],
        "warnings": [w for r in reports for w in r.warnings],
        "seconds": time.time() - started,
    }


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def merge(path: Path, entry: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write ``entry`` into the results file, replacing an older entry of the same family."""
    data = json.loads(path.read_text()) if path.exists() else {"families": {}}
    data["families"][entry["family"]] = {**entry, **meta}
    data["families"] = {f: data["families"][f] for f in FAMILIES if f in data["families"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def summary(entry: dict[str, Any]) -> str:
    parts = [f"{name} {m['paired_speedup']:.2f}x [{m['ci95'][0]:.2f}-{m['ci95'][1]:.2f}] of "
             f"{m['flop_bound_speedup']:.2f}x ({m['share_of_bound']:.0%})" for name, m in entry["methods"].items()]
    return f"{entry['family']}: " + "; ".join(parts) + f" ({entry['seconds']:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all 8)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved timed rounds")
    parser.add_argument("--more-rounds", type=int, default=8, help="extra rounds at most when an interval is wide")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-profile", action="store_true", help="skip the per-operator profile of each model")
    args = parser.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    for family in families:
        entry = measure_family(family, rounds=args.rounds, more_rounds=args.more_rounds, threads=args.threads,
                               batch=args.batch, seq=args.seq, seed=args.seed, profile=not args.no_profile)
        meta = {"command": f"experiments/families/bench_families.py --families {family} --rounds {args.rounds} "
        "--more-rounds "
                           f"{args.more_rounds} --threads {args.threads} --batch {args.batch} --seq {args.seq}",
                "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "shared_machine_load": [s["load_average_before"] for s in entry["settings"]]
                + [entry["settings"][-1]["load_average_after"]]}
        merge(args.out, entry, meta)
        print(summary(entry), flush=True)


if __name__ == "__main__":
    main()

