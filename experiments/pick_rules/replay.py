"""Pick rules replayed on recorded ``--max-drop`` runs: which candidate each rule returns, and how it does on test.

``record.py`` keeps every candidate's per-example scores on dev and test. Here each candidate's search and
held-out figures are recomputed from them (and checked against the figures compress reported), each rule picks
from them as compress would, and the pick is scored on test: retained accuracy (% of the original's) and its
predicted speedup (the table's; compress times only the few it may pick).

Test is split in two by a seeded permutation: the rules are compared on the **tuning half**, and the one
chosen is reported on the **report half**, which chose nothing.

    python experiments/pick_rules/replay.py experiments/pick_rules/results/record_zen4.json \
        --out experiments/pick_rules/results/replay_zen4.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from surgery.compress.candidate_run import along_paths
from surgery.compress.held_out import bootstrap_interval, paired_drop

PATHS = ("path", "units-path", "uniform-path")


@dataclass
class Cand:
    """One candidate of a recorded run, its per-example scores as tensors (the fields the library's
    ``along_paths`` reads: ``name``, ``origin``, ``path_step``)."""

    name: str
    origin: str
    path_step: int | None
    speedup: float
    search_drop: float  # the figure the search decided on (screen, or the whole search part for a contender)
    dev: torch.Tensor
    test: torch.Tensor


@dataclass
class Run:
    key: str
    limit: float
    original_dev: torch.Tensor
    original_test: torch.Tensor
    search: list[int]
    pick: list[int]
    cands: list[Cand]
    winner: str
    reported_held_out: dict[str, float]  # compress's own held-out drop of each candidate it judged there


def tensor(bits: str) -> torch.Tensor:
    return torch.tensor([c == "1" for c in bits], dtype=torch.float64)


def load_runs(path: Path) -> list[Run]:
    """Every recorded run, its twins resolved to the candidate whose files they share."""
    out = []
    for key, row in json.loads(path.read_text())["runs"].items():
        scores = row["scores"]
        cands = []
        for c in row["candidates"]:
            s = scores.get(c["name"])
            if s is None or c["tier"] == "distil":
                continue
            s = scores[s["twin_of"]] if "twin_of" in s else s
            cands.append(Cand(c["name"], c["origin"], c.get("path_step"), c["predicted_speedup"], c["drop"],
                              tensor(s["dev"]), tensor(s["test"])))
        held = {c["name"]: c["held_out"]["drop"] for c in row["candidates"] if c.get("held_out")}
        out.append(Run(key, row["config"]["max_drop"], tensor(row["original"]["dev"]), tensor(row["original"]["test"]),
                       row["split"]["search"], row["split"]["pick"], cands, row["winner"], held))
    return out


def mismatches(runs: Sequence[Run]) -> list[str]:
    """Where a held-out figure recomputed from the recorded scores differs from the one compress reported."""
    bad = []
    for run in runs:
        for c in run.cands:
            if c.name in run.reported_held_out:
                mine = drop(run.original_dev[run.pick], c.dev[run.pick])
                if abs(mine - run.reported_held_out[c.name]) > 1e-6:
                    bad.append(f"{run.key} {c.name}: held-out {mine:.4f} recomputed, "
                               f"{run.reported_held_out[c.name]} reported")
    return bad


def drop(ref: torch.Tensor, cand: torch.Tensor) -> float:
    return float(100.0 * (ref - cand).mean())


# -- bounds on a paired drop: each maps (run, finalists, the dev examples read) to each finalist's upper end ----
Bounds = Callable[[Run, Sequence[Cand], list[int]], dict[str, float]]


def bootstrap_high(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """The bound compress used up to session 21: the upper end of the paired percentile bootstrap's 90% interval
    (``surgery.compress.held_out.bootstrap_interval``, 2,000 seeded resamples, which ``paired_drop`` then applied to
    right/wrong scores too)."""
    return round(bootstrap_interval(100.0 * (ref - cand))[1], 4)


def adjusted_wald_high(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """The bound compress uses from session 22 (``surgery.compress.held_out.paired_drop`` on right/wrong scores)."""
    return paired_drop(ref, cand).drop_interval[1]


def own(high: Callable[[torch.Tensor, torch.Tensor], float]) -> Bounds:
    """Each finalist's own bound on the examples read."""
    return lambda run, finalists, idx: {c.name: high(run.original_dev[idx], c.dev[idx]) for c in finalists}


