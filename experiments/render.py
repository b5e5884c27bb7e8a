"""The one renderer: every study's tables, from records, by the column spec in its study.toml.

For each study with an ``experiments/<study>/study.toml``, each ``[[tables]]`` entry becomes the text between
``<!-- MARKER:begin -->`` and ``<!-- MARKER:end -->`` of its page (docs/results.md unless it names
another, e.g. README.md); tables that share a marker follow one another. Rows come from a record
(``experiments/run.py``'s output) or from a committed legacy results file through its reader
(``experiments/readers.py``), never typed by hand.

    python experiments/render.py            # rewrite the blocks
    python experiments/render.py --check    # exit 1 if a block differs from what the files give

Example:
    >>> col = Column(header="speedup", key=["speedup", "speedup_interval"], fmt="{0:.2f}x [{1[0]:.2f}, {1[1]:.2f}]")
    >>> cell({"speedup": 2.0, "speedup_interval": [1.9, 2.1]}, col), cell({"speedup": None}, col)
    ('2.00x [1.90, 2.10]', '-')
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: experiments/ modules
from experiments.record import ROOT, read_record
from experiments.study import OPS, Column, Study, StudyError, Table, Target, load_study, matches, study_names


def get(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, following dots into nested objects (None where a step is missing)."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def cell(row: dict[str, Any], column: Column) -> str:
    """One table cell: ``column.fmt`` over the values of its keys, ``column.missing`` if one is absent."""
    values = [get(row, k) for k in column.key]
    fmt = column.fmt
    if any(v is None for v in values):
        if column.partial is None or values[0] is None:
            return column.missing
        fmt, values = column.partial, values[:1]
    if column.scale is not None:
        values = [v * column.scale if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                  for v in values]
    return fmt.format(*values)


def machine_summary(machine: dict[str, Any] | None) -> str:
    """One line: CPU model, CPUs, the speed flags, threads."""
    if not machine or not machine.get("cpu_model"):
        threads = (machine or {}).get("torch_threads")
        return "CPU not recorded" + (f", {threads} torch thread(s)" if threads else "")
    flags = ", ".join(machine.get("flags") or []) or "none recorded"
    cpus = machine.get("usable_cpus") or machine.get("logical_cpus")
    threads = machine.get("torch_threads")
    return (f"{machine.get('cpu_model', '?')}, {cpus} CPUs, flags {flags}"
            + (f", {threads} torch thread(s)" if threads else ""))


def rows_of(records: list[dict[str, Any]], table: Table) -> list[dict[str, Any]]:
    """The rows of ``records`` that match the table's ``where``, sorted by its ``sort`` keys."""
    rows = [{"run": rec["run"], **r} for rec in records for r in rec["rows"]  # ``run``: which file a row is from
            if all(matches(get(r, k), v) for k, v in table.where.items())]
    for key in reversed(table.sort):
        rows.sort(key=lambda r, k=key: (get(r, k) is None, get(r, k) if get(r, k) is not None else 0))
    return rows


def target_line(rows: list[dict[str, Any]], target: Target) -> str:
    """``- text: met by every row (N)`` or ``- text: **missed** by label (value), ...``."""
    judged = [r for r in rows if get(r, target.key) is not None
              and all(matches(get(r, k), v) for k, v in target.where.items())]
    missed = [r for r in judged if not OPS[target.op](get(r, target.key), target.value)]
    if not judged:
        return f"- {target.text}: not measured"
    if target.over == "mean":
        values = [float(get(r, target.key)) for r in judged]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
        verdict = "met" if OPS[target.op](mean, target.value) else "**missed**"
        return f"- {target.text}: {verdict} (mean {mean:.4g} ± {std:.2g} over {len(values)} rows)"
    if not missed:
        return f"- {target.text}: met" + (f" by all {len(judged)} rows" if len(judged) > 1 else "")
    names = ", ".join(" ".join(str(get(r, k)) for k in target.label if get(r, k) not in (None, "")) +
                      f" ({get(r, target.key):.4g})"
                      for r in missed)
    held = len(judged) - len(missed)
    if target.at_least is not None and held >= target.at_least:  # "8 of 9 runs": a miss the target allows
        return f"- {target.text}: met by {held} of {len(judged)} (at least {target.at_least} asked); not by {names}"
    return f"- {target.text}: **missed** by {len(missed)} of {len(judged)}: {names}"


