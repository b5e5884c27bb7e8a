"""Rich rendering of the library's data: strategy lists, anatomies, surgery reports, progress.

Every function here takes plain data (the pydantic reports of :mod:`surgery.core.report`) and returns
rich renderables; only the command functions in :mod:`surgery.cli.app` print them. Text that comes
from users or plugins is wrapped in :class:`rich.text.Text`, so brackets in it are never read as
rich markup.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

from surgery.core.progress import ProgressEvent
from surgery.core.registry import PluginInfo
from surgery.core.report import ModelAnatomy, ParamCount, SurgeryReport

if TYPE_CHECKING:
    from surgery.measure.bench import BenchReport

MAX_CELL = 100


def format_value(value: Any, *, limit: int = MAX_CELL) -> str:
    """A short display form of a metric or progress value.

    Floats get four significant digits; long lists of numbers are summarised by count, min, mean
    and max; mappings and short lists are shown item by item; the text is cut to ``limit`` characters.

    Example:
        >>> format_value(0.123456), format_value([0.5] * 20), format_value({"acc": 0.9, "usage": [0.25, 0.75]})
        ('0.1235', '20 values: min 0.5, mean 0.5, max 0.5', '{acc: 0.9, usage: [0.25, 0.75]}')
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, (list, tuple)) and len(value) > 8 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        nums = [float(v) for v in value]
        return (f"{len(nums)} values: min {min(nums):.4g}, mean {statistics.fmean(nums):.4g}, "
                f"max {max(nums):.4g}")
    if isinstance(value, (list, tuple)):
        text = "[" + ", ".join(format_value(v, limit=limit) for v in value) + "]"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {format_value(v, limit=limit)}" for k, v in value.items()) + "}"
    elif isinstance(value, str):
        text = value
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact_json(value: Any, *, limit: int = 300) -> str:
    """Settings as one line of JSON (what ``--set`` and ``--config`` accept), cut to ``limit`` characters.

    Example:
        >>> compact_json({"ratio": 0.5, "layers": None})
        '{"ratio": 0.5, "layers": null}'
    """
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def flatten(values: Mapping[str, Any], prefix: str = "", depth: int = 2) -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted.key, value)`` for nested mappings down to ``depth`` levels.

    Example:
        >>> list(flatten({"a": {"b": 1, "c": {"d": 2}}}, depth=2))
        [('a.b', 1), ('a.c', {'d': 2})]
    """
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and depth > 1:
            yield from flatten(value, f"{name}.", depth - 1)
        else:
            yield name, value


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def split_metrics(values: Mapping[str, Any], prefix: str = "", depth: int = 2
                  ) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """Separate what reads best as its own table from the scalar metrics.

    Lists of records (per-epoch histories, search probes) and embedded benchmark reports become
    sections ``(dotted.name, value)``, a benchmark as a :class:`~surgery.measure.bench.BenchReport`; the
    rest keeps its nesting for :func:`flatten`. Any strategy's metrics get the same treatment.

    Example:
        >>> split_metrics({"acc": 0.9, "history": [{"epoch": 1, "loss": 0.5}]})
        ({'acc': 0.9}, [('history', [{'epoch': 1, 'loss': 0.5}])])
    """
    scalars: dict[str, Any] = {}
    sections: list[tuple[str, Any]] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and not value:
            continue  # e.g. a recorded step that reported nothing
        if _is_records(value):
            sections.append((name, value))
        elif isinstance(value, Mapping) and {"settings", "models", "comparisons"} <= value.keys():
            from surgery.measure.bench import (
                BenchReport,  # only reports that hold a benchmark pay for torch here
            )

            try:
                sections.append((name, BenchReport.model_validate(value)))
            except ValueError:  # a mapping that only looks like a benchmark stays a metric
                scalars[key] = value
        elif isinstance(value, Mapping) and value and depth > 1:
            inner, more = split_metrics(value, f"{name}.", depth - 1)
            if inner:
                scalars[key] = inner
            sections += more
        else:
            scalars[key] = value
    return scalars, sections


def records_table(title: str, records: list[Mapping[str, Any]]) -> Table:
    """One row per record, one column per key (in first-seen order); cells through :func:`format_value`.

    Example:
        >>> records_table("history", [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "acc": 0.9}]).row_count
        2
    """
    columns: list[str] = []
    for record in records:
        columns += [str(k) for k in record if str(k) not in columns]
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(Text(column))
    for record in records:
        table.add_row(*(Text(format_value(record.get(c), limit=40)) for c in columns))
    return table


def strategies_table(infos: Mapping[str, PluginInfo]) -> Table:
    """Registered strategies: name, source package and one line of help."""
    table = Table(title="Registered strategies", title_justify="left")
    table.add_column("strategy", style="bold cyan", no_wrap=True)
    table.add_column("package", style="magenta", no_wrap=True)
    table.add_column("help")
    for name, info in infos.items():
        table.add_row(Text(name), Text(info.source), Text(info.summary))
    return table


def params_table(rows: Mapping[str, ParamCount], *, title: str = "Parameters") -> Table:
    """Parameter counts with and without embeddings, one column per named model or stage."""
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for name in rows:
        table.add_column(name, justify="right")
    names = list(rows)
    has_ratio = len(names) == 2
    if has_ratio:
        table.add_column("change", justify="right")
    for label, attr in (("total", "total"), ("without embeddings", "without_embeddings")):
        values = [getattr(rows[n], attr) for n in names]
        cells = [f"{v:,}" for v in values]
        if has_ratio:
            before, after = values
            cells.append(f"{(after - before) / before:+.1%}" if before else "n/a")
        table.add_row(label, *cells)
    return table


def anatomy_view(anatomy: ModelAnatomy, *, title: str = "") -> RenderableType:
    """Per-layer kind, heads, head dim, FFN width and parameters; totals; recorded steps."""
    layers = Table(
        title=title or f"{anatomy.model_class} ({anatomy.model_type}), hidden {anatomy.hidden_size}, "
        f"{anatomy.num_layers} layers",
        title_justify="left",
    )
    for column in ("layer", "kind", "heads", "head dim", "FFN width", "params"):
        layers.add_column(column, justify="left" if column == "kind" else "right")
    has_details = any(layer.details for layer in anatomy.layers)
    if has_details:
        layers.add_column("details")
    for layer in anatomy.layers:
        cells = [str(layer.index), Text(layer.kind), _opt(layer.heads), _opt(layer.head_dim), _opt(layer.ffn_width),
                 f"{layer.params:,}"]
        if has_details:
            cells.append(Text(", ".join(f"{k}={format_value(v, limit=40)}" for k, v in layer.details.items())))
        layers.add_row(*cells)
    totals = Table(title="Parameters", title_justify="left")
    totals.add_column("")
    totals.add_column("count", justify="right")
    totals.add_row("total", f"{anatomy.params.total:,}")
    totals.add_row("without embeddings", f"{anatomy.params.without_embeddings:,}")
    parts: list[RenderableType] = [layers, totals]
    if anatomy.steps:
        steps = Table(title="Recorded surgery steps", title_justify="left")
        steps.add_column("#", justify="right")
        steps.add_column("strategy", style="bold cyan")
        steps.add_column("config")
        for number, step in enumerate(anatomy.steps):
            steps.add_row(str(number), Text(step.strategy), Text(compact_json(step.config)))
        parts.append(steps)
    else:
        parts.append(Text("No recorded surgery steps.", style="dim"))
    return Group(*parts)


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def report_view(report: SurgeryReport, *, saved_to: Path | None = None) -> RenderableType:
    """A surgery report: per-layer changes, parameters before and after, metrics, where it was saved."""
    parts: list[RenderableType] = [
        Text.assemble(("strategy ", "dim"), (report.strategy, "bold cyan"),
                      ("  config ", "dim"), compact_json(report.config),
                      ("  took ", "dim"), f"{report.seconds:.1f}s"),
        Text.assemble(("reference ", "dim"), report.reference),
    ]
    if report.changes:
        changes = Table(title="Changes per layer", title_justify="left")
        for column in ("layer", "component", "before", "after", "note"):
            changes.add_column(column, justify="right" if column in ("layer", "before", "after") else "left")
        for change in report.changes:
            changes.add_row(str(change.layer), Text(change.component), _opt(change.before), _opt(change.after),
                            Text(change.note))
        parts.append(changes)
    else:
        parts.append(Text("No layer changed.", style="yellow"))
    parts.append(params_table({"before": report.params_before, "after": report.params_after}))
    scalars, sections = split_metrics(report.metrics)
    metrics = list(flatten(scalars))
    if metrics:
        table = Table(title="Metrics", title_justify="left")
        table.add_column("metric", style="bold")
        table.add_column("value")
        for key, value in metrics:
            table.add_row(Text(key), Text(format_value(value)))
        parts.append(table)
    for name, value in sections:
        if type(value).__name__ == "BenchReport":
            parts += [Text(f"Benchmark ({name})", style="bold"), bench_view(value)]
        else:
            parts.append(records_table(name, value))
    if report.checks:
        parts.append(checks_table(report))
    if saved_to is not None:
        parts.append(Text.assemble(("saved to ", "green"), str(saved_to)))
    return Group(*parts)


def checks_table(report: SurgeryReport) -> Table:
    """The guard's accuracy per structural step: before, after, drop (points), after recovery, remaining drop."""
    # "before" is the reference's accuracy: the model before the step, or the original given as teacher.
    table = Table(title=f"Accuracy per step (guard; before = {report.reference})", title_justify="left")
    for column in ("step", "strategy", "before", "after", "drop", "recovered", "remaining", "max_drop"):
        table.add_column(column, justify="left" if column == "strategy" else "right")

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    def pts(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1f}"

    for c in report.checks:
        table.add_row(str(c.step), Text(c.strategy + (" (trained after)" if c.trained_after else "")),
                      pct(c.accuracy_before), pct(c.accuracy_after), pts(c.drop),
                      pct(c.accuracy_final) if c.recovery else "-", pts(c.remaining_drop),
                      Text("-" if c.max_drop is None else f"{c.max_drop:g}", style="red" if c.exceeded else ""))
    return table


