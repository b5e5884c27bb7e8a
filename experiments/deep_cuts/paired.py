"""Paired differences in retained test accuracy: each current row of deep_cuts.json against a superseded row of the
same task, seed and target (the same fine-tuned model and data split), for the README's A/B figures.

    python experiments/deep_cuts/paired.py --target 12x-20min --baseline 90c9fc2 dd0189b 1e8fe28 dcb86c8
    python experiments/deep_cuts/paired.py --results experiments/deep_cuts/results/deep_cuts_zen5.json \
        --target emb-6x-10min --metric test_cosine test_recall_at_10 --baseline be719fd

``--baseline``: the commits whose superseded rows are the baseline (one per key; without it, the row
superseded last for each key). ``--metric``: the row fields compared (``retained``: % of the fine-tuned
model's test accuracy; ``test_cosine`` and ``test_recall_at_10`` for the embedding rows). Prints one line
per pair and the mean ± std of the differences, per metric.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "deep_cuts.json"


def pairs(results: dict, target: str, baseline: list[str] | None) -> list[tuple[str, dict, dict]]:
    """(key, current row, baseline row) for every current row of ``target`` that has a baseline row."""
    out = []
    for key, row in sorted(results["runs"].items()):
        if row.get("target") != target:
            continue
        old = [r for k, r in results.get("superseded", {}).items()
               if k.split("@")[0] == key and (baseline is None or r.get("commit") in baseline)]
        if old:
            out.append((key, row, old[-1]))  # the last superseded (rows are moved there in the order they ran)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--target", default="12x-20min")
    parser.add_argument("--baseline", nargs="*", default=None, help="commits of the baseline rows")
    parser.add_argument("--metric", nargs="+", default=["retained"], help="row fields to compare")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    found = pairs(results, args.target, args.baseline)
    if not found:
        print("no pairs")
    for metric in args.metric:
        diffs = []
        for key, row, old in found:
            diff = row[metric] - old[metric]
            diffs.append(diff)
            print(f"{key} {metric}: {row[metric]:.4f} ({row['winner']}, {row['measured_speedup']:.2f}x, "
                  f"{row['commit']}) against {old[metric]:.4f} ({old['winner']}, {old['measured_speedup']:.2f}x, "
                  f"{old['commit']}): {diff:+.4f}")
        if len(diffs) >= 2:
            print(f"{metric}, {len(diffs)} pairs: {statistics.mean(diffs):+.4f} ± {statistics.stdev(diffs):.4f}")


if __name__ == "__main__":
    main()
