"""Phases 1-4 of ``surgery.compress``: the batch shape, the latency table, what every unit carries, the search.

:func:`plan_compress` measures and scores but changes nothing; its :class:`CompressPlan` is what
``--dry-run`` prints and what the candidates (:mod:`surgery.compress.candidate_run`) are cut from.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.compress.candidates import Unchanged, leading_batches, unchanged_on
from surgery.compress.compress_report import DropTarget, SpeedupTarget, Target
from surgery.compress.config import CompressConfig
from surgery.compress.job_estimate import IMPORTANCE_SHARE, JobEstimate, plan_settings
from surgery.compress.latency_source import SPEEDUP_REPEATS, LatencySource, MeasuredLatency
from surgery.compress.latency_table import LatencyTable
from surgery.compress.mask_fisher import (
    LAYER_BATCHES,
    FisherBatch,
    ObjectiveName,
    UnitCosts,
    fisher_batch,
    unit_costs,
)
from surgery.compress.removal_path import RemovalPath, describe_cut, search_path
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError, DataError, StockFormatError
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.measure.serving import ServingShape, data_batches, measured_shape
from surgery.measure.timing import batch_length
from surgery.runtimes.shared.alignment import Alignment, measure_alignment
from surgery.training.refit import task_calibration_batches

if TYPE_CHECKING:
    from surgery.runtimes import Runtime

#: Examples the mask Fisher reads (Kwon et al. use 2k on a GPU; 512 keep a CPU run within minutes); int8
#: smoothing reads them too (as many as ``surgery export --calibration`` reads texts by default).
FISHER_EXAMPLES = 512
#: Examples the least-squares refit reads; inputs longer than 128 tokens reach REFIT_TOKENS with fewer of them.
REFIT_EXAMPLES = 256
#: Token positions (padded) the refit reads at most: REFIT_EXAMPLES at 128 tokens. A least-squares row is a token,
#: so at 512 tokens 64 examples give it the rows 256 gave at 128 (32,768, eight times the widest projection's
#: inputs at BERT-large widths) at a quarter of the cost; at up to 128 tokens nothing changes.
REFIT_TOKENS = REFIT_EXAMPLES * 128
CALIBRATION_BATCH = 32
#: Path points tried around a --speedup target, as factors of it (the target first).
AROUND_TARGET = (1.0, 1.1, 0.9)
#: How far past the last of those the --speedup path goes on (a factor of it): where every point around the
#: target measures slower than the table said, the walk on (CandidateRun.walk) judges the point the corrected
#: prediction puts at the target, and the path must hold it. The greedy path's earlier points do not change.
WALK_ROOM = 1.3

def refit_batches(calibration: list[Any]) -> list[Any]:
    """The first calibration batches, as many as the refit reads: up to REFIT_EXAMPLES examples and REFIT_TOKENS
    token positions, at least one batch.

    Example:
        >>> import torch
        >>> def batches(length): return [{"input_ids": torch.ones(32, length, dtype=torch.long)}] * 16
        >>> [len(refit_batches(batches(n))) for n in (64, 128, 256, 512)]
        [8, 8, 4, 2]
    """
    return leading_batches(calibration, examples=REFIT_EXAMPLES, tokens=REFIT_TOKENS, padded=True)


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
    from surgery.runtimes.shared.alignment import serving_shape

    loader = data.loader("train", batch_size=batch_size)
    first = [b for b, _ in zip(loader, range(batches), strict=False)]
    if not first:
        raise DataError("compress: the training data holds no examples")
    return max(1, serving_shape(first)[1])  # the rule surgery export's --pad-to-multiple-of auto times at


@dataclass
class CompressPlan:
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
    #: seconds per phase estimated before the work, and what a budget scaled down (None: times not measured here)
    estimate: JobEstimate | None = None
    #: the serving shape every time is measured at (batch, threads, lengths and the drawn lengths' summary)
    shape: ServingShape | None = None
    #: the batches of the data's texts every time is measured on (``lengths="data"``; None: one random batch)
    batches: list[Any] | None = None
    #: the unchanged model as it runs on the runtime, written once for the run, with its measured speedup (None
    #: where times were not measured here: the ``unchanged`` candidate then writes it)
    unchanged: Unchanged | None = None
    #: the unchanged speedup's interval where it was measured (None: a prediction, or the reference runtime itself)
    unchanged_interval: list[float] | None = None
    #: whether padding batches to a block multiple was measured to pay on the runtime (None: not measured here);
    #: where it pays, the runtime's models are timed padded to its multiple and the saved artefact records it
    alignment: Alignment | None = None

    @property
    def dev_examples(self) -> int | None:
        """Dev examples the candidates are judged on: a budget's seeded subsample of the dev split, sized by the
        job estimate (None: the whole split)."""
        return self.estimate.settings.dev_examples if self.estimate is not None else None

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
        points = [describe_cut(self.path, j) for j in _speed_points(self.path)]
        return {"target": target.describe(), "runtime": self.table.runtime, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "objective": self.objective,
                **({"serving_shape": self.shape.model_dump(mode="json")} if self.shape is not None else {}),
                "predicted_ms_original": round(self.table.predict_ms(self.start), 4),
                "unchanged_speedup": round(self.unchanged_speedup, 4),
                "would_cut": describe_cut(self.path, k) if k is not None else None,
                "reachable": k is not None or isinstance(target, DropTarget),
                "max_predicted_speedup": round(self.path.speedup_at(len(self.path.steps)), 4),
                "speed_points": points,
                **({"estimate": self.estimate.report(self.phases)} if self.estimate is not None else {})}

    @property
    def speedup_repeats(self) -> int:
        """Side-by-side rounds of each candidate's speedup (fewer when a budget scaled them down)."""
        return self.estimate.settings.speedup_repeats if self.estimate is not None else SPEEDUP_REPEATS


