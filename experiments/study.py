"""A study's declarative config: ``experiments/<study>/study.toml``.

Sections (see experiments/README.md for a full example):

- ``[study]``: ``question``; ``kind``: ``compress`` or ``bench`` (run by ``experiments/run.py``) or
  ``results`` (committed results only, rendered by a reader); ``record``: the file ``run.py`` writes
  under the study's ``results/`` (default ``<study>.record.json``).
- ``[config]``: what the kind runs (model, tasks, seeds, targets with their ``CompressConfig`` fields, or
  methods with their settings, runtimes, bench settings); ``[smoke]``: keys that replace ``[config]``'s
  for ``--smoke`` (tiny models from ``surgery.testing``).
- ``[[tables]]``: what the renderer shows, each with ``marker`` (the block of ``page``, default
  docs/results.md), ``source`` (a record file, or a legacy results file with ``reader``), ``columns``
  (``{header, key, fmt}``), and optional ``title``, ``intro``, ``where``, ``sort``, ``targets``, ``notes``.

Example:
    >>> spec = load_study("refit")
    >>> spec.kind, spec.tables[0].marker
    ('results', 'refit')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (pytest's dependency there)
    import tomli as tomllib

EXPERIMENTS = Path(__file__).resolve().parent
KINDS = ("compress", "bench", "results")


class StudyError(ValueError):
    """A study name or study.toml that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Column:
    header: str
    key: list[str]
    fmt: str = "{}"
    missing: str = "-"
    scale: float | None = None  # multiplies the numbers before formatting (bytes -> MB: 1e-6)
    partial: str | None = None  # the format when only the first key has a value (a ratio without its interval)


@dataclass(frozen=True)
class Target:
    """A check over a table's rows: ``key op value`` must hold for each row; the line says which missed."""

    text: str
    key: str
    op: str
    value: float
    label: list[str]
    where: dict[str, Any] = field(default_factory=dict)
    #: "each": every row must hold it; "mean": the mean over the rows must (reported with its std)
    over: str = "each"
    #: with ``over = "each"``: how many rows must hold it (None: all of them), as "8 of 9 runs"
    at_least: int | None = None


@dataclass(frozen=True)
class Table:
    marker: str
    page: str
    source: list[str]
    reader: str | None
    columns: list[Column]
    title: str | None = None
    intro: str | None = None
    where: dict[str, Any] = field(default_factory=dict)
    sort: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: bool = True
    footer: bool = True
    summary: dict[str, Any] = field(default_factory=dict)  # {by = KEY, keys = [KEYS]}: mean ± std per group
    record: str | None = None  # run.py's record: when it exists under results/, it replaces ``source``
    aggregate: dict[str, Any] = field(default_factory=dict)  # {by, keys, carry}: one row per group, KEY_mean/_std
    include: bool = False  # ``source`` is a markdown table the study's script wrote: shown as it is, no columns


@dataclass(frozen=True)
class Study:
    name: str
    question: str
    kind: str
    record: str
    config: dict[str, Any]
    smoke: dict[str, Any]
    tables: list[Table]
    folder: Path

    def settings(self, smoke: bool = False) -> dict[str, Any]:
        """``[config]``, with ``[smoke]``'s keys in their place when ``smoke``."""
        return {**self.config, **self.smoke} if smoke else dict(self.config)


OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def matches(value: Any, wanted: Any) -> bool:
    """A ``where`` test: equal, or one of a list."""
    return value in wanted if isinstance(wanted, list) else value == wanted


def study_names() -> list[str]:
    """Every folder of experiments/ that holds a study.toml, sorted."""
    return sorted(p.parent.name for p in EXPERIMENTS.glob("*/study.toml"))


def _keys(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise StudyError(f"{where}: key must be a string or a list of strings, got {value!r}")


def _table(raw: dict[str, Any], where: str) -> Table:
    unknown = set(raw) - {"marker", "page", "source", "reader", "columns", "title", "intro", "where", "sort",
                          "targets", "notes", "footer", "summary", "record", "include", "aggregate"}
    if unknown:
        raise StudyError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for needed in ("marker", "source") if raw.get("include") else ("marker", "source", "columns"):
        if needed not in raw:
            raise StudyError(f"{where}: missing {needed!r}")
    columns = []
    for i, col in enumerate(raw.get("columns", [])):
        if not isinstance(col, dict) or "header" not in col or "key" not in col:
            raise StudyError(f"{where}.columns[{i}]: needs header and key")
        columns.append(Column(header=col["header"], key=_keys(col["key"], f"{where}.columns[{i}]"),
                              fmt=col.get("fmt", "{}"), missing=col.get("missing", "-"), scale=col.get("scale"),
                              partial=col.get("partial")))
    targets = []
    for i, t in enumerate(raw.get("targets", [])):
        if t.get("op") not in OPS:
            raise StudyError(f"{where}.targets[{i}]: op must be one of {', '.join(OPS)}, got {t.get('op')!r}")
        if t.get("over", "each") not in ("each", "mean"):
            raise StudyError(f"{where}.targets[{i}]: over must be 'each' or 'mean', got {t.get('over')!r}")
        at_least = t.get("at_least")
        if at_least is not None and (not isinstance(at_least, int) or at_least < 1 or t.get("over", "each") != "each"):
            raise StudyError(f"{where}.targets[{i}]: at_least must be a whole number of rows, 1 or more, with "
                             f"over = 'each'; got {at_least!r}")
        targets.append(Target(text=t["text"], key=t["key"], op=t["op"], value=float(t["value"]),
                              label=_keys(t.get("label", "name"), f"{where}.targets[{i}]"),
                              where=t.get("where", {}), over=t.get("over", "each"), at_least=at_least))
    source = raw["source"] if isinstance(raw["source"], list) else [raw["source"]]
    return Table(marker=raw["marker"], page=raw.get("page", "docs/results.md"), source=source,
                 reader=raw.get("reader"), columns=columns, title=raw.get("title"), intro=raw.get("intro"),
                 where=raw.get("where", {}), sort=raw.get("sort", []), targets=targets,
                 notes=raw.get("notes", True), footer=raw.get("footer", True),
                 summary=raw.get("summary", {}), record=raw.get("record"), include=raw.get("include", False),
                 aggregate=raw.get("aggregate", {}))


def load_study(name: str) -> Study:
    """The study ``name`` (a folder of experiments/ with a study.toml); StudyError naming what is wrong."""
    folder = EXPERIMENTS / name
    path = folder / "study.toml"
    if not path.is_file():
        known = ", ".join(study_names())
        raise StudyError(f"no study {name!r}: {path.relative_to(EXPERIMENTS.parent)} does not exist "
                         f"(studies: {known})")
    rel = path.relative_to(EXPERIMENTS.parent)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{rel}: not valid TOML ({exc})") from None
    head = raw.get("study", {})
    kind = head.get("kind")
    if kind not in KINDS:
        raise StudyError(f"{rel}: [study] kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind != "results" and "config" not in raw:
        raise StudyError(f"{rel}: a {kind} study needs a [config] section")
    tables = [_table(t, f"{rel}: tables[{i}]") for i, t in enumerate(raw.get("tables", []))]
    return Study(name=name, question=head.get("question", ""), kind=kind,
                 record=head.get("record", f"{name}.record.json"), config=raw.get("config", {}),
                 smoke=raw.get("smoke", {}), tables=tables, folder=folder)
