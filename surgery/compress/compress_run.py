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

Phases 1-4 live in :mod:`surgery.compress.plan`, 5-6 in :mod:`surgery.compress.candidate_run`.

The budget (minutes) covers the whole job: a candidate whose expected cost no longer fits is
skipped and said so, and training gets only the time that is left.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from surgery.compress.candidate_run import CandidateRun
from surgery.compress.candidates import Judge
from surgery.compress.compress_report import CompressResult, Target
from surgery.compress.latency_source import LatencySource, MeasuredLatency
from surgery.compress.mask_fisher import ObjectiveName
from surgery.compress.plan import CALIBRATION_BATCH, Clock, check_arguments, data_objective, plan_compress
from surgery.core.errors import DataError
from surgery.core.progress import ProgressCallback, no_progress
from surgery.data.task_data import check_label_order


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
        >>> from surgery.compress import DropTarget
        >>> from surgery.compress.latency_source import TableLatency
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> model, report, candidates = compress(model, tiny_task_data(), target=DropTarget(max_drop=2.0),
        ...                                      latency=TableLatency({"torch": shape_latency_table(model)}))
        >>> report.winner_result().drop <= 2.0, report.reference
        (True, 'the original model in torch (fp32), unchanged')
    """
    check_arguments(target, runtime, against_runtime, budget_minutes, batch_size, seq_len, objective)
    clock = Clock(budget_minutes)
    emit = progress or no_progress
    was_training = model.training
    model.eval()
    try:
        # The held-out data is checked before any work: without it no candidate can be judged.
        dev, texts = _dev_source(data, eval_data, data_objective(data, objective),
                                 batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH)))
        if type(model).__name__.endswith("ForSequenceClassification"):  # ids numbered as the head reads them
            for name, source in (("compress: the data", data), ("compress: the eval data", eval_data)):
                check_label_order(model.config, getattr(source, "label_names", None) or [], name)
        plan = plan_compress(model, data, target=target, runtime=runtime, against_runtime=against_runtime,
                             objective=objective, batch_size=batch_size, seq_len=seq_len, stock=stock,
                             latency=latency, threads=threads, progress=progress, clock=clock)
        source = latency or MeasuredLatency(batch_size=plan.batch_size, seq_len=plan.seq_len, threads=threads)
        with tempfile.TemporaryDirectory(prefix="surgery-compress-") as tmp:
            judge = Judge(original=model, objective=plan.objective, runtime=runtime, calibration=plan.calibration,
                          smoothing=plan.smoothing, workdir=Path(tmp), dev=dev, texts=texts,
                          tokenizer=getattr(data, "tokenizer", None), sentence=getattr(data, "sentence_config", None),
                          max_length=(getattr(data, "info", None) or {}).get("max_length"), threads=threads)
            run = CandidateRun(plan, judge, source, clock, emit, target, runtime, against_runtime)
            run.try_all()
            winner, why, warnings = run.pick()
            final_model, winner_name, training = run.train_winner(winner, data, budget_minutes, seed, train=train)
        report = run.report(winner_name, why, warnings, training, budget_minutes, threads, stock, clock)
        report.text_length = dict((getattr(data, "info", None) or {}).get("text_length") or {})
    finally:
        model.train(was_training)
    return CompressResult(final_model, report, plan.smoothing)
