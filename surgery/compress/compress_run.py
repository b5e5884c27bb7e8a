"""``surgery.compress``: a model N times faster on this machine's runtime, at the smallest loss, in one call.

Phases, each reported as progress and timed in the report:

1. the batch shape (the user's, or read off the data) and the calibration batches;
2. the latency table of the original on the target runtime (measured on this machine), and, when
   the target runtime is not the reference one, the original's own speedup there;
3. what every head, neuron group and layer carries (:mod:`surgery.compress.mask_fisher`);
4. the search (:mod:`surgery.compress.removal_path`): one path of removals, every speed point on it,
   and the same search over heads and neurons only (Kwon et al.'s space) and with every layer cut
   alike (the uniform cuts this project measured);
5. candidates, each cut, refitted, exported for an ONNX runtime and judged on that runtime against
   the original: path points around the target (``--speedup``) or found by bisection along the
   paths (``--max-drop``), the points of the units-only and the uniform paths, the unchanged model
   on the runtime (smoothed int8 alone, for ``onnxruntime-int8``) and a uniform layer-drop at the
   same predicted speed; each timed side by side;
6. the pick, then the training tier on the winner when the budget leaves whole epochs for it.

The budget (minutes) covers the whole job: a candidate whose expected cost no longer fits is
skipped and said so, and training gets only the time that is left.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from surgery.compress.candidates import CandidateResult, Judge, layer_drop_removal, result_of
from surgery.compress.compress_report import CompressReport, CompressResult, DropTarget, SpeedupTarget, Target
from surgery.compress.latency_source import LatencySource, MeasuredLatency
from surgery.compress.latency_table import RUNTIMES, LatencyTable
from surgery.compress.mask_fisher import ObjectiveName, UnitCosts, unit_costs
from surgery.compress.removal_path import Removal, RemovalPath, describe, search_path
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError, DataError
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.training.refit import calibration_batches

#: Examples the mask Fisher reads (Kwon et al. use 2k on a GPU; 512 keep a CPU run within minutes); int8
#: smoothing reads them too (as many as ``surgery export --calibration`` reads texts by default).
FISHER_EXAMPLES = 512
#: The share of the budget left at the importance phase that the mask Fisher may take.
IMPORTANCE_SHARE = 0.15
#: Examples the least-squares refit and the int8 smoothing read.
REFIT_EXAMPLES = 256
CALIBRATION_BATCH = 32
#: Path points tried around a --speedup target, as factors of it (the target first).
AROUND_TARGET = (1.0, 1.1, 0.9)
#: Predicted and measured speedups further apart than this are reported.
PREDICTION_TOLERANCE = 0.05
#: Distillation epochs at most, however long the budget (the recovery runs this project measured used 2-4).
MAX_EPOCHS = 6


def check_arguments(target: Any, runtime: str, against_runtime: str, budget_minutes: float | None,
                    batch_size: int | None, seq_len: int | None, objective: str | None) -> None:
    """Refuse bad settings in one line each, before any work.

    Example:
        >>> check_arguments(SpeedupTarget(speedup=2), "torch", "torch", None, None, None, None)
        >>> try:
        ...     check_arguments(SpeedupTarget(speedup=2), "tensorrt", "torch", None, None, None, None)
        ... except ConfigError as err:
        ...     print(err)
        compress: runtime 'tensorrt' is not one of torch, onnxruntime, onnxruntime-int8
    """
    if not isinstance(target, SpeedupTarget | DropTarget):
        raise ConfigError("compress: target must be SpeedupTarget(speedup=X) or DropTarget(max_drop=P)")
    for name, value in (("runtime", runtime), ("against_runtime", against_runtime)):
        if value not in RUNTIMES:
            raise ConfigError(f"compress: {name} {value!r} is not one of {', '.join(RUNTIMES)}")
    if budget_minutes is not None and not budget_minutes > 0:
        raise ConfigError(f"compress: budget_minutes must be positive (minutes for the whole job), "
                          f"got {budget_minutes}")
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if value is not None and value < 1:
            raise ConfigError(f"compress: {name} must be at least 1, got {value}")
    if objective not in (None, "task", "embedding"):
        raise ConfigError(f"compress: objective {objective!r} is not 'task' or 'embedding'")


def data_objective(data: Any, requested: str | None) -> ObjectiveName:
    """The objective ``data`` supports (unlabelled texts: embedding; task data: task), checked against a request."""
    own = "embedding" if getattr(data, "objective", "task") == "embedding" else "task"
    if requested is not None and requested != own:
        what = "unlabelled texts (TextData)" if own == "embedding" else "labelled task data"
        raise ConfigError(f"compress: objective {requested!r} but the data is {what}; load the data for the "
                          f"{requested} objective or drop the objective setting")
    return own  # type: ignore[return-value]


def batch_seq_len(data: Any, batch_size: int, batches: int = 20) -> int:
    """The sequence length batches of ``data`` are padded to, on average (its first ``batches`` training batches).

    Example:
        >>> import datasets
        >>> from surgery.data.task_data import TaskData
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 5, 6, 7, 3]], "labels": [0, 1]})
        >>> batch_seq_len(TaskData(rows, rows, ["a", "b"]), 1)
        4
    """
    loader = data.loader("train", batch_size=batch_size)
    lengths = [int(b["input_ids"].shape[1]) for b, _ in zip(loader, range(batches), strict=False)]
    if not lengths:
        raise DataError("compress: the training data holds no examples")
    return max(1, round(statistics.mean(lengths)))


@dataclass
class Plan:
    """What the search decided before any candidate is built: the table, the costs, the path."""

    table: LatencyTable
    costs: UnitCosts
    path: RemovalPath
    #: the same search without whole layers (None with --stock, whose only other move is a layer)
    units_path: RemovalPath | None
    #: heads and neuron groups cut alike in every layer (None with --stock: the main path is uniform already)
    uniform_path: RemovalPath | None
    start: Structure
    unchanged_speedup: float
    batch_size: int
    seq_len: int
    objective: ObjectiveName
    calibration: list[Any]  # what the refit reads
    smoothing: list[Any]  # what int8 smoothing reads (as many texts as `surgery export --calibration`)
    phases: dict[str, float]

    def families(self) -> dict[str, RemovalPath]:
        """Every search path by its candidates' origin: ``path``, ``units-path``, ``uniform-path``."""
        found = {"path": self.path, "units-path": self.units_path, "uniform-path": self.uniform_path}
        return {name: path for name, path in found.items() if path is not None}

    def target_step(self, target: Target) -> int | None:
        """The path point the search would cut for a --speedup target (None for --max-drop: data decides)."""
        return self.path.first_reaching(target.speedup) if isinstance(target, SpeedupTarget) else None

    def preview(self, target: Target) -> dict[str, Any]:
        """The latency prediction and the structure the run would cut (``--dry-run``)."""
        k = self.target_step(target)
        points = [describe(self.path, j) for j in _speed_points(self.path)]
        return {"target": target.describe(), "runtime": self.table.runtime, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "objective": self.objective,
                "predicted_ms_original": round(self.table.predict_ms(self.start), 4),
                "unchanged_speedup": round(self.unchanged_speedup, 4),
                "would_cut": describe(self.path, k) if k is not None else None,
                "reachable": k is not None or isinstance(target, DropTarget),
                "max_predicted_speedup": round(self.path.speedup_at(len(self.path.steps)), 4),
                "speed_points": points}


