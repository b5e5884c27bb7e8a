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

from surgery.persist.untrusted import file_depth

#: The first bytes of each compression format a data file may be named for.
MAGIC = {".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00", ".zst": b"\x28\xb5\x2f\xfd"}
COMPRESSION = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
#: How much of a file is scanned for a bad line (the first failure is near the start in practice).
SCAN_BYTES = 64 * 2**20
#: How much of a file's start tells what it is (byte-order mark, magic number, NUL bytes).
SNIFF_BYTES = 4096
#: Deepest nesting of a JSON data file: rows are objects of scalars or short lists.
MAX_DATA_DEPTH = 64


#: What ``--calibration`` reads, said where a calibration file is missing.
CALIBRATION_FORMATS = ("texts like the ones the model will serve: a .txt file (one text per line), or a table "
                       "(.csv/.tsv/.json/.jsonl/.parquet) whose --text-column holds them")
#: What labelled ``--data`` reads.
TABLE_FORMATS = "a .csv, .tsv, .json, .jsonl or .parquet file with a text and a label column"
#: What ``--data`` reads where plain texts also serve (the embedding objective of apply and compress).
DATA_FORMATS = ("labelled data (.csv/.tsv/.json/.jsonl/.parquet with a text and a label column), or for a "
                "sentence-embedding model any texts (also .txt, one per line)")
#: The table formats ``datasets`` reads, by file suffix (before any compression suffix).
TABLE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
#: Plain text, one text per line (the embedding objective and --calibration).
TEXT_SUFFIXES = (".txt", ".txt.gz", ".txt.bz2")


#: NNCF's default calibration subset (``nncf.quantize``'s ``subset_size``): the examples its int8 ranges are set on.
QUANTIZER_SUBSET = 300


class DataWarning(UserWarning):
    """Data that is read, but probably not what its author meant (some texts empty, too few to calibrate ...)."""


def calibration_warning(texts: int, tokens: int, flag: str = "--calibration") -> str | None:
    """Why ``texts`` calibration texts of ``tokens`` tokens in all are too few for int8 ranges; None if enough.

    The int8 runtimes set each activation's range (and SmoothQuant its scales) from these texts; NNCF
    samples :data:`QUANTIZER_SUBSET` of them by default. A handful of short texts leaves the ranges to
    chance: the graph is written, and its drift measured, but on texts it never saw the ranges are wrong.

    Example:
        >>> calibration_warning(1, 3)  # doctest: +ELLIPSIS
        '--calibration gave 1 text (3 tokens in all): int8 ranges set on so few are left to chance (NNCF ...'
        >>> calibration_warning(512, 20_000) is None
        True
    """
    if texts >= QUANTIZER_SUBSET:
        return None
    return (f"{flag} gave {texts} text{'s' if texts != 1 else ''} ({tokens:,} tokens in all): int8 ranges set on so "
            f"few are left to chance (NNCF calibrates on {QUANTIZER_SUBSET} examples by default); pass a few hundred "
            "texts like the ones the model will serve")


def data_suffix(path: Path) -> str:
    """The suffix that says a data file's format, compression suffixes set aside (``.csv`` of ``d.csv.gz``).

    Example:
        >>> data_suffix(Path("train.jsonl.gz")), data_suffix(Path("notes"))
        ('.jsonl', '')
    """
    suffixes = [s for s in path.suffixes if s not in COMPRESSION]
    return suffixes[-1].lower() if suffixes else ""


