"""The ``surgery`` command: ``strategies``, ``inspect``, ``apply``, ``compress``, ``bench``, ``export``, ``plot``.

Commands of one method, such as ``experts`` (:mod:`surgery.cli.experts`), register through the entry-point
group ``surgery.commands`` (:mod:`surgery.cli.plugins`) and are built from :mod:`surgery.cli.plugin_kit`, as a
third-party package's commands are.

Bad input (every :class:`surgery.core.errors.SurgeryError`, pydantic validation errors, bad command-line
parameters, missing or unreadable files) prints one line ``error: ...`` to stderr and exits with
status 2; ``surgery --debug ...`` prints the traceback as well. Anything else is a bug and keeps its
traceback. Progress, notes and warnings go to stderr, results to stdout.

Example:
    >>> from typer.testing import CliRunner
    >>> result = CliRunner().invoke(app, ["inspect", "/no/such/dir"])
    >>> result.exit_code, result.stderr.startswith("error: model directory /no/such/dir does not exist")
    (2, True)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from pydantic import ValidationError

import surgery
from surgery.cli import render
from surgery.cli.compress import compress_command
from surgery.cli.console import CliState, note, stderr, stdout
from surgery.cli.export_command import bench_data, bench_tokenizer, calibration_texts_batches, export_command
from surgery.cli.inputs import read_model_config, strategy_settings
from surgery.cli.options import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_ROUNDS,
    BatchSize,
    Calibration,
    CalibrationTexts,
    Int8Fp32,
    LabelColumn,
    MaxLength,
    MaxTrain,
    Overwrite,
    Seed,
    SmoothAlpha,
    TextColumn,
    TextPairColumn,
)
from surgery.cli.outputs import decide_outputs, decided_outputs
from surgery.cli.plot import plot_command
from surgery.cli.plugins import add_plugin_commands
from surgery.cli.teacher import teacher_path
from surgery.core import registry
from surgery.core.distributed import end_process, is_main_process, leave_process_group
from surgery.core.errors import ConfigError, SurgeryError
from surgery.data.data_diagnosis import (
    CALIBRATION_FORMATS,
    DATA_FORMATS,
    TABLE_FORMATS,
    TABLE_SUFFIXES,
    TEXT_SUFFIXES,
    check_input_file,
)
from surgery.persist.assets import resolve_model_path
from surgery.persist.atomic import atomic_write, saved_outputs
from surgery.persist.config_values import check_batch_memory, check_length, check_lengths, threads_warning
from surgery.runtimes.shared.names import CALIBRATION_TEXTS, SMOOTH_ALPHA

EXIT_BAD_INPUT = 2
#: Exit status after SIGINT / SIGTERM, as a shell reports a process killed by that signal (128 + number).
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(BaseException):
    """SIGINT or SIGTERM during a command, raised so that every ``finally`` (temporary directories, lock files) runs.

    Not a KeyboardInterrupt: typer turns that into a silent exit 130, and ``except Exception`` must not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


EXIT_STRICT = 3  # --strict: a step's accuracy loss remains above --max-drop


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_message(exc: BaseException) -> str | None:
    """The one-line message for an exception caused by bad input, or None for anything else (a bug)."""
    if isinstance(exc, SurgeryError):
        return _one_line(str(exc))
    if isinstance(exc, ValidationError):
        from surgery.core.strategy import validation_message

        return _one_line(validation_message(f"invalid {exc.title}", exc))
    if isinstance(exc, typer.TyperException):  # click's usage errors: missing option, bad integer ...
        return _one_line(exc.format_message())
    if isinstance(exc, OSError):  # unreadable or unwritable files named on the command line
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return _one_line(f"{exc.strerror or exc}{where}")
    return None


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    typer.echo(f"warning: {_one_line(str(message))}", err=True)


