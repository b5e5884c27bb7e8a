"""``surgery plot``: a Pareto plot (accuracy retained vs measured speedup) and per-layer expert usage, as PNGs.

Reads either a report written by ``surgery apply --report`` (one point: the model against the model
it was made from) or the suite's ``experiments/suite/results/suite.json`` (one point per method and task).
matplotlib is an optional extra: ``pip install 'encoder-surgery[plot]'``.

Example:
    >>> report = {"strategy": "shrp", "metrics": {"accuracy_input": 0.5, "accuracy_pruned": 0.8,
    ...           "history": [{"stage": 0, "eval_acc": 0.8}], "usage": {"5": [3, 1]},
    ...           "bench": {"comparisons": [{"speedup": 1.9}]}}}
    >>> pareto_points(report)
    [{'label': 'shrp', 'group': 'report', 'speedup': 1.9, 'retained': 100.0}]
    >>> usage_panels(report)
    {'at the cut (evaluation data)': {'5': [3, 1]}}
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from surgery.cli.console import stdout
from surgery.cli.outputs import decide_outputs
from surgery.core.errors import ConfigError, DataError
from surgery.persist.atomic import atomic_write
from surgery.persist.untrusted import MAX_JSON_BYTES, read_regular

PLOT_HINT = "matplotlib is needed for plots; install it with: pip install 'encoder-surgery[plot]'"


def _reference_accuracy(metrics: dict[str, Any]) -> float | None:
    # A pipeline with stage 0 starts from an untrained head: its reference is the fine-tuned model.
    tuned = [h["eval_acc"] for h in metrics.get("history", []) if h.get("stage") == 0 and "eval_acc" in h]
    return tuned[-1] if tuned else metrics.get("accuracy_input")


def final_accuracy(metrics: dict[str, Any]) -> float | None:
    """The accuracy of the model a report hands back (after recovery, else after pruning)."""
    for key in ("accuracy_recovered", "accuracy_pruned", "accuracy"):
        if metrics.get(key) is not None:
            return float(metrics[key])
    return None


def pareto_points(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``label``, ``group``, ``speedup`` and ``retained`` (% of the reference accuracy) of each point."""
    if "suite" in data:
        return [dict(p) for p in data["suite"]["pareto"]]
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        raise DataError("plot: the JSON is neither a surgery report (no 'metrics') nor a suite result (no 'suite')")
    comparisons = (metrics.get("bench") or {}).get("comparisons") or []
    ref, acc = _reference_accuracy(metrics), final_accuracy(metrics)
    if not comparisons or ref is None or acc is None or not ref:
        return []
    return [{"label": data.get("strategy", "model"), "group": "report", "speedup": comparisons[0]["speedup"],
             "retained": 100.0 * acc / ref}]


