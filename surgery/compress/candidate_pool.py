"""Candidates built and judged in parallel worker processes; timing stays in the parent, one at a time.

Candidates are independent: each is cut, refitted, written as the runtime's artefact (NNCF int8 for
``openvino-int8``) and judged on the dev data. :class:`CandidatePool` runs those jobs in a
:class:`concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start method (a fork of a process
holding OpenMP/OpenVINO threads is unsafe), each worker held to ``cores // workers`` threads. Timing
is never done here: the parent times one candidate at a time so measurements stay clean.

What crosses processes: the original and every built model as safetensors files in the run's own
temporary directory (saved by :func:`surgery.persist.model_io.save_pretrained`, read back by
:func:`surgery.persist.model_io.from_pretrained`: no pickle of a module), the batches as one
safetensors file, the texts and settings as JSON; jobs and answers are plain data classes.
With one worker the jobs run in this process, on the caller's objects.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgery.compress.candidates import Judge, PartScores, apply_removal
from surgery.compress.removal_path import Removal
from surgery.core.errors import SurgeryError

#: The most workers chosen by default: each holds a copy of the model and its quantizer's statistics.
MAX_DEFAULT_WORKERS = 4
#: Below this many parameters one candidate costs less than starting a worker (importing torch and the
#: runtime): the default is then one process.
POOL_MIN_PARAMS = 2_000_000


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow).

    Example:
        >>> available_cores() >= 1
        True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_workers(model: nn.Module, cores: int | None = None) -> int:
    """Workers when none are asked for: one per core up to :data:`MAX_DEFAULT_WORKERS`; one for a tiny model.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> default_workers(tiny_model(TinySpec("bert")), cores=8)
        1
    """
    if sum(p.numel() for p in model.parameters()) < POOL_MIN_PARAMS:
        return 1
    return max(1, min(cores or available_cores(), MAX_DEFAULT_WORKERS))


def worker_threads(workers: int, threads: int | None, cores: int | None = None) -> int:
    """Threads each worker runs with: the cores shared out (``threads`` caps it when given).

    Example:
        >>> worker_threads(2, None, cores=16), worker_threads(4, 2, cores=16), worker_threads(8, None, cores=2)
        (8, 2, 1)
    """
    share = max(1, (cores or available_cores()) // max(workers, 1))
    return min(share, threads) if threads is not None else share


def pool_share(workers: int, threads: int | None, cores: int | None = None) -> int:
    """The cores a pool of ``workers`` holds: their threads together, at most the cores there are.

    Example:
        >>> pool_share(2, 1, cores=2), pool_share(4, 1, cores=2), pool_share(2, None, cores=8)
        (2, 2, 8)
    """
    cores = cores or available_cores()
    return min(workers * worker_threads(workers, threads, cores), cores)


@dataclass(frozen=True)
class BuildJob:
    """Build candidate ``index`` (cut, refit, the runtime's artefact) and judge it on ``parts``."""

    index: int
    removal: dict[str, Any]
    refit: bool
    parts: tuple[str, ...]
    int8_float: list[str] = field(default_factory=list)
    #: refit the cut against the inputs its int8 artefact feeds it (the runtime's quantization-aware refit)
    int8_refit: bool = False


@dataclass(frozen=True)
class JudgeJob:
    """Judge the already built candidate ``index`` on more ``parts`` (its artefact, or its weights for torch)."""

    index: int
    removal: dict[str, Any]
    directory: str | None
    weights: str | None
    parts: tuple[str, ...]
    int8_float: list[str] = field(default_factory=list)


@dataclass
class Built:
    """What a build job hands back: scores per part, where the files are, what happened."""

    index: int
    scores: dict[str, PartScores] = field(default_factory=dict)
    refitted: bool = False
    notes: list[str] = field(default_factory=list)
    directory: str | None = None
    digests: dict[str, str] = field(default_factory=dict)
    weights: str | None = None
    error: str | None = None
    seconds: float = 0.0
    #: built in a worker process (held to the pool's ``threads``), not in this one on the pool's whole share
    worker: bool = False
    #: seconds of its steps: ``cut`` (cut, refit and the calibration objective around it), ``artefact`` (the
    #: runtime's files written and loaded), ``scores`` (judged on the job's parts)
    steps: dict[str, float] = field(default_factory=dict)


def build_candidate(judge: Judge, job: BuildJob, *, save_weights: bool) -> tuple[Built, nn.Module | None]:
    """Cut, refit, serve and judge one candidate with ``judge``; its torch model saved to a file or returned."""
    started = time.perf_counter()
    removal = Removal.model_validate(job.removal)
    model, refitted, notes = judge.build(removal, refit=job.refit)
    if job.int8_float or job.int8_refit:  # the precision pass: a float map, a refit against int8 inputs, or both
        from surgery.compress.precision import precision_build

        notes += precision_build(model, judge, job.int8_float, int8_refit=job.int8_refit)
    steps = {"cut": time.perf_counter() - started}
    out = judge.workdir / f"candidate-{job.index}"
    try:
        # The unchanged model's files were written once for the run (the estimate, the table and its speedup
        # used them): judged on those, not exported again.
        unchanged = judge.unchanged if removal.units() == 0 and not job.int8_float and not job.int8_refit else None
        served = unchanged or judge.serve(model, out / "artefact")
    except (RuntimeError, ValueError, SurgeryError) as exc:
        if removal.units() == 0:  # the unchanged model must run: nothing to compare with otherwise
            raise
        # A structure the runtime cannot run (an FFN cut to width 0 on OpenVINO): skipped and said so.
        return Built(job.index, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}",
                     seconds=time.perf_counter() - started), None
    steps["artefact"] = time.perf_counter() - started - steps["cut"]
    scores = {part: judge.scores(served.model, part) for part in job.parts}
    steps["scores"] = time.perf_counter() - started - steps["cut"] - steps["artefact"]
    built = Built(job.index, scores, refitted is not None, notes,
                  None if served.directory is None else str(served.directory), served.digests,
                  steps={k: round(v, 3) for k, v in steps.items()})
    if save_weights:
        from safetensors.torch import save_model

        out.mkdir(parents=True, exist_ok=True)
        built.weights = str(out / "weights.safetensors")
        save_model(model, built.weights)
        model = None
    built.seconds = time.perf_counter() - started
    return built, model


