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
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from torch import nn

from surgery.anatomy import adapter_for
from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import Structure
from surgery.persist.atomic import atomic_write

#: Bump when the meaning of a cached table changes (how it is measured or solved).
CACHE_FORMAT = 1
CACHE_ENV = "SURGERY_CACHE"


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


def read_cached(path: Path, key: Mapping[str, Any]) -> tuple[LatencyTable | None, str | None]:
    """The table stored at ``path`` for exactly ``key``, or ``(None, why not)``; never raises on content.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.json"
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                      overhead_ms=0.0, attention_ms={4: 1.0}, ffn_ms={8: 1.0})
        >>> _ = write_cached(path, {"runtime": "torch"}, table)
        >>> read_cached(path, {"runtime": "torch"})[0] == table, read_cached(path, {"runtime": "onnxruntime"})[1]
        (True, '... holds another key')
        >>> _ = path.write_text("{broken")
        >>> read_cached(path, {"runtime": "torch"})[1].endswith("is not readable JSON (JSONDecodeError)")
        True
    """
    if not path.is_file():
        return None, None
    try:
        stored = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{path} is not readable JSON ({type(exc).__name__})"
    if not isinstance(stored, dict) or stored.get("format") != CACHE_FORMAT:
        return None, f"{path} is not a latency table of format {CACHE_FORMAT}"
    if stored.get("key") != json.loads(json.dumps(key)):
        return None, f"{path} holds another key"
    try:
        return LatencyTable.model_validate(stored.get("table")), None
    except (ValidationError, ValueError, TypeError) as exc:
        return None, f"{path} holds no valid table ({' '.join(str(exc).split())[:120]})"


def write_cached(path: Path, key: Mapping[str, Any], table: LatencyTable) -> Path:
    """Store ``table`` for ``key`` at ``path`` (JSON, written atomically); :func:`read_cached` shows it."""
    payload = {"format": CACHE_FORMAT, "key": key, "table": table.model_dump(mode="json")}
    return atomic_write(path, json.dumps(payload, indent=1, sort_keys=True) + "\n", overwrite=True)