def usage_panels(data: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """Per-layer expert usage to draw: ``{phase: {layer: counts}}`` (stage-1 training usage and the cut's)."""
    if "suite" in data:
        # A list of [phase, usage] pairs: JSON objects may be re-sorted, the phases have an order.
        return {phase: dict(usage) for phase, usage in data["suite"].get("usage", [])}
    metrics = data.get("metrics") or {}
    panels: dict[str, dict[str, list[int]]] = {}
    stage1 = [h for h in metrics.get("history", []) if h.get("stage") == 1 and h.get("usage")]
    if stage1:
        panels[f"training, epoch {stage1[-1].get('epoch', '?')} (end of stage 1)"] = stage1[-1]["usage"]
    if metrics.get("usage"):
        panels["at the cut (evaluation data)"] = metrics["usage"]
    return panels


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(PLOT_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path, overwrite: bool) -> Path:
    """Render ``fig`` to PNG bytes and write them atomically (an existing file only with ``overwrite``)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    plt.close(fig)
    return atomic_write(path, buffer.getvalue(), overwrite=overwrite)


def write_pareto(points: list[dict[str, Any]], path: Path,
                 title: str = "accuracy retained vs measured speedup",
                 xlabel: str = "measured speedup (x, against the fine-tuned model)",
                 ylabel: str = "accuracy retained (% of the fine-tuned model)", *, overwrite: bool = False) -> Path:
    """A scatter of ``points`` (one colour per label, one marker per group) saved as PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = sorted({p["label"] for p in points})
    groups = sorted({p["group"] for p in points})
    markers = "osD^vP*X"
    colours = plt.get_cmap("tab10")
    for p in points:
        ax.scatter(p["speedup"], p["retained"], color=colours(labels.index(p["label"]) % 10),
                   marker=markers[groups.index(p["group"]) % len(markers)], s=45)
        if "retained_std" in p:
            ax.errorbar(p["speedup"], p["retained"], yerr=p["retained_std"], fmt="none", alpha=0.5,
                        color=colours(labels.index(p["label"]) % 10))
    for i, label in enumerate(labels):
        ax.scatter([], [], color=colours(i % 10), label=label)
    for j, group in enumerate(groups if len(groups) > 1 else []):
        ax.scatter([], [], color="grey", marker=markers[j % len(markers)], label=group)
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(plt, fig, path, overwrite)


def write_usage(panels: dict[str, dict[str, list[int]]], path: Path, *, overwrite: bool = False) -> Path:
    """One bar chart per (phase, layer): the share of sequences each expert took; PNG at ``path``."""
    plt = _pyplot()
    rows = list(panels)
    layers = sorted({layer for usage in panels.values() for layer in usage}, key=int)
    fig, axes = plt.subplots(len(rows), len(layers), figsize=(2.6 * len(layers), 2.2 * len(rows)),
                             squeeze=False, sharey=True)
    for r, phase in enumerate(rows):
        for c, layer in enumerate(layers):
            ax = axes[r][c]
            counts = panels[phase].get(layer)
            if counts:
                total = sum(counts) or 1
                ax.bar(range(len(counts)), [100.0 * n / total for n in counts], color="tab:blue")
                ax.set_xticks(range(0, len(counts), max(1, len(counts) // 6)))
            ax.set_title(f"layer {layer}", fontsize=8)
            ax.set_xlabel("expert", fontsize=7)
            ax.tick_params(labelsize=6)
            if c == 0:
                ax.set_ylabel("% of sequences", fontsize=7)
                ax.annotate(phase, xy=(0.0, 1.22), xycoords="axes fraction", fontsize=8, fontweight="bold")
    fig.tight_layout(h_pad=2.5)
    return _save(plt, fig, path, overwrite)


def plot_report(report: Path, out: Path, *, overwrite: bool = False) -> list[Path]:
    """Render the Pareto and usage PNGs of a report or suite JSON into ``out``; returns the files written.

    Which files will be written is decided (and checked: never an existing file without ``overwrite``,
    never the report itself) before anything is drawn.
    """
    if not report.exists():
        raise DataError(f"plot: {report} does not exist; pass a report from 'surgery apply --report'")
    try:
        data = json.loads(read_regular(report, MAX_JSON_BYTES))  # a regular file of bounded size: no FIFO hang
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise DataError(f"plot: {report} is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise DataError(f"plot: {report} holds no report object")
    points, panels = pareto_points(data), usage_panels(data)
    if not points and not panels:
        raise DataError(f"plot: {report} has neither a benchmark with accuracy nor expert usage to draw")
    pareto, usage = out / "pareto.png", out / "usage.png"
    decide_outputs([report], files=[("--out", file) for file, wanted in ((pareto, points), (usage, panels))
                                    if wanted], overwrite=overwrite)
    written = []
    if points:
        written.append(write_pareto(points, pareto, overwrite=overwrite))
    if panels:
        written.append(write_usage(panels, usage, overwrite=overwrite))
    return written


def plot_command(
    report: Annotated[Path, typer.Argument(
        help="A report JSON (surgery apply --report) or experiments/suite/results/suite.json.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for pareto.png and usage.png.")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing pareto.png / usage.png.")] = False,
) -> None:
    """Draw accuracy retained vs measured speedup, and per-layer expert usage, as PNG files."""
    for path in plot_report(report, out, overwrite=overwrite):
        stdout().print(str(path))
