"""Why a data file cannot be read, in one line that names the file, the row and the fix.

``datasets`` reports every unreadable file as "An error occurred while generating the dataset", with
the cause chained below it or nowhere. When reading fails, :func:`diagnose` looks at the file itself,
cheapest question first: is it empty, is a ``.gz``/``.bz2``/``.xz``/``.zst`` file really compressed,
which line is not UTF-8, which line of a JSON Lines file does not parse; and otherwise it names the
innermost cause that ``datasets`` chained (pandas' "Expected 2 fields in line 3, saw 3").
"""

from __future__ import annotations

import json
from pathlib import Path

#: The first bytes of each compression format a data file may be named for.
MAGIC = {".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00", ".zst": b"\x28\xb5\x2f\xfd"}
COMPRESSION = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
#: How much of a file is scanned for a bad line (the first failure is near the start in practice).
SCAN_BYTES = 64 * 2**20


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc


def _first_bad_utf8_line(path: Path) -> str | None:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return (f"line {number} is not UTF-8 text (byte 0x{line[exc.start]:02x} at column {exc.start + 1}); "
                        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or check that it is a text file")
            if handle.tell() > SCAN_BYTES:
                return None
    return None


def _first_bad_json_line(path: Path) -> str | None:
    text = path.read_text(encoding="utf-8")[:SCAN_BYTES]
    try:
        json.loads(text)
        return None  # one JSON document: readable as such
    except ValueError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            return (f"line {number} is not valid JSON ({exc.msg} at column {exc.colno}); fix or remove that line "
                    "(JSON Lines: one object per line)")
        if not isinstance(row, dict):
            return f"line {number} holds a JSON {type(row).__name__}, not an object with one field per column"
    return None


def diagnose(path: Path, exc: BaseException) -> str:
    """The one-line reason ``path`` could not be read by ``datasets`` (which raised ``exc``).

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "rows.jsonl"
        >>> _ = f.write_text('{"text": "a", "label": 1}\\n{"text": "b", "label": \\n')
        >>> diagnose(f, ValueError("An error occurred while generating the dataset"))  # doctest: +ELLIPSIS
        'data file .../rows.jsonl: line 2 is not valid JSON (Expecting value at column 24); fix or remove that line ...'
    """
    where = f"data file {path}"
    try:
        size = path.stat().st_size
        if size == 0:
            return f"{where} is empty; it needs a header row (e.g. text,label) and one row per example"
        compression = path.suffix.lower()
        if compression in MAGIC:
            with path.open("rb") as handle:
                head = handle.read(len(MAGIC[compression]))
            if head != MAGIC[compression]:
                return (f"{where} is named {compression} but is not {COMPRESSION[compression]}-compressed; rename "
                        f"it without {compression}, or compress it")
        else:
            problem = _first_bad_utf8_line(path)
            if problem is None and path.suffix.lower() in (".json", ".jsonl"):
                problem = _first_bad_json_line(path)
            if problem is not None:
                return f"{where}: {problem}"
    except OSError as error:
        return f"cannot read {where}: {error.strerror or error}"
    cause = _root_cause(exc)
    detail = " ".join(str(cause).split())[:200] or type(cause).__name__
    if "No columns to parse" in detail:
        return f"{where} holds no rows; it needs a header row (e.g. text,label) and one row per example"
    return f"cannot read {where}: {type(cause).__name__}: {detail}; check that it is a well-formed {path.suffix} file"