def rebuilt(original: nn.Module, removal: Removal, weights: str, int8_float: Sequence[str] = ()) -> nn.Module:
    """The candidate a worker built: the original cut by ``removal`` (the same registered steps), its weights
    read, and its precision map recorded again (the weights file holds tensors only)."""
    from safetensors.torch import load_model

    model = copy.deepcopy(original)
    apply_removal(model, removal)
    load_model(model, weights)
    if int8_float:
        from surgery.core.manifest import set_int8_float

        set_int8_float(model, list(int8_float))
    return model.eval()


def judge_candidate(judge: Judge, job: JudgeJob, model: nn.Module | None = None) -> dict[str, PartScores]:
    """Scores of an already built candidate on more parts, read back from its files (or ``model``, in process)."""
    if model is None:
        assert job.weights is not None
        model = rebuilt(judge.original, Removal.model_validate(job.removal), job.weights, job.int8_float)
    served = model if job.directory is None else judge.load(Path(job.directory), model)
    return {part: judge.scores(served, part) for part in job.parts}


# -- the worker side ----------------------------------------------------------------------------
_WORKER: dict[str, Judge] = {}


def write_shared(judge: Judge, directory: Path) -> Path:
    """The files a worker rebuilds ``judge`` from: the original (safetensors), the batches, the original's
    embeddings computed so far (embedding objective), the settings."""
    from safetensors.torch import save_file

    from surgery.persist.model_io import save_pretrained

    save_pretrained(judge.original, directory / "original")
    if judge.tokenizer is not None and judge.objective == "embedding":
        judge.tokenizer.save_pretrained(directory / "tokenizer")
    tensors: dict[str, torch.Tensor] = {}
    groups = {"calibration": judge.calibration, "smoothing": judge.smoothing}
    if judge.objective == "task":
        groups.update({f"part.{name}": batches for name, batches in judge.parts.items()})
    for group, batches in groups.items():
        for i, batch in enumerate(batches):
            for key, value in batch.items():
                tensors[f"{group}/{i}/{key}"] = value.clone()  # own storage: one batch may be in two groups
    teacher_texts: list[str] = []
    if judge.objective == "embedding" and judge.tokenizer is not None:
        # The original's embeddings, computed once here (Judge.prepare_reference): no worker embeds them again.
        cache = judge.teacher_cache()
        teacher_texts = cache.known()
        if teacher_texts:
            tensors["teacher/0/embeddings"] = cache.embed(teacher_texts).clone()
    save_file(tensors, str(directory / "batches.safetensors"))
    settings = {"objective": judge.objective, "runtime": judge.runtime.name, "workdir": str(judge.workdir),
                "max_length": judge.max_length, "parts": list(judge.parts),
                "texts": judge.parts if judge.objective == "embedding" else {}, "teacher_texts": teacher_texts,
                "sentence": judge.sentence.to_dict() if judge.sentence is not None else None}
    (directory / "settings.json").write_text(json.dumps(settings))
    return directory