def centred_along_path(bounds: Bounds) -> Bounds:
    """``bounds`` centred on each finalist's drop read along its path (the fitted point plus its own margin)."""
    def read(run: Run, finalists: Sequence[Cand], idx: list[int]) -> dict[str, float]:
        held = {c.name: drop(run.original_dev[idx], c.dev[idx]) for c in finalists}
        fitted = along_paths(finalists, lambda c: held[c.name], PATHS)
        return {name: fitted[name] + high - held[name] for name, high in bounds(run, finalists, idx).items()}
    return read


def path_bootstrap(run: Run, finalists: Sequence[Cand], idx: list[int], rounds: int = 400,
                   seed: int = 0) -> dict[str, float]:
    """Each finalist's drop read along its path, bounded by a paired bootstrap of that reading: the examples
    resampled together for every candidate, the fit along the paths redone on each resample, the 95th percentile
    of each candidate's fitted drop. Nested cuts share their disagreements, so the fit pools them; a resample
    that happens to spare a deep cut spares its neighbours too."""
    ref = run.original_dev[idx]
    diffs = {c.name: 100.0 * (ref - c.dev[idx]) for c in finalists}
    draws = torch.randint(ref.numel(), (rounds, ref.numel()), generator=torch.Generator().manual_seed(seed))
    fitted: dict[str, list[float]] = {c.name: [] for c in finalists}
    for row in draws:
        means = {name: float(d[row].mean()) for name, d in diffs.items()}
        for name, v in along_paths(finalists, lambda c, m=means: m[c.name], PATHS).items():
            fitted[name].append(v)
    return {name: float(torch.tensor(v).quantile(0.95)) for name, v in fitted.items()}


# -- the rules -----------------------------------------------------------------------------------------------
def pick(run: Run, bounds: Bounds, *, every_dev: bool = False, point_fallback: bool = True) -> Cand:
    """compress's pick with ``bounds``: of the finalists (within on the search's figures), the fastest whose bound
    is within; else (``point_fallback``) the fastest whose point estimate, read along its path, is within; else
    the least lost. Read on the held-out part, or (``every_dev``) on every dev example, the search part's too,
    which chose the finalists (their figures there lean low)."""
    limit = run.limit
    idx = sorted(run.search + run.pick) if every_dev else run.pick
    finalists = [c for c in run.cands if c.search_drop <= limit]
    held = {c.name: drop(run.original_dev[idx], c.dev[idx]) for c in finalists}
    bound = bounds(run, finalists, idx)
    within = [c for c in finalists if bound[c.name] <= limit]
    if all(c.origin == "unchanged" for c in within):
        within = []
    if within:
        return max(within, key=lambda c: (c.speedup, -held[c.name]))
    if point_fallback:
        fitted = along_paths(finalists, lambda c: held[c.name], PATHS)
        point = [c for c in finalists if fitted[c.name] <= limit]
        if point:
            return max(point, key=lambda c: (c.speedup, -fitted[c.name]))
    return min(finalists or run.cands[:1], key=lambda c: (bound.get(c.name, 0.0), -c.speedup))


def read_along_paths(run: Run, finalists: Sequence[Cand], idx: list[int]) -> dict[str, float]:
    """No margin: each finalist's drop read along its path."""
    held = {c.name: drop(run.original_dev[idx], c.dev[idx]) for c in finalists}
    return along_paths(finalists, lambda c: held[c.name], PATHS)


def oracle(run: Run) -> Cand:
    """Not a rule: the fastest candidate that keeps 99% of the original's accuracy on the whole test split."""
    base = float(run.original_test.mean())
    ok = [c for c in run.cands if 100.0 * float(c.test.mean()) / base >= 99.0]
    return max(ok, key=lambda c: c.speedup)