def _speed_points(path: RemovalPath, every: float = 0.25) -> list[int]:
    """Path steps at every ``every`` of predicted speedup (1.25x, 1.5x, ...): a summary of the path."""
    out, goal = [], 1.0 + every
    for k in range(1, len(path.steps) + 1):
        if path.speedup_at(k) >= goal:
            out.append(k)
            while path.speedup_at(k) >= goal:
                goal += every
    return out


def distinct_cuts(paths: list[RemovalPath], goal: float) -> int:
    """How many different cuts a --speedup run judges: the points of the first path at each factor of
    :data:`AROUND_TARGET`, the others' at the target, and a layer-drop (equal cuts are judged once).

    Example:
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> from surgery.compress.latency_source import TableLatency
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> plan = plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5),
        ...                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> 1 <= distinct_cuts(list(plan.families().values()), 1.5) <= 6
        True
    """
    cuts = []
    for n, path in enumerate(paths):
        for factor in AROUND_TARGET if n == 0 else AROUND_TARGET[:1]:
            k = path.first_reaching(goal * factor)
            if k:
                cuts.append(path.removal_at(k).effective())
    unique = [c for i, c in enumerate(cuts) if c not in cuts[:i]]
    return len(unique) + (1 if unique else 0)  # the layer-drop beside them


class Clock:
    """The job's deadline, and phase timings.

    ``start``: the :func:`time.perf_counter` the budget counts from (default: now); ``after``: seconds kept back
    from the deadline for what the caller does once the job returns (the CLI's save).

    Example:
        >>> clock = Clock(1.0, start=time.perf_counter() - 20.0, after=10.0)
        >>> 29.0 < clock.left() <= 30.0, Clock(None).left()
        (True, inf)
    """

    def __init__(self, budget_minutes: float | None, *, start: float | None = None, after: float = 0.0) -> None:
        self.start = time.perf_counter() if start is None else start
        self.deadline = None if budget_minutes is None else self.start + 60.0 * budget_minutes - after
        self.phases: dict[str, float] = {}

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left()

    def phase(self, name: str, since: float) -> None:
        self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - since, 3)