def read_shared(directory: Path, threads: int) -> Judge:
    """The :class:`Judge` :func:`write_shared` wrote, for a worker held to ``threads`` threads."""
    from safetensors.torch import load_file

    from surgery.persist.model_io import from_pretrained
    from surgery.persist.tokenizer_files import read_tokenizer

    settings = json.loads((directory / "settings.json").read_text())
    flat = load_file(str(directory / "batches.safetensors"))
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for key, value in flat.items():
        group, index, name = key.split("/")
        groups.setdefault(group, {}).setdefault(int(index), {})[name] = value

    def batches(group: str) -> list[dict[str, torch.Tensor]]:
        found = groups.get(group, {})
        return [found[i] for i in sorted(found)]

    sentence = None
    if settings["sentence"] is not None:
        from surgery.embedding.pooling import SentenceConfig

        raw = settings["sentence"]
        sentence = SentenceConfig(**{**raw, "modes": tuple(raw["modes"])})
    parts: dict[str, list[Any]] = ({name: batches(f"part.{name}") for name in settings["parts"]}
                                   if settings["objective"] == "task" else dict(settings["texts"]))
    original = from_pretrained(directory / "original").eval()
    tokenizer = read_tokenizer(directory / "tokenizer") if (directory / "tokenizer").exists() else None
    judge = Judge(original=original, objective=settings["objective"], runtime=settings["runtime"],
                  calibration=batches("calibration"), workdir=Path(settings["workdir"]),
                  smoothing=batches("smoothing"), tokenizer=tokenizer, sentence=sentence,
                  max_length=settings["max_length"], threads=threads, parts=parts)
    teacher_texts = settings.get("teacher_texts") or []
    if teacher_texts and "teacher" in groups:
        judge.teacher_cache().add(teacher_texts, groups["teacher"][0]["embeddings"])
    return judge


def start_worker(shared: str, threads: int) -> None:
    """A worker's start: its thread count, then the judge from the shared files (once per process)."""
    torch.set_num_threads(threads)
    _WORKER["judge"] = read_shared(Path(shared), threads)


def worker_build(job: BuildJob) -> Built:
    return replace(build_candidate(_WORKER["judge"], job, save_weights=True)[0], worker=True)


def worker_judge(job: JudgeJob) -> tuple[dict[str, PartScores], float]:
    """A judge job in a worker: its scores, and the seconds it took there (not counting its wait in the queue)."""
    started = time.perf_counter()
    return judge_candidate(_WORKER["judge"], job), time.perf_counter() - started


def split_jobs(count: int, workers: int) -> tuple[int, int]:
    """How many of ``count`` jobs go to ``workers`` worker processes and how many are built in this process.

    Workers take waves of ``workers`` jobs at once, each held to its share of the cores. A job left alone in the
    last wave is built here with all of them instead: in a worker it holds one share and the rest of the machine
    waits (a round of three on two workers ended with one job on one of the two cores). With one worker everything
    is built here.

    Example:
        >>> split_jobs(3, 2), split_jobs(4, 2), split_jobs(1, 2), split_jobs(5, 4), split_jobs(6, 4), split_jobs(3, 1)
        ((2, 1), (4, 0), (0, 1), (4, 1), (6, 0), (0, 3))
    """
    if workers <= 1:
        return 0, count
    lone = 1 if count % workers == 1 else 0
    return count - lone, lone