BOOTSTRAP, WALD = own(bootstrap_high), own(adjusted_wald_high)
RULES: dict[str, Callable[[Run], Cand]] = {
    "bootstrap bound (compress to session 21)": lambda run: pick(run, BOOTSTRAP),
    "adjusted-Wald bound (compress from session 22)": lambda run: pick(run, WALD),
    "bootstrap bound read along the path": lambda run: pick(run, centred_along_path(BOOTSTRAP)),
    "adjusted-Wald bound read along the path": lambda run: pick(run, centred_along_path(WALD)),
    "bootstrap of the reading along the path": lambda run: pick(run, path_bootstrap),
    "all dev, read along the path": lambda run: pick(run, read_along_paths, every_dev=True, point_fallback=False),
    "all dev, bootstrap of the reading along the path": lambda run: pick(run, path_bootstrap, every_dev=True,
                                                                         point_fallback=False),
    "oracle (whole test chose it)": oracle,
}


def halves(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[: n // 2]), sorted(order[n // 2:])


def outcome(run: Run, chosen: Cand, idx: list[int]) -> dict[str, Any]:
    base = float(run.original_test[idx].mean())
    unchanged = next((c for c in run.cands if c.origin == "unchanged"), None)
    return {"pick": chosen.name, "retained": round(100.0 * float(chosen.test[idx].mean()) / base, 3),
            "vs_unchanged": round(chosen.speedup / unchanged.speedup, 3) if unchanged else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"records": [str(p) for p in args.records], "rows": [], "runs": {}}
    runs = []
    for path in args.records:
        report.setdefault("machine", json.loads(path.read_text()).get("machine"))
        runs += load_runs(path)
    report["mismatches"] = mismatches(runs)
    for rule_name, rule in RULES.items():
        picks = {}
        for run in runs:
            tune, held = halves(run.original_test.numel())
            chosen = rule(run)
            picks[run.key] = {"tuning": outcome(run, chosen, tune), "report": outcome(run, chosen, held),
                              "whole_test": outcome(run, chosen, list(range(run.original_test.numel())))}
        row: dict[str, Any] = {"rule": rule_name, "runs": len(runs)}
        for part in ("tuning", "report", "whole_test"):
            retained = [r[part]["retained"] for r in picks.values()]
            speed = [r[part]["vs_unchanged"] for r in picks.values() if r[part]["vs_unchanged"]]
            row[part] = {"at_least_99": sum(x >= 99.0 for x in retained),
                         "retained_mean": round(statistics.fmean(retained), 3),
                         "retained_std": round(statistics.stdev(retained), 3) if len(retained) > 1 else None,
                         "retained_min": round(min(retained), 3),
                         "vs_unchanged_mean": round(statistics.fmean(speed), 3) if speed else None}
        report["rows"].append(row)
        report["runs"][rule_name] = picks
        t = row["tuning"]
        print(f"{rule_name:48s} tuning half: {t['at_least_99']}/{len(runs)} >= 99%, retained {t['retained_mean']:.2f} "
              f"(min {t['retained_min']:.2f}), {t['vs_unchanged_mean']}x the unchanged int8 (predicted)")
    # How far each run's held-out figures sit from test: the mean over its candidates (layer drops aside, whose
    # tens of points say nothing of the pick's range) of held-out drop minus test drop, and the spread.
    for run in runs:
        gaps = [drop(run.original_dev[run.pick], c.dev[run.pick]) - drop(run.original_test, c.test)
                for c in run.cands if c.origin != "uniform-layer-drop"]
        report.setdefault("held_minus_test", {})[run.key] = {"mean": round(statistics.fmean(gaps), 3),
                                                             "std": round(statistics.pstdev(gaps), 3),
                                                             "candidates": len(gaps)}
    replayed = sum(RULES["bootstrap bound (compress to session 21)"](r).name == r.winner for r in runs)
    report["current_rule_reproduces_winner"] = [replayed, len(runs)]
    print(f"the current rule replayed returns compress's own winner in {replayed} of {len(runs)} runs; "
          f"{len(report['mismatches'])} held-out figures differ from compress's")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
