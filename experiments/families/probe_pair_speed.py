"""One family's surgery timed against its original alone (two models), beside the four-model run.

``experiments/families/bench_families.py`` times the original and three surgeries interleaved in one process. This
probe checks whether a share-of-bound figure from that run depends on the company the model keeps:
it builds the same models (same seed, same calibration batch) and times only the original and one
method, interleaved, then profiles each over several forwards. Written for DeBERTa-v3's DoE cut,
whose paired speedup (1.33x of a 1.60x bound) disagrees with its single-forward profile (1.54x)::

    python experiments/families/probe_pair_speed.py --family deberta-v2 --method "doe ffn 0.65" --rounds 12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_families import base_config, op_profile, pooled, variants

from surgery.measure.bench import bench_models
from surgery.measure.stats import bootstrap_median
from surgery.measure.timing import make_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="deberta-v2")
    parser.add_argument("--method", default="doe ffn 0.65")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--profiles", type=int, default=3, help="profiled forwards per model, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("experiments/families/results/pair_speed_probe.json"))
    args = parser.parse_args()
    config, _ = base_config(args.family)
    calibration = [make_inputs(config.vocab_size, batch_size=8, seq_len=args.seq, seed=args.seed + 1)]
    built = variants(config, calibration, args.seed)
    pair = {"original": built["original"], args.method: built[args.method]}
    report = bench_models(pair, batch_size=args.batch, seq_len=args.seq, repeats=args.rounds, warmup=1,
                          threads=args.threads, seed=args.seed)
    ci = bootstrap_median(pooled([report], args.method))
    bound = report.comparisons[0].flop_bound_speedup
    inputs = make_inputs(config.vocab_size, batch_size=args.batch, seq_len=args.seq, seed=args.seed)
    profiles: dict[str, list[dict[str, float]]] = {name: [] for name in pair}
    for _ in range(args.profiles):  # alternating, so drift in the machine hits both models alike
        for name, m in pair.items():
            p = op_profile(m, inputs, args.threads)
            profiles[name].append({"total_ms": p["total_ms"], "matmul_ms": p["matmul_ms"]})
    ratio = [a["total_ms"] / b["total_ms"] for a, b in zip(profiles["original"], profiles[args.method], strict=True)]
    result = {
        "family": args.family, "method": args.method, "flop_bound_speedup": bound,
        "pair_paired_speedup": ci.estimate, "pair_ci95": [ci.low, ci.high], "pair_share_of_bound": ci.estimate / bound,
        "profile_total_ratios": ratio, "profiles": profiles, "settings": report.settings.model_dump(),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.family} {args.method}: alone with the original {ci.estimate:.2f}x [{ci.low:.2f}-{ci.high:.2f}] "
          f"of {bound:.2f}x ({100 * ci.estimate / bound:.0f}%); profile ratios {[round(r, 2) for r in ratio]}")


if __name__ == "__main__":
    main()