def _speed_points(path: RemovalPath, every: float = 0.25) -> list[int]:
    """Path steps at every ``every`` of predicted speedup (1.25x, 1.5x, ...): a summary of the path."""
    out, goal = [], 1.0 + every
    for k in range(1, len(path.steps) + 1):
        if path.speedup_at(k) >= goal:
            out.append(k)
            while path.speedup_at(k) >= goal:
                goal += every
    return out


class _Clock:
    """The job's deadline, and phase timings."""

    def __init__(self, budget_minutes: float | None) -> None:
        self.start = time.perf_counter()
        self.deadline = None if budget_minutes is None else self.start + 60.0 * budget_minutes
        self.phases: dict[str, float] = {}

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left()

    def phase(self, name: str, since: float) -> None:
        self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - since, 3)


def plan_compress(model: nn.Module, data: Any, *, target: Target, runtime: str = "torch",
                  against_runtime: str = "torch", objective: str | None = None, batch_size: int | None = None,
                  seq_len: int | None = None, stock: bool = False, latency: LatencySource | None = None,
                  threads: int | None = None, progress: ProgressCallback | None = None,
                  clock: _Clock | None = None) -> Plan:
    """Phases 1-4 of :func:`compress`: measure, score, search. Changes nothing (``--dry-run`` stops here).

    Example:
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.testing import TinySpec, shape_latency_table, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> plan = plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5),
        ...                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> plan.path.speedup_at(plan.target_step(SpeedupTarget(speedup=1.5))) >= 1.5
        True
    """
    check_arguments(target, runtime, against_runtime, None, batch_size, seq_len, objective)
    clock = clock or _Clock(None)
    emit = progress or no_progress
    chosen = data_objective(data, objective)
    since = time.perf_counter()
    batch_size = batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH))
    seq_len = seq_len or batch_seq_len(data, batch_size)
    calibration = calibration_batches(data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                      batch_size=CALIBRATION_BATCH)
    clock.phase("data", since)
    emit(ProgressEvent("compress: batch shape", 1, 1, {"batch": batch_size, "seq_len": seq_len,
                                                       "objective": chosen}))
    since = time.perf_counter()
    source = latency or MeasuredLatency(batch_size=batch_size, seq_len=seq_len, threads=threads)
    table = source.table(model, runtime)
    unchanged = 1.0
    if runtime != against_runtime:  # the runtime alone is worth something (int8): the path starts from it
        unchanged, _ = source.speedup(model, model, runtime=runtime, reference_runtime=against_runtime)
    clock.phase("latency", since)
    start = Structure.from_model(model)
    emit(ProgressEvent("compress: latency table", 1, 1, {"runtime": runtime,
                                                         "predicted_ms": round(table.predict_ms(start), 3),
                                                         "unchanged_speedup": round(unchanged, 3)}))
    since = time.perf_counter()
    importance_objective = data.importance_objective() if chosen == "embedding" else None
    pooled = None
    if chosen == "embedding":
        from surgery.embedding.evaluate import embed_batch
        from surgery.embedding.pooling import SentenceConfig

        sentence = getattr(data, "sentence_config", None) or SentenceConfig()

        def pooled(m: nn.Module, batch: Any) -> Any:
            return embed_batch(m, batch, sentence)[0]

    # With a budget, the Fisher gets a share of it (the rest goes to candidates and training).
    share = None if clock.deadline is None else IMPORTANCE_SHARE * max(clock.left(), 0.0)
    costs = unit_costs(model, calibration, objective=chosen, importance_objective=importance_objective,
                       pooled=pooled, max_seconds=share)
    clock.phase("importance", since)
    emit(ProgressEvent("compress: importance", 1, 1, {"examples": costs.examples,
                                                      "seconds": round(costs.seconds, 1)}))
    since = time.perf_counter()
    reference_ms = table.predict_ms(start) * unchanged
    stop = target.speedup * max(AROUND_TARGET) if isinstance(target, SpeedupTarget) else None
    path = search_path(costs, table, start, reference_ms=reference_ms, stop_speedup=stop, stock=stock)
    units_path = None if stock else search_path(costs, table, start, reference_ms=reference_ms, stop_speedup=stop,
                                                layers=False)
    uniform = len({s.ffn_width for s in start.kept}) == 1 and len({s.heads for s in start.kept}) == 1
    uniform_path = None if stock or not uniform else search_path(costs, table, start, reference_ms=reference_ms,
                                                                  stop_speedup=stop, layers=False, uniform=True)
    clock.phase("search", since)
    emit(ProgressEvent("compress: search", 1, 1, {"steps": len(path.steps),
                                                  "max_speedup": round(path.speedup_at(len(path.steps)), 3)}))
    refit = calibration[: max(1, math.ceil(REFIT_EXAMPLES / CALIBRATION_BATCH))]
    return Plan(table=table, costs=costs, path=path, units_path=units_path, uniform_path=uniform_path, start=start,
                unchanged_speedup=unchanged,
                batch_size=batch_size, seq_len=seq_len, objective=chosen, calibration=refit, smoothing=calibration,
                phases=clock.phases)