class ProgressDisplay:
    """A :data:`surgery.core.progress.ProgressCallback` that draws one rich progress bar per task.

    Use it as a context manager around the long work; events with an unknown ``total`` show a
    spinner and a count, and ``info`` figures (loss, accuracy, expert usage) appear beside the bar.
    When the console is not a terminal (a log file, CI), a live bar would print nothing until the
    end, so plain lines are written instead: when a task starts and ends, at every tenth of its
    total, and at least every ``LINE_EVERY_S`` seconds.

    Example:
        >>> from surgery.core.progress import ProgressEvent
        >>> with ProgressDisplay(Console(file=open("/dev/null", "w"))) as show:
        ...     show(ProgressEvent("calibration", 1, 4, {"loss": 0.5}))
    """

    def __init__(self, console: Console) -> None:
        # The task name and counts never shrink; the live figures take what width is left and are
        # cut with an ellipsis rather than squeezing the bar away on narrow terminals.
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False, table_column=Column(no_wrap=True, min_width=10)),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}", markup=False,
                       table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=console,
            expand=True,
        )
        self.tasks: dict[str, Any] = {}
        self.console = console
        self.lines = not console.is_terminal
        self.last_line: dict[str, tuple[float, int]] = {}

    LINE_EVERY_S = 30.0

    def __enter__(self) -> ProgressDisplay:
        if not self.lines:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.lines:
            self.progress.stop()

    def _line(self, event: ProgressEvent, info: str) -> None:
        now = time.monotonic()
        last = self.last_line.get(event.task)
        step = max(1, (event.total or 0) // 10)
        due = (last is None or event.completed == event.total or event.completed - last[1] >= step
               or now - last[0] >= self.LINE_EVERY_S)
        if not due:
            return
        self.last_line[event.task] = (now, event.completed)
        count = f"{event.completed}/{event.total}" if event.total else str(event.completed)
        self.console.print(Text(f"{event.task}: {count}" + (f"  {info}" if info else "")), soft_wrap=True)

    def __call__(self, event: ProgressEvent) -> None:
        info = "  ".join(f"{k}={format_value(v, limit=60)}" for k, v in event.info.items())
        if self.lines:
            self._line(event, info)
            return
        task = self.tasks.get(event.task)
        if task is None:
            task = self.tasks[event.task] = self.progress.add_task(
                event.task, total=event.total, info=info
            )
        self.progress.update(task, completed=event.completed, total=event.total, info=info)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def bench_view(report: BenchReport) -> RenderableType:
    """A benchmark: settings, one row per model, ratios against the reference, and warnings.

    A small batch (an online service's, :data:`surgery.measure.bench.SMALL_BATCH` or fewer) is read by its
    latency per batch: p50 and p95 lead, with their ratios; a large one by its throughput, as before.
    """
    s = report.settings
    if s.lengths == "data" and s.length_summary is not None:
        d = s.length_summary
        shape = (f"batch {s.batch_size} of texts from the data, each batch padded to its longest (padded length p50 "
                 f"{d.padded_p50:g}, p95 {d.padded_p95:g}, max {d.padded_max}; {d.text_mean:g} tokens per text on "
                 "average)")
    else:
        shape = f"batch {s.batch_size} x {s.seq_len} tokens"
    parts: list[RenderableType] = [Text(
        f"{shape}, {s.repeats} interleaved rounds after {s.warmup} warm-up, "
        f"{s.threads} thread{'' if s.threads == 1 else 's'} on {s.device} ({s.machine}), torch {s.torch_version}",
        style="dim")]
    if report.machine is not None:  # int8 gains depend on these flags: a figure is quoted with its CPU
        parts.append(Text(f"CPU: {report.machine.summary()}", style="dim"))
    models = Table(title="Models", title_justify="left")
    accuracy = any(m.accuracy is not None for m in report.models)
    small = s.small_batch
    speed = ["p50 ms", "p95 ms", "samples/s"] if small else ["samples/s", "p50 ms", "p95 ms"]
    for column in ("model", "params", "params w/o emb.", "GFLOPs/batch", *speed, "size MiB", "peak MiB",
                   *(["accuracy"] if accuracy else [])):
        models.add_column(column, justify="left" if column == "model" else "right")
    for m in report.models:
        figures = {"samples/s": f"{m.throughput:,.1f}", "p50 ms": f"{m.latency_p50_ms:,.2f}",
                   "p95 ms": f"{m.latency_p95_ms:,.2f}"}
        models.add_row(Text(m.name), f"{m.params.total:,}", f"{m.params.without_embeddings:,}",
                       f"{m.flops_per_batch / 1e9:,.3f}", *(figures[c] for c in speed), _mib(m.weights_bytes),
                       _mib(m.peak_memory_bytes),
                       *([("-" if m.accuracy is None else f"{m.accuracy:.2%}")] if accuracy else []))
    parts.append(models)
    if report.comparisons:
        ratios = Table(title=f"Against {report.comparisons[0].reference}", title_justify="left")
        latency = ["p50 speedup", "p95 speedup"] if small else []
        for column in ("model", *latency, "speedup", "paired [95% CI]", "params", "params w/o emb.", "FLOPs",
                       "FLOP-bound speedup", "of bound", "memory"):
            ratios.add_column(column, justify="left" if column == "model" else "right")
        for c in report.comparisons:
            ci = f" [{c.paired_speedup_ci[0]:.2f}-{c.paired_speedup_ci[1]:.2f}]" if c.paired_speedup_ci else ""
            by_latency = [("-" if v is None else f"{v:.2f}x") for v in (c.p50_speedup, c.p95_speedup)] if small else []
            ratios.add_row(Text(c.name), *by_latency, f"{c.speedup:.2f}x", f"{c.paired_speedup:.2f}x{ci}",
                           f"{c.params_ratio:.3f}", f"{c.params_ratio_without_embeddings:.3f}", f"{c.flops_ratio:.3f}",
                           f"{c.flop_bound_speedup:.2f}x", f"{c.fraction_of_flop_bound:.0%}",
                           "-" if c.memory_ratio is None else f"{c.memory_ratio:.3f}")
        parts.append(ratios)
    parts.extend(Text.assemble(("warning: ", "bold yellow"), (w, "yellow")) for w in report.warnings)
    return Group(*parts)
