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
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PATHS = ("path", "units-path", "uniform-path")
LIMIT = 1.0
#: the one-sided level of every bound below (the library's 90% two-sided interval's upper end)
Z = 1.6448536269514722


@dataclass
class Cand:
    """One candidate of a recorded run, its per-example scores as tensors."""

    name: str
    origin: str
    step: int | None
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
        out.append(Run(key, row["config"]["max_drop"], tensor(row["original"]["dev"]), tensor(row["original"]["test"]),
                       row["split"]["search"], row["split"]["pick"], cands, row["winner"]))
    return out


def check(path: Path) -> list[str]:
    """Where a held-out figure recomputed from the recorded scores differs from the one compress reported."""
    bad = []
    for key, row in json.loads(path.read_text())["runs"].items():
        run = next(r for r in load_runs(path) if r.key == key)
        by_name = {c.name: c for c in run.cands}
        for c in row["candidates"]:
            if c.get("held_out") and c["name"] in by_name:
                mine = drop(run.original_dev[run.pick], by_name[c["name"]].dev[run.pick])
                if abs(mine - c["held_out"]["drop"]) > 1e-6:
                    bad.append(f"{key} {c['name']}: held-out {mine:.4f} recomputed, {c['held_out']['drop']} reported")
    return bad


def drop(ref: torch.Tensor, cand: torch.Tensor) -> float:
    return float(100.0 * (ref - cand).mean())


# -- bounds on a paired drop --------------------------------------------------------------------------------
def bootstrap_high(ref: torch.Tensor, cand: torch.Tensor, rounds: int = 2000, seed: int = 0) -> float:
    """The bound compress used up to session 22: the upper end of the paired percentile bootstrap's 90% interval
    (2,000 seeded resamples, as ``surgery.compress.held_out.paired_drop`` drew them then)."""
    diff = 100.0 * (ref - cand)
    n = diff.numel()
    draws = torch.randint(n, (rounds, n), generator=torch.Generator().manual_seed(seed))
    means = diff[draws].mean(dim=1)
    return round(float(torch.quantile(means, torch.tensor([0.05, 0.95], dtype=torch.float64))[1]), 4)


