"""``surgery.compress``: a model N times faster on this machine's runtime, at the smallest loss, in one call.

Phases, each reported as progress and timed in the report:

1. the batch shape (the user's, or read off the data) and the calibration batches;
2. the latency table of the original on the target runtime (measured on this machine), and, when
   the target runtime is not the reference one, the original's own speedup there;
3. what every head, neuron group and layer carries (:mod:`surgery.compress.mask_fisher`);
4. the search (:mod:`surgery.compress.removal_path`): one path of removals, every speed point on it,
   and the same search over heads and neurons only (Kwon et al.'s space) and with every layer cut
   alike (the uniform cuts this project measured);
5. candidates, each cut, refitted, written as the runtime's artefact (ONNX graph, OpenVINO IR, bf16
   weights; int8 calibrated on the user's batches), loaded, and judged and timed on that artefact against
   the original: path points around the target (``--speedup``) or found by bisection along the
   paths (``--max-drop``), the points of the units-only and the uniform paths, the unchanged model
   on the runtime (smoothed int8 alone, for ``onnxruntime-int8``) and a uniform layer-drop at the
   same predicted speed; each timed side by side;
6. the pick, then the training tier on the winner when the budget leaves whole epochs for it; the
   winner's artefact (the judged files) is handed back in the result, never exported again.

``--runtime auto`` (:mod:`surgery.compress.auto_runtime`) runs this on every runtime available here
that can reach the target and keeps the best.

Phases 1-4 live in :mod:`surgery.compress.plan`, 5-6 in :mod:`surgery.compress.candidate_run`.

The budget (minutes) covers the whole job: a candidate whose expected cost no longer fits is
skipped and said so, and training gets only the time that is left.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from torch import nn

from surgery.compress.candidate_run import CandidateRun
from surgery.compress.candidates import Judge
from surgery.compress.compress_report import CompressResult
from surgery.compress.config import CompressConfig
from surgery.compress.latency_source import LatencySource, MeasuredLatency
from surgery.compress.mask_fisher import ObjectiveName, UnitCosts
from surgery.compress.plan import CALIBRATION_BATCH, Clock, check_arguments, data_objective, plan_compress
from surgery.core.errors import ConfigError, DataError
from surgery.core.progress import ProgressCallback, no_progress
from surgery.data.task_data import check_label_order
from surgery.persist.config_values import check_data_argument, check_model_argument


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


def compress(model: nn.Module, data: Any, config: CompressConfig | None = None, *, eval_data: Any = None,
             latency: LatencySource | None = None, progress: ProgressCallback | None = None,
             **settings: Any) -> CompressResult:
    """Make ``model`` reach the target of ``config`` on its runtime at the smallest loss; judged against the original.

    Args:
        model: the original (a task model with ``data`` labelled, or an encoder with unlabelled texts);
            it is not changed.
        data: :class:`surgery.data.task_data.TaskData` (task objective) or :class:`surgery.embedding.TextData`
            (embedding objective); its training split calibrates, its eval split judges.
        config: the settings (:class:`~surgery.compress.config.CompressConfig`): the target (``speedup``,
            ``max_drop``), the ``runtime`` (any registered name, or ``auto``), the budget, the batch shape.
        eval_data: held-out data to judge on instead of ``data``'s eval split.
        latency: where times come from (default: measured on this machine).
        progress: called with progress events.
        **settings: the config's fields as keywords instead of ``config`` (``target=SpeedupTarget(...)``
            stands for ``speedup`` and ``max_drop``).

    Returns:
        One :class:`CompressResult`: the chosen model, the report (its ``config`` the settings by the
        same names), the candidates, and the winner's runtime artefact (``artefact``), the very files
        it was judged and timed on.

    Example:
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> model, report, candidates = compress(model, tiny_task_data(), CompressConfig(max_drop=2.0),
        ...                                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> report.winner_result().drop <= 2.0, report.reference, report.config["runtime"]
        (True, 'the original model in torch (fp32), unchanged', 'torch')
    """
    check_model_argument(model, "compress")  # a name or path is refused in one line, saying how to load it
    check_data_argument(data, "compress")
    check_data_argument(eval_data, "compress", "eval_data")
    if config is None:
        config = CompressConfig.build(**settings)
    elif not isinstance(config, CompressConfig):
        raise ConfigError(f"compress: config must be a CompressConfig, got {type(config).__name__}")
    elif settings:
        raise ConfigError(f"compress: pass settings in the CompressConfig or as keywords, not both (got "
                          f"{', '.join(sorted(settings))})")
    if config.auto:
        from surgery.compress.auto_runtime import compress_auto

        return compress_auto(model, data, config, eval_data=eval_data, latency=latency, progress=progress)
    result, _ = compress_on(model, data, config, runtime=config.runtime, eval_data=eval_data, latency=latency,
                            progress=progress, clock=Clock(config.budget_minutes))
    return result


def compress_on(model: nn.Module, data: Any, config: CompressConfig, *, runtime: str, eval_data: Any = None,
                latency: LatencySource | None = None, progress: ProgressCallback | None = None,
                clock: Clock, costs: UnitCosts | None = None) -> tuple[CompressResult, UnitCosts]:
    """One search on one ``runtime`` (phases 1-6) within ``clock``; returns the result and the unit costs it read."""
    budget_minutes = None if clock.deadline is None else round(max(clock.left(), 0.0) / 60.0, 3)
    check_arguments(config.target, runtime, config.against_runtime, None, config.batch_size, config.seq_len,
                    config.objective)
    emit = progress or no_progress
    was_training = model.training
    model.eval()
    try:
        # The held-out data is checked before any work: without it no candidate can be judged.
        dev, texts = _dev_source(data, eval_data, data_objective(data, config.objective),
                                 config.batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH)))
        if type(model).__name__.endswith("ForSequenceClassification"):  # ids numbered as the head reads them
            for name, source in (("compress: the data", data), ("compress: the eval data", eval_data)):
                check_label_order(model.config, getattr(source, "label_names", None) or [], name)
        plan = plan_compress(model, data, target=config.target, runtime=runtime,
                             against_runtime=config.against_runtime, objective=config.objective,
                             batch_size=config.batch_size, seq_len=config.seq_len, stock=config.stock,
                             latency=latency, threads=config.threads, progress=progress, clock=clock, costs=costs)
        source = latency or MeasuredLatency(batch_size=plan.batch_size, seq_len=plan.seq_len, threads=config.threads)
        with tempfile.TemporaryDirectory(prefix="surgery-compress-") as tmp:
            judge = Judge(original=model, objective=plan.objective, runtime=runtime, calibration=plan.calibration,
                          smoothing=plan.smoothing, workdir=Path(tmp), dev=dev, texts=texts,
                          tokenizer=getattr(data, "tokenizer", None), sentence=getattr(data, "sentence_config", None),
                          max_length=(getattr(data, "info", None) or {}).get("max_length"), threads=config.threads)
            run = CandidateRun(plan, judge, source, clock, emit, config.target, runtime, config.against_runtime)
            run.try_all()
            winner, why, warnings = run.pick()
            final_model, winner_name, training = run.train_winner(winner, data, budget_minutes, config.seed,
                                                                  train=config.train)
            # The judged files themselves leave the work directory (moved, never written again).
            artefact = keep_artefact(run.artefacts.get(winner_name))
        report = run.report(winner_name, why, warnings, training, budget_minutes, config.threads, config.stock,
                            clock)
        report.text_length = dict((getattr(data, "info", None) or {}).get("text_length") or {})
        report.config = config.model_dump(mode="json")
        report.artefact = dict(report.winner_result().artefact) if report.winner_result() else {}
    finally:
        model.train(was_training)
    result = CompressResult(final_model, report, plan.smoothing, artefact)
    if artefact is not None:  # removed with the result, unless the caller moved it away first
        weakref.finalize(result, shutil.rmtree, artefact.parent, True)
    return result, plan.costs


def keep_artefact(directory: Path | None) -> Path | None:
    """Move a judged artefact's directory out of the run's work directory into a new temporary one.

    A move on one filesystem renames; across filesystems it copies the bytes: either way the files
    are the ones judged (:attr:`CandidateResult.artefact` holds their digests).

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
    kept = Path(tempfile.mkdtemp(prefix="surgery-compress-artefact-")) / "artefact"
    shutil.move(str(directory), str(kept))
    return kept