def stock_search_limits(model: nn.Module) -> list[int]:
    """With ``--stock``: refuse, before any work, a model no stock config can state; else the layers it must keep.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> stock_search_limits(tiny_model(TinySpec("modernbert", layers=3)))
        [0]
    """
    from surgery.compress.stock_export import stock_fixed_layers, stock_structure_problem

    problem = stock_structure_problem(model)
    if problem is not None:  # found now, not at the save after the whole job
        raise StockFormatError(f"compress --stock: the model cannot be written as a stock Hugging Face directory: "
                               f"{problem}; drop --stock to save it in surgery's format")
    return stock_fixed_layers(model)


def plan_compress(model: nn.Module, data: Any, config: CompressConfig | None = None, *,
                  runtime: Runtime | None = None, against: Runtime | None = None,
                  latency: LatencySource | None = None, progress: ProgressCallback | None = None,
                  clock: Clock | None = None, write_cache: bool = True, costs: UnitCosts | None = None,
                  dev_examples: int | None = None, unchanged: Unchanged | None = None, **settings: Any
                  ) -> CompressPlan:
    """Phases 1-4 of :func:`compress`: measure, score, search. Changes nothing (``--dry-run`` stops here).

    ``config`` (:class:`~surgery.compress.config.CompressConfig`) holds the settings the plan reads: the
    target, the runtime, what speedups are against, the objective, the batch shape, ``stock``, the
    threads and ``train``. Its fields may be given as keywords instead (``target=SpeedupTarget(...)``,
    ``runtime="onnxruntime"``, ``against_runtime=...``, ``batch_size=...``: a config is built of them,
    ``train`` False unless given). ``runtime`` and ``against`` are the config's runtimes already resolved
    (:func:`surgery.runtimes.get_runtime`) by a caller that resolved them once; resolved here otherwise.

    ``costs``: what every unit carries, when already measured (``--runtime auto`` plans several
    runtimes on one model: the mask Fisher does not depend on the runtime).

    When times are measured here (no ``latency`` given), the job is estimated first
    (:mod:`surgery.compress.job_estimate`): small timed steps of each phase give seconds per phase,
    emitted as the ``compress: estimate`` progress event before any phase runs, and with a budget the
    phases are scaled down to fit it. ``dev_examples`` (the dev set's size) and ``train`` (distillation
    allowed) inform that estimate.

    ``config.lengths == "data"``: every time (the latency table, the speedups) is measured on batches of the data's
    own texts, each padded to its own longest (:func:`surgery.measure.serving.data_batches`), at
    ``batch_size`` and ``threads``: the serving shape, recorded in ``CompressPlan.shape``.

    The unchanged model is written on the runtime once (:func:`~surgery.compress.candidates.unchanged_on`,
    or ``unchanged`` when the caller wrote it: ``--runtime auto`` times every runtime's first): the
    estimate times it, the latency table times it as its ``model`` probe, its speedup is measured on it
    once, and the plan hands it on (``CompressPlan.unchanged``) for the ``unchanged`` candidate.

    Example:
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> plan = plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5),
        ...                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> plan.path.speedup_at(plan.target_step(SpeedupTarget(speedup=1.5))) >= 1.5
        True
    """
    if config is None:  # the keywords of before: the config's fields
        if isinstance(runtime, str):
            settings["runtime"], runtime = runtime, None
        config = CompressConfig.build(**{"train": False, **settings})
    elif settings:
        raise ConfigError(f"plan_compress: pass settings in the CompressConfig or as keywords, not both (got "
                          f"{', '.join(sorted(settings))})")
    if runtime is None or against is None:
        from surgery.compress.latency_measure import resolve_runtime

        if config.auto:
            raise ConfigError("plan_compress: runtime 'auto' is chosen by compress; plan one runtime (a name)")
        runtime = runtime or resolve_runtime(config.runtime, "compress")
        against = against or resolve_runtime(config.against_runtime, "compress: against_runtime")
    target, stock, threads, train = config.target, config.stock, config.threads, config.train
    fixed_layers = stock_search_limits(model) if stock else []
    clock = clock or Clock(None)
    emit = progress or no_progress
    chosen = data_objective(data, config.objective)
    since = time.perf_counter()
    batch_size = config.batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH))
    lengths = config.lengths
    batches = data_batches(data, batch_size=batch_size) if lengths == "data" else None
    seq_len = max(batch_length(b) for b in batches) if batches else config.seq_len or batch_seq_len(data, batch_size)
    shape = measured_shape(ServingShape(batch_size=batch_size, threads=threads, lengths=lengths,  # type: ignore[arg-type]
                                        seq_len=seq_len), batches or [])
    calibration = task_calibration_batches(data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                      batch_size=CALIBRATION_BATCH)
    clock.phase("data", since)
    emit(ProgressEvent("compress: batch shape", 1, 1, {"batch": batch_size, "seq_len": seq_len,
                                                       "lengths": lengths, "objective": chosen}))
    importance_objective = data.importance_objective() if chosen == "embedding" else None
    first: FisherBatch | None = None
    alignment: Alignment | None = None
    estimate, held = None, None
    written: dict[str, nn.Module] = {}
    interval = None
    if latency is None:  # times are measured here: estimate the job before spending it
        from surgery.compress.candidate_pool import default_workers

        since = time.perf_counter()

        def fisher() -> FisherBatch:
            nonlocal first
            if costs is not None:  # measured already (--runtime auto): nothing to spend
                return FisherBatch({}, {}, 0, 0.0)
            first = fisher_batch(model, calibration[0], objective=chosen, importance_objective=importance_objective)
            return first

        if unchanged is None:  # the run's one export of the unchanged model, as a candidate's (user calibration)
            unchanged = unchanged_on(runtime, model, objective=chosen, calibration=calibration, threads=threads)
        if runtime.aligns and unchanged.served.directory is not None:
            # Where the runtime's kernels run a padded batch faster, the artefact is served padded: every model on
            # the runtime is then timed padded, as the saved one runs; the reference as the user's batch is.
            alignment = measure_alignment(unchanged.served.model, vocab_size=int(model.config.vocab_size),
                                          batch_size=batch_size, seq_len=seq_len, threads=threads)
            if alignment.multiple is not None:
                unchanged.speedup = None  # timed as given (--runtime auto): timed again as served
            emit(ProgressEvent("compress: alignment", 1, 1, {"why": alignment.why()}))
        budget = None if clock.deadline is None else max(clock.left(), 0.0)
        estimate, written, held = plan_settings(
            model, data, target, runtime=runtime, against=against, batch_size=batch_size,
            seq_len=seq_len, threads=threads, fisher_batches=len(calibration),
            refit_batches=len(refit_batches(calibration)),
            dev_examples=dev_examples if dev_examples is not None else len(getattr(data, "eval", None) or []),
            removable_layers=0 if costs is not None else len(Structure.from_model(model).layers),
            budget_seconds=budget, train=train, fisher=fisher, unchanged=unchanged, started=since,
            workers=config.workers or default_workers(model),
            pad_to_multiple_of=alignment.multiple if alignment is not None else None)
        clock.phase("estimate", since)
        emit(ProgressEvent("compress: estimate", 1, 1, estimate.info()))
    since = time.perf_counter()
    # write_cache=False: --dry-run reads a cached latency table but writes nothing, the cache included.
    # The table times the run's unchanged model and the estimate's probe as they are: neither is written again.
    source = latency or MeasuredLatency(
        batch_size=batch_size, seq_len=seq_len, threads=threads, write_cache=write_cache,
        table_repeats=estimate.settings.table_repeats if estimate is not None else None,
        repeats=estimate.settings.speedup_repeats if estimate is not None else SPEEDUP_REPEATS, batches=batches,
        prepared={**written, **({"model": unchanged.served.model} if unchanged is not None
                                and unchanged.served.directory is not None else {})},
        pad_to_multiple_of=alignment.multiple if alignment is not None else None)
    table = source.table(model, runtime.name)
    written = {}
    if held is not None:
        held.cleanup()
    speedup = 1.0
    if runtime.name != against.name:  # the runtime alone is worth something (int8): the path starts from it
        if unchanged is not None and unchanged.speedup is not None:  # timed already (--runtime auto's ratios)
            speedup, interval = unchanged.speedup
        else:  # timed once, on the run's artefact of the model; the unchanged candidate reads it from the plan
            speedup, interval = source.speedup(model, model, runtime=runtime.name, reference_runtime=against.name,
                                               served=None if unchanged is None or unchanged.served.directory is None
                                               else unchanged.served.model)
            if unchanged is not None:
                unchanged.speedup = (speedup, interval)
    clock.phase("latency", since)
    start = Structure.from_model(model)
    emit(ProgressEvent("compress: latency table", 1, 1, {"runtime": runtime.name,
                                                         "predicted_ms": round(table.predict_ms(start), 3),
                                                         "unchanged_speedup": round(speedup, 3)}))
    since = time.perf_counter()
    pooled = None
    if chosen == "embedding":
        from surgery.embedding.evaluate import embed_batch
        from surgery.embedding.pooling import SentenceConfig

        sentence = getattr(data, "sentence_config", None) or SentenceConfig()

        def pooled(m: nn.Module, batch: Any) -> Any:
            return embed_batch(m, batch, sentence)[0]

    # With a budget, the Fisher gets a share of it (the rest goes to candidates and training).
    share = None if clock.deadline is None else IMPORTANCE_SHARE * max(clock.left(), 0.0)
    if costs is None:
        costs = unit_costs(model, calibration, objective=chosen, importance_objective=importance_objective,
                           pooled=pooled, max_seconds=share, first=first,
                           max_batches=estimate.settings.fisher_batches if estimate is not None else None,
                           layer_batches=estimate.settings.layer_batches if estimate is not None else LAYER_BATCHES)
    clock.phase("importance", since)
    emit(ProgressEvent("compress: importance", 1, 1, {"examples": costs.examples,
                                                      "seconds": round(costs.seconds, 1)}))
    since = time.perf_counter()
    reference_ms = table.predict_ms(start) * speedup
    stop = target.speedup * max(AROUND_TARGET) * WALK_ROOM if isinstance(target, SpeedupTarget) else None
    path = search_path(costs, table, start, reference_ms=reference_ms, stop_speedup=stop, stock=stock,
                       fixed_layers=fixed_layers)
    units_path = None if stock else search_path(costs, table, start, reference_ms=reference_ms, stop_speedup=stop,
                                                layers=False)
    uniform = len({s.ffn_width for s in start.kept}) == 1 and len({s.heads for s in start.kept}) == 1
    uniform_path = None if stock or not uniform else search_path(costs, table, start, reference_ms=reference_ms,
                                                                  stop_speedup=stop, layers=False, uniform=True)
    clock.phase("search", since)
    emit(ProgressEvent("compress: search", 1, 1, {"steps": len(path.steps),
                                                  "max_speedup": round(path.speedup_at(len(path.steps)), 3)}))
    if estimate is not None and isinstance(target, SpeedupTarget):  # the cuts are known now: say it again
        paths = [p for p in (path, units_path, uniform_path) if p is not None]
        emit(ProgressEvent("compress: estimate after the search", 1, 1, estimate.refine(
            distinct_cuts(paths, target.speedup), speedup >= target.speedup)))
    refit = refit_batches(calibration)
    if estimate is not None:  # a budget may leave the refit fewer batches (said in the estimate's notes)
        refit = refit[:estimate.settings.refit_batches]
    return CompressPlan(table=table, costs=costs, path=path, units_path=units_path, uniform_path=uniform_path,
                        start=start, unchanged_speedup=speedup, batch_size=batch_size, seq_len=seq_len,
                        objective=chosen, calibration=refit, smoothing=calibration, phases=clock.phases,
                        estimate=estimate, shape=shape, batches=batches, unchanged=unchanged,
                        unchanged_interval=interval, alignment=alignment)