def adjusted_wald_high(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """Bonett & Price (2012)'s adjusted Wald bound for a difference of paired proportions: one pseudo-example
    added to each discordant cell, so that few (or no) disagreements still leave a bound of their size."""
    n = ref.numel()
    lost = float(((ref == 1) & (cand == 0)).sum())
    won = float(((ref == 0) & (cand == 1)).sum())
    p12, p21 = (lost + 1) / (n + 2), (won + 1) / (n + 2)
    diff = p12 - p21
    se = math.sqrt(max(p12 + p21 - diff * diff, 0.0) / (n + 2))
    return 100.0 * (diff + Z * se)


# -- the rules -----------------------------------------------------------------------------------------------
def isotonic(cands: Sequence[Cand], value: Callable[[Cand], float]) -> dict[str, float]:
    """Each path point's value made non-decreasing along its path (the library's ``along_paths``)."""
    from scipy.optimize import isotonic_regression

    out = {c.name: value(c) for c in cands}
    for family in PATHS:
        points = sorted((c for c in cands if c.origin == family and c.step is not None), key=lambda c: c.step)
        if points:
            fitted = isotonic_regression([value(c) for c in points]).x
            out.update({c.name: float(v) for c, v in zip(points, fitted, strict=True)})
    main = {c.step: c for c in cands if c.origin == "path"}
    for c in cands:
        if c.origin == "precision" and c.step in main:
            out[c.name] = out[main[c.step].name] + value(c) - value(main[c.step])
    return out


def current(run: Run, high: Callable[[torch.Tensor, torch.Tensor], float] = bootstrap_high,
            smooth_bound: bool = False) -> Cand:
    """compress's pick: of the finalists (within on the search's figures), the fastest whose held-out bound is
    within; else the fastest whose held-out point estimate, read along its path, is within; else the least lost.
    ``smooth_bound``: the bound read along the path too (the fitted point plus the candidate's own margin)."""
    limit = run.limit
    ref = run.original_dev[run.pick]
    finalists = [c for c in run.cands if c.search_drop <= limit]
    held = {c.name: drop(ref, c.dev[run.pick]) for c in finalists}
    bound = {c.name: high(ref, c.dev[run.pick]) for c in finalists}
    fitted = isotonic(finalists, lambda c: held[c.name])
    if smooth_bound:
        bound = {c.name: fitted[c.name] + bound[c.name] - held[c.name] for c in finalists}
    within = [c for c in finalists if bound[c.name] <= limit]
    if all(c.origin == "unchanged" for c in within):
        within = []
    if within:
        return max(within, key=lambda c: (c.speedup, -held[c.name]))
    point = [c for c in finalists if fitted[c.name] <= limit]
    if point:
        return max(point, key=lambda c: (c.speedup, -fitted[c.name]))
    pool = finalists or run.cands[:1]
    return min(pool, key=lambda c: (bound.get(c.name, 0.0), -c.speedup))


def path_bootstrap_high(run: Run, finalists: Sequence[Cand], rounds: int = 400, seed: int = 0) -> dict[str, float]:
    """Each finalist's held-out drop read along its path, bounded by a paired bootstrap of that reading: the
    held-out examples resampled together for every candidate, the fit along the paths redone on each resample,
    the 95th percentile of each candidate's fitted drop. Nested cuts share their disagreements, so the fit pools
    them; a resample that happens to spare a deep cut spares its neighbours too."""
    ref = run.original_dev[run.pick]
    diffs = {c.name: 100.0 * (ref - c.dev[run.pick]) for c in finalists}
    n = ref.numel()
    draws = torch.randint(n, (rounds, n), generator=torch.Generator().manual_seed(seed))
    fitted = {c.name: [] for c in finalists}
    for row in draws:
        means = {name: float(d[row].mean()) for name, d in diffs.items()}
        for name, v in isotonic(finalists, lambda c, m=means: m[c.name]).items():
            fitted[name].append(v)
    return {name: float(torch.tensor(v).quantile(0.95)) for name, v in fitted.items()}


def along_path_bootstrap(run: Run) -> Cand:
    """:func:`current` with the bound of :func:`path_bootstrap_high` in place of each candidate's own."""
    limit = run.limit
    ref = run.original_dev[run.pick]
    finalists = [c for c in run.cands if c.search_drop <= limit]
    held = {c.name: drop(ref, c.dev[run.pick]) for c in finalists}
    bound = path_bootstrap_high(run, finalists)
    fitted = isotonic(finalists, lambda c: held[c.name])
    within = [c for c in finalists if bound[c.name] <= limit and c.origin != "unchanged"]
    if within:
        return max(within, key=lambda c: (c.speedup, -held[c.name]))
    point = [c for c in finalists if fitted[c.name] <= limit]
    if point:
        return max(point, key=lambda c: (c.speedup, -fitted[c.name]))
    return min(finalists or run.cands[:1], key=lambda c: (bound.get(c.name, 0.0), -c.speedup))


def pooled(run: Run, bound: bool) -> Cand:
    """The finalists (within on the search's figures) judged on every dev example, search part and held-out
    part together, read along their paths: the fastest within on that reading (``bound``: on the 95th
    percentile of its paired bootstrap, redone along the paths on each resample). Twice the examples of the
    held-out part alone; the search part's examples chose the finalists, so their figures lean low."""
    every = sorted(run.search + run.pick)
    both = Run(run.key, run.limit, run.original_dev, run.original_test, run.search, every, run.cands, run.winner)
    finalists = [c for c in run.cands if c.search_drop <= run.limit]
    ref = run.original_dev[every]
    held = {c.name: drop(ref, c.dev[every]) for c in finalists}
    reading = path_bootstrap_high(both, finalists) if bound else isotonic(finalists, lambda c: held[c.name])
    within = [c for c in finalists if reading[c.name] <= run.limit]
    if within:
        return max(within, key=lambda c: (c.speedup, -held[c.name]))
    return min(finalists or run.cands[:1], key=lambda c: (reading.get(c.name, 0.0), -c.speedup))


def oracle(run: Run) -> Cand:
    """Not a rule: the fastest candidate that keeps 99% of the original's accuracy on the whole test split."""
    base = float(run.original_test.mean())
    ok = [c for c in run.cands if 100.0 * float(c.test.mean()) / base >= 99.0]
    return max(ok, key=lambda c: c.speedup)


RULES: dict[str, Callable[[Run], Cand]] = {
    "bootstrap bound (compress to session 21)": current,
    "adjusted-Wald bound (compress from session 22)": lambda run: current(run, adjusted_wald_high),
    "bootstrap bound read along the path": lambda run: current(run, smooth_bound=True),
    "adjusted-Wald bound read along the path": lambda run: current(run, adjusted_wald_high, smooth_bound=True),
    "bootstrap of the reading along the path": along_path_bootstrap,
    "all dev, read along the path": lambda run: pooled(run, bound=False),
    "all dev, bootstrap of the reading along the path": lambda run: pooled(run, bound=True),
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
    report: dict[str, Any] = {"records": [str(p) for p in args.records], "mismatches": [], "rows": [], "runs": {}}
    runs = []
    for path in args.records:
        report["mismatches"] += check(path)
        report.setdefault("machine", json.loads(path.read_text()).get("machine"))
        runs += load_runs(path)
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
