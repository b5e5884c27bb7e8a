"""The cost of a ``compress`` job, estimated before the work from small timed steps, and fitted to a budget.

:func:`time_probes` times one small step of each phase on this machine, at the job's batch shape:

* the original in PyTorch (one batch: the unit of the Fisher, the refit and the layer costs), and on
  the target runtime, its artefact written as a candidate's is (int8 calibrated on the user's
  batches): that export is the run's only export of the unchanged model
  (:class:`~surgery.compress.candidates.Unchanged`), whose files the latency table, the unchanged
  speedup and the ``unchanged`` candidate then use, so it is not spent twice;
* one latency probe (two full layers of the model's widest layer) written and timed on the runtime: the
  latency table's own full-width probe, handed to it rather than written again;
* the mask Fisher of one calibration batch (kept: it is the importance phase's first batch).

:func:`estimate_job` turns these into seconds per phase by counting what each phase does with them
(probes x rounds for the latency table, batches for the Fisher, per candidate a refit over its
projections, an export, a pass over the dev data and the side-by-side rounds), and, when a budget
is given, scales phases down until the sum fits: fewer timing rounds (latency table and speedups),
a Fisher subsample, the dev examples candidates are judged on (a seeded subsample of the dev split),
fewer refit batches, fewer candidates; every reduction is said in ``notes``.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.compress.candidates import Unchanged
from surgery.compress.compress_report import SpeedupTarget, Target
from surgery.compress.held_out import MIN_DEV_EXAMPLES
from surgery.compress.latency_measure import REPEATS as TABLE_REPEATS
from surgery.compress.latency_source import SPEEDUP_REPEATS
from surgery.compress.mask_fisher import LAYER_BATCHES, FisherBatch
from surgery.compress.structure import Structure
from surgery.measure.cost import MAX_JOB_SECONDS

if TYPE_CHECKING:
    from surgery.runtimes import Runtime

#: The fewest timing rounds a budget may leave the latency table (its median polish needs 3; default
#: :data:`~surgery.compress.latency_measure.REPEATS`) and each speedup (default
#: :data:`~surgery.compress.latency_source.SPEEDUP_REPEATS`).
MIN_TABLE_REPEATS, MIN_SPEEDUP_REPEATS = 3, 6
#: Candidates a --speedup search judges at most: the unchanged model, the path at the target and 10%
#: either side, the units-only and the uniform paths' points, a uniform layer-drop.
SPEEDUP_CANDIDATES = 7
#: Points a --max-drop bisection builds per path, for 3 paths. Guided by the Fisher's estimates of the loss
#: (``candidate_run.guided_step``), and a point another path already built is free (the same cut): MiniLM-L6's
#: --max-drop 1 built 6, 4 and 5 on its three paths in one run and 6, 3 and 3 in another (experiments/compress_cost,
#: sessions 14 and 15), not the 7 each of an unguided bisection of about a hundred steps (log2). Since a path stops at
#: the latency table's resolution (candidate_run.BISECTION_RESOLUTION) ten recorded runs on a Zen 4 (sessions 20-21,
#: experiments/deep_cuts) built 15-23 candidates, 18.1 on average, each cheaper than priced: at 5 points a path their
#: candidates phase came in at 0.63-1.13 of its estimate (three outside 30%), at 4 at 0.74-1.34 (one outside).
BISECTION_POINTS = 4
#: The share of the budget (left at the importance phase, for a running job) that the mask Fisher may take.
IMPORTANCE_SHARE = 0.15
#: The share of the candidates' room (the budget less the estimate, the latency table and the importance phase) that
#: the passes over the dev data may take where the whole dev split does not fit: the original's pass and the unchanged
#: model's, and one cut's. At 512 tokens on BERT-base widths the original's pass over 998 dev texts alone was 9 of a
#: 30-minute budget's minutes, and no cut fitted after it (experiments/compress_cost).
DEV_SHARE = 0.25
#: A wave of ``w`` candidates built at once by ``w`` worker processes, each held to its share of the cores, takes
#: ``w x WAVE_SHARE`` times one candidate built alone in this process with all of them (until a wave was measured;
#: then the measured seconds count). Below 1 by what the workers gain over threads: a process each keeps the
#: single-threaded parts (NNCF's graph passes, Python) busy where threads wait. On two cores (Zen 5) a wave of two
#: took 0.91x two candidates alone (MiniLM-L6 --max-drop 1: about 30 s a candidate in a wave, 16.5 s alone) and
#: about 0.9x at BERT-base widths and 128 tokens (334 and 365 s in a wave, where the refit probe and the rest put
#: one alone near 200 s): experiments/compress_cost, session 15. The workers buy little on two cores.
WAVE_SHARE = 0.95
#: Where the job itself runs on fewer threads than the cores (``--threads 1`` on two cores), a worker has as many
#: threads as this process, and a wave of them runs side by side on cores that were idle: it takes about one
#: candidate's time, slowed by what the processes share (caches, memory, NNCF's start in a fresh process). On the
#: Zen 5 at one thread, a wave of two MiniLM-L6 cuts took 1.13-1.29x one built alone at the same depth (23.5-30.7 s
#: against 18.0-23.8 s; experiments/deep_cuts, session 16's --max-drop rows), where ``w x WAVE_SHARE`` had priced
#: 1.9x and the candidates phase came in at 0.48-0.60 of its estimate.
WAVE_CONTENTION = 1.25
#: A job left alone in a round runs in this process on the cores the workers hold (``candidate_pool.CandidatePool
#: .whole_share``), not only the job's threads: its time scales as (threads / share) to this power. On the Zen 4 at
#: ``--threads 1`` with two workers, a MiniLM-L6 build took 24.8 s on two threads against 39.4 s on one (means over
#: 8 and 20 builds of rt-sentiment's --max-drop 1 search; experiments/compress_cost, session 19): 1.59x, 2 ** 0.67.
LONE_THREAD_EXPONENT = 0.67


def wave_share(workers: int, threads: int | None, cores: int | None = None) -> float:
    """One wave of ``workers`` candidates built at once, in units of one candidate built alone in this process.

    This process builds with ``threads`` (all the cores when None); a worker with its share of the cores
    (:func:`~surgery.compress.candidate_pool.worker_threads`). Where each worker has fewer threads than this
    process, the wave costs ``workers x WAVE_SHARE``; where it has as many, about one candidate's time
    (:data:`WAVE_CONTENTION`). The smaller of ``WAVE_CONTENTION x`` the thread ratio and ``workers x WAVE_SHARE``
    covers both and what lies between.

    Example:
        >>> wave_share(1, None, cores=2), wave_share(2, None, cores=2), wave_share(2, 1, cores=2)
        (1.0, 1.9, 1.25)
    """
    from surgery.compress.candidate_pool import available_cores, worker_threads

    if workers <= 1:
        return 1.0
    cores = cores or available_cores()
    here = min(threads, cores) if threads is not None else cores
    ratio = here / worker_threads(workers, threads, cores)
    return min(workers * WAVE_SHARE, WAVE_CONTENTION * ratio)


def lone_share(workers: int, threads: int | None, cores: int | None = None) -> float:
    """A job left alone in a round, built here on the workers' cores, in units of one built alone on the job's own
    threads: 1 where those are every core already (``threads`` None) or there is one worker.

    Example:
        >>> lone_share(1, 1, cores=2), lone_share(2, None, cores=2), round(lone_share(2, 1, cores=2), 3)
        (1.0, 1.0, 0.629)
    """
    from surgery.compress.candidate_pool import available_cores, pool_share

    if workers <= 1 or threads is None:
        return 1.0
    cores = cores or available_cores()
    return min(1.0, (min(threads, cores) / pool_share(workers, threads, cores)) ** LONE_THREAD_EXPONENT)


#: The estimate's phases, in the order they run (the names of the report's ``phases``).
PHASES = ("estimate", "latency", "importance", "candidates", "training")


@dataclass
class Probes:
    """Seconds of the small steps timed before the work (see the module doc)."""

    forward: float
    runtime_forward: float
    export: float
    probe_export: float
    probe_forward: float
    fisher_batch: float
    seconds: float = 0.0

    @property
    def runtime_gain(self) -> float:
        """The unchanged model on the target runtime against the original in PyTorch (at least 1)."""
        return max(self.forward / self.runtime_forward, 1.0) if self.runtime_forward > 0 else 1.0


@dataclass
class JobShape:
    """The counts the estimate multiplies the probes by (all known before the work)."""

    layers: int
    removable_layers: int
    probes: int  # latency probes, the model included
    probe_fraction: float  # a probe's mean time against the timed probe's
    fisher_batches: int
    layer_batches: int
    refit_batches: int
    dev_batches: float  # a pass over the whole dev split, in timed batches
    dev_examples: int  # the examples of the whole dev split
    train_batches: int
    target: float  # the speedup the candidates are near (--speedup, else drop_target)
    drop_search: bool  # --max-drop: bisection along three paths
    cached_table: bool
    runtime_differs: bool  # the runtime is not the reference one: the unchanged model is timed too
    workers: int = 1  # processes candidates are built in (candidate_pool.CandidatePool)
    wave: float | None = None  # a wave of them against one candidate built alone here (wave_share; None: the
    # job has every core, w x WAVE_SHARE)
    alone: float = 1.0  # a round's lone job, built here on the workers' cores, against one on the job's (lone_share)
    teacher_kept: float = 0.0  # the share of the original's layers whose outputs a process keeps for its refits
    # (candidates.REFIT_TEACHER_BYTES, refit_teacher_kept): their teacher pass is paid once a process, not per cut


@dataclass
class Settings:
    """What the job will do: rounds, Fisher batches, candidates (the defaults, or scaled to a budget)."""

    table_repeats: int = TABLE_REPEATS
    speedup_repeats: int = SPEEDUP_REPEATS
    fisher_batches: int = 16
    layer_batches: int = LAYER_BATCHES
    candidates: int = SPEEDUP_CANDIDATES
    training: bool = False
    #: calibration batches the refit of a cut reads (:func:`surgery.compress.plan.refit_batches`; fewer under a budget)
    refit_batches: int = 8
    #: dev examples candidates are judged on (None: the whole dev split; fewer: a seeded subsample under a budget)
    dev_examples: int | None = None


@dataclass
class JobEstimate:
    """Seconds per phase before the work, the settings they assume, and what a budget scaled down."""

    phases: dict[str, float]
    settings: Settings
    probes: Probes
    budget_seconds: float | None = None
    notes: list[str] = field(default_factory=list)
    shape: JobShape | None = None
    #: the candidates phase again once the search has said which cuts it will judge (:meth:`refine`)
    refined: dict[str, Any] = field(default_factory=dict)
    #: one distillation epoch of the original's size: what a budgeted run that trains keeps back for recovery
    epoch_seconds: float = 0.0

    def refine(self, cuts: int, unchanged_meets: bool) -> dict[str, Any]:
        """The candidates phase re-estimated for ``cuts`` distinct cuts the run will judge (a --speedup search,
        known after the search; ``unchanged_meets``: the runtime alone reaches the target, one candidate)."""
        if self.shape is None:
            return {}
        count = 1 if unchanged_meets else min(self.settings.candidates, 1 + cuts)
        seconds = phase_seconds(self.probes, self.shape, replace(self.settings, candidates=count))["candidates"]
        self.refined = {"candidates": count, "candidates_s": round(seconds, 1)}
        return {"candidates": f"{seconds / 60:.1f} min", "candidates_planned": count}

    def timed_seconds(self) -> float:
        """Seconds one candidate's side-by-side timing is estimated to take in a --speedup search (0 in a --max-drop
        bisection, which times at the pick only). Timing runs in the main process, one candidate at a time, so a round
        of candidates built at once by several workers is timed one after another.

        Example:
            >>> JobEstimate({}, Settings(), Probes(0, 0, 0, 0, 0, 0)).timed_seconds()  # no shape: nothing to count
            0.0
        """
        if self.shape is None or self.shape.drop_search:
            return 0.0
        return candidate_seconds(self.probes, self.shape, self.settings)["timed"]

    def cut_seconds(self, *, refit: bool = True) -> float:
        """Seconds one cut candidate is estimated to take (refit, objective, artefact, dev pass, and for a --speedup
        search its side-by-side rounds): what a budgeted run expects of a cut before it has built one.
        ``refit=False``: a cut that removes whole layers only (the layer-drop), which has no projection to refit
        and costs a fraction of one that does (at BERT-base widths the refit is about four fifths of a cut).

        tests/test_pick.py checks both against the candidates phase.

        Example:
            >>> JobEstimate({}, Settings(), Probes(0, 0, 0, 0, 0, 0)).cut_seconds()  # no shape: nothing to count
            0.0
        """
        if self.shape is None:
            return 0.0
        return candidate_seconds(self.probes, self.shape, self.settings)["cut" if refit else "layer_drop"]

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def info(self) -> dict[str, Any]:
        """Minutes per phase, for the progress event the CLI prints before the work."""
        out: dict[str, Any] = {name: f"{seconds / 60:.1f} min" for name, seconds in self.phases.items()}
        out["total"] = f"{self.total / 60:.1f} min"
        out["candidates_planned"] = self.settings.candidates
        if self.notes:
            out["notes"] = "; ".join(self.notes)
        return out

    def report(self, actual: dict[str, float]) -> dict[str, Any]:
        """Estimate against actual seconds per phase (``actual``: the report's ``phases``), for compress.json."""
        rows = {}
        for name, estimated in self.phases.items():
            spent = actual.get(name)
            if name == "latency":  # the clock's data phase (batch shape, calibration batches) runs before it
                spent = None if spent is None else spent + actual.get("data", 0.0)
            if name == "importance":
                spent = None if spent is None else spent + actual.get("search", 0.0)
            rows[name] = {"estimated_s": round(estimated, 1), "actual_s": None if spent is None else round(spent, 1),
                          "ratio": None if not spent or not estimated else round(spent / estimated, 3)}
            if name == "candidates" and self.refined:
                rows[name]["after_search_s"] = self.refined["candidates_s"]
        return {"phases": rows, "total_estimated_s": round(self.total, 1), "settings": asdict(self.settings),
                "probes_s": {k: round(v, 3) for k, v in asdict(self.probes).items()},
                "budget_seconds": self.budget_seconds, "notes": list(self.notes)}


def phase_seconds(p: Probes, shape: JobShape, s: Settings, epoch: float | None = None) -> dict[str, float]:
    """Seconds per phase for probes ``p``, counts ``shape`` and settings ``s`` (the model of the module doc)."""
    # `time_models` runs each short probe twice before the rounds (to count its calls), the table one warm-up round.
    rounds = s.table_repeats + 3
    # No export of the model here: the estimate's (``export``) is the one the table and the unchanged speedup time.
    # The table writes its probes but the one the estimate wrote, and its zero-width floor: ``probes - 1`` exports.
    # Counting the model's export again put the phase 1.6-1.8x over its actual on five --speedup 12 runs with a
    # cached table (experiments/deep_cuts, session 6).
    if shape.cached_table:
        latency = 6 * p.runtime_forward
    else:
        latency = (max(shape.probes - 1, 0) * p.probe_export
                   + rounds * (shape.probes * shape.probe_fraction * p.probe_forward + p.runtime_forward))
    if shape.runtime_differs:  # the unchanged model against the original, side by side (its export is the probe's)
        latency += (2 + s.speedup_repeats) * (p.forward + p.runtime_forward)
    fisher = max(s.fisher_batches - 1, 0) * p.fisher_batch
    importance = fisher + layer_probe_seconds(p, shape, s.layer_batches)
    c = candidate_seconds(p, shape, s)
    w = shape.workers
    if shape.drop_search:
        # Judged along three paths side by side, each path's next point queued for the workers as soon as its last
        # is judged (CandidateRun.run_chains): the builds flow through the workers in waves, then a few are timed.
        others = max(s.candidates - 1, 0)
        timed_share = min(4, others)
        built = build_seconds(c["built"], others, w, share=shape.wave, alone=shape.alone)
        candidates = c["unchanged"] + built + timed_share * c["timed"]
    else:
        # The search builds refitted path points first (at once) and the layer-drop after them: with room for two
        # candidates, the unchanged model and one refitted cut (counting the layer-drop there priced a BERT-base run
        # at 512 tokens 2.5x under its candidates phase, which built two refitted cuts: experiments/compress_cost,
        # session 14). Each is timed here, one after another.
        drop = s.candidates >= 3
        cut = max(s.candidates - (2 if drop else 1), 0)
        candidates = (c["unchanged"] + build_seconds(c["built"], cut, w, share=shape.wave, alone=shape.alone)
                      + cut * c["timed"]
                      + (c["layer_drop"] if drop else 0.0))
    phases = {"estimate": p.seconds, "latency": latency, "importance": importance, "candidates": candidates}
    if s.training and epoch is not None:
        phases["training"] = epoch + c["judged"]
    return phases


def build_seconds(one: float, count: int, workers: int, wave: float | None = None, *, share: float | None = None,
                  alone: float = 1.0) -> float:
    """Seconds to build ``count`` candidates of ``one`` second each (built alone in this process) handed over at
    once to a pool of ``workers`` (:func:`~surgery.compress.candidate_pool.split_jobs`): waves of ``workers`` at
    once in the workers, ``wave`` seconds each (default ``one`` x ``share``, and ``share`` by default
    ``workers`` x :data:`WAVE_SHARE`: see :func:`wave_share`), and a job left alone in the last wave built here
    in ``one`` x ``alone`` (:func:`lone_share`: on the workers' cores).

    Example:
        >>> build_seconds(100.0, 3, 1), build_seconds(100.0, 3, 2), build_seconds(100.0, 4, 2, wave=180.0)
        (300.0, 290.0, 360.0)
        >>> build_seconds(100.0, 4, 2, share=1.25)  # workers with as many threads as this process
        250.0
        >>> build_seconds(100.0, 3, 2, share=1.25, alone=0.6)  # and the lone third on both workers' cores
        185.0
    """
    from surgery.compress.candidate_pool import split_jobs

    away, here = split_jobs(count, workers)
    waves = -(-away // max(workers, 1))
    if wave is None:
        wave = one * (workers * WAVE_SHARE if share is None else share)
    return waves * wave + here * one * (alone if workers > 1 else 1.0)


def layer_probe_seconds(p: Probes, shape: JobShape, batches: int) -> float:
    """Seconds to measure every layer's removal on ``batches`` batches (the whole model, then once per layer)."""
    return (1 + shape.removable_layers) * batches * p.forward


def batches_within(count: int, per_batch: float, share: float) -> int:
    """How many of ``count`` batches of ``per_batch`` seconds fit in ``share`` seconds: at least one, at most all.

    Example:
        >>> batches_within(16, 3.0, 30.0), batches_within(4, 100.0, 30.0), batches_within(4, 0.0, 30.0)
        (10, 1, 4)
    """
    if per_batch <= 0 or count * per_batch <= share:
        return count
    return max(1, min(count, int(share / per_batch)))


def candidate_seconds(p: Probes, shape: JobShape, s: Settings) -> dict[str, float]:
    """Seconds of one candidate's steps: ``refit``, ``objective`` (before and after the refit), ``judged`` (artefact
    and dev pass), ``timed`` (side-by-side rounds), ``built`` (a cut judged, not timed), ``cut`` (as the search runs
    one: timed too in a --speedup search), ``layer_drop`` (a cut of whole layers only: nothing to refit, judged and
    timed) and ``unchanged`` (the run's unchanged model, whose artefact is the estimate's: judged, and timed where
    the runtime differs from the reference; before it, once per run, ``reference``: the original's pass over every
    dev example, the figures each candidate is paired with)."""
    small = p.forward / max(shape.target, 1.0)  # a candidate near the target, on the runtime
    cut = torch_forward(p, shape.target)  # the same cut in PyTorch fp32, where it is refitted
    # The refit, per batch: two forwards of the original (its layers' calls recorded, then each layer's projection
    # outputs) and four of the cut (recorded, advanced layer by layer, and one layer run per refitted projection,
    # two a layer); the Gram matrices ride along. experiments/probes/refit_cost.py at BERT-base widths, 128 tokens:
    # 6.1 forwards of the original a batch at 0.9 of the widths (2 + 4 x 0.91 = 5.6) and 3.8 at half (2 + 4 x 0.5
    # = 4.0); the estimate before, a half-model pass per projection, put them at 24 and 18. Then the calibration
    # objective before and after the refit.
    # The original's part is paid once per process for the layers it keeps (surgery.training.refit.TeacherOutputs):
    # on MiniLM-L6 at up to 64 tokens all six, which took a refit's solve from 15-16 s of CPU to 7-8 after a
    # process's first (experiments/compress_cost, session 21).
    per_process = max(1, math.ceil(s.candidates / max(shape.workers, 1)))
    teacher = 2 * p.forward * (1 - shape.teacher_kept + shape.teacher_kept / per_process)
    refit = s.refit_batches * (teacher + 4 * cut)
    objective = 2 * s.refit_batches * cut
    dev = dev_batches(shape, s)
    judged = p.export + dev * small
    timed = (2 + s.speedup_repeats) * (p.forward + small)
    # The original over every dev example judged in PyTorch fp32, once (Judge.prepare_reference): at 512 tokens on
    # BERT-base widths 9.5 of a 30-minute job's minutes, which the estimate had left out (experiments/compress_cost).
    reference = dev * p.forward
    # The unchanged model's artefact is the estimate's own export (in its probes' seconds) and its speedup is timed in
    # the latency phase: its candidate is judged, no more. Counting both again priced it at 923 s at 512 tokens on
    # BERT-base widths, where it took 41 s beside the original's pass (experiments/compress_cost).
    unchanged = reference + dev * p.runtime_forward
    built = refit + objective + judged
    cut = built + (0.0 if shape.drop_search else timed)
    return {"refit": refit, "objective": objective, "judged": judged, "timed": timed, "built": built, "cut": cut,
            "layer_drop": objective + judged + timed, "reference": reference, "unchanged": unchanged}


def torch_forward(p: Probes, target: float) -> float:
    """Seconds of a forward in PyTorch fp32 of a cut that runs ``target`` x faster than the original on the target
    runtime: the runtime's own gain (the unchanged model there against the original in PyTorch) is not the cut's.
    At BERT-base widths on OpenVINO int8 (7.2x unchanged), a cut at 8x is nine tenths of the original in PyTorch.

    Example:
        >>> p = Probes(forward=4.0, runtime_forward=0.5, export=0.0, probe_export=0.0, probe_forward=0.0,
        ...            fisher_batch=0.0)
        >>> torch_forward(p, 8.0), torch_forward(p, 16.0), torch_forward(p, 4.0)
        (4.0, 2.0, 4.0)
    """
    return p.forward * min(1.0, p.runtime_gain / max(target, 1.0))


def dev_batches(shape: JobShape, s: Settings) -> float:
    """A pass over the dev examples ``s`` judges on (all of ``shape``'s, or a budget's subsample), in timed batches.

    Example:
        >>> shape = JobShape(layers=2, removable_layers=2, probes=3, probe_fraction=0.5, fisher_batches=16,
        ...                  layer_batches=4, refit_batches=8, dev_batches=31.25, dev_examples=1000, train_batches=0,
        ...                  target=2.0, drop_search=False, cached_table=False, runtime_differs=False)
        >>> dev_batches(shape, Settings()), dev_batches(shape, Settings(dev_examples=256))
        (31.25, 8.0)
    """
    if s.dev_examples is None or shape.dev_examples <= 0:
        return shape.dev_batches
    return shape.dev_batches * min(s.dev_examples, shape.dev_examples) / shape.dev_examples


def fit_dev_and_refit(probes: Probes, shape: JobShape, settings: Settings, budget_seconds: float
                      ) -> tuple[Settings, list[str]]:
    """Where the job does not fit ``budget_seconds``: the dev examples candidates are judged on, and the refit's
    batches, scaled down so that the unchanged model and one refitted cut fit the candidates' room (the budget less
    the phases before them); each reduction said.

    The dev passes (the original's and the unchanged model's over the whole split, and one cut's) get
    :data:`DEV_SHARE` of the room, judged on a seeded subsample where they need more (at least
    :data:`~surgery.compress.held_out.MIN_DEV_EXAMPLES`); the refit gets what is left of the room for one cut, down to
    one batch. Both by :func:`batches_within`, the rule the Fisher's and the layers' batches are scaled by.

    Example:
        >>> # BERT-base widths at 512 tokens on two cores: a 32 x 512 forward at 16 s, 998 dev texts
        >>> p = Probes(16.0, 2.5, 140.0, 4.0, 0.4, 31.0, 210.0)
        >>> counts = {"layers": 12, "removable_layers": 12, "probes": 19, "probe_fraction": 0.7}
        >>> shape = JobShape(**counts, fisher_batches=16, layer_batches=4, refit_batches=2, dev_batches=31.2,
        ...                  dev_examples=998, train_batches=0, target=8.0, drop_search=False, cached_table=False,
        ...                  runtime_differs=True)
        >>> fitted, notes = fit_dev_and_refit(p, shape, Settings(fisher_batches=8, layer_batches=1,
        ...                                                       refit_batches=2), 1700.0)
        >>> fitted.dev_examples, fitted.refit_batches, len(notes)
        (256, 1, 2)
    """
    before = {k: v for k, v in phase_seconds(probes, shape, replace(settings, candidates=0)).items()
              if k != "candidates"}
    room = max(budget_seconds - sum(before.values()), 0.0)
    notes: list[str] = []
    whole = replace(settings, dev_examples=None)
    # One dev example through the original and the unchanged model, and through one cut.
    one = candidate_seconds(probes, shape, replace(whole, dev_examples=1))
    per_example = one["unchanged"] + (one["judged"] - probes.export)
    share = DEV_SHARE * room
    fewer = max(min(MIN_DEV_EXAMPLES, shape.dev_examples), batches_within(shape.dev_examples, per_example, share))
    if fewer < shape.dev_examples:
        notes.append(f"candidates are judged on {fewer} of the {shape.dev_examples} dev examples, a seeded subsample "
                     f"(the original's pass and each candidate's over all of them would take "
                     f"{shape.dev_examples * per_example / 60:.1f} min of the {room / 60:.1f} min left for candidates)")
        settings = replace(settings, dev_examples=fewer)
    single = candidate_seconds(probes, shape, replace(settings, refit_batches=1))
    per_batch = single["refit"] + single["objective"]
    share = room - single["unchanged"] - (single["cut"] - per_batch)
    fewer = batches_within(settings.refit_batches, per_batch, share)
    if fewer < settings.refit_batches:
        notes.append(f"a cut's refit reads {fewer} of {settings.refit_batches} calibration batches (all of them "
                     f"would take {settings.refit_batches * per_batch / 60:.1f} min; "
                     f"{max(share, 0.0) / 60:.1f} min is left for one cut's refit)")
        settings = replace(settings, refit_batches=fewer)
    return settings, notes


def estimate_job(probes: Probes, shape: JobShape, *, budget_seconds: float | None, train: bool) -> JobEstimate:
    """Seconds per phase, and with a budget the settings scaled down until the phases fit (each reduction said).

    Example:
        >>> p = Probes(forward=1.0, runtime_forward=0.3, export=20.0, probe_export=3.0, probe_forward=0.1,
        ...            fisher_batch=3.0, seconds=30.0)
        >>> shape = JobShape(layers=12, removable_layers=12, probes=19, probe_fraction=0.7, fisher_batches=16,
        ...                  layer_batches=4, refit_batches=8, dev_batches=10, dev_examples=320, train_batches=100,
        ...                  target=8.0, drop_search=False, cached_table=False, runtime_differs=True)
        >>> full = estimate_job(p, shape, budget_seconds=None, train=False)
        >>> full.settings.table_repeats, full.notes
        (7, [])
        >>> tight = estimate_job(p, shape, budget_seconds=0.5 * full.total, train=False)
        >>> tight.total <= full.total, tight.settings.speedup_repeats < 20, len(tight.notes) > 0
        (True, True, True)
    """
    settings = Settings(fisher_batches=shape.fisher_batches, layer_batches=shape.layer_batches,
                        candidates=3 * BISECTION_POINTS + 4 if shape.drop_search else SPEEDUP_CANDIDATES,
                        training=train and budget_seconds is not None, refit_batches=shape.refit_batches)
    # An epoch: the student's forward and backward (the Fisher batch is one) and the teacher's forward, per batch.
    epoch = shape.train_batches * (probes.fisher_batch + probes.forward) * 1.1
    phases = phase_seconds(probes, shape, settings, epoch)
    notes: list[str] = []
    if budget_seconds is None:
        if sum(phases.values()) > MAX_JOB_SECONDS:  # said before the work: the caller may stop it here
            notes.append(f"the job is estimated at {sum(phases.values()) / 3600:.1f} h, beyond "
                         f"{MAX_JOB_SECONDS / 3600:.0f} h: a shorter max length or a budget makes it faster")
        return JobEstimate(phases, settings, probes, None, notes, shape, epoch_seconds=epoch)

    def fits(s: Settings) -> bool:
        # A run that trains keeps one epoch back for recovery: with cuts that lose tens of points, the candidates
        # took the whole budget (emb-6x-10min, experiments/deep_cuts: 11 judged, 14 s left, no tier ran).
        cost = phase_seconds(probes, shape, s)
        return sum(cost.values()) + (epoch if s.training else 0.0) <= budget_seconds

    base = replace(settings)
    if not fits(settings):
        settings = replace(settings, table_repeats=MIN_TABLE_REPEATS, speedup_repeats=MIN_SPEEDUP_REPEATS)
        notes.append(f"latency table timed in {MIN_TABLE_REPEATS} rounds (not {base.table_repeats}) and each "
                     f"speedup in {MIN_SPEEDUP_REPEATS} (not {base.speedup_repeats})")
    share = IMPORTANCE_SHARE * budget_seconds
    fewer = batches_within(settings.fisher_batches, probes.fisher_batch, share)
    if fewer < settings.fisher_batches:
        notes.append(f"the Fisher reads {fewer} of {settings.fisher_batches} calibration batches "
                     f"({IMPORTANCE_SHARE:.0%} of the budget)")
        settings = replace(settings, fisher_batches=fewer)
    # The layers' removal gets the same share: at 512 tokens on BERT-base widths its 13 x 4 forwards of a 16 s
    # batch were 14 of a 30-minute budget's minutes, unscaled (experiments/compress_cost).
    fewer = batches_within(settings.layer_batches, layer_probe_seconds(probes, shape, 1), share)
    if fewer < settings.layer_batches:
        notes.append(f"each layer's removal is measured on {fewer} of {settings.layer_batches} batches "
                     f"({IMPORTANCE_SHARE:.0%} of the budget)")
        settings = replace(settings, layer_batches=fewer)
    if not fits(settings):
        settings, said = fit_dev_and_refit(probes, shape, settings, budget_seconds)
        notes += said
    while settings.candidates > 2 and not fits(settings):
        settings = replace(settings, candidates=settings.candidates - 1)
    if settings.candidates < base.candidates:
        notes.append(f"about {settings.candidates} of the {base.candidates} candidates fit (the rest are skipped "
                     "and said so)")
    phases = phase_seconds(probes, shape, settings)
    if settings.training:
        left = budget_seconds - sum(phases.values())
        whole = math.floor(max(left, 0.0) / epoch) if epoch > 0 else 0
        phases["training"] = min(whole, 6) * epoch
        if whole < 1:
            notes.append(f"no distillation: an epoch takes about {epoch / 60:.1f} min and about "
                         f"{max(left, 0) / 60:.1f} min would be left")
    if sum(phases.values()) > budget_seconds:
        notes.append(f"even scaled down the job is estimated at {sum(phases.values()) / 60:.1f} min, beyond the "
                     f"budget of {budget_seconds / 60:.1f} min: candidates stop when it runs out")
    return JobEstimate(phases, settings, probes, budget_seconds, notes, shape, epoch_seconds=epoch)


def probe_fraction(model: nn.Module) -> tuple[int, float]:
    """How many latency probes the table times (the model included), and their mean cost against two full
    layers (attention weighed by its projections, the FFN by its two matrices)."""
    from surgery.compress.latency_measure import PROBE_LAYERS, probes, template_layer

    shape = Structure.from_model(model).kept[template_layer(model)]
    plan = probes(shape.heads, shape.ffn_width, PROBE_LAYERS)
    hidden = float(getattr(model.config, "hidden_size", 0) or getattr(model.config, "dim", 0) or 1)
    attention, ffn = 4 * hidden * hidden, 2 * hidden * max(shape.ffn_width, 1)

    def cost(p: Any) -> float:
        return p.layers * (attention * p.heads / max(shape.heads, 1) + ffn * p.ffn_width / max(shape.ffn_width, 1))

    full = PROBE_LAYERS * (attention + ffn)
    return len(plan) + 1, sum(cost(p) for p in plan) / (len(plan) * full)


def time_probes(model: nn.Module, *, runtime: Runtime, batch_size: int, seq_len: int, threads: int | None,
                fisher: Any, workdir: Path, unchanged: Unchanged, started: float | None = None
                ) -> tuple[Probes, dict[str, nn.Module]]:
    """Time the small steps of the module doc; returns them and the probe it wrote, loaded, by the latency table's
    name for it (the table's full-width probe: timed here, never written twice). ``unchanged`` is the model as
    it runs on ``runtime``, written once for the run: its export's seconds and a forward of it are the export and
    runtime probes. ``fisher()`` computes and returns the first Fisher batch; ``started`` (default: now) is when
    the estimate began (before ``unchanged`` was written, when it was written for it).
    """
    from surgery.compress.latency_measure import (
        PROBE_LAYERS,
        Probe,
        build_probe,
        probe_calibration_batches,
        runtime_model,
        template_layer,
    )
    from surgery.measure.timing import make_inputs, time_once, torch_threads

    started = time.perf_counter() if started is None else started
    device = next(model.parameters()).device
    inputs = make_inputs(int(model.config.vocab_size), batch_size=batch_size, seq_len=seq_len, device=device)

    def once(target: nn.Module) -> float:
        return time_once(target, inputs)

    with torch_threads(threads):
        forward = once(model)
        served = unchanged.served.model
        runtime_forward = forward if served is model else once(served)
        template = template_layer(model)
        shape = Structure.from_model(model).kept[template]
        since = time.perf_counter()
        probe = Probe(f"heads {shape.heads}", PROBE_LAYERS, shape.heads, shape.ffn_width)  # the table's own
        written = runtime_model(build_probe(model, probe, template), runtime, workdir / "probe", threads=threads,
                                calibration=probe_calibration_batches(model, seq_len))
        probe_export = time.perf_counter() - since
        probe_forward = once(written)
        first: FisherBatch = fisher()
    probes = Probes(forward=forward, runtime_forward=runtime_forward, export=unchanged.seconds,
                    probe_export=probe_export, probe_forward=probe_forward, fisher_batch=first.seconds,
                    seconds=time.perf_counter() - started)
    return probes, {probe.name: written}


def plan_settings(model: nn.Module, data: Any, target: Target, *, runtime: Runtime, against: Runtime,
                  batch_size: int, seq_len: int, threads: int | None, fisher_batches: int,
                  refit_batches: int, dev_examples: int, removable_layers: int, budget_seconds: float | None,
                  train: bool, fisher: Any, unchanged: Unchanged, started: float | None = None, workers: int = 1,
                  pad_to_multiple_of: int | None = None
                  ) -> tuple[JobEstimate, dict[str, nn.Module], tempfile.TemporaryDirectory[str]]:
    """Time the probes and estimate the job (see the module doc). Returns the estimate, the latency probe it wrote
    (loaded, by the table's name for it) and the temporary directory that holds it (removed when dropped)."""
    from surgery.compress.latency_measure import table_cached

    work = tempfile.TemporaryDirectory(prefix="surgery-estimate-")
    probes, written = time_probes(model, runtime=runtime, batch_size=batch_size, seq_len=seq_len, threads=threads,
                                  fisher=fisher, workdir=Path(work.name), unchanged=unchanged, started=started)
    count, fraction = probe_fraction(model)
    train_rows = len(getattr(data, "train", None) or [])
    shape = JobShape(layers=len(Structure.from_model(model).layers), removable_layers=removable_layers,
                     probes=count, probe_fraction=fraction, fisher_batches=fisher_batches, layer_batches=LAYER_BATCHES,
                     refit_batches=refit_batches, dev_batches=dev_examples / max(batch_size, 1),
                     dev_examples=dev_examples,
                     train_batches=math.ceil(train_rows / max(min(batch_size, 32), 1)),
                     target=target.speedup if isinstance(target, SpeedupTarget) else drop_target(probes),
                     drop_search=not isinstance(target, SpeedupTarget),
                     cached_table=table_cached(model, runtime=runtime.name, batch_size=batch_size, seq_len=seq_len,
                                               threads=threads, pad_to_multiple_of=pad_to_multiple_of),
                     runtime_differs=runtime.name != against.name, workers=workers,
                     wave=wave_share(workers, threads), alone=lone_share(workers, threads),
                     teacher_kept=refit_teacher_kept(model, refit_batches=refit_batches, batch_size=batch_size,
                                                     seq_len=seq_len))
    return estimate_job(probes, shape, budget_seconds=budget_seconds, train=train), written, work


def refit_teacher_kept(model: nn.Module, *, refit_batches: int, batch_size: int, seq_len: int) -> float:
    """The share of ``model``'s layers whose outputs a refit keeps for the next cut (at most
    :data:`~surgery.compress.candidates.REFIT_TEACHER_BYTES` a process): per layer, the two projections' outputs and
    the two residual sums they are added into, float32, every padded position counted (an upper bound).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> refit_teacher_kept(tiny_model(TinySpec("bert")), refit_batches=8, batch_size=32, seq_len=128)
        1.0
    """
    from surgery.compress.candidates import REFIT_TEACHER_BYTES

    layers = len(Structure.from_model(model).layers)
    per_layer = 4 * refit_batches * batch_size * seq_len * int(model.config.hidden_size) * 4
    if layers == 0 or per_layer == 0:
        return 0.0
    return min(layers, REFIT_TEACHER_BYTES // per_layer) / layers


def drop_target(p: Probes) -> float:
    """The speedup a --max-drop search's candidates are priced at: twice the runtime's own gain (the unchanged
    model there against the original in PyTorch). On OpenVINO int8 MiniLM-L6's --max-drop 1 candidates measured
    7-18x over a 5.7-6.2x runtime gain (experiments/compress_cost); priced at 2x, each was a full-width forward.

    Example:
        >>> drop_target(Probes(forward=0.24, runtime_forward=0.04, export=0.0, probe_export=0.0, probe_forward=0.0,
        ...                    fisher_batch=0.0))
        12.0
    """
    return 2.0 * p.runtime_gain


def forward_equivalents(model: nn.Module, target: Target, *, dev_examples: int, batch_size: int,
                        fisher_batches: int) -> float:
    """How many forwards of the timed batch a job runs by the estimate's own counts, exports left out: what one
    forward's estimate (:func:`surgery.measure.cost.forward_cost`) is multiplied by to judge a runaway job.

    A backward counts as two forwards (a Fisher batch as three); a latency probe as its share of the layers.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> n = forward_equivalents(tiny_model(TinySpec("bert")), SpeedupTarget(speedup=2), dev_examples=64,
        ...                         batch_size=32, fisher_batches=16)
        >>> 100 < n < 2000
        True
    """
    from surgery.compress.latency_measure import PROBE_LAYERS

    count, fraction = probe_fraction(model)
    layers = len(Structure.from_model(model).layers)
    unit = Probes(forward=1.0, runtime_forward=1.0, export=0.0, probe_export=0.0,
                  probe_forward=PROBE_LAYERS / max(layers, 1), fisher_batch=3.0)
    shape = JobShape(layers=layers, removable_layers=layers, probes=count, probe_fraction=fraction,
                     fisher_batches=fisher_batches, layer_batches=LAYER_BATCHES, refit_batches=8,
                     dev_batches=dev_examples / max(batch_size, 1), dev_examples=dev_examples, train_batches=0,
                     target=target.speedup if isinstance(target, SpeedupTarget) else 2.0,
                     drop_search=not isinstance(target, SpeedupTarget), cached_table=False, runtime_differs=True)
    return estimate_job(unit, shape, budget_seconds=None, train=False).total