def aggregate(rows: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per value of ``spec['by']``: ``KEY_mean`` and ``KEY_std`` of each of ``spec['keys']``, ``runs`` (the
    rows in the group) and the first row's value of each ``spec['carry']`` key."""
    import statistics

    out = []
    for group in sorted({get(r, spec["by"]) for r in rows}, key=str):
        members = [r for r in rows if get(r, spec["by"]) == group]
        row: dict[str, Any] = {spec["by"]: group, "runs": len(members),
                               **{k: get(members[0], k) for k in spec.get("carry", [])}}
        for key in spec["keys"]:
            values = [get(r, key) for r in members if get(r, key) is not None]
            row[f"{key}_mean"] = statistics.mean(values) if values else None
            row[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)
        out.append(row)
    return out


def summary_lines(rows: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Mean ± standard deviation of ``spec['keys']`` over the rows of each value of ``spec['by']``."""
    import statistics

    lines = []
    for group in sorted({get(r, spec["by"]) for r in rows}, key=str):
        members = [r for r in rows if get(r, spec["by"]) == group]
        cells = []
        for key in spec["keys"]:
            values = [get(r, key) for r in members if get(r, key) is not None]
            if values:
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{key} {statistics.mean(values):.2f} ± {spread:.2f}")
        if cells:
            lines.append(f"- {group}: {', '.join(cells)} over {len(members)} row(s)")
    return lines


def footer(found: list[tuple[Path, dict[str, Any]]], table: Table, page_dir: Path) -> str:
    """Which files the table came from (commit, date, load of each) and the machine(s) they ran on."""
    sources, machines = [], []
    for path, rec in found:
        facts = [f"from `{rec['source']}`"]
        if rec.get("commit"):
            facts.append(f"commit `{rec['commit']}`")
        if rec.get("date"):
            facts.append(str(rec["date"]))
        load = rec.get("load_average") or {}
        if any(load.get(k) is not None for k in ("before", "after")):
            facts.append("load " + " / ".join(f"{load[k]:.1f} {k}" for k in ("before", "after")
                                              if load.get(k) is not None))
        sources.append(f"[`{path.name}`]({os.path.relpath(path, page_dir)}) ({'; '.join(facts)})")
        summary = machine_summary(rec.get("machine"))
        if summary not in machines:
            machines.append(summary)
    legacy = any(rec.get("source") != "experiments/run.py" for _, rec in found)
    how = f", read by `experiments/readers.py` ({table.reader})" if table.reader and legacy else ""
    return f"Source: {'; '.join(sources)}{how}. Machine: {'; '.join(machines)}."


def records_for(study: Study, table: Table) -> list[tuple[Path, dict[str, Any]]]:
    """Each source file of the table and its record (a reader's for a legacy file)."""
    from experiments.readers import READERS

    if table.record and (study.folder / "results" / table.record).exists():
        path = study.folder / "results" / table.record
        return [(path, read_record(path))]
    out = []
    for name in table.source:
        path = study.folder / "results" / name
        if not path.exists():
            continue
        data = json.loads(path.read_text()) if path.suffix == ".json" else None
        if isinstance(data, dict) and "schema" in data:
            out.append((path, read_record(path)))
        elif table.reader is None:
            raise StudyError(f"{path.relative_to(ROOT)} is not a record and its table names no reader")
        else:
            out.append((path, READERS[table.reader](path)))
    return out


class _Fields(dict):
    """format_map fields that render a missing name as ``?`` rather than raising."""

    def __missing__(self, key: str) -> str:
        return "?"


def include_table(study: Study, table: Table) -> str | None:
    """A markdown table the study's script wrote, shown as it is: its title gives way to ``table.title``, its
    headings become bold lines, its links to sibling files point at the study's results/ from the page."""
    parts = []
    link_base = os.path.relpath(study.folder / "results", (ROOT / table.page).parent)
    for name in table.source:
        path = study.folder / "results" / name
        if not path.exists():
            continue
        text = re.sub(r"^#{2,} (.*)$", r"**\1**", path.read_text().strip(), flags=re.M)
        text = re.sub(r"^# .*$", "", text, count=1, flags=re.M).strip()
        text = re.sub(r"\]\(([^/)#:]+)\)", rf"]({link_base}/\1)", text)
        intro = table.intro.strip().format_map(_Fields(results=link_base)) if table.intro else None
        parts.append("\n\n".join(p for p in (f"### {table.title}" if table.title else None, intro, text,
                                               f"Source: [`{name}`]({link_base}/{name}) (a table the study's "
                                               "script wrote).") if p))
    return "\n\n".join(parts) or None


def render_table(study: Study, table: Table) -> str | None:
    """The markdown of one table entry (None when none of its sources exist)."""
    if table.include:
        return include_table(study, table)
    found = records_for(study, table)
    if not found:
        return None
    page_dir = (ROOT / table.page).parent
    records = [rec for _, rec in found]
    first = records[0]
    parts = []
    if table.title:
        parts.append(f"### {table.title}")
    if table.intro:
        fields = _Fields({**first, "config": _Fields(first.get("config") or {}),
                          "results": os.path.relpath(study.folder / "results", page_dir)})
        parts.append(table.intro.strip().format_map(fields))
    rows = rows_of(records, table)
    if table.aggregate:
        rows = aggregate(rows, table.aggregate)
    if not rows:
        return None
    lines = ["| " + " | ".join(c.header for c in table.columns) + " |",
             "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(r, c) for c in table.columns) + " |" for r in rows]
    parts.append("\n".join(lines))
    if table.targets:
        parts.append("\n".join(target_line(rows, t) for t in table.targets))
    if table.notes:
        notes = [n for rec in records for n in rec.get("notes", [])]
        if notes:
            parts.append("\n".join(f"- {n}" for n in notes))
    if table.summary:
        parts.append("\n".join(summary_lines(rows, table.summary)))
    if table.footer:
        parts.append(footer(found, table, page_dir))
    return "\n\n".join(parts)


def replace_block(page: str, marker: str, body: str, where: str) -> str:
    """``page`` with the text between ``marker``'s begin and end comments replaced by ``body``."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin not in page or end not in page:
        raise StudyError(f"{where} has no {begin} ... {end} block; add the markers where the table goes")
    return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", page, flags=re.S)


def render_all(studies: list[str] | None = None) -> dict[str, str]:
    """Page path -> its new text, with every table of ``studies`` (default all) rendered in."""
    blocks: dict[tuple[str, str], list[str]] = {}
    for name in studies or study_names():
        study = load_study(name)
        for table in study.tables:
            text = render_table(study, table)
            if text is not None:
                blocks.setdefault((table.page, table.marker), []).append(text)
    pages: dict[str, str] = {}
    for (page, marker), texts in blocks.items():
        current = pages.get(page) or (ROOT / page).read_text()
        pages[page] = replace_block(current, marker, "\n\n".join(texts), page)
    return pages


def collect_demo(out_dir: Path) -> dict[str, Any]:
    """The README demo's outputs (``scripts/demo.sh`` writes them under ``out/``) as one file to commit."""
    import subprocess

    files = {"report": out_dir / "minilm-shrp-report.json", "bench": out_dir / "minilm-shrp-bench.json"}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise StudyError(f"{', '.join(missing)} not found; run `bash scripts/demo.sh` first")
    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"command": "bash scripts/demo.sh", "commit": commit,
            **{k: json.loads(p.read_text()) for k, p in files.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render every study's tables into docs/results.md and README.md.")
    parser.add_argument("studies", nargs="*", help="studies to render (default: every study with a study.toml)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the files give")
    parser.add_argument("--demo", type=Path, help="the out/ directory of a `bash scripts/demo.sh` run: record it "
                        "as experiments/shrp/results/demo_shrp.json first")
    args = parser.parse_args(argv)
    try:
        if args.demo is not None:
            demo = collect_demo(args.demo)
            (ROOT / "experiments" / "shrp" / "results" / "demo_shrp.json").write_text(json.dumps(demo, indent=2) + "\n")
        pages = render_all(args.studies or None)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for page, text in pages.items():
        path = ROOT / page
        if path.read_text() != text:
            stale.append(page)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)} (run python experiments/render.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