@contextmanager
def _quiet_libraries(debug: bool) -> Iterator[None]:
    """One-line warnings, and no transformers log chatter or progress bars, unless --debug; restored afterwards.

    transformers is configured here only if it is already imported; otherwise through its environment
    variables, which it reads when a command imports it, so that `--help` and input errors stay fast.
    """
    loaded = "transformers" in sys.modules
    if loaded:
        import transformers

        verbosity = transformers.logging.get_verbosity()
        hf_bars = transformers.utils.logging.is_progress_bar_enabled()
    environ = {k: os.environ.get(k) for k in QUIET_ENV}
    with warnings.catch_warnings():
        if not debug:
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.showwarning = _show_warning
            # The CLI says itself when it adds a classification head; transformers' "newly
            # initialized weights ... you should probably TRAIN" would repeat it in four lines.
            # Progress bars: "Loading weights" bars; ours are rich.
            if loaded:
                transformers.logging.set_verbosity_error()
                transformers.utils.logging.disable_progress_bar()
            else:
                os.environ.update(QUIET_ENV)
        try:
            yield
        finally:
            for key, value in environ.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if loaded:
                transformers.logging.set_verbosity(verbosity)
                if hf_bars:
                    transformers.utils.logging.enable_progress_bar()
            elif not debug and "transformers" in sys.modules:  # imported by the command: back to its default
                import transformers

                # (Its progress bars stay off: huggingface_hub read the variable when it was imported.)
                transformers.logging.set_verbosity_warning()


QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` for the duration of a command (main thread only)."""
    try:
        previous = {signum: signal.signal(signum, _raise_interrupted) for signum in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(signum) is not signal.SIG_IGN}  # nohup and `&` ignore SIGINT: keep that
    except ValueError:  # not the main thread (e.g. a test runner's worker): leave signals alone
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class SurgeryGroup(typer.core.TyperGroup):
    """The root command group: runs a command and turns bad input into ``error: ...`` and exit 2."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        state = CliState(debug="--debug" in argv)  # known even when parsing fails before the callback
        extra.setdefault("obj", state)
        for problem in PLUGIN_PROBLEMS:
            typer.echo(f"warning: {problem}", err=True)
        joined = False
        saved_before, decided_before = len(saved_outputs()), len(decided_outputs())
        try:
            with _signals_interrupt(), _quiet_libraries(state.debug):
                try:
                    result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
                finally:
                    joined = leave_process_group()  # under torchrun: every process finishes before any exits
            code = result if isinstance(result, int) else 0
        except (Interrupted, KeyboardInterrupt, typer.Abort) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            # Told from what was put in place, not guessed: a signal held during a swap lands right after it.
            # Only what the command was asked to write: a search's candidates and caches are its own business.
            asked = {path.resolve() for path in decided_outputs()[decided_before:]}
            saved = ", ".join(str(path) for path in saved_outputs()[saved_before:] if path.resolve() in asked)
            typer.echo(f"error: interrupted ({signal.Signals(signum).name}); "
                       + (f"{saved} had been saved in full" if saved else "nothing was saved"), err=True)
            code = EXIT_SIGNAL.get(signum, 130)
        except Exception as exc:
            message = error_message(exc)
            if message is None:
                raise  # a bug: keep the traceback
            if state.debug:
                traceback.print_exception(exc, file=sys.stderr)
            typer.echo(f"error: {message}", err=True)
            code = EXIT_BAD_INPUT
        if joined:
            end_process(code)  # not sys.exit: torch's gloo teardown can deadlock (surgery.core.distributed)
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=SurgeryGroup,
    name="surgery",
    help="Model surgery for Hugging Face encoders: prune heads and FFN neurons, convert attention to experts, "
    "save models that reload.",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


app.command("export")(export_command)
app.command("plot")(plot_command)
app.command("compress")(compress_command)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")] = False,
    allow_pickle: Annotated[bool, typer.Option(
        "--allow-pickle", help="Load pytorch_model.bin/.pt weights with torch's weights-only loader (refused "
        "by default: unpickling can run code; convert them to safetensors instead).")] = False,
) -> None:
    state = ctx.ensure_object(CliState)
    state.debug = state.debug or debug
    state.allow_pickle = allow_pickle
    if ctx.invoked_subcommand is None:  # plain `surgery`: show the help
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# -- strategies --------------------------------------------------------------------------
@app.command("strategies")
def strategies_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every registered strategy, the package it comes from and one line of help."""
    infos = registry.method_catalog()
    if as_json:
        typer.echo(json.dumps([{"name": i.name, "package": i.source, "help": i.summary} for i in infos.values()],
                              indent=2))
        return
    stdout().print(render.strategies_table(infos))


# -- inspect -----------------------------------------------------------------------------
@app.command("inspect")
def inspect_command(
    ctx: typer.Context,
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the anatomy as JSON.")] = False,
) -> None:
    """Show a model's anatomy: per-layer kind, heads, head dim, FFN width and parameters, and recorded steps."""
    path = resolve_model_path(model_dir)
    read_model_config(path)  # an unsupported family fails here, before the weights are read
    anatomy = surgery.inspect(surgery.from_pretrained(path, allow_pickle=ctx.ensure_object(CliState).allow_pickle))
    if as_json:
        typer.echo(anatomy.model_dump_json(indent=2))
        return
    stdout().print(render.anatomy_view(anatomy))
    if (path / "compress.json").is_file():  # a compress output: what it holds and how to serve it, as its README
        from surgery.cli.compress import read_report, served_summary

        stdout().print("\n".join(served_summary(read_report(path), path)), markup=False, highlight=False)


# -- apply -------------------------------------------------------------------------------
@app.command("apply")
def apply_command(
    ctx: typer.Context,
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="Registered strategy name (see `surgery "
                                          "strategies`).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory to save the result to (new or "
                                             "empty). Required unless --dry-run.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Strategy settings, a .json or .yaml "
                                                "mapping.")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="One setting as key=value (JSON or YAML value), "
                                                   "repeatable; wins over --config.")] = None,
    data: Annotated[str | None, typer.Option("--data", help="Training data (.csv/.tsv/.json/.jsonl/.parquet), or "
                                             "rotten-tomatoes: labelled for the task objective; for the embedding "
                                             "objective any text (also .txt, one per line), labels ignored.")] = None,
    eval_data: Annotated[str | None, typer.Option("--eval-data", help="Evaluation data; default: a seeded 10% "
                                                  "split of --data.")] = None,
    text_column: TextColumn = "text",
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = "label",
    max_length: MaxLength = 64,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_train: MaxTrain = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan as JSON; change and save "
                                          "nothing.")] = False,
    overwrite: Overwrite = False,
    report_file: Annotated[Path | None, typer.Option("--report", help="Also write the report as JSON to this "
                                                     "file.")] = None,
    recover_epochs: Annotated[int | None, typer.Option(
        min=0, max=MAX_EPOCHS, help="Recovery after surgery: epochs of distillation from the model before it (needs "
        "--data).")] = None,
    max_drop: Annotated[float | None, typer.Option(min=0.0, help="Accuracy points a step may lose; a step that "
                                                   "loses more is recovered (needs --data).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 when a step's loss remains above "
                                         "--max-drop.")] = False,
    refit: Annotated[bool | None, typer.Option("--refit/--no-refit", help="Before recovery training, re-solve the "
                                               "cut output projections by least squares against the model before "
                                               "surgery (needs --data; alone: the refit is the recovery).")] = None,
    teacher: Annotated[str | None, typer.Option("--teacher", metavar="ORIGINAL", help="When MODEL was already "
                                                "surgered: the model it was cut from (a directory or embedded name). "
                                                "Recovery distils from it and accuracy or embedding fidelity is "
                                                "measured against it (needs --data).")] = None,
) -> None:
    """Run a strategy on a model and save the result (or, with --dry-run, only print its plan)."""
    # Cheap checks first: paths, then the strategy and its settings (which import torch), then the
    # model's config; a typo fails in a second, before any loading, and nothing is written.
    source = resolve_model_path(model_dir)
    out_dir = None if dry_run else _require_out(out)
    # The teacher is an input too: --out naming it is refused as such before the overwrite rule speaks.
    original = teacher_path(teacher, source, out_dir, has_data=data is not None)
    outputs = decide_outputs([source, original, data, eval_data, config],
                             out=None if out_dir is None else ("--out", out_dir),
                             files=[("--report", report_file)], overwrite=overwrite)
    target, report_file = outputs.directory, outputs.file("--report")
    if eval_data is not None and data is None:
        raise ConfigError("--eval-data needs --data (the training data it goes with)")
    for flag, given in (("--data", data), ("--eval-data", eval_data)):  # a typo: one line, before torch is imported
        check_input_file(given, flag, DATA_FORMATS, TABLE_SUFFIXES + TEXT_SUFFIXES)
    strategy_class = registry.get_method(strategy)
    settings = strategy_settings(config, sets or [])
    recovery = recovery_settings(recover_epochs, max_drop, batch_size, seed, has_data=data is not None, refit=refit)
    # Imported here, not at the top: they import transformers, which `surgery --help` must not pay for.
    from surgery.cli.embedding_apply import evaluate_against, pop_objective, teacher_copy
    from surgery.cli.prepare import DataFiles, DataOptions, prepare_inputs
    from surgery.cli.teacher import load_teacher, reference_label
    from surgery.embedding.pooling import write_sentence_config

    requested_objective = pop_objective(settings)
    chosen = strategy_class(settings)
    inputs = prepare_inputs(ctx.ensure_object(CliState), source,
                            {} if data is None else {"data": DataFiles(data, eval_data)},
                            DataOptions.from_command(ctx), required_by="--data", strategy=strategy_class,
                            requested_objective=requested_objective)
    task_data = inputs.data.get("data")

    if target is None:  # --dry-run
        # A strategy's preview is the step as it will be recorded; a pipeline's is its schedule, marked so.
        typer.echo(json.dumps(surgery.preview(inputs.model, chosen, data=task_data), indent=2))
        return

    reference = None if original is None else load_teacher(ctx.ensure_object(CliState), original, inputs, task_data)
    measured = inputs.is_embedding and task_data is not None
    against = reference if reference is not None else teacher_copy(inputs.model) if measured else None
    with render.ProgressDisplay(stderr()) as progress:
        report = surgery.convert(inputs.model, chosen, data=task_data, progress=progress, recovery=recovery,
                                 teacher=reference)
    if teacher is not None and original is not None:
        report.reference = reference_label(teacher, original)
    if measured and against is not None:
        with stderr().status(f"embedding evaluation against the {report.reference} (held-out texts)"):
            report.metrics["embedding"] = evaluate_against(against, inputs.model, task_data, inputs.tokenizer,
                                                           max_length)
    if not is_main_process():  # under torchrun every process computed the same model; the main one writes it
        return
    sentence = inputs.objective.sentence if inputs.objective is not None else None
    saved = surgery.save_pretrained(inputs.model, target, tokenizer=inputs.tokenizer, overwrite=overwrite,
                                    extra=(lambda d: write_sentence_config(sentence, d)) if sentence else None)
    if report_file is not None:
        atomic_write(report_file, report.model_dump_json(indent=2) + "\n", overwrite=overwrite)
    stdout().print(render.report_view(report, saved_to=saved))
    if report.warnings:
        typer.echo(f"warning: accuracy loss remains: {'; '.join(report.warnings)}", err=True)
        if strict:
            raise typer.Exit(EXIT_STRICT)