def _dev_source(data: Any, eval_data: Any, objective: ObjectiveName, batch_size: int) -> tuple[list[Any], list[str]]:
    """The dev batches (task) or texts (embedding) every candidate is judged on."""
    source = eval_data if eval_data is not None else data
    if objective == "embedding":
        texts = list(getattr(source, "eval_texts", None) or (getattr(source, "train_texts", None)
                                                             if eval_data is not None else None) or [])
        if len(texts) < 2:
            raise DataError("compress: the embedding objective needs at least 2 held-out texts to measure fidelity; "
                            "pass eval_data (--eval-data) or more data")
        return [], texts
    split = "eval" if getattr(source, "eval", None) is not None else "train" if eval_data is not None else None
    if split is None:
        raise DataError("compress: no held-out data to measure the accuracy drop on; pass eval_data (--eval-data)")
    return list(source.loader(split, batch_size=batch_size)), []


def compress(model: nn.Module, data: Any, *, target: Target, runtime: str = "torch", against_runtime: str = "torch",
             budget_minutes: float | None = None, objective: str | None = None, batch_size: int | None = None,
             seq_len: int | None = None, eval_data: Any = None, stock: bool = False,
             progress: ProgressCallback | None = None, latency: LatencySource | None = None,
             threads: int | None = None, seed: int = 0, train: bool = True) -> CompressResult:
    """Make ``model`` reach ``target`` on ``runtime`` at the smallest loss; judged against the original.

    Args:
        model: the original (a task model with ``data`` labelled, or an encoder with unlabelled texts);
            it is not changed.
        data: :class:`surgery.data.task_data.TaskData` (task objective) or :class:`surgery.embedding.TextData`
            (embedding objective); its training split calibrates, its eval split judges.
        target: ``SpeedupTarget(speedup=X)`` (the most accurate candidate at least X times faster)
            or ``DropTarget(max_drop=P)`` (the fastest within P points).
        runtime: where the model will run: ``torch``, ``onnxruntime`` or ``onnxruntime-int8``.
        against_runtime: what speedups are against (the original as served today; default torch fp32).
        budget_minutes: wall-clock minutes for the whole job; whole epochs of distillation from the
            original run on the winner when they fit. None: no training (the refit tier only).
        train: False keeps to the refit tier whatever the budget (a time limit without training).
        objective, batch_size, seq_len: default from the data.
        eval_data: held-out data to judge on instead of ``data``'s eval split.
        stock: keep to structures a stock transformers config can say (uniform FFN width, whole
            layers, no head pruning).
        latency: where times come from (default: measured on this machine).

    Example:
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.testing import TinySpec, shape_latency_table, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> model, report, candidates = compress(model, tiny_task_data(), target=DropTarget(max_drop=2.0),
        ...                                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> report.winner_result().drop <= 2.0, report.reference
        (True, 'the original model in torch (fp32), unchanged')
    """
    check_arguments(target, runtime, against_runtime, budget_minutes, batch_size, seq_len, objective)
    clock = _Clock(budget_minutes)
    emit = progress or no_progress
    was_training = model.training
    model.eval()
    try:
        # The held-out data is checked before any work: without it no candidate can be judged.
        dev, texts = _dev_source(data, eval_data, data_objective(data, objective),
                                 batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH)))
        plan = plan_compress(model, data, target=target, runtime=runtime, against_runtime=against_runtime,
                             objective=objective, batch_size=batch_size, seq_len=seq_len, stock=stock,
                             latency=latency, threads=threads, progress=progress, clock=clock)
        source = latency or MeasuredLatency(batch_size=plan.batch_size, seq_len=plan.seq_len, threads=threads)
        with tempfile.TemporaryDirectory(prefix="surgery-compress-") as tmp:
            judge = Judge(original=model, objective=plan.objective, runtime=runtime, calibration=plan.calibration,
                          smoothing=plan.smoothing, workdir=Path(tmp), dev=dev, texts=texts,
                          tokenizer=getattr(data, "tokenizer", None), sentence=getattr(data, "sentence_config", None),
                          max_length=(getattr(data, "info", None) or {}).get("max_length"), threads=threads)
            run = _CandidateRun(plan, judge, source, clock, emit, target, runtime, against_runtime)
            run.try_all()
            winner, why, warnings = run.pick()
            final_model, winner_name, training = run.train_winner(winner, data, budget_minutes, seed, train=train)
        report = run.report(winner_name, why, warnings, training, budget_minutes, threads, stock, clock)
    finally:
        model.train(was_training)
    return CompressResult(final_model, report, plan.smoothing)


