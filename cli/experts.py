"""``surgery experts``: unplug-and-play task experts (DoE) from the command line.

A command plugin like a third party's: registered through the ``surgery.commands`` entry point and
built only from :mod:`surgery.cli.plugin_kit`.

``build`` runs ``doe`` once per task on copies of one model and saves a runtime directory: the full
model once (a normal surgery model directory) plus ``experts/<task>.safetensors`` and ``.json``
per task. ``show`` lists a runtime's experts and measures how long switching takes.

Example:
    >>> from typer.testing import CliRunner
    >>> from surgery.cli.app import app
    >>> result = CliRunner().invoke(app, ["experts", "build", "minilm-l6", "--task", "nofile", "--out", "x"])
    >>> result.exit_code, result.stderr.strip()
    (2, "error: --task: expected NAME=FILE, got 'nofile'")
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from surgery.cli.plugin_kit import (
    BatchSize,
    CliState,
    LabelColumn,
    MaxLength,
    MaxTrain,
    Overwrite,
    ProgressDisplay,
    Seed,
    TextColumn,
    TextPairColumn,
    decide_outputs,
    format_value,
    read_model_config,
    stderr,
    stdout,
    strategy_settings,
)
from surgery.core.distributed import is_main_process
from surgery.core.errors import ConfigError
from surgery.persist.assets import resolve_model_path
from surgery.persist.atomic import atomic_write

experts_app = typer.Typer(
    help="Unplug-and-play task experts (DoE): one full model, one small expert per task.",
    no_args_is_help=True,
)

TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: The figures of doe's report metrics that the table shows per task (``full_accuracy``: the prompt-tuned
#: full model's accuracy before the search).
DOE_FIGURES = ("mode", "full_accuracy", "accuracy", "pruning_rate", "units_removed", "units_total")


def parse_tasks(items: Sequence[str], flag: str) -> dict[str, str]:
    """``NAME=FILE`` items as an ordered mapping; names must be distinct and usable as file names.

    Example:
        >>> parse_tasks(["sst2=train.csv", "plot=rotten-tomatoes"], "--task")
        {'sst2': 'train.csv', 'plot': 'rotten-tomatoes'}
    """
    tasks: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{flag}: expected NAME=FILE, got {item!r}")
        if not TASK_NAME.fullmatch(name):
            raise ConfigError(f"{flag}: task name {name!r} must use letters, digits, '.', '_' or '-'")
        if name in tasks:
            raise ConfigError(f"{flag}: task {name!r} is given twice")
        tasks[name] = path
    return tasks


@experts_app.command("build")
def build_command(
    ctx: typer.Context,
    model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
    task: Annotated[list[str], typer.Option("--task", help="A task as NAME=FILE (labelled training data, or "
                                            "rotten-tomatoes); repeat for each task.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the runtime (new or empty).")],
    eval_task: Annotated[list[str] | None, typer.Option("--eval-task", help="Evaluation data of a task as "
                                                        "NAME=FILE; default: a seeded 10% split of its "
                                                        "training data.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="doe settings, a .json or .yaml "
                                                "mapping (shared by every task).")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="One doe setting as key=value, repeatable; "
                                                   "wins over --config.")] = None,
    text_column: TextColumn = "text",
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = "label",
    max_length: MaxLength = 64,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_train: MaxTrain = None,
    overwrite: Overwrite = False,
    report_file: Annotated[Path | None, typer.Option("--report", help="Also write every task's figures as JSON "
                                                     "to this file.")] = None,
) -> None:
    """Run doe once per task on one model and save the full model once plus a small expert per task."""
    tasks = parse_tasks(task, "--task")
    evals = parse_tasks(eval_task or [], "--eval-task")
    unknown = sorted(set(evals) - set(tasks))
    if unknown:
        raise ConfigError(f"--eval-task: {unknown} name no --task; known tasks: {sorted(tasks)}")
    settings = strategy_settings(config, sets or [])
    source = resolve_model_path(model_dir)
    # Before torch is imported: a bad --out or --report fails in a second.
    outputs = decide_outputs([source, config, *tasks.values(), *evals.values()], out=("--out", out),
                             files=[("--report", report_file)], overwrite=overwrite)
    # Imported here, not at the top: they import torch and transformers, which `surgery --help` must not pay for.
    from surgery.cli.plugin_kit import DataFiles, DataOptions, prepare_inputs
    from surgery.strategies.doe import build_runtime, check_tasks, runtime_config

    doe_config = runtime_config(settings)  # doe's own checks of the shared settings, before anything is loaded
    target, report_file = outputs.directory, outputs.file("--report")
    inputs = prepare_inputs(ctx.ensure_object(CliState), source,
                            {name: DataFiles(path, evals.get(name)) for name, path in tasks.items()},
                            DataOptions.from_command(ctx), required_by="--task", data_label="task {name}",
                            check=lambda model, data: check_tasks(model, data, doe_config),
                            labels_from_head=False)  # every task trains its own expert head, on its own labels
    with ProgressDisplay(stderr()) as progress:
        runtime, metrics = build_runtime(inputs.model, inputs.data, doe_config, progress=progress)
    if not is_main_process():  # under torchrun every process built the same runtime; the main one writes it
        return
    saved = runtime.save(target, tokenizer=inputs.tokenizer, overwrite=overwrite)
    rows = {}
    for name, m in metrics.items():
        data = inputs.data[name]
        rows[name] = {
            "labels": data.label_names, "train_size": data.info["train_size"], "eval_size": data.info["eval_size"],
            # doe's own figures, under doe's own names
            **{key: m.get(key) for key in DOE_FIGURES}, **runtime.switch_latency(name),
            "expert_bytes": sum(p.stat().st_size for p in (saved / "experts").glob(f"{name}.*")),
        }
    if report_file is not None:
        atomic_write(report_file, json.dumps({"runtime": str(saved), "tasks": rows, "metrics": metrics}, indent=2,
                                             default=str) + "\n", overwrite=overwrite)
    stdout().print(tasks_table("Task experts", rows))
    stdout().print(Text.assemble(("saved to ", "green"), str(saved)))


@experts_app.command("show")
def show_command(
    runtime_dir: Annotated[Path, typer.Argument(help="A directory written by `surgery experts build`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List a runtime's task experts and measure how long plugging each in and restoring takes."""
    from surgery.strategies.doe.unplug import EXPERTS_DIR, UnplugRuntime

    read_model_config(resolve_model_path(str(runtime_dir)))
    runtime = UnplugRuntime.load(runtime_dir)
    rows = {}
    for name, expert in runtime.experts.items():
        meta = expert.meta
        rows[name] = {
            "labels": meta.get("labels"), "mode": meta.get("mode"), "module_set": meta.get("module_set"),
            "accuracy": meta.get("accuracy"), "pruning_rate": meta.get("pruning_rate"),
            "units_removed": sum(len(u) for groups in expert.remove.values() for u in groups.values()),
            "prompt_tokens": None if expert.prompt is None else int(expert.prompt.shape[0]),
            **runtime.switch_latency(name, repeats=10),
            "expert_bytes": sum(p.stat().st_size for p in (runtime_dir / EXPERTS_DIR).glob(f"{name}.*")),
        }
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    stdout().print(tasks_table(f"Task experts in {runtime_dir}", rows))


def tasks_table(title: str, rows: dict[str, dict[str, Any]]) -> Table:
    """One row per task expert; the columns are the figures the rows have, in a fixed order."""
    order = ["labels", "mode", "module_set", "train_size", "eval_size", "full_accuracy", "accuracy",
             "pruning_rate", "units_removed", "units_total", "prompt_tokens", "plug_ms", "restore_ms",
             "expert_bytes"]
    present = [c for c in order if any(r.get(c) is not None for r in rows.values())]
    table = Table(title=title, title_justify="left")
    table.add_column("task", style="bold cyan")
    for column in present:
        table.add_column(column.replace("_", " "), justify="left" if column in ("labels", "mode", "module_set")
                         else "right")
    for name, row in rows.items():
        table.add_row(Text(name), *(Text(format_value(row.get(c), limit=40)) for c in present))
    return table


def register(app: typer.Typer) -> None:
    """Add ``surgery experts`` to the command line: the target of the ``surgery.commands`` entry point ``experts``.

    Example:
        >>> app = typer.Typer()
        >>> register(app)
        >>> [group.name for group in app.registered_groups]
        ['experts']
    """
    app.add_typer(experts_app, name="experts")