def check_input_file(path: str | None, flag: str, formats: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse, before any work (torch is not imported), an input file that does not exist, is not a regular
    file or (with ``suffixes``) is in a format that will not be read, naming its flag and the formats it takes.

    Embedded dataset names (``rotten-tomatoes``) count as existing.

    Example:
        >>> check_input_file("nope.txt", "--calibration", CALIBRATION_FORMATS)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.DataError: --calibration nope.txt does not exist; pass texts like ... ...
    """
    from surgery.core.errors import DataError
    from surgery.persist.assets import DATASETS

    if path is None or path in DATASETS:
        return
    file = Path(path).expanduser()
    if not file.exists():
        raise DataError(f"{flag} {path} does not exist; pass {formats} (or one of: {', '.join(DATASETS)})")
    if not file.is_file():
        kind = "a directory" if file.is_dir() else "not a regular file (a pipe, socket or device)"
        raise DataError(f"{flag} {path} is {kind}; pass a regular file: {formats}")
    if suffixes is not None and not (data_suffix(file) in suffixes or file.name.lower().endswith(suffixes)):
        raise DataError(f"{flag} {path}: unsupported format {data_suffix(file) or '(no suffix)'}; pass {formats}")


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


def json_nesting_problem(path: Path) -> str | None:
    """Why a JSON or JSON Lines data file cannot be rows: nested deeper than :data:`MAX_DATA_DEPTH` anywhere (a
    parser recurses once per level: Python's json raises RecursionError, datasets' reader crashed the process), or
    None. The whole file is scanned without parsing, in bounded memory (about 30 MB/s).

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "rows.json"
        >>> _ = f.write_text("[" * 100_000 + "]" * 100_000)
        >>> json_nesting_problem(f)
        'nests deeper than 64 levels; data rows are flat objects ({"text": ..., "label": ...}), one per row'
    """
    if file_depth(path, MAX_DATA_DEPTH) > MAX_DATA_DEPTH:
        return (f"nests deeper than {MAX_DATA_DEPTH} levels; data rows are flat objects "
                '({"text": ..., "label": ...}), one per row')
    return None


def check_json_data(path: Path) -> None:
    """Refuse, before ``datasets`` parses it, a ``.json``/``.jsonl`` data file nested absurdly deep.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "rows.jsonl"
        >>> _ = f.write_text('{"text": "a", "label": 1}\\n')
        >>> check_json_data(f)
    """
    from surgery.core.errors import DataError

    if path.suffix.lower() in (".json", ".jsonl") and path.is_file():
        problem = json_nesting_problem(path)
        if problem is not None:
            raise DataError(f"data file {path} {problem}")


def _first_bad_json_line(path: Path) -> str | None:
    problem = json_nesting_problem(path)
    if problem is not None:
        return problem
    text = path.read_text(encoding="utf-8")[:SCAN_BYTES]
    try:
        json.loads(text)
        return None  # one JSON document: readable as such
    except (ValueError, RecursionError):
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            return f"line {number} nests too deeply; data rows are flat objects, one per line"
        except ValueError as exc:
            return (f"line {number} is not valid JSON ({exc.msg} at column {exc.colno}); fix or remove that line "
                    "(JSON Lines: one object per line)")
        if not isinstance(row, dict):
            return f"line {number} holds a JSON {type(row).__name__}, not an object with one field per column"
    return None


#: Byte-order marks of text saved in UTF-16 or UTF-32 (longest first: UTF-32's starts like UTF-16's).
BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
        (b"\xfe\xff", "UTF-16"))
PARQUET_MAGIC = b"PAR1"


def _encoding_problem(head: bytes, path: Path) -> str | None:
    """A text file in UTF-16 or UTF-32 (told by its byte-order mark, or by NUL bytes between letters), or None.

    Example:
        >>> _encoding_problem("text,label".encode("utf-16"), Path("d/rows.csv"))  # doctest: +ELLIPSIS
        'is UTF-16 text (...); save it as UTF-8: iconv -f UTF-16 -t UTF-8 rows.csv > rows-utf8.csv'
    """
    convert = f"{path.name} > {path.stem}-utf8{path.suffix}"
    for bom, name in BOMS:
        if head.startswith(bom):
            return (f"is {name} text (it starts with a {name} byte-order mark); save it as UTF-8: iconv -f {name} -t "
                    f"UTF-8 {convert}")
    sample = head[:SNIFF_BYTES]
    if sample and sample.count(0) > len(sample) // 4:
        return ("holds NUL bytes between its characters: UTF-16 or UTF-32 text without a byte-order mark, or not a "
                f"text file; save text as UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8 {convert})")
    return None


def _parquet_problem(path: Path, head: bytes, size: int) -> str | None:
    """Why a ``.parquet`` file is not Parquet (Parquet starts and ends with ``PAR1``), saying what it is instead."""
    with path.open("rb") as handle:
        handle.seek(max(size - len(PARQUET_MAGIC), 0))
        tail = handle.read()
    if head.startswith(PARQUET_MAGIC):
        return None if tail == PARQUET_MAGIC else "is truncated: it starts as Parquet but has no Parquet footer"
    kind = next((f"{COMPRESSION[suffix]}-compressed data" for suffix, magic in MAGIC.items() if head.startswith(magic)),
                None)
    if kind is None:
        kind = _encoding_problem(head, path)
        if kind is not None:
            return f"is named .parquet but {kind.removeprefix('is ')}"
        try:
            head[:4096].decode("utf-8")
            kind = "text (CSV or JSON?); name it for its format (.csv, .tsv, .json, .jsonl)"
        except UnicodeDecodeError as exc:
            kind = "binary data" if exc.start < 4000 else "text (CSV or JSON?)"
    return f"is named .parquet but is not a Parquet file (no PAR1 header): it holds {kind}"


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
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
        if compression == ".parquet":  # a Parquet file that datasets still cannot read: its own reason, below
            problem = _parquet_problem(path, head, size)
            if problem is not None:
                return f"{where} {problem}"
        elif compression in MAGIC:
            if not head.startswith(MAGIC[compression]):
                return (f"{where} is named {compression} but is not {COMPRESSION[compression]}-compressed; rename "
                        f"it without {compression}, or compress it")
        else:
            problem = _encoding_problem(head, path)
            if problem is not None:
                return f"{where} {problem}"
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
    if "corresponds to no data" in detail:  # datasets' words for a file that parsed into zero rows
        return (f"{where} has no rows (a header at most); it needs one row per example under its header "
                "(e.g. text,label)")
    return f"cannot read {where}: {type(cause).__name__}: {detail}; check that it is a well-formed {path.suffix} file"
