"""``--runtime auto``: the fastest model that meets the target, on whichever runtime of this machine gives it.

1. **Every runtime available here** (:func:`surgery.runtimes.available_runtimes`) gets the unchanged
   model, prepared as it would be served, and all are timed side by side with the reference (the
   original in ``against_runtime``, PyTorch fp32 by default) in the same interleaved rounds: one ratio
   per runtime, at one load. Each runtime's unchanged model is written there once for the whole run
   (int8 calibrated on the data, as a candidate's): its search, or its judging as it is, uses those
   files and that ratio, never another export or timing of the unchanged model.
2. **Which runtimes to search.** A runtime can reach ``--speedup X`` when its unchanged ratio times
   the largest cut the search allows (``CompressConfig.max_cut``) reaches X; a ``--max-drop`` target
   can be reached anywhere. fp32 runtimes compute the same function (each artefact is parity-checked
   against PyTorch fp32), so of them only the fastest is searched: the same cut is faster there at the
   same fidelity. An unavailable runtime is never timed nor picked; the report says why it was left.
3. **Searching.** A runtime that already meets ``--speedup`` unchanged is judged unchanged only (a cut
   only removes: on that runtime nothing is more faithful than the unchanged model); the others run the
   whole search (:func:`surgery.compress.runtime_search.compress_on`), the mask Fisher computed once and
   shared, the budget split evenly over the runtimes left.
4. **The pick**: the fastest model that meets the target. For ``--speedup X --max-drop P``, the
   fastest of the runtimes' winners measured X times faster within P points; for ``--speedup X``
   alone, the most faithful of those measured X times faster, models within :data:`AUTO_DROP_SLACK`
   points of it counting as equally faithful, and of those the fastest (int8 is the fastest here but
   loses a quarter point of cosine an unguarded ``--speedup`` did not offer to give); for
   ``--max-drop``, the fastest within it. The report names the winning runtime and lists every
   runtime with its ratio.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.compress.candidate_run import MEET_TOLERANCE, meets
from surgery.compress.candidates import CandidateResult, Judge, Unchanged, reference_label, result_of, unchanged_on
from surgery.compress.compress_report import CompressReport, CompressResult, DropTarget, SpeedupTarget
from surgery.compress.config import CompressConfig
from surgery.compress.latency_source import LatencySource, MeasuredLatency
from surgery.compress.mask_fisher import UnitCosts
from surgery.compress.plan import (
    CALIBRATION_BATCH,
    FISHER_EXAMPLES,
    Clock,
    batch_seq_len,
    data_objective,
    refit_batches,
)
from surgery.compress.removal_path import Removal
from surgery.compress.runtime_search import compress_on, dev_source, keep_artefact
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.measure.serving import ServingShape, data_batches, measured_shape
from surgery.measure.timing import batch_length

if TYPE_CHECKING:
    from surgery.runtimes import Runtime

#: Points of drop within which two runtimes' models count as equally faithful for ``--runtime auto`` without
#: ``--max-drop`` (0.1 point: a mean cosine 0.999 apart; below one dev example in 400 for accuracy).
AUTO_DROP_SLACK = 0.1


def precision(runtime: str) -> str:
    """The numbers a runtime computes in, as the runtime says (:attr:`surgery.runtimes.Runtime.precision`).

    Example:
        >>> precision("openvino-int8"), precision("torch-bf16"), precision("openvino-bf16"), precision("onnxruntime")
        ('int8', 'bf16', 'bf16', 'fp32')
    """
    from surgery.runtimes import runtime_class

    return runtime_class(runtime).precision


def unchanged_ratios(source: LatencySource, model: nn.Module, runtimes: list[str], against: str,
                   written: dict[str, Unchanged] | None = None) -> dict[str, float]:
    """The unchanged model's speedup in each runtime over ``against``: one side-by-side timing where the
    source measures, else the source's own answer per runtime (a table's prediction).

    ``written``: runtimes whose unchanged model is already written for the run (:func:`write_unchanged`),
    timed as they are; each gets its measured speedup and interval (``Unchanged.speedup``), so that its
    search does not time it again."""
    timed = getattr(source, "ratios", None)
    if callable(timed):
        written = written or {}
        found = timed(model, runtimes, reference_runtime=against,
                      prepared={name: u.served.model for name, u in written.items() if u.served.directory is not None})
        for name, values in found.items():
            if name in written:
                written[name].speedup = (values[0], list(values[1:3]) if len(values) >= 3 else None)
        return {name: values[0] for name, values in found.items()}
    return {name: source.speedup(model, model, runtime=name, reference_runtime=against)[0] for name in runtimes}


def write_unchanged(model: nn.Module, data: Any, config: CompressConfig, runtimes: list[Runtime]
                    ) -> dict[str, Unchanged]:
    """The unchanged model written once on each of ``runtimes`` that writes an artefact, as a candidate's is (int8
    calibrated on the data's batches): timed side by side for the ratios, then handed to that runtime's search
    (its estimate, latency table, speedup and ``unchanged`` candidate) or judged as it is."""
    from surgery.training.refit import task_calibration_batches

    objective = data_objective(data, config.objective)
    smoothing = task_calibration_batches(data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                         batch_size=CALIBRATION_BATCH)
    return {runtime.name: unchanged_on(runtime, model, objective=objective, calibration=smoothing,
                                       threads=config.threads) for runtime in runtimes if not runtime.as_is}


def plan_runtimes(ratios: dict[str, float], unavailable: dict[str, str], config: CompressConfig
                  ) -> list[dict[str, Any]]:
    """One entry per runtime: its ratio, whether it can reach the target, whether it is searched and why.

    Example:
        >>> config = CompressConfig(speedup=8, runtime="auto", max_cut=4)
        >>> rows = plan_runtimes({"torch": 1.0, "onnxruntime": 1.2, "openvino": 1.4, "openvino-int8": 5.0},
        ...                      {"torch-bf16": "no avx512_bf16"}, config)
        >>> [(r["runtime"], r["searched"]) for r in rows]  # doctest: +NORMALIZE_WHITESPACE
        [('torch', False), ('onnxruntime', False), ('openvino', False), ('openvino-int8', True),
         ('torch-bf16', False)]
        >>> rows[0]["why"]
        'cannot reach 8x: 1.00x unchanged times the largest cut searched (4x) is 4.00x'
    """
    target = config.target
    goal = target.speedup if isinstance(target, SpeedupTarget) else None
    fp32 = [name for name in ratios if precision(name) == "fp32"]
    fastest_fp32 = max(fp32, key=lambda n: ratios[n]) if fp32 else None
    rows = []
    for name, ratio in ratios.items():
        reach = ratio * config.max_cut
        row: dict[str, Any] = {"runtime": name, "precision": precision(name), "unchanged_ratio": round(ratio, 4),
                               "reach": round(reach, 4), "available": True}
        if goal is not None and reach < goal * (1.0 - MEET_TOLERANCE):
            row.update(searched=False, why=f"cannot reach {goal:g}x: {ratio:.2f}x unchanged times the largest cut "
                       f"searched ({config.max_cut:g}x) is {reach:.2f}x")
        elif name != fastest_fp32 and row["precision"] == "fp32":
            row.update(searched=False, why=f"fp32 like {fastest_fp32}, which runs the unchanged model faster "
                       f"({ratios[fastest_fp32]:.2f}x): the same cut is faster there at the same fidelity")
        else:
            unchanged = goal is not None and ratio >= goal * (1.0 - MEET_TOLERANCE)
            row.update(searched=True, unchanged_only=unchanged,
                       why="meets the target unchanged: judged unchanged (a cut could only lose)" if unchanged
                       else "searched")
        rows.append(row)
    rows += [{"runtime": name, "available": False, "searched": False, "why": reason}
             for name, reason in unavailable.items()]
    return rows


def _unchanged_on(model: nn.Module, data: Any, config: CompressConfig, runtime: Runtime, against: Runtime, *,
                  eval_data: Any, source: LatencySource, workdir: Path, batch_size: int, seq_len: int,
                  unchanged: Unchanged | None = None) -> tuple[CandidateResult, Judge, Path | None]:
    """The unchanged model on ``runtime``: its artefact written (int8 calibrated on the data), judged and timed;
    ``unchanged``: written and timed already for the run, judged as it is."""
    from surgery.training.refit import task_calibration_batches

    started = time.perf_counter()
    objective = data_objective(data, config.objective)
    dev, texts = dev_source(data, eval_data, objective, config.batch_size or int(getattr(data, "batch_size",
                                                                                        CALIBRATION_BATCH)))
    smoothing = task_calibration_batches(data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                         batch_size=CALIBRATION_BATCH)
    judge = Judge(original=model, objective=objective, runtime=runtime,
                  calibration=refit_batches(smoothing), smoothing=smoothing,
                  workdir=workdir, dev=dev, texts=texts, tokenizer=getattr(data, "tokenizer", None),
                  sentence=getattr(data, "sentence_config", None),
                  max_length=(getattr(data, "info", None) or {}).get("max_length"), threads=config.threads)
    served = unchanged.served if unchanged is not None else judge.serve(model)
    figures = {**judge.reference(), "drop": 0.0} if runtime.as_is else judge.judge(served.model)
    if runtime.name == against.name:
        speed, interval = 1.0, None
    elif unchanged is not None and unchanged.speedup is not None:  # timed once, with the ratios
        speed, interval = unchanged.speedup
    else:
        speed, interval = source.speedup(model, model, runtime=runtime.name, reference_runtime=against.name,
                                         served=served.model if served.directory is not None else None)
    result = result_of("unchanged", "unchanged", runtime.name, Removal(), Structure.from_model(model), predicted=speed,
                       figures=figures, started=started, tier="none")
    result.measured_speedup, result.speedup_interval, result.artefact = round(speed, 4), interval, served.digests
    return result, judge, served.directory


def _pick(winners: dict[str, CandidateResult], config: CompressConfig) -> tuple[str, str]:
    """The winning runtime among each runtime's own winner, by compress's rule, and why."""
    target = config.target
    if isinstance(target, SpeedupTarget):
        met = {n: r for n, r in winners.items() if meets(r, target.speedup)
               and (target.max_drop is None or r.drop <= target.max_drop)}
        if met:
            # With a guard the user said how much may go: the fastest within it. Without one, the most faithful,
            # runtimes within AUTO_DROP_SLACK of it counting as equally faithful, and of those the fastest.
            limit = target.max_drop if target.max_drop is not None else min(r.drop for r in met.values()) + \
                AUTO_DROP_SLACK
            near = {n: r for n, r in met.items() if r.drop <= limit}
            name = max(near, key=lambda n: (near[n].measured_speedup or 0, -near[n].drop))
            return name, (f"the fastest ({near[name].measured_speedup:.2f}x) of the {len(met)} runtime(s) whose model "
                          f"measured at least {target.speedup:g}x, among those within {limit:.2f} points of drop "
                          f"(its drop: {near[name].drop:.2f})")
        name = max(winners, key=lambda n: (winners[n].measured_speedup or 0, -winners[n].drop))
        return name, f"no runtime's model measured {target.speedup:g}x; the fastest"
    assert isinstance(target, DropTarget)
    within = {n: r for n, r in winners.items() if r.drop <= target.max_drop}
    if within:
        name = max(within, key=lambda n: (within[n].measured_speedup or 0, -within[n].drop))
        return name, (f"the fastest among the {len(within)} runtime(s) whose model kept within {target.max_drop:g} "
                      "points")
    name = min(winners, key=lambda n: winners[n].drop)
    return name, f"no runtime's model kept within {target.max_drop:g} points; the one that lost least"


def compress_auto(model: nn.Module, data: Any, config: CompressConfig, *, eval_data: Any = None,
                  latency: LatencySource | None = None, progress: ProgressCallback | None = None,
                  clock: Clock | None = None) -> CompressResult:
    """``compress`` with ``runtime='auto'`` (see the module doc); the report names the winning runtime."""
    from surgery.runtimes import available_runtimes, get_runtime

    clock = clock or Clock(config.budget_minutes)
    emit = progress or no_progress
    found = available_runtimes()
    names = [name for name, reason in found.items() if reason is None]
    unavailable = {name: reason for name, reason in found.items() if reason is not None}
    if config.against_runtime not in names:
        raise ConfigError(f"compress: against_runtime {config.against_runtime!r} is not available here: "
                          f"{unavailable.get(config.against_runtime)}")
    # Each available runtime resolved once, here: its search and its judging are handed the object.
    runtimes = {name: get_runtime(name, require_available=False) for name in names}
    against = runtimes[config.against_runtime]
    batch_size = config.batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH))
    batches = data_batches(data, batch_size=batch_size) if config.lengths == "data" else None
    seq_len = max(batch_length(b) for b in batches) if batches else config.seq_len or batch_seq_len(data, batch_size)
    shape = measured_shape(ServingShape(batch_size=batch_size, threads=config.threads, lengths=config.lengths,
                                        seq_len=seq_len), batches or [])
    source = latency or MeasuredLatency(batch_size=batch_size, seq_len=seq_len, threads=config.threads,
                                        batches=batches)
    since = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        # Where times are measured, each runtime's unchanged model is written once for the whole run: timed here
        # beside the others, then its search (or its judging as it is) uses the same files and the same time.
        written = write_unchanged(model, data, config, list(runtimes.values())) if callable(
            getattr(source, "ratios", None)) else {}
        ratios = unchanged_ratios(source, model, names, config.against_runtime, written)
    finally:
        model.train(was_training)
    clock.phase("runtimes", since)
    rows = plan_runtimes(ratios, unavailable, config)
    emit(ProgressEvent("compress: runtimes", 1, 1, {r["runtime"]: f"{r['unchanged_ratio']:.2f}x"
                                                    for r in rows if r["available"]}))
    searched = [r for r in rows if r["searched"]]
    if not searched:  # nothing can reach the target: search the fastest runtime, so the miss is measured
        best = max((r for r in rows if r["available"]), key=lambda r: r["unchanged_ratio"])
        best.update(searched=True, unchanged_only=False, why="no runtime can reach the target; the fastest is "
                    "searched so that the miss is measured")
        searched = [best]
    searched.sort(key=lambda r: not r["unchanged_only"])  # the cheap ones first
    results: dict[str, CompressResult] = {}
    costs: UnitCosts | None = None
    for i, row in enumerate(searched):
        name = row["runtime"]
        share = None if clock.deadline is None else max(clock.left(), 0.0) / (len(searched) - i) / 60.0
        run_clock = Clock(share) if share is None or share > 0 else Clock(1e-6)
        emit(ProgressEvent("compress: runtime", i + 1, len(searched), {"runtime": name}))
        if row["unchanged_only"]:
            results[name] = _unchanged_result(model, data, config, runtimes[name], against, eval_data=eval_data,
                                              source=source, batch_size=batch_size, seq_len=seq_len,
                                              ratio=ratios[name], shape=shape,
                                              unchanged=written.get(name))
        else:
            results[name], costs = compress_on(model, data, config.model_copy(update={"runtime": name}),
                                               runtime=runtimes[name], against=against, eval_data=eval_data,
                                               latency=latency, progress=progress, clock=run_clock, costs=costs,
                                               unchanged=written.get(name))
        row["winner"] = results[name].report.winner
        won = results[name].report.winner_result()
        row.update(measured_speedup=won.measured_speedup if won else None, drop=won.drop if won else None)
    winners = {n: r.report.winner_result() for n, r in results.items()}
    chosen, why = _pick({n: w for n, w in winners.items() if w is not None}, config)
    for row in rows:
        row["chosen"] = row["runtime"] == chosen
    return _merged(results, chosen, why, rows, config, clock)


def _unchanged_result(model: nn.Module, data: Any, config: CompressConfig, runtime: Runtime, against: Runtime, *,
                      eval_data: Any, source: LatencySource, batch_size: int, seq_len: int, ratio: float,
                      shape: ServingShape | None = None, unchanged: Unchanged | None = None) -> CompressResult:
    """A one-candidate result: the unchanged model on ``runtime`` (judged and timed on its artefact)."""
    from surgery.measure.machine import machine_info

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="surgery-compress-") as tmp:
        result, judge, directory = _unchanged_on(model, data, config, runtime, against, eval_data=eval_data,
                                                 source=source,
                                                 workdir=Path(tmp), batch_size=batch_size, seq_len=seq_len,
                                                 unchanged=unchanged)
        artefact = keep_artefact(directory)
    name = f"unchanged@{result.measured_speedup:.2f}x"
    result.name = name
    report = CompressReport(
        target=config.target.describe(), runtime=runtime.name, against_runtime=against.name,
        objective=judge.objective, reference=reference_label(against),
        metric="dev accuracy" if judge.objective == "task" else "mean cosine and recall@10 of embeddings",
        original=judge.reference(), batch_size=batch_size, seq_len=seq_len, threads=config.threads,
        serving_shape=shape,
        stock=config.stock, budget_minutes=config.budget_minutes, machine=machine_info().model_dump(mode="json"),
        unchanged_speedup=round(ratio, 4), candidates=[result], winner=name,
        why=f"the unchanged model on {runtime.name} measured {result.measured_speedup:.2f}x, meeting the target",
        phases={"unchanged": round(time.perf_counter() - started, 3)},
        seconds=round(time.perf_counter() - started, 3), config=config.model_dump(mode="json"),
        artefact=dict(result.artefact))
    # The artefact (a KeptDirectory) stays on disk while the result or its path is used.
    return CompressResult(copy.deepcopy(model).eval(), report, list(judge.smoothing), artefact)


def _merged(results: dict[str, CompressResult], chosen: str, why: str, rows: list[dict[str, Any]],
            config: CompressConfig, clock: Clock) -> CompressResult:
    """The chosen runtime's result, its report carrying every runtime's candidates (``runtime/name``) and rows."""
    result = results[chosen]
    report = result.report
    candidates = [c.model_copy(update={"name": f"{n}/{c.name}"}) for n, r in results.items()
                  for c in r.report.candidates]
    target = config.target
    warnings = list(report.warnings)
    winner = report.winner_result()
    if isinstance(target, SpeedupTarget) and winner is not None and not meets(winner, target.speedup):
        warnings = [w for w in warnings if not w.startswith("target missed")] + [
            f"target missed: no runtime's model measured {target.speedup:g}x; the fastest measured "
            f"{winner.measured_speedup or 0:.2f}x on {chosen}"]
    result.report = report.model_copy(update={
        "candidates": candidates, "winner": f"{chosen}/{report.winner}", "runtimes": rows,
        "why": f"--runtime auto chose {chosen}: {why}; on {chosen}: {report.why}",
        "config": config.model_dump(mode="json"), "phases": {**clock.phases, **report.phases},
        "seconds": round(time.perf_counter() - clock.start, 3), "warnings": warnings,
        "notes": [*report.notes, *(f"runtime {r['runtime']}: {r['why']}" for r in rows if not r["searched"])]})
    return result