def recovery_settings(epochs: int | None, max_drop: float | None, batch_size: int, seed: int, *,
                      has_data: bool, refit: bool | None = None) -> Any:
    """The RecoveryConfig that --recover-epochs/--max-drop/--refit ask for (None when none is given).

    ``--refit`` alone refits and trains nothing; with ``--max-drop`` alone recovery trains one epoch.
    """
    if epochs is None and max_drop is None and not refit:
        return None
    if not has_data:
        raise ConfigError("--recover-epochs, --max-drop and --refit need --data (recovery trains and the guard "
                          "measures on it)")
    from surgery.training import RecoveryConfig

    if epochs is None:
        epochs = 0 if refit and max_drop is None else 1
    settings: dict[str, Any] = {} if refit is None else {"refit": refit}
    return RecoveryConfig(epochs=epochs, max_drop=max_drop, batch_size=batch_size, seed=seed, **settings)


def _require_out(out: Path | None) -> Path:
    if out is None:
        raise ConfigError("--out is required: the directory to save the changed model to (or pass --dry-run)")
    return out


# -- bench -------------------------------------------------------------------------------
def bench_estimate(models: dict[str, Any], *, batch_size: int, seq_len: int, rounds: int, threads: int | None,
                   device: str) -> str:
    """What the rounds will take, estimated from a short timed forward of each model (CPU only), as a phrase;
    beyond reason (:func:`surgery.measure.cost.cap_length`) it is also noted: the shape is the user's, so it
    runs as asked, but the cost is said before it is spent."""
    if device != "cpu":
        return ""
    from surgery.measure.cost import cap_length, forward_cost

    costs = [forward_cost(model, batch_size, seq_len, threads=threads) for model in models.values()]
    total = sum(rounds * c.seconds_at(batch_size, seq_len) for c in costs)
    slowest = max(costs, key=lambda c: c.seconds_at(batch_size, seq_len))
    cap = cap_length(slowest, batch=batch_size, seq_len=seq_len, forwards=rounds * len(costs), what="bench",
                     ask_more="", given=True)
    if cap.message is not None:
        note(cap.message)
    return f" (about {total / 60:.1f} min estimated)" if total >= 60 else f" (about {total:.0f} s estimated)"


