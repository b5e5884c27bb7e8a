"""Latency tables kept on disk: one JSON file per model shape, runtime, batch shape, threads and machine.

Measuring a table takes seconds to minutes, and its numbers hold for every model of the same shape on
the same machine, runtime and libraries, so they are kept under ``$SURGERY_CACHE/latency`` (default
``~/.cache/surgery/latency``). The key says everything a timing depends on: the model's class, family,
hidden size, head dimension, vocabulary and per-layer heads and FFN widths; the runtime, batch shape
and threads; the probe design; the machine's fingerprint (CPU model and flags,
:mod:`surgery.measure.machine`) and the torch, onnxruntime and transformers versions. A file is JSON
only, read back through the :class:`LatencyTable` validator, and used only when its stored key equals
the one asked for; anything else (unreadable, corrupt, another key) is ignored and measured again.
Files are written atomically, so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from torch import nn

from surgery.anatomy import adapter_for
from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import Structure
from surgery.core.errors import ModelLoadError, SurgeryError
from surgery.persist.atomic import atomic_write
from surgery.persist.untrusted import read_regular, text_depth

#: Bump when the meaning of a cached table changes (how it is measured or solved).
CACHE_FORMAT = 1
CACHE_ENV = "SURGERY_CACHE"
#: Largest cache file read: a table is a few kilobytes.
MAX_CACHE_BYTES = 2**20
#: Deepest nesting read: a table file nests 5 levels.
MAX_CACHE_DEPTH = 16
#: How far a cached table's prediction may be from the model's own time (either way, as a ratio) before it is
#: measured again. Not 25%: two timings of one model minutes apart on a busy machine differ by that much
#: (experiments/latency_prediction; 27% here on a shared 2-core machine), and re-measuring on noise would
#: make the cache useless; a tampered or foreign table (100x off, Infinity) is far outside it. A uniformly
#: scaled table would not change a speedup anyway: speedups are ratios of one table's predictions.
CHECK_TOLERANCE = 0.5
#: Timed rounds of that check (after one warm-up).
CHECK_REPEATS = 5
#: The entries of a table's ``measured`` kept from a file: numbers only (a file's text never reaches a report).
_MEASURED_NUMBERS = ("repeats", "probe_layers", "seconds", "scale", "load_before", "load_after", "spread",
                     "ffn_step", "threads")


def default_cache_dir() -> Path:
    """``$SURGERY_CACHE/latency``, or ``~/.cache/surgery/latency`` when the variable is unset or empty.

    Example:
        >>> os.environ["SURGERY_CACHE"] = "/tmp/surgery-cache"
        >>> str(default_cache_dir())
        '/tmp/surgery-cache/latency'
        >>> del os.environ["SURGERY_CACHE"]
    """
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "surgery")
    return Path(root).expanduser() / "latency"


def model_shape(model: nn.Module) -> dict[str, Any]:
    """What a model's timing depends on, as plain JSON (weights' values do not matter).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> shape = model_shape(tiny_model(TinySpec("bert", task="seq-cls")))
        >>> shape["model_class"], shape["hidden"], shape["head_dim"], shape["layers"][0]
        ('BertForSequenceClassification', 32, 8, {'heads': 4, 'ffn_width': 37})
    """
    adapter = adapter_for(model)
    config = model.config
    first = next(iter(model.parameters()), None)
    return {
        "model_class": type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "hidden": adapter.hidden_size,
        "head_dim": adapter.head_dim(),
        "vocab": getattr(config, "vocab_size", None),
        "num_labels": getattr(config, "num_labels", None),
        "attention": getattr(config, "_attn_implementation", None),
        "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
        "layers": Structure.from_model(model).to_json(),
    }


def model_key(shape: Mapping[str, Any]) -> str:
    """A short readable name of a :func:`model_shape` for the table's ``model_key``.

    Example:
        >>> model_key({"model_type": "bert", "model_class": "BertModel", "hidden": 384, "head_dim": 32,
        ...            "layers": [{"heads": 12, "ffn_width": 1536}] * 6, "attention": "sdpa"})
        'bert BertModel hidden 384, 6 layers, heads 12 x 32, ffn 1536, sdpa'
    """
    kept = [layer for layer in shape["layers"] if layer is not None]
    heads = sorted({layer["heads"] for layer in kept})
    widths = sorted({layer["ffn_width"] for layer in kept})

    def span(values: list[int]) -> str:
        return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}" if values else "-"

    return (f"{shape['model_type']} {shape['model_class']} hidden {shape['hidden']}, {len(kept)} layers, "
            f"heads {span(heads)} x {shape['head_dim']}, ffn {span(widths)}, {shape.get('attention')}")


def cache_path(cache_dir: str | os.PathLike[str], key: Mapping[str, Any]) -> Path:
    """The file of ``key`` in ``cache_dir``: a readable prefix and a digest of the whole key.

    Example:
        >>> key = {"shape": {"model_type": "bert"}, "runtime": "torch", "batch_size": 8, "seq_len": 64,
        ...        "threads": 1}
        >>> cache_path("/tmp/c", key).name
        'bert-torch-b8-s64-t1-4cda9266a1b7658c55cc.json'
    """
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    prefix = (f"{key['shape'].get('model_type')}-{key['runtime']}-b{key['batch_size']}-s{key['seq_len']}"
              f"-t{key['threads']}")
    return Path(cache_dir) / f"{prefix}-{digest}.json"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a time")


def _numbers(value: Any) -> list[float]:
    """Every number in a parsed JSON value (its depth is already capped, so recursion is bounded)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def table_problem(table: LatencyTable) -> str | None:
    """Why a table's numbers cannot be times, or None: every time finite and >= 0, and some time positive.

    A measured table may hold zeros (attention at the head count whose whole cost is the layer's
    overhead, an FFN of width 0), so zero is a time; infinite, NaN or negative numbers are not, and a
    table of zeros predicts nothing.

    Example:
        >>> t = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                  overhead_ms=0.0, attention_ms={4: 1.0}, ffn_ms={8: 1.0})
        >>> table_problem(t) is None, table_problem(t.model_copy(update={"ffn_ms": {8: float("inf")}}))
        (True, 'ffn_ms holds a time that is not a finite number >= 0')
    """
    for name in ("attention_ms", "ffn_ms"):
        values = list(getattr(table, name).values())
        if not values or not all(math.isfinite(v) and v >= 0 for v in values):
            return f"{name} holds a time that is not a finite number >= 0"
    for name in ("base_ms", "overhead_ms", "reference_ms"):
        value = getattr(table, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            return f"{name} is not a finite number >= 0"
    if not max(table.attention_ms.values()) + max(table.ffn_ms.values()) + table.overhead_ms > 0:
        return "its layers cost nothing"
    return None


def _clean(table: LatencyTable, key: Mapping[str, Any]) -> LatencyTable:
    """The table with its free-form text replaced by what the key says: a file's text never reaches a report."""
    shape = key.get("shape")
    measured = {k: v for k, v in table.measured.items() if k in _MEASURED_NUMBERS and isinstance(v, int | float)
                and not isinstance(v, bool) and math.isfinite(v)}
    return table.model_copy(update={"model_key": model_key(shape) if isinstance(shape, Mapping) else "cached table",
                                    "machine": {}, "measured": measured})


def read_cached(path: Path, key: Mapping[str, Any]) -> tuple[LatencyTable | None, str | None]:
    """The table stored at ``path`` for exactly ``key``, or ``(None, why not)``; never raises on content.

    A cache file is untrusted input: a regular file of at most :data:`MAX_CACHE_BYTES`, nested at most
    :data:`MAX_CACHE_DEPTH` deep (checked before parsing), holding only finite positive times. Its
    free-form text (model key, machine, notes) is dropped: the caller fills in its own, so nothing
    written in the file is copied into a report. The reasons returned name the file, never its text.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.json"
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                      overhead_ms=0.0, attention_ms={4: 1.0}, ffn_ms={8: 1.0})
        >>> _ = write_cached(path, {"runtime": "torch"}, table)
        >>> read_cached(path, {"runtime": "torch"})[0].ffn_ms, read_cached(path, {"runtime": "onnxruntime"})[1]
        ({8: 1.0}, '... holds another key')
        >>> _ = path.write_text("{broken")
        >>> read_cached(path, {"runtime": "torch"})[1].endswith("is not readable JSON (JSONDecodeError)")
        True
    """
    try:
        if not path.is_file():
            return None, None
        data = read_regular(path, MAX_CACHE_BYTES)
    except (OSError, ModelLoadError):
        return None, f"{path} is not a regular file of at most {MAX_CACHE_BYTES} bytes"
    if text_depth(data, MAX_CACHE_DEPTH) > MAX_CACHE_DEPTH:
        return None, f"{path} nests deeper than {MAX_CACHE_DEPTH} levels"
    try:
        stored = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"{path} is not readable JSON ({type(exc).__name__})"
    if not isinstance(stored, dict) or stored.get("format") != CACHE_FORMAT:
        return None, f"{path} is not a latency table of format {CACHE_FORMAT}"
    if stored.get("key") != json.loads(json.dumps(key)):
        return None, f"{path} holds another key"
    if not all(math.isfinite(n) for n in _numbers(stored.get("table"))):
        return None, f"{path} holds a number that is not finite"
    try:
        table = LatencyTable.model_validate(stored.get("table"))
    except (ValidationError, ValueError, TypeError) as exc:
        fields = exc.errors() if isinstance(exc, ValidationError) else []
        where = ", ".join(sorted({".".join(str(p) for p in e["loc"][:1]) for e in fields})) or type(exc).__name__
        return None, f"{path} holds no valid table ({where})"
    problem = table_problem(table)
    if problem is not None:
        return None, f"{path}: {problem}"
    return _clean(table, key), None


def write_cached(path: Path, key: Mapping[str, Any], table: LatencyTable) -> Path:
    """Store ``table`` for ``key`` at ``path`` (JSON, written atomically); :func:`read_cached` shows it."""
    payload = {"format": CACHE_FORMAT, "key": key, "table": table.model_dump(mode="json")}
    # record=False: a cache file is surgery's own (named by its key, in surgery's cache), not a user's output.
    return atomic_write(path, json.dumps(payload, indent=1, sort_keys=True) + "\n", overwrite=True, record=False)


def try_write_cached(path: Path, key: Mapping[str, Any], table: LatencyTable) -> str | None:
    """:func:`write_cached`, or a one-line note naming ``SURGERY_CACHE`` when the location cannot hold files.

    A cache is an optimisation: a location that is not a directory (``SURGERY_CACHE=/dev/null``), is
    read-only or is full costs the next run a measurement, not this run its result.

    Example:
        >>> t = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                  overhead_ms=0.0, attention_ms={4: 1.0}, ffn_ms={8: 1.0})
        >>> try_write_cached(Path("/dev/null/latency/t.json"), {}, t)  # doctest: +ELLIPSIS
        'latency cache: cannot write /dev/null/latency/t.json (...); measured without a cache: set SURGERY_CACHE ...'

        A table that :func:`read_cached` would refuse (noise on a tiny model left its layers costing nothing)
        is not written:

        >>> import tempfile
        >>> nothing = t.model_copy(update={"attention_ms": {4: 0.0}, "ffn_ms": {8: 0.0}})
        >>> out = Path(tempfile.mkdtemp()) / "t.json"
        >>> try_write_cached(out, {}, nothing), out.exists()
        ('latency cache: not stored, its layers cost nothing (measured again next time)', False)
    """
    if (problem := table_problem(table)) is not None:  # read_cached would refuse it: a file no run can use
        return f"latency cache: not stored, {problem} (measured again next time)"
    try:
        write_cached(path, key, table)
    except (OSError, SurgeryError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        return (f"latency cache: cannot write {path} ({reason}); measured without a cache: set {CACHE_ENV} to a "
                "writable directory to keep latency tables between runs")
    return None
