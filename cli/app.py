"""The ``surgery`` command: ``strategies``, ``inspect``, ``apply``, ``bench`` and ``experts`` (in experts.py).

Bad input (every :class:`surgery.errors.SurgeryError`, pydantic validation errors, bad command-line
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
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

import surgery
from surgery import registry
from surgery.assets import resolve_model_path
from surgery.cli import render
from surgery.cli.console import CliState, note, quiet_datasets, stderr, stdout
from surgery.cli.experts import experts_app
from surgery.cli.inputs import check_output_dir, load_model, load_tokenizer, read_model_config, strategy_settings
from surgery.cli.options import (
    BatchSize,
    LabelColumn,
    MaxLength,
    MaxTrain,
    Overwrite,
    Seed,
    TextColumn,
    TextPairColumn,
)
from surgery.cli.plot import plot_command
from surgery.errors import ConfigError, SurgeryError
from surgery.strategy import validation_message

EXIT_BAD_INPUT = 2


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_message(exc: BaseException) -> str | None:
    """The one-line message for an exception caused by bad input, or None for anything else (a bug)."""
    if isinstance(exc, SurgeryError):
        return _one_line(str(exc))
    if isinstance(exc, ValidationError):
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
    """One-line warnings, and no transformers log chatter or progress bars, unless --debug; restored afterwards."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    hf_bars = transformers.utils.logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        if not debug:
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.showwarning = _show_warning
            # The CLI says itself when it adds a classification head; transformers' "newly
            # initialized weights ... you should probably TRAIN" would repeat it in four lines.
            transformers.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars; ours are rich
        try:
            yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            if hf_bars:
                transformers.utils.logging.enable_progress_bar()


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
        try:
            with _quiet_libraries(state.debug):
                result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except (KeyboardInterrupt, typer.Abort):
            typer.echo("error: interrupted", err=True)
            code = 130
        except Exception as exc:
            message = error_message(exc)
            if message is None:
                raise  # a bug: keep the traceback
            if state.debug:
                traceback.print_exception(exc, file=sys.stderr)
            typer.echo(f"error: {message}", err=True)
            code = EXIT_BAD_INPUT
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


app.add_typer(experts_app, name="experts")
app.command("plot")(plot_command)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")] = False,
) -> None:
    state = ctx.ensure_object(CliState)
    state.debug = state.debug or debug
    if ctx.invoked_subcommand is None:  # plain `surgery`: show the help
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# -- strategies --------------------------------------------------------------------------
@app.command("strategies")
def strategies_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every registered strategy, the package it comes from and one line of help."""
    infos = registry.strategies()
    if as_json:
        typer.echo(json.dumps([{"name": i.name, "package": i.source, "help": i.summary} for i in infos.values()],
                              indent=2))
        return
    stdout().print(render.strategies_table(infos))


# -- inspect -----------------------------------------------------------------------------
@app.command("inspect")
def inspect_command(
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the anatomy as JSON.")] = False,
) -> None:
    """Show a model's anatomy: per-layer kind, heads, head dim, FFN width and parameters, and recorded steps."""
    path = resolve_model_path(model_dir)
    read_model_config(path)  # an unsupported family fails here, before the weights are read
    anatomy = surgery.inspect(surgery.from_pretrained(path))
    if as_json:
        typer.echo(anatomy.model_dump_json(indent=2))
        return
    stdout().print(render.anatomy_view(anatomy))


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
    data: Annotated[str | None, typer.Option("--data", help="Labelled training data (.csv/.tsv/.json/.jsonl/"
                                             ".parquet), or rotten-tomatoes.")] = None,
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
) -> None:
    """Run a strategy on a model and save the result (or, with --dry-run, only print its plan)."""
    import torch

    # Cheap checks first: a typo in the strategy, its settings or the paths fails before any loading.
    strategy_class = registry.get_strategy(strategy)
    chosen = strategy_class(strategy_settings(config, sets or []))
    source = resolve_model_path(model_dir)
    target = None if dry_run else check_output_dir(source, _require_out(out), overwrite=overwrite)
    if eval_data is not None and data is None:
        raise ConfigError("--eval-data needs --data (the training data it goes with)")
    model_config = read_model_config(source)

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(source, required_by="--data" if data is not None else None)
    task_data = None
    if data is not None:
        from surgery.data import load_task_data

        with quiet_datasets(ctx.ensure_object(CliState).debug):
            task_data = load_task_data(
                data, tokenizer, eval_data=eval_data, text_column=text_column, text_pair_column=text_pair_column,
                label_column=label_column, max_length=max_length, seed=seed, max_train=max_train,
                batch_size=batch_size,
            )
    loaded = load_model(source, model_config, task_data)
    if task_data is not None:  # noted only once the inputs are known to fit together
        note(f"data: {task_data.info['train_size']:,} train / {task_data.info['eval_size']:,} eval examples, "
              f"labels {', '.join(task_data.label_names[:8])}")
    if loaded.note:
        note(loaded.note)

    if target is None:  # --dry-run
        plan = surgery.plan(loaded.model, chosen, data=task_data)
        step = {"strategy": chosen.name, "plan_version": chosen.plan_version,
                "config": json.loads(chosen.config.model_dump_json()), "plan": plan}
        typer.echo(json.dumps(step, indent=2))
        return

    with render.ProgressDisplay(stderr()) as progress:
        report = surgery.convert(loaded.model, chosen, data=task_data, progress=progress)
    saved = surgery.save_pretrained(loaded.model, target, tokenizer=tokenizer, overwrite=overwrite)
    if report_file is not None:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(report.model_dump_json(indent=2) + "\n")
    stdout().print(render.report_view(report, saved_to=saved))


def _require_out(out: Path | None) -> Path:
    if out is None:
        raise ConfigError("--out is required: the directory to save the changed model to (or pass --dry-run)")
    return out


# -- bench -------------------------------------------------------------------------------
@app.command("bench")
def bench_command(
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    against: Annotated[str | None, typer.Option("--against", help="Reference model to compare with (ratios are "
                                                "MODEL_DIR / reference).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per batch.")] = 32,
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence (no padding).")] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="Timed rounds; each runs one batch on every model.")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed rounds before them.")] = 2,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON to this "
                                                   "file.")] = None,
) -> None:
    """Measure throughput, latency, parameters, FLOPs and peak memory, side by side with --against."""
    from surgery.bench import bench_dirs

    paths = [against, model_dir] if against is not None else [model_dir]
    for path in paths:
        read_model_config(resolve_model_path(path))
    with stderr().status("benchmarking (interleaved rounds)"):
        report = bench_dirs(paths, batch_size=batch_size, seq_len=seq_len, repeats=repeats, warmup=warmup,
                            threads=threads, device=device)
    if json_file is not None:
        report.write_json(json_file)
    stdout().print(render.bench_view(report))


def main() -> None:
    """Entry point of the ``surgery`` console script."""
    app()