def meets(result: CandidateResult, goal: float) -> bool:
    """Whether ``result`` measured ``goal`` times faster: its median ratio, or ``goal`` within its 95% interval
    (timing noise must not pass over a candidate that is as fast as asked).

    Example:
        >>> from surgery.compress.candidates import CandidateResult, Removal
        >>> r = CandidateResult(name="a", origin="path", runtime="torch", structure=[], removal=Removal(),
        ...                     predicted_speedup=2.0, measured_speedup=1.99, speedup_interval=[1.95, 2.03], drop=1.0)
        >>> meets(r, 2.0), meets(r.model_copy(update={"speedup_interval": None}), 2.0)
        (True, False)
    """
    measured = result.measured_speedup
    if measured is None:
        return False
    interval = result.speedup_interval
    return measured >= goal or (interval is not None and interval[0] <= goal <= interval[1])


def _steps(path: RemovalPath) -> list[dict[str, Any]]:
    """A path as the report lists it: one entry per removal."""
    return [{"kind": s.kind, "layers": s.layers, "units": sum(map(len, s.units)) or None,
             "predicted_speedup": round(s.predicted_speedup, 4), "estimated_loss": round(s.cumulative_loss, 6)}
            for s in path.steps]


class _CandidateRun:
    """Phase 5 and 6: build, judge and time candidates within the budget, pick, train the winner."""

    def __init__(self, plan: Plan, judge: Judge, source: LatencySource, clock: _Clock,
                 emit: Callable[[ProgressEvent], None], target: Target, runtime: str, against: str) -> None:
        self.plan, self.judge, self.source, self.clock, self.emit = plan, judge, source, clock, emit
        self.target, self.runtime, self.against = target, runtime, against
        self.results: list[CandidateResult] = []
        self.models: dict[str, Any] = {}
        self.notes: list[str] = []
        self.last_cost = 0.0
        self.reference = judge.reference()

    # -- one candidate --------------------------------------------------------------------
    def candidate(self, name: str, origin: str, removal: Removal, *, path_step: int | None = None,
                  timed: bool = True, refit: bool = True, path: RemovalPath | None = None) -> CandidateResult | None:
        """Build, judge and (if ``timed``) time one candidate, if the budget still has room for it."""
        if any(r.name == name for r in self.results):
            return next(r for r in self.results if r.name == name)
        # Two paths often reach a speed by the same cut (no layer is worth removing yet): judge it once.
        cut = removal.effective()
        same = next((r for r in self.results if r.removal == cut and (timed <= (r.measured_speedup is not None))),
                    None)
        if same is not None:
            twin = same.model_copy(update={"name": name, "origin": origin, "path_step": path_step, "seconds": 0.0,
                                           "notes": [f"the same cut as {same.name}: built, judged and timed once"]})
            self.results.append(twin)
            self.models[name] = self.models[same.name]
            return twin
        if self.results and not self.clock.fits(self.last_cost):  # the first (the unchanged model) always runs
            self.notes.append(f"skipped candidate {name}: the budget has {max(self.clock.left(), 0):.0f} s left and "
                              f"a candidate took {self.last_cost:.0f} s")
            return None
        started = time.perf_counter()
        model, refitted, build_notes = self.judge.build(removal, refit=refit)
        if removal.units() == 0 and self.runtime == "torch":  # the original itself: the reference's own figures
            figures = {**self.reference, "drop": 0.0}
        else:
            figures = self.judge.judge(self.judge.on_runtime(model))
        structure = removal.structure(self.plan.start)
        predicted = self.plan.path.reference_ms / self.plan.table.predict_ms(structure)
        estimated = (path or self.plan.path).steps[path_step - 1].cumulative_loss if path_step else None
        result = result_of(name, origin, self.runtime, removal, self.plan.start, predicted=predicted,  # type: ignore[arg-type]
                           figures=figures, started=started, path_step=path_step, estimated_loss=estimated,
                           tier="refit" if refitted is not None else "none", notes=build_notes)
        if timed:
            self.time(result, model)
        result.seconds = round(time.perf_counter() - started, 3)
        self.last_cost = max(self.last_cost, result.seconds)
        self.results.append(result)
        self.models[name] = model
        self.emit(ProgressEvent("compress: candidates", len(self.results), None,
                                {"name": name, "predicted": f"{result.predicted_speedup:.2f}x",
                                 "measured": "-" if result.measured_speedup is None
                                 else f"{result.measured_speedup:.2f}x",
                                 "drop": f"{result.drop:.2f}"}))
        return result

    def time(self, result: CandidateResult, model: nn.Module) -> None:
        """Measure ``result``'s speedup side by side with the original on the reference runtime."""
        if result.removal.units() == 0 and self.runtime == self.against:
            result.measured_speedup = 1.0  # the original itself
            return
        value, interval = self.source.speedup(self.judge.original, model, runtime=self.runtime,
                                              reference_runtime=self.against)
        result.measured_speedup = round(value, 4)
        result.speedup_interval = interval
        if abs(value - result.predicted_speedup) > PREDICTION_TOLERANCE * value:
            result.notes.append(f"predicted {result.predicted_speedup:.2f}x but measured {value:.2f}x "
                                f"(more than {PREDICTION_TOLERANCE:.0%} apart)")

    def path_point(self, k: int, *, timed: bool = True, family: str = "path") -> CandidateResult | None:
        path = self.plan.families()[family]
        prefix = family.removesuffix("-path")
        return self.candidate(f"{prefix}-{k}@{path.speedup_at(k):.2f}x", family, path.removal_at(k), path_step=k,
                              timed=timed, path=path)

    # -- the candidates -------------------------------------------------------------------
    def try_all(self) -> None:
        path = self.plan.path
        others = [name for name in self.plan.families() if name != "path"]
        since = time.perf_counter()
        self.candidate("unchanged", "unchanged", Removal())
        if isinstance(self.target, SpeedupTarget):
            goal = self.target.speedup
            self.around(goal, "path")
            for family in others:
                self.around(goal, family, factors=AROUND_TARGET[:1])
            # Predictions are off by what the table misses: walk on along the path while no point measured fast enough.
            for _ in range(2):
                met = [r for r in self.results if (r.measured_speedup or 0) >= goal]
                timed = [r for r in self.results if r.origin == "path" and r.measured_speedup]
                if met or not timed:
                    break
                fastest = max(timed, key=lambda r: r.measured_speedup or 0)
                wanted = fastest.predicted_speedup * goal / (fastest.measured_speedup or 1) * 1.02
                k = path.first_reaching(wanted)
                if k is None or any(r.origin == "path" and r.path_step == k for r in self.results):
                    break
                self.path_point(k)
            anchor = path.first_reaching(goal) or len(path.steps)
        else:
            anchor = self.bisect(self.target.max_drop, "path")
            if anchor > 0:
                best = self.path_point(anchor)
                lower = path.first_reaching(path.speedup_at(anchor) * 0.9)
                if best is not None and lower is not None and 0 < lower < anchor:
                    self.path_point(lower)
            for family in others:
                found = self.bisect(self.target.max_drop, family)
                if found > 0:
                    self.path_point(found, family=family)
        if anchor > 0:
            self.layer_drop(path.speedup_at(anchor))
        self.clock.phase("candidates", since)

    def around(self, goal: float, family: str, *, factors: tuple[float, ...] = AROUND_TARGET) -> None:
        """The points of one path that first reach each factor of ``goal`` (the target first)."""
        path = self.plan.families()[family]
        for factor in factors:
            k = path.first_reaching(goal * factor)
            if k is not None and k > 0:
                self.path_point(k, family=family)

    def bisect(self, max_drop: float, family: str) -> int:
        """The most steps along a path whose refitted candidate stays within ``max_drop`` (judged, not timed)."""
        path = self.plan.families()[family]
        lo, hi = 0, len(path.steps)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            result = self.path_point(mid, timed=False, family=family)
            if result is None:  # out of budget: keep what is known to hold
                break
            if result.drop <= max_drop:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def layer_drop(self, speedup: float) -> None:
        """The uniform layer-drop candidate at (at least) the predicted speed of the chosen path point."""
        path = self.plan.path

        def predicted(removal: Removal) -> float:
            return path.reference_ms / self.plan.table.predict_ms(removal.structure(self.plan.start))

        removal = layer_drop_removal(len(self.plan.start.layers), predicted, speedup, sorted(self.plan.costs.layers))
        if removal is not None:
            self.candidate(f"layer-drop-{len(removal.layers)}@{predicted(removal):.2f}x", "uniform-layer-drop",
                           removal)

    # -- the pick -------------------------------------------------------------------------
    def pick(self) -> tuple[CandidateResult, str, list[str]]:
        timed = [r for r in self.results if r.measured_speedup is not None]
        warnings: list[str] = []
        metric = "accuracy" if self.plan.objective == "task" else "fidelity (mean cosine)"
        if isinstance(self.target, SpeedupTarget):
            goal = self.target.speedup
            met = [r for r in timed if meets(r, goal)]
            if met:
                winner = min(met, key=lambda r: (r.drop, -(r.measured_speedup or 0)))
                why = (f"the smallest {metric} drop ({winner.drop:.2f} points) among the {len(met)} candidate(s) "
                       f"measured at least {goal:g}x faster")
                if (winner.measured_speedup or 0) < goal:
                    why += (f" (its {winner.measured_speedup:.3f}x is below {goal:g}x, but {goal:g}x is within the "
                            "95% interval of its measurement)")
            else:
                winner = max(timed, key=lambda r: (r.measured_speedup or 0, -r.drop))
                why = f"no candidate measured {goal:g}x faster; the fastest measured ({winner.measured_speedup:.2f}x)"
                end = self.plan.path.speedup_at(len(self.plan.path.steps))
                warnings.append(f"target missed: the fastest candidate measured {winner.measured_speedup:.2f}x, "
                                f"not {goal:g}x (the path ends at {end:.2f}x predicted, or the budget ran out)")
            limit = self.target.max_drop
        else:
            limit = self.target.max_drop
            within = [r for r in timed if r.drop <= limit]
            if within:
                winner = max(within, key=lambda r: (r.measured_speedup or 0, -r.drop))
                why = (f"the fastest ({winner.measured_speedup:.2f}x measured) among the {len(within)} candidate(s) "
                       f"within {limit:g} points of {metric}")
            else:
                winner = min(timed, key=lambda r: r.drop)
                why = f"no candidate within {limit:g} points; the one that lost least ({winner.drop:.2f})"
        if limit is not None and winner.drop > limit:
            warnings.append(f"the chosen model loses {winner.drop:.2f} points of {metric} against the original, "
                            f"more than --max-drop {limit:g}")
        return winner, why, warnings

    # -- the training tier ----------------------------------------------------------------
    def train_winner(self, winner: CandidateResult, data: Any, budget_minutes: float | None,
                     seed: int, *, train: bool = True) -> tuple[nn.Module, str, dict[str, Any] | None]:
        """Distil the original into the winner for the whole epochs the budget has left (its name after it)."""
        model = self.models[winner.name]
        if not train:
            self.notes.append("training turned off: the refit tier only")
            return model, winner.name, None
        if budget_minutes is None:
            self.notes.append("no budget given: the refit tier only (give a budget in minutes to allow distillation "
                              "from the original)")
            return model, winner.name, None
        if winner.removal.units() == 0:
            return model, winner.name, None
        from surgery.compress.training_tier import distil, epochs_that_fit, seconds_per_epoch

        since = time.perf_counter()
        batch = min(self.plan.batch_size, 32)
        epoch = seconds_per_epoch(model, self.judge.original, data, batch)
        # Kept back: judging (and exporting) the trained model once more.
        spare = self.clock.left() - winner.seconds
        epochs = epochs_that_fit(spare, epoch, MAX_EPOCHS)
        training: dict[str, Any] = {"epoch_seconds_estimated": round(epoch, 2), "seconds_left": round(spare, 1),
                                    "epochs": epochs}
        if epochs == 0:
            self.notes.append(f"no distillation: one epoch takes about {epoch:.0f} s and the budget has "
                              f"{max(spare, 0):.0f} s left")
            self.clock.phase("training", since)
            return model, winner.name, training
        self.emit(ProgressEvent("compress: distillation", 0, epochs, {"candidate": winner.name}))
        result = distil(model, self.judge.original, data, epochs=epochs, batch_size=batch, seed=seed,
                        progress=self.emit)
        training.update(steps=result.steps, seconds=round(result.seconds, 2))
        figures = self.judge.judge(self.judge.on_runtime(model))
        trained_result = winner.model_copy(update={
            "name": f"{winner.name}+distil", "tier": "distil", "accuracy": figures.get("accuracy"),
            "mean_cosine": figures.get("mean_cosine"), "recall_at_10": figures.get("recall_at_10"),
            "drop": float(figures["drop"]), "seconds": round(time.perf_counter() - since, 3),
            "notes": [*winner.notes, f"distilled from the original for {epochs} epoch(s); same structure, so the "
                      "same measured speed"]})
        self.results.append(trained_result)
        self.clock.phase("training", since)
        return model, trained_result.name, training

    def report(self, winner: str, why: str, warnings: list[str], training: dict[str, Any] | None,
               budget_minutes: float | None, threads: int | None, stock: bool, clock: _Clock) -> CompressReport:
        final = next(r for r in self.results if r.name == winner)
        limit = self.target.max_drop
        if final.tier == "distil":
            why += "; then distilled from the original"
            warnings = [w for w in warnings if "more than --max-drop" not in w]
            if limit is not None and final.drop > limit:
                warnings.append(f"the chosen model loses {final.drop:.2f} points against the original, more than "
                                f"--max-drop {limit:g}")
        notes = list(self.notes)
        notes += [f"{r.name}: {n}" for r in self.results for n in r.notes if "measured" in n and "predicted" in n]
        path = self.plan.path
        reference = f"the original model in {self.against}" + (" (fp32), unchanged" if self.against == "torch"
                                                                 else ", unchanged")
        table = self.plan.table
        return CompressReport(
            target=self.target.describe(), runtime=self.runtime, against_runtime=self.against,
            objective=self.plan.objective, reference=reference,
            metric="dev accuracy" if self.plan.objective == "task" else "mean cosine and recall@10 of embeddings",
            original=self.reference, batch_size=self.plan.batch_size, seq_len=self.plan.seq_len, threads=threads,
            stock=stock, budget_minutes=budget_minutes, machine=dict(table.machine),
            latency_table=table.model_dump(mode="json"), unchanged_speedup=round(self.plan.unchanged_speedup, 4),
            importance=self.plan.costs.summary(),
            path=_steps(path), units_path=_steps(self.plan.units_path) if self.plan.units_path else [],
            uniform_path=_steps(self.plan.uniform_path) if self.plan.uniform_path else [],
            candidates=self.results, winner=winner, why=why, training=training, phases=clock.phases,
            seconds=round(time.perf_counter() - clock.start, 3), warnings=warnings, notes=notes)