@app.command("bench")
def bench_command(
    ctx: typer.Context,
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    against: Annotated[str | None, typer.Option("--against", help="Reference model to compare with (ratios are "
                                                "MODEL_DIR / reference).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "--batch", min=1, max=MAX_BATCH, help="Sequences per "
                                            "batch: the batch a service runs (at 8 or fewer, p50/p95 latency per "
                                            "batch lead the table).")] = 32,
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence with --lengths fixed (no padding).")] = 64,
    lengths: Annotated[str, typer.Option("--lengths", help="fixed: every sequence --seq-len tokens; data: batches "
                                         "of real texts drawn from --data (cut at --max-length), each padded to its "
                                         "own longest, as a server pads.")] = "fixed",
    repeats: Annotated[int, typer.Option(min=1, max=MAX_ROUNDS, help="Timed rounds; each runs one batch on every "
                                         "model.")] = 10,
    warmup: Annotated[int, typer.Option(min=0, max=MAX_ROUNDS, help="Untimed rounds before them.")] = 2,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON to this "
                                                   "file.")] = None,
    runtimes: Annotated[list[str] | None, typer.Option("--runtime", help="torch, torch-bf16, onnxruntime, "
                                                       "onnxruntime-int8, openvino, openvino-int8 (NNCF, needs "
                                                       "--calibration) ..., repeatable; every model runs in each "
                                                       "(`surgery export --runtime list` shows what runs here).")
                        ] = None,
    int8: Annotated[bool, typer.Option("--int8", hidden=True, help="Replaced by --runtime onnxruntime-int8.")] = False,
    int8_fp32: Int8Fp32 = None,
    calibration: Calibration = None,
    calibration_texts: CalibrationTexts = CALIBRATION_TEXTS,
    smooth_alpha: SmoothAlpha = SMOOTH_ALPHA,
    data: Annotated[str | None, typer.Option("--data", help="Labelled data: accuracy of each row on its held-out "
                                             "split (or rotten-tomatoes).")] = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    max_length: MaxLength = 64,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --json file.")] = False,
) -> None:
    """Measure throughput, latency, parameters, FLOPs and peak memory, side by side with --against."""
    if int8:
        raise ConfigError("--int8 is replaced by --runtime onnxruntime-int8 (add it beside --runtime torch; one name "
                          "per runtime, as export and compress take it)")
    check_lengths(lengths)
    if lengths == "data" and data is None:
        raise ConfigError("--lengths data draws its batches from the texts of --data; pass --data FILE (or "
                          "--lengths fixed)")
    paths = [against, model_dir] if against is not None else [model_dir]
    longest, length_flag = (seq_len, "--seq-len") if lengths == "fixed" else (max_length, "--max-length")
    for path in paths:
        check_batch_memory(resolve_model_path(path), batch_size, longest, ("--batch-size", length_flag))
    check_input_file(calibration, "--calibration", CALIBRATION_FORMATS)
    check_input_file(data, "--data", TABLE_FORMATS, TABLE_SUFFIXES)
    if (too_many := threads_warning(threads)) is not None:
        note(too_many)
    json_file = decide_outputs([*(resolve_model_path(p) for p in paths), data, calibration],
                               files=[("--json", json_file)], overwrite=overwrite).file("--json")
    if runtimes or int8_fp32 or calibration is not None:  # each runtime's flags, from its class: before torch
        from surgery.runtimes import get_runtime
        from surgery.runtimes.runtime_registry import check_calibration_use

        named = [get_runtime(name) for name in dict.fromkeys(runtimes or ["torch"])]  # unknown or unavailable
        if int8_fp32 and not any("int8_fp32" in r.export_settings for r in named):
            raise ConfigError("--int8-fp32 (parts kept in fp32) belongs to --runtime onnxruntime-int8; add it")
        check_calibration_use(named, calibration is not None)
    from surgery.measure.bench import bench_models, model_names
    from surgery.measure.timing import check_device, check_seq_len

    check_device(device)
    model_names(paths)
    for path in paths:
        model_config = read_model_config(resolve_model_path(path))
        if data is not None or calibration is not None:
            check_length(model_config, max_length, "--max-length", path)
    settings = dict(batch_size=batch_size, seq_len=seq_len, repeats=repeats, warmup=warmup, threads=threads,
                    device=device)
    console = stderr()
    waiting = f"benchmarking {len(paths)} model(s): {warmup} warm-up and {repeats} timed interleaved rounds"
    # Across runtimes (surgery.runtimes): each runtime's artefact, then the same bench; it also refuses
    # --calibration without an int8 runtime, and openvino-int8 without --calibration.
    if runtimes or int8_fp32 or data is not None or calibration is not None:
        from surgery.runtimes import runtime_class
        from surgery.runtimes.runtime_bench import bench_runtimes, resolve_runtimes

        # --int8-fp32 and --smooth-alpha go to the runtimes that read int8_fp32 (onnxruntime-int8).
        readers = [n for n in runtimes or [] if "int8_fp32" in runtime_class(n).export_settings]
        options = {n: {"int8_fp32": list(int8_fp32 or ()), "smooth_alpha": smooth_alpha} for n in readers}
        resolve_runtimes(runtimes or ["torch"], options)  # unknown or unavailable here: one line, before exporting
        task_data = bench_data(ctx, paths, data, text_column=text_column, label_column=label_column,
                               max_length=max_length) if data is not None else None
        batches = task_data.loader("eval") if task_data is not None else None
        if lengths == "data":  # one batch of real texts per round, each padded to its own longest
            from surgery.measure.serving import data_batches

            settings["batches"] = data_batches(task_data, batch_size=batch_size, count=warmup + repeats)
        smoothing = None if calibration is None else calibration_texts_batches(
            ctx, calibration, bench_tokenizer(paths), max_texts=calibration_texts, max_length=max_length,
            text_column=text_column)
        if not console.is_terminal:  # the spinner below is invisible in a log: say what the wait is for
            note(f"exporting to ONNX where needed, then {waiting}")
        with console.status("exporting to ONNX where needed, then benchmarking (interleaved rounds)"):
            report = bench_runtimes(paths, runtimes=runtimes or ["torch"], options=options, calibration=smoothing,
                                    data=batches, **settings)
    else:
        models = bench_rows(paths, allow_pickle=ctx.ensure_object(CliState).allow_pickle, threads=threads)
        check_seq_len(models, seq_len)
        waiting += bench_estimate(models, batch_size=batch_size, seq_len=seq_len, rounds=warmup + repeats,
                                  threads=threads, device=device)
        if not console.is_terminal:
            note(waiting)
        with console.status("benchmarking (interleaved rounds)"):
            report = bench_models(models, **settings)
    if json_file is not None:
        report.write_json(json_file, overwrite=overwrite)
    stdout().print(render.bench_view(report))


