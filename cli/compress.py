"""``surgery compress``: a model N times faster on this machine and runtime, at the smallest loss, in one command.

The command checks its cheap inputs (paths, target, runtime, budget) first, loads the model and
data the way ``apply`` does (:func:`surgery.cli.prepare.prepare_inputs`, objective detected the same
way), runs :func:`surgery.compress` and saves into OUT, in one atomic save: the model as every
surgery model (plus the winner's runtime artefact, the very files it was judged and timed on, under
``OUT/onnx``, ``OUT/openvino`` or ``OUT/<runtime>``: the runtime's own folder), ``compress.json``
(the report), ``README.md`` (what OUT holds, the winner's measured speed and accuracy, and the lines that
serve it; ``surgery inspect OUT`` prints the same) and ``pareto.png`` (when matplotlib is installed).
``--dry-run`` prints the latency prediction and the structure it would cut, and writes nothing. With
``--strict`` a missed target or a drop beyond ``--max-drop`` exits 3.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from surgery.cli.console import CliState, note, stderr, stdout
from surgery.cli.options import (
    EvalData,
    LabelColumn,
    MaxLengthAuto,
    MaxTrain,
    Overwrite,
    Seed,
    TextColumn,
    TextPairColumn,
)
from surgery.cli.outputs import decide_outputs
from surgery.core.errors import ConfigError, SurgeryError
from surgery.data.data_diagnosis import DATA_FORMATS, TABLE_SUFFIXES, TEXT_SUFFIXES, check_input_file
from surgery.persist.assets import resolve_model_path
from surgery.persist.config_values import (
    check_batch_memory,
    check_lengths,
    check_max_drop,
    check_speedup,
    threads_warning,
)

EXIT_STRICT = 3
#: What ``--budget`` keeps back for the save after the job: a floor, and the model's weights at this rate. Saving
#: BERT-base widths (440 MB) took 0.9 s here and BERT-large's (1.3 GB) 3.1 s; the winner's artefact and reports are
#: written beside them.
SAVE_FLOOR_SECONDS, SAVE_BYTES_PER_SECOND = 5.0, 100e6
REPORT_NAME = "compress.json"
#: What OUT holds and how to serve it, generated from the report (``surgery inspect OUT`` prints the same).
README_NAME = "README.md"
PARETO_NAME = "pareto.png"
#: Where in OUT an ONNX Runtime artefact lands (each runtime names its own folder: Runtime.folder).
ONNX_DIR = "onnx"


class CompressObjectives:
    """What :func:`~surgery.cli.prepare.prepare_inputs` asks of a method to choose the objective: both work here."""

    name = "compress"
    objectives = ("task", "embedding")
    objective_flag = "--objective "  # what the objective note tells the user to pass (not apply's --set)


def check_target(speedup: float | None, max_drop: float | None) -> Any:
    """The target the flags ask for, or a one-line ConfigError.

    Example:
        >>> check_target(2.0, None).describe(), check_target(None, 1.0).describe()
        ('--speedup 2', '--max-drop 1')
        >>> check_target(3.0, 0.5).describe()
        '--speedup 3 --max-drop 0.5'
    """
    check_target_values(speedup, max_drop)
    from surgery.compress.compress_report import DropTarget, SpeedupTarget  # imports torch: after the checks

    if speedup is not None:
        return SpeedupTarget(speedup=speedup, max_drop=max_drop)
    return DropTarget(max_drop=max_drop)


def check_target_values(speedup: float | None, max_drop: float | None) -> None:
    """Refuse a missing or impossible target in one line, importing nothing heavy.

    Example:
        >>> check_target_values(float("inf"), None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --speedup must be more than 1 and finite (...), got inf
    """
    if speedup is None and max_drop is None:
        raise ConfigError("give a target: --speedup X (times faster than the original) or --max-drop P (points of "
                          "accuracy or fidelity it may lose)")
    check_speedup(speedup)
    check_max_drop(max_drop)


def check_runtime(name: str, flag: str, *, auto: bool = False) -> str:
    """``name`` if it is a registered runtime (``auto`` where allowed) that runs here, else one line naming ``flag``.

    Example:
        >>> check_runtime("torch", "--runtime"), check_runtime("auto", "--runtime", auto=True)
        ('torch', 'auto')
        >>> check_runtime("tensorrt-doc", "--runtime")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --runtime 'tensorrt-doc': choose one of torch, torch-bf16, ...
    """
    from surgery.runtimes import get_runtime, runtime_names

    if auto and name == "auto":
        return name
    if name not in runtime_names():
        choices = [*runtime_names(), *(["auto"] if auto else [])]
        raise ConfigError(f"{flag} {name!r}: choose one of {', '.join(choices)}")
    try:
        get_runtime(name)  # not available here: its one line (the missing package's extra, the CPU flag)
    except SurgeryError as exc:  # ConfigError or MissingDependencyError
        raise type(exc)(f"{flag} {exc}") from None
    return name


def candidate_points(report: Any) -> list[dict[str, Any]]:
    """One plot point per timed candidate: measured speedup against % of the original's accuracy or fidelity.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> c = NS(name="path-3", origin="path", tier="refit", measured_speedup=2.0, accuracy=0.8, mean_cosine=None)
        >>> candidate_points(NS(candidates=[c], winner="path-3", original={"accuracy": 0.9}, objective="task"))
        [{'label': 'path (refit)', 'group': 'winner', 'speedup': 2.0, 'retained': 88.88888888888889}]
    """
    points = []
    for c in report.candidates:
        if c.measured_speedup is None:
            continue
        if report.objective == "task":
            ref = report.original.get("accuracy")
            if not ref or c.accuracy is None:
                continue
            retained = 100.0 * c.accuracy / ref
        else:
            if c.mean_cosine is None:
                continue
            retained = 100.0 * c.mean_cosine
        points.append({"label": f"{c.origin} ({c.tier})", "group": "winner" if c.name == report.winner else "tried",
                       "speedup": c.measured_speedup, "retained": retained})
    return points


def read_report(directory: Path) -> Any:
    """The :class:`~surgery.compress.compress_report.CompressReport` saved in ``directory``; one line if it is not."""
    from pydantic import ValidationError

    from surgery.compress.compress_report import CompressReport
    from surgery.persist.untrusted import read_json_file

    path = directory / REPORT_NAME
    try:
        return CompressReport.model_validate(read_json_file(path, what="compress report", fix="run compress again"))
    except ValidationError as exc:
        raise ConfigError(f"{path} is not a compress report ({exc.error_count()} fields wrong); run compress "
                          "again") from None


def measured_at(report: Any) -> str:
    """The shape a compress report's times were measured at, in words.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> measured_at(NS(batch_size=32, seq_len=64, threads=None, serving_shape=None))
        'batch 32 x 64 tokens, all thread(s)'
    """
    shape = getattr(report, "serving_shape", None)
    if shape is not None and shape.lengths == "data":
        return shape.describe()
    return f"batch {report.batch_size} x {report.seq_len} tokens, {report.threads or 'all'} thread(s)"


def served_summary(report: Any, out: Path) -> list[str]:
    """What a compress output at ``out`` holds, its measured speed and accuracy, and the lines that serve it.

    Read from the report alone (``compress.json``), so ``surgery inspect OUT`` says what the README says.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> won = NS(name="path-3", measured_speedup=2.5, accuracy=0.86, mean_cosine=None, recall_at_10=None, drop=0.4)
        >>> report = NS(runtime="onnxruntime", winner="path-3", candidates=[won], reference="the original model in "
        ...             "torch (fp32), unchanged", batch_size=32, seq_len=64, threads=1, target="--speedup 2",
        ...             original={"accuracy": 0.864}, objective="task")
        >>> lines = served_summary(report, Path("out"))
        >>> lines[2]  # doctest: +ELLIPSIS
        '- Measured: 2.50x faster than the original model in torch (fp32), unchanged (batch 32 x 64 tokens, ...)'
        >>> lines[-2]
        'outputs = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})'
    """
    from surgery.runtimes import get_runtime

    runtime = get_runtime(report.runtime.partition("/")[0], require_available=False)
    won = next((c for c in report.candidates if c.name == report.winner), None)
    folder = out / runtime.folder if not runtime.as_is else out
    if won is None:
        figures = "no candidate won (see compress.json)"
    elif won.accuracy is not None:
        original = report.original.get("accuracy", float("nan"))
        figures = f"dev accuracy {won.accuracy:.4f} (the original: {original:.4f}; drop {won.drop:.2f} points)"
    else:
        figures = (f"mean cosine {won.mean_cosine or 0:.5f} to the original's embeddings, recall@10 "
                   f"{won.recall_at_10 or 0:.3f} (drop {won.drop:.2f} points)")
    speed = "not measured" if won is None or won.measured_speedup is None else f"{won.measured_speedup:.2f}x faster"
    return [
        f"# {out.name}: compressed for {runtime.name} ({report.target})",
        f"- Serve: `{folder}` ({runtime.description or runtime.name}; the winner {report.winner}, the files it was "
        "judged and timed on)" if not runtime.as_is else f"- Serve: `{folder}` (PyTorch, the winner {report.winner})",
        f"- Measured: {speed} than {report.reference} ({measured_at(report)})",
        f"- Accuracy: {figures}",
        "- Also here: the same model in PyTorch fp32 (model.safetensors, surgery.json: `surgery.from_pretrained`), "
        "compress.json (every candidate), pareto.png",
        "", "```python", "texts = [\"a first text\", \"another one\"]", *runtime.serving_code(str(folder)), "```",
    ]


def write_outputs(directory: Path, result: Any, *, tokenizer: Any, objective: str, sentence: Any = None,
                  served_from: Path | None = None) -> list[str]:
    """Write the report, the Pareto plot and the winner's runtime artefact into ``directory``; notes of what was
    skipped.

    The artefact is the one the winner was judged and timed on (``result.artefact``), copied byte for
    byte into ``directory/<the runtime's folder>`` (never exported again), with the tokenizer and,
    for an embedding model, the pooling beside it.
    """
    import shutil

    from surgery.cli.plot import write_pareto

    skipped = []
    report = result.report
    if result.artefact is not None:
        from surgery.runtimes import get_runtime

        target = directory / get_runtime(report.runtime, require_available=False).folder
        shutil.copytree(result.artefact, target)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(target))
        if sentence is not None:
            from surgery.embedding.pooling import write_sentence_config

            write_sentence_config(sentence, target)
    points = candidate_points(report)
    if importlib.util.find_spec("matplotlib") is None:
        skipped.append(f"{PARETO_NAME} not written: matplotlib is not installed (pip install "
                       "'encoder-surgery[plot]')")
    elif points:
        write_pareto(points, directory / PARETO_NAME, title=f"compress {report.target} ({report.runtime})",
                     xlabel=f"measured speedup (x, against {report.reference})",
                     ylabel="accuracy retained (%)" if objective == "task" else "mean cosine to the original (%)")
    report.notes.extend(skipped)
    (directory / REPORT_NAME).write_text(report.model_dump_json(indent=2) + "\n")
    # The README names the final folder (``served_from``), not the temporary one being written.
    (directory / README_NAME).write_text("\n".join(served_summary(report, served_from or directory)) + "\n")
    return skipped


def auto_preview(model: Any, data: Any, config: Any) -> dict[str, Any]:
    """``--runtime auto --dry-run``: the unchanged model timed on every runtime here and which would be searched."""
    from surgery.compress.auto_runtime import plan_runtimes, runtime_ratios
    from surgery.compress.latency_source import MeasuredLatency
    from surgery.compress.plan import CALIBRATION_BATCH, batch_seq_len
    from surgery.measure.serving import data_batches
    from surgery.measure.timing import batch_length
    from surgery.runtimes import available_runtimes

    found = available_runtimes()
    batch = config.batch_size or int(getattr(data, "batch_size", CALIBRATION_BATCH))
    batches = data_batches(data, batch_size=batch) if config.lengths == "data" else None
    source = MeasuredLatency(batch_size=batch, seq_len=max(batch_length(b) for b in batches) if batches else
                             config.seq_len or batch_seq_len(data, batch), threads=config.threads, batches=batches)
    ratios = runtime_ratios(source, model, [n for n, why in found.items() if why is None], config.against_runtime)
    return {"target": config.target.describe(), "runtime": "auto", "against_runtime": config.against_runtime,
            "runtimes": plan_runtimes(ratios, {n: why for n, why in found.items() if why is not None}, config)}


def summary_lines(report: Any) -> list[str]:
    """The lines printed after a run: one per candidate, then the winner and why."""
    lines = []
    for c in report.candidates:
        figure = f"acc {c.accuracy:.4f}" if c.accuracy is not None else (
            f"cos {c.mean_cosine:.4f} r@10 {c.recall_at_10:.3f}" if c.mean_cosine is not None else "-")
        measured = "-" if c.measured_speedup is None else f"{c.measured_speedup:.2f}x"
        held = "" if c.held_out is None else (f"  held-out drop {c.held_out.drop:.2f} "
                                              f"[{c.held_out.drop_interval[0]:.2f}, {c.held_out.drop_interval[1]:.2f}]")
        lines.append(f"{'*' if c.name == report.winner else ' '} {c.name:<28} predicted {c.predicted_speedup:.2f}x  "
                     f"measured {measured:>6}  {figure}  drop {c.drop:.2f}{held}  {c.tier}  {c.seconds:.0f}s")
    for t in (report.training or {}).get("tiers", []):
        before, after = t.get("accuracy_before"), t.get("accuracy_after")
        change = f", dev acc {before:.4f} -> {after:.4f} (PyTorch)" if before is not None and after is not None else ""
        lines.append(f"  recovery tier {t['tier']}: estimated {t['estimated_seconds']:.0f}s, took {t['seconds']:.0f}s"
                     f"{change}")
    lines.append(f"winner: {report.winner} ({report.why}); against {report.reference}")
    if rule := report.judging.get("max_drop_rule"):
        lines.append(f"--max-drop {rule}")
    return lines


def capped_length(model: Any, data: Any, target: Any, *, batch: int, seq_len: int, threads: int | None,
                  given: bool, budget_minutes: float | None = None) -> int | None:
    """The length to read the data at when ``batch`` x ``seq_len`` would run beyond reason here; None: as it is.

    One forward is estimated from a short timed one (:func:`surgery.measure.cost.forward_cost`) and
    multiplied by the forwards the job runs (:func:`surgery.compress.job_estimate.forward_equivalents`);
    beyond :data:`~surgery.measure.cost.MAX_JOB_SECONDS` (or the budget, when shorter) the length is
    capped. A length the user gave (``given``) is kept and only warned about. What was decided is noted.
    """
    from surgery.compress.job_estimate import forward_equivalents
    from surgery.measure.cost import MAX_JOB_SECONDS, cap_length, forward_cost

    dev = len(getattr(data, "eval", None) or []) or len(getattr(data, "eval_texts", None) or [])
    forwards = forward_equivalents(model, target, dev_examples=dev, batch_size=batch, fisher_batches=16)
    cap = cap_length(forward_cost(model, batch, seq_len, threads=threads), batch=batch, seq_len=seq_len,
                     forwards=forwards, what="compress", ask_more=f"--max-length {seq_len}", given=given,
                     max_seconds=min(MAX_JOB_SECONDS, 60.0 * budget_minutes) if budget_minutes else MAX_JOB_SECONDS,
                     budget=bool(budget_minutes) and 60.0 * budget_minutes <= MAX_JOB_SECONDS)
    if cap.message is not None:
        note(cap.message)
    return cap.seq_len if cap.capped else None


def budget_clock(budget_minutes: float | None, model: Any) -> Any:
    """The job's deadline for ``--budget``: counted from this command's start (the interpreter's, so that imports and
    reading the model and the data count), less the save that follows the job (the model's weights at
    :data:`SAVE_BYTES_PER_SECOND`, and :data:`SAVE_FLOOR_SECONDS`). The budget is the command's wall-clock time: at
    BERT-base widths and 128 tokens, ``--budget 15`` with the job's own clock within its 15 minutes took 15.05
    minutes end to end (experiments/compress_cost, session 15).

    Example:
        >>> import time
        >>> from surgery.testing import TinySpec, tiny_model
        >>> clock = budget_clock(1.0, tiny_model(TinySpec("bert")))  # counted from this interpreter's start
        >>> clock.start < time.perf_counter(), clock.deadline - clock.start < 60.0 - SAVE_FLOOR_SECONDS
        (True, True)
        >>> budget_clock(None, None).deadline is None
        True
    """
    import time

    import psutil

    from surgery.compress.plan import Clock

    if budget_minutes is None:
        return Clock(None)
    age = max(time.time() - psutil.Process().create_time(), 0.0)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return Clock(budget_minutes, start=time.perf_counter() - age,
                 after=SAVE_FLOOR_SECONDS + weights / SAVE_BYTES_PER_SECOND)


def estimate_line(info: dict[str, Any]) -> str:
    """The plan printed before the work, from the ``compress: estimate`` event's figures.

    Example:
        >>> estimate_line({"estimate": "0.5 min", "latency": "3.0 min", "total": "3.5 min", "candidates_planned": 7})
        'plan (estimated from timed steps): estimate 0.5 min, latency 3.0 min; total 3.5 min, 7 candidates planned'
    """
    phases = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("total", "candidates_planned", "notes"))
    line = (f"plan (estimated from timed steps): {phases}; total {info.get('total')}, "
            f"{info.get('candidates_planned')} candidates planned")
    return line + (f"; {info['notes']}" if info.get("notes") else "")


def announcing(display: Any) -> Any:
    """A progress callback that prints the up-front plan as a line of its own and passes the rest to ``display``."""
    def show(event: Any) -> None:
        if event.task == "compress: estimate":
            note(estimate_line(event.info))
        elif event.task == "compress: estimate after the search" and event.info:
            note(f"plan after the search: {event.info['candidates_planned']} candidate(s) to judge, about "
                 f"{event.info['candidates']}")
        else:
            display(event)
    return show


def compress_command(
    ctx: typer.Context,
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    data: Annotated[str, typer.Option("--data", help="Training data: labelled for the task objective, any text for "
                                      "the embedding objective (.csv/.tsv/.json/.jsonl/.parquet/.txt).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory to save the compressed model to (new "
                                             "or empty). Required unless --dry-run.")] = None,
    speedup: Annotated[float | None, typer.Option("--speedup", help="Times faster than the original (measured on "
                                                  "this machine); the most accurate candidate that is wins.")] = None,
    max_drop: Annotated[float | None, typer.Option("--max-drop", help="Points of dev accuracy (or of "
                                                   "100 x mean cosine) it may lose; alone: the fastest within "
                                                   "them wins; with --speedup: the guard.")] = None,
    runtime: Annotated[str, typer.Option("--runtime", help="Where the model will run: a runtime name (torch, "
                                         "torch-bf16, onnxruntime, onnxruntime-int8, openvino, openvino-int8, or "
                                         "one a package registered), or auto: the fastest runtime here that meets "
                                         "the target.")] = "torch",
    against_runtime: Annotated[str, typer.Option("--against-runtime", help="What speedups are against: the original "
                                                 "on this runtime.")] = "torch",
    budget: Annotated[float | None, typer.Option("--budget", help="Wall-clock minutes for the whole job; "
                                                 "recovery from the original (block-wise reconstruction, then "
                                                 "distillation) gets the time left, each tier estimated first. "
                                                 "Default: no training (least-squares refit only).")] = None,
    objective: Annotated[str | None, typer.Option("--objective", help="task or embedding (default: detected as "
                                                  "`apply` does).")] = None,
    batch: Annotated[int | None, typer.Option("--batch", min=1, help="Batch size to time (default: the data "
                                              "loaders').")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1, help="Tokens per sequence to time with "
                                                "--lengths fixed (default: the data's padded length).")] = None,
    lengths: Annotated[str, typer.Option("--lengths", help="fixed: every timed sequence --seq-len tokens; data: "
                                         "batches of the data's own texts, each padded to its own longest, as a "
                                         "server pads (the shape a service runs, with --batch and --threads).")
                       ] = "fixed",
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="CPU threads to time with.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Processes candidates are built and judged "
                                                "in, in parallel (timing stays one at a time). Default: one per "
                                                "available core up to 4 (one for a tiny model).")] = None,
    eval_data: EvalData = None,
    text_column: TextColumn = "text",
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = "label",
    max_length: MaxLengthAuto = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Batch size of the data loaders.")] = 32,
    seed: Seed = 0,
    max_train: MaxTrain = None,
    no_train: Annotated[bool, typer.Option("--no-train", help="The refit tier only, whatever --budget allows "
                                           "(--budget then only limits the job's time).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the latency prediction and the structure it would "
                                          "cut; train and write nothing.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 when the target is missed or the drop exceeds "
                                         "--max-drop.")] = False,
    stock: Annotated[bool, typer.Option("--stock", help="Keep to what a stock transformers config can say (uniform "
                                        "FFN width, whole layers) and write a plain Hugging Face directory.")] = False,
    overwrite: Overwrite = False,
) -> None:
    """Make a model N times faster on this machine and runtime (--speedup) or as fast as a loss allows (--max-drop)."""
    # Cheap checks first: a typo fails in a second, before anything is loaded, and nothing is written.
    check_target_values(speedup, max_drop)
    check_lengths(lengths)
    if lengths == "data" and seq_len is not None:
        raise ConfigError("--seq-len fixes every sequence's length; with --lengths data the lengths are the data's "
                          "own (cut at --max-length): drop --seq-len")
    if budget is not None and not budget > 0:
        raise ConfigError(f"--budget must be a positive number of minutes, got {budget:g}")
    if objective is not None and objective not in ("task", "embedding"):
        raise ConfigError(f"--objective {objective!r}: choose task or embedding")
    if out is None and not dry_run:
        raise ConfigError("--out is required: the directory to save the compressed model to (or pass --dry-run)")
    source = resolve_model_path(model_dir)
    for flag, given in (("--data", data), ("--eval-data", eval_data)):  # a typo: one line, before torch is imported
        check_input_file(given, flag, DATA_FORMATS, TABLE_SUFFIXES + TEXT_SUFFIXES)
    check_batch_memory(source, batch or batch_size, seq_len or max_length or 1)  # unknown length: a lower bound
    if (too_many := threads_warning(threads)) is not None:
        note(too_many)
    # One place decides every output path: never inside an input (model, data), never over a user's file.
    out_dir = decide_outputs([source, data, eval_data], out=("--out", None if dry_run else out),
                             overwrite=overwrite).directory
    check_runtime(runtime, "--runtime", auto=True)  # imports the runtime registry (torch): after the cheap checks
    check_runtime(against_runtime, "--against-runtime")
    target = check_target(speedup, max_drop)
    from surgery.cli.prepare import DataFiles, DataOptions, prepare_inputs

    options = DataOptions(text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
                          max_length=max_length, batch_size=batch_size, seed=seed, max_train=max_train)
    inputs = prepare_inputs(ctx.ensure_object(CliState), source, {"data": DataFiles(data, eval_data)}, options,
                            required_by="--data", strategy=CompressObjectives, requested_objective=objective)
    task_data = inputs.data["data"]
    if (length := seq_len or int(task_data.info.get("max_length") or 0)) > 0:
        capped = capped_length(inputs.model, task_data, target, batch=batch or batch_size, seq_len=length,
                               threads=threads, given=max_length is not None or seq_len is not None,
                               budget_minutes=budget)
        if capped is not None:  # read again at the capped length: judged and timed as it will be served
            from surgery.cli.inputs import read_model_config
            from surgery.cli.prepare import load_data_set

            task_data = load_data_set(ctx.ensure_object(CliState), DataFiles(data, eval_data), inputs.tokenizer,
                                      dataclasses.replace(options, max_length=capped), inputs.objective,
                                      model=(source, read_model_config(source)))
    from surgery.cli import render
    from surgery.compress.compress_run import compress
    from surgery.compress.config import CompressConfig
    from surgery.compress.plan import plan_compress

    # One config, validated once: the Python API takes the same object and the report carries its fields.
    config = CompressConfig.build(target=target, runtime=runtime, against_runtime=against_runtime,
                                  objective=inputs.objective.name if inputs.objective else None, batch_size=batch,
                                  seq_len=seq_len, lengths=lengths, stock=stock, threads=threads, workers=workers,
                                  budget_minutes=budget, seed=seed, train=not no_train)
    with render.ProgressDisplay(stderr()) as display:
        progress = announcing(display)
        if out_dir is None:  # --dry-run
            if config.auto:
                typer.echo(json.dumps(auto_preview(inputs.model, task_data, config), indent=2))
                return
            plan = plan_compress(inputs.model, task_data, config, progress=progress, write_cache=False)
            typer.echo(json.dumps(plan.preview(target), indent=2))
            return
        result = compress(inputs.model, task_data, config, progress=progress,
                          clock=budget_clock(budget, inputs.model))
    report = result.report
    sentence = inputs.objective.sentence if inputs.objective is not None else None

    def extra(directory: Path) -> None:
        from surgery.embedding.pooling import write_sentence_config

        if sentence is not None:
            write_sentence_config(sentence, directory)
        write_outputs(directory, result, tokenizer=inputs.tokenizer, objective=report.objective,
                      sentence=sentence, served_from=out_dir)  # what it skips joins the report's notes, below

    if stock:
        from surgery.compress.stock_export import save_stock

        # A plain Hugging Face directory; the tokenizer and the reports land with it in one atomic save.
        saved = save_stock(result.model, out_dir, overwrite=overwrite, tokenizer=inputs.tokenizer, extra=extra)
    else:
        import surgery

        saved = surgery.save_pretrained(result.model, out_dir, tokenizer=inputs.tokenizer, overwrite=overwrite,
                                        extra=extra)
    for line in summary_lines(report):
        stdout().print(line, markup=False, highlight=False)
    stdout().print(f"saved to {saved}", markup=False, highlight=False)
    for line in report.notes:
        note(line)
    if report.warnings:
        typer.echo(f"warning: {'; '.join(report.warnings)}", err=True)
        if strict:
            raise typer.Exit(EXIT_STRICT)