class CandidatePool:
    """Build and judge jobs, in this process (one worker) or in ``workers`` spawned processes.

    Answers come back in the order of the jobs whatever order they finish in, so the search that
    reads them decides the same way with any number of workers.
    """

    def __init__(self, judge: Judge, workers: int, threads: int | None = None) -> None:
        self.judge, self.workers = judge, max(1, workers)
        self.threads = worker_threads(self.workers, threads)
        #: the cores the pool holds (:func:`pool_share`): what a job run here while the workers wait gets
        self.share = pool_share(self.workers, threads)
        self.executor: ProcessPoolExecutor | None = None
        #: candidate index -> its torch model, for jobs run in this process
        self.models: dict[int, nn.Module] = {}

    def start(self) -> None:
        if self.workers == 1 or self.executor is not None:
            return
        shared = write_shared(self.judge, self.judge.workdir / "shared")
        self.executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"),
                                            initializer=start_worker, initargs=(str(shared), self.threads))

    @contextmanager
    def whole_share(self) -> Iterator[None]:
        """A job run in this process while the workers wait gets the pool's :attr:`share` of threads (its build,
        refit and judging; timing is not done in jobs), not only the caller's: at ``--threads 1`` with two workers
        a lone last job of a round held one core and the other waited. With one worker, or where the caller
        already runs on every core (``threads`` unset), nothing changes."""
        judged = self.judge.threads
        if self.workers == 1 or judged is None or judged >= self.share:
            yield
            return
        held = torch.get_num_threads()
        self.judge.threads = self.share
        torch.set_num_threads(self.share)
        try:
            yield
        finally:
            torch.set_num_threads(held)
            self.judge.threads = judged

    def build(self, jobs: Sequence[BuildJob]) -> list[Built]:
        """Build ``jobs``: in waves of :attr:`workers` at once in the worker processes, and a last job left alone
        in a wave here, on the pool's whole share of cores (:func:`split_jobs`, :meth:`whole_share`)."""
        away, _ = split_jobs(len(jobs), self.workers)
        answers: list[Built] = []
        if away:
            self.start()
            assert self.executor is not None
            answers += list(self.executor.map(worker_build, jobs[:away]))
        for job in jobs[away:]:
            with self.whole_share():
                built, model = build_candidate(self.judge, job, save_weights=False)
            if model is not None:
                self.models[job.index] = model
            answers.append(built)
        return answers

    def judge_more(self, jobs: Sequence[JudgeJob]) -> list[dict[str, PartScores]]:
        if not jobs:
            return []
        # Jobs of models built in this process (the first, alone) run here: no worker has their weights.
        here = [j for j in jobs if self.executor is None or len(jobs) == 1 or j.weights is None]
        with self.whole_share():  # the workers wait meanwhile
            answers = {j.index: judge_candidate(self.judge, j, self.models.get(j.index)) for j in here}
        away = [j for j in jobs if j not in here]
        if away:
            assert self.executor is not None
            answers.update(zip((j.index for j in away), (scores for scores, _ in self.executor.map(worker_judge, away)),
                               strict=True))
        return [answers[j.index] for j in jobs]

    def submit_build(self, job: BuildJob) -> Future[Built]:
        """``job`` queued for the next free worker (the workers started if they were not): for a search that keeps
        every worker busy with steps of its own (:meth:`~surgery.compress.candidate_run.CandidateRun.run_chains`)
        rather than handing over a round at once (:meth:`build`). Its answer is marked built in a worker."""
        self.start()
        assert self.executor is not None, "submit_build needs worker processes (workers > 1)"
        return self.executor.submit(worker_build, job)

    def submit_judge(self, job: JudgeJob) -> Future[tuple[dict[str, PartScores], float]]:
        """A judge job of a candidate built in a worker (its weights in a file), queued like :meth:`submit_build`:
        its scores and the seconds it took in the worker."""
        self.start()
        assert self.executor is not None and job.weights is not None, "submit_judge needs a worker-built candidate"
        return self.executor.submit(worker_judge, job)

    def model(self, index: int, removal: Removal, weights: str | None, int8_float: Sequence[str] = ()) -> nn.Module:
        """Candidate ``index``'s torch model: kept in this process, or read back from its weights."""
        if index not in self.models:
            assert weights is not None
            self.models[index] = rebuilt(self.judge.original, removal, weights, int8_float)
        return self.models[index]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None

