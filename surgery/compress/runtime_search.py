"""One search of ``surgery compress`` on one runtime (phases 1-6), and what a search on several shares.

:func:`compress_on` is the whole search on one runtime; :func:`surgery.compress.compress_run.compress`
calls it once, and ``--runtime auto`` (:mod:`surgery.compress.auto_runtime`) once per runtime. Both
import it from here, so neither imports the other.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.compress.candidate_pool import default_workers
from surgery.compress.candidate_run import CandidateRun
from surgery.compress.candidates import Judge, Unchanged, file_digests
from surgery.compress.compress_report import CompressResult, KeptDirectory
from surgery.compress.config import CompressConfig
from surgery.compress.held_out import DevSplit, split_dev
from surgery.compress.latency_source import LatencySource, MeasuredLatency
from surgery.compress.mask_fisher import ObjectiveName, UnitCosts
from surgery.compress.plan import CALIBRATION_BATCH, Clock, data_objective, plan_compress
from surgery.core.errors import DataError
from surgery.core.progress import ProgressCallback, no_progress
from surgery.data.task_data import check_label_order
from surgery.measure.memory import peak_rss_bytes

if TYPE_CHECKING:
    from surgery.runtimes import Runtime


def dev_source(data: Any, eval_data: Any, objective: ObjectiveName, batch_size: int) -> tuple[list[Any], list[str]]:
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


def dev_table(data: Any, eval_data: Any) -> tuple[Any, str]:
    """Where a task's dev examples live: ``eval_data`` (else ``data``) and its split, ``eval`` if it has one
    (else ``train``: eval data given as one table)."""
    source = eval_data if eval_data is not None else data
    return source, "eval" if getattr(source, "eval", None) is not None else "train"


def dev_parts(data: Any, eval_data: Any, objective: ObjectiveName, batch_size: int,
              dev: list[Any], texts: list[str], examples: int | None = None) -> tuple[dict[str, list[Any]], DevSplit]:
    """The dev data split (:func:`surgery.compress.held_out.split_dev`) into the search's screen, the rest of
    the search's part and the held-out pick part: texts (embedding) or batches of those examples (task).
    ``examples``: a budget's seeded subsample of the dev data to split instead (None: all of it).

    Example:
        >>> from surgery.testing import tiny_task_data
        >>> data = tiny_task_data(96)
        >>> dev, texts = dev_source(data, None, "task", 8)
        >>> parts, split = dev_parts(data, None, "task", 8, dev, texts, examples=40)
        >>> split.judged, split.drawn_from == len(data.eval), sum(len(b["labels"]) for p in parts.values() for b in p)
        (40, True, 40)
    """
    if objective == "embedding":
        split = split_dev(len(texts), examples=examples)
        return {name: [texts[i] for i in getattr(split, name)] for name in ("screen", "rest", "pick")}, split
    source, name = dev_table(data, eval_data)
    table = getattr(source, name)
    if dataclasses.is_dataclass(source) and hasattr(table, "select"):  # TaskData: the examples themselves
        split = split_dev(len(table), examples=examples)

        def batches(indices: tuple[int, ...]) -> list[Any]:
            if not indices:
                return []
            part = dataclasses.replace(source, **{name: table.select(list(indices))})
            return list(part.loader(name, batch_size=batch_size))

        return {part: batches(getattr(split, part)) for part in ("screen", "rest", "pick")}, split
    # A loader only: whole batches split (a subsample: as many batches as hold about ``examples``).
    total = sum(int(b["input_ids"].shape[0]) for b in dev)
    split = split_dev(len(dev), examples=None if examples is None or total <= examples
                      else max(2, math.ceil(examples * len(dev) / max(total, 1))))
    return {part: [dev[i] for i in getattr(split, part)] for part in ("screen", "rest", "pick")}, split


def search_part_data(data: Any, eval_data: Any, split: DevSplit) -> Any:
    """``data`` whose eval split is the search part of the dev examples only, for the training tier to measure
    its epochs on: the examples the pick holds out never steer training.

    Where the dev examples cannot be selected (a loader only), the eval split is dropped instead, so the
    training tier measures nothing rather than the pick's part.

    Example:
        >>> from surgery.testing import tiny_task_data
        >>> data = tiny_task_data(8)
        >>> split = split_dev(len(data.eval))
        >>> len(search_part_data(data, None, split).eval) == len(split.search) < len(data.eval)
        True
    """
    source, name = dev_table(data, eval_data)
    table = getattr(source, name, None)
    if dataclasses.is_dataclass(data) and hasattr(table, "select"):
        return dataclasses.replace(data, eval=table.select(list(split.search)))  # type: ignore[arg-type]
    if getattr(data, "eval", None) is None or (eval_data is not None and eval_data is not data):
        return data  # its eval split is not the dev split: the pick's part is not in it
    if dataclasses.is_dataclass(data):
        return dataclasses.replace(data, eval=None)  # type: ignore[arg-type]
    dropped = copy.copy(data)
    dropped.eval = None
    return dropped


def compress_on(model: nn.Module, data: Any, config: CompressConfig, *, runtime: Runtime, against: Runtime,
                eval_data: Any = None, latency: LatencySource | None = None, progress: ProgressCallback | None = None,
                clock: Clock, costs: UnitCosts | None = None, unchanged: Unchanged | None = None
                ) -> tuple[CompressResult, UnitCosts]:
    """One search on one ``runtime`` (phases 1-6) within ``clock``; returns the result and the unit costs it read.

    ``config`` is the run's settings, validated once (its ``runtime`` is ``runtime``'s name, or ``auto``);
    ``runtime`` and ``against`` are its runtimes resolved once by the caller (:func:`surgery.runtimes.get_runtime`),
    handed on as they are. ``unchanged``: the unchanged model already written (and timed) on ``runtime`` for
    this run, used as it is.
    """
    budget_minutes = None if clock.deadline is None else round(max(clock.left(), 0.0) / 60.0, 3)
    emit = progress or no_progress
    was_training = model.training
    model.eval()
    try:
        # The held-out data is checked before any work: without it no candidate can be judged.
        objective = data_objective(data, config.objective)
        batch = config.batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH))
        dev, texts = dev_source(data, eval_data, objective, batch)
        if type(model).__name__.endswith("ForSequenceClassification"):  # ids numbered as the head reads them
            for name, source in (("compress: the data", data), ("compress: the eval data", eval_data)):
                check_label_order(model.config, getattr(source, "label_names", None) or [], name)
        plan = plan_compress(model, data, config, runtime=runtime, against=against, latency=latency,
                             progress=progress, clock=clock, costs=costs, unchanged=unchanged,
                             dev_examples=sum(int(b["input_ids"].shape[0]) for b in dev) or len(texts))
        # Split once the estimate has said how many dev examples the budget affords (a seeded subsample, or all);
        # the judge holds those only, so that nothing reads the rest (the original's accuracy included).
        parts, split = dev_parts(data, eval_data, objective, batch, dev, texts, plan.dev_examples)
        if split.judged < split.drawn_from:
            dev = [b for name in ("screen", "rest", "pick") for b in parts[name]] if dev else []
            texts = [t for name in ("screen", "rest", "pick") for t in parts[name]] if texts else []
        source = latency or MeasuredLatency(batch_size=plan.batch_size, seq_len=plan.seq_len, threads=config.threads,
                                            repeats=plan.speedup_repeats, batches=plan.batches,
                                            pad_to_multiple_of=plan.alignment.multiple if plan.alignment else None)
        with tempfile.TemporaryDirectory(prefix="surgery-compress-") as tmp:
            judge = Judge(original=model, objective=plan.objective, runtime=runtime, calibration=plan.calibration,
                          smoothing=plan.smoothing, workdir=Path(tmp), dev=dev, texts=texts,
                          tokenizer=getattr(data, "tokenizer", None), sentence=getattr(data, "sentence_config", None),
                          max_length=(getattr(data, "info", None) or {}).get("max_length"), threads=config.threads,
                          parts=parts, unchanged=None if plan.unchanged is None or plan.unchanged.served.directory
                          is None else plan.unchanged.served)
            workers = config.workers or default_workers(model)
            run = CandidateRun(plan, judge, source, clock, emit, config.target, runtime, against,
                               split=split, workers=workers, threads=config.threads,
                               trains=config.train and budget_minutes is not None)
            try:
                run.try_all()
                winner, why, warnings = run.pick()
            finally:
                run.pool.close()
            final_model, winner_name, training = run.train_winner(winner, search_part_data(data, eval_data, split),
                                                                  budget_minutes, config.seed, train=config.train)
            # The judged files themselves leave the work directory (moved, never written again).
            artefact = keep_artefact(run.artefacts.get(winner_name))
            aligned = artefact is not None and plan.alignment is not None and plan.alignment.multiple is not None
            if aligned:
                runtime.align(artefact, plan.alignment.multiple,  # served padded, as it was timed
                              f"compress measured it on the unchanged model: {plan.alignment.why()}")
        report = run.report(winner_name, why, warnings, training, budget_minutes, config.threads, config.stock,
                            clock)
        report.text_length = dict((getattr(data, "info", None) or {}).get("text_length") or {})
        report.config = config.model_dump(mode="json")
        report.artefact = dict(report.winner_result().artefact) if report.winner_result() else {}
        report.alignment = plan.alignment.model_dump(mode="json") if plan.alignment is not None else None
        if aligned:  # the record now says how the artefact is served: its digests again, the winner's too
            report.artefact = file_digests(Path(artefact))
            report.winner_result().artefact = dict(report.artefact)
            report.notes.append(f"the {runtime.name} artefact pads each batch: {plan.alignment.why()} on the "
                                "unchanged model (alignment in compress.json)")
        if plan.estimate is not None:  # estimated before the work, against what each phase took
            report.estimate = plan.estimate.report(report.phases)
            report.notes.extend(f"estimate: {n}" for n in plan.estimate.notes)
        report.peak_rss_bytes = peak_rss_bytes()
    finally:
        model.train(was_training)
    return CompressResult(final_model, report, plan.smoothing, artefact), plan.costs


def keep_artefact(directory: Path | None) -> KeptDirectory | None:
    """Move a judged artefact's directory out of the run's work directory into a new temporary one.

    A move on one filesystem renames; across filesystems it copies the bytes: either way the files
    are the ones judged (:attr:`CandidateResult.artefact` holds their digests). The returned path
    keeps them on disk while it is used (:class:`KeptDirectory`).

    Example:
        >>> import tempfile
        >>> src = Path(tempfile.mkdtemp()) / "candidate-1"
        >>> src.mkdir(); _ = (src / "model.onnx").write_bytes(b"graph")
        >>> kept = keep_artefact(src)
        >>> (kept / "model.onnx").read_bytes(), src.exists(), keep_artefact(None)
        (b'graph', False, None)
    """
    if directory is None:
        return None
    kept = KeptDirectory.take(Path(tempfile.mkdtemp(prefix="surgery-compress-artefact-")))
    kept.rmdir()  # shutil.move renames onto a missing path
    shutil.move(str(directory), str(kept))
    return kept