def bench_rows(paths: list[str], *, allow_pickle: bool, threads: int | None) -> dict[str, Any]:
    """The bench row of each path by name: a model directory loaded by surgery, or an OpenVINO IR directory
    (``surgery export --runtime openvino``) served by the openvino runtime's own loader."""
    from surgery.measure.bench import load_dirs, model_names
    from surgery.persist.untrusted import openvino_ir

    rows: dict[str, Any] = {}
    for name, path in zip(model_names(paths), paths, strict=True):
        where = resolve_model_path(path)
        if not openvino_ir(where):
            rows.update(load_dirs([path], [name], allow_pickle=allow_pickle))
            continue
        from surgery.persist.config_values import load_config
        from surgery.runtimes import get_runtime
        from surgery.runtimes.openvino.openvino_ir_bench import OpenVinoIrRow

        served = get_runtime("openvino").load(where, config=load_config(where), threads=threads)
        rows[name] = OpenVinoIrRow(served, where)
    return rows


# Last, so that a plugin cannot take the name of a built-in command: the commands of every installed
# package (surgery's own `experts` included) from the entry-point group surgery.commands.
PLUGIN_PROBLEMS = add_plugin_commands(app)


def main() -> None:
    """Entry point of the ``surgery`` console script."""
    try:
        app()
    finally:
        # A second Ctrl-C or SIGTERM while Python shuts down (atexit handlers of torch, datasets ...)
        # would print "Exception ignored in atexit"; the command is over, so both are ignored now.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
