"""Saving and reloading surgically changed models.

A saved model is a directory with ``config.json`` (the original HF config), ``model.safetensors``
and ``surgery.json``: format version, library versions, the model class and the ordered steps
(strategy name, plan version, config, plan). Reloading builds the model from its config, replays
each step's ``apply`` through the registry and then loads the weights strictly. Nothing is
unpickled, and no class path read from the file is imported.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_model, save_model
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from surgery.errors import ModelLoadError, OutputPathError, StrategyNotFoundError
from surgery.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    set_source_dir,
    set_steps,
    source_dir_of,
    steps_of,
)
from surgery.registry import get_strategy

WEIGHTS_NAME = "model.safetensors"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _same_path(a: str | os.PathLike[str] | None, b: Path) -> bool:
    if not a:
        return False
    try:
        return Path(a).expanduser().resolve() == b
    except OSError:
        return False


@contextmanager
def atomic_directory(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``out_dir`` only if the block succeeds.

    An interrupted or failing write leaves ``out_dir`` exactly as it was.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> with atomic_directory(root / "model") as tmp:
        ...     _ = (tmp / "a.txt").write_text("x")
        >>> (root / "model" / "a.txt").read_text()
        'x'
    """
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"output path {out} exists and is a file; choose a directory path")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise OutputPathError(f"output directory {out} exists and is not empty; choose a new path or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_manifest(model: nn.Module) -> dict[str, Any]:
    """The ``surgery.json`` content for ``model``."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": {
            "encoder-surgery": _version("encoder-surgery"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        # Restored on reload so the rebuilt model computes attention the same way (eager vs sdpa differ
        # in the last bits).
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        # Restored on reload: modules that replayed steps create start in torch's default dtype.
        "dtype": weights_dtype(model),
        "steps": steps_of(model),
    }


def weights_dtype(model: nn.Module) -> str | None:
    """The floating dtype of all of ``model``'s parameters (e.g. ``"bfloat16"``), None if mixed or none.

    Example:
        >>> weights_dtype(nn.Linear(2, 2).to(torch.float16))
        'float16'
    """
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else None


def _dtype(name: str | torch.dtype, where: str) -> torch.dtype:
    dtype = name if isinstance(name, torch.dtype) else getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ModelLoadError(f"{where}: dtype {name!r} is not a torch floating dtype (float32, float16, bfloat16, "
                             "float64)")
    return dtype


def save_pretrained(
    model: nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Save ``model`` (weights, HF config, surgery manifest) atomically to ``out_dir``.

    Args:
        model: a transformers model, changed by surgery or not.
        out_dir: a new (or empty) directory; never the directory the model was loaded from.
        tokenizer: optionally saved alongside, so the output directory is self-contained.
        overwrite: replace a non-empty ``out_dir`` (atomically; it is still never the source).
        extra: writes further files into the directory before it is renamed into place, so they
            are part of the same atomic save (e.g. the task experts of an unplug-and-play runtime).

    Example:
        >>> import tempfile
        >>> from transformers import BertConfig, BertModel
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> path = save_pretrained(BertModel(cfg), Path(tempfile.mkdtemp()) / "m")
        >>> sorted(p.name for p in path.iterdir())
        ['config.json', 'model.safetensors', 'surgery.json']
    """
    out = Path(out_dir).expanduser().resolve()
    if _same_path(source_dir_of(model), out):
        raise OutputPathError(f"output directory {out} is the directory the model was loaded from; choose another")
    with atomic_directory(out, overwrite=overwrite) as tmp:
        # Like transformers, record the class that was saved, on a copy so the caller's model is untouched.
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(tmp)
        save_model(model, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / MANIFEST_NAME).write_text(json.dumps(build_manifest(model), indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extra is not None:
            extra(tmp)
    return out


def resolve_model_class(name: str | type[nn.Module] | None, config: Any) -> type[PreTrainedModel]:
    """A transformers model class by name, looked up only among transformers' own classes."""
    if isinstance(name, type):
        return name  # type: ignore[return-value]
    candidates = [name] if name else list(getattr(config, "architectures", None) or [])
    for candidate in candidates:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", candidate or ""):
            raise ModelLoadError(f"model class {candidate!r} is not a valid transformers class name")
        cls = getattr(transformers, candidate, None)
        # Only transformers' own model classes (or its AutoModel* factories) are accepted.
        if isinstance(cls, type) and (issubclass(cls, PreTrainedModel) or candidate.startswith("AutoModel")):
            return cls
        raise ModelLoadError(
            f"model class {candidate!r} is not a transformers model class; pass model_class= explicitly"
        )
    return transformers.AutoModel  # type: ignore[return-value]


def _read_manifest(path: Path) -> dict[str, Any] | None:
    file = path / MANIFEST_NAME
    if not file.exists():
        return None
    try:
        manifest = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{file} is not valid JSON ({exc}); the save is damaged, re-create it") from None
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("steps"), list):
        raise ModelLoadError(f"{file} is not a surgery manifest (missing 'format': 'surgery' or 'steps')")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ModelLoadError(
            f"{file} has format_version {manifest['format_version']}, newer than this surgery supports "
            f"({FORMAT_VERSION}); upgrade encoder-surgery"
        )
    return manifest


def _replay(model: nn.Module, steps: list[dict[str, Any]], where: Path) -> None:
    for number, step in enumerate(steps):
        name = step.get("strategy")
        try:
            cls = get_strategy(str(name))
        except StrategyNotFoundError:
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} used strategy {name!r}, which is not installed; "
                "install the package that provides it"
            ) from None
        if int(step.get("plan_version", 1)) > cls.plan_version:
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} ({name}) has plan_version {step.get('plan_version')}, "
                f"newer than the installed strategy supports ({cls.plan_version}); upgrade its package"
            )
        strategy = cls(step.get("config") or {})
        strategy.apply(model, step.get("plan") or {})


def _first_mismatch(message: str) -> str:
    match = re.search(r"size mismatch for ([^:]+): copying a param with shape (\S+) .*? current model is (\S+)\.",
                      message.replace("\n", " "))
    if match:
        return f"{match.group(1)} has shape {match.group(2)} in the file but {match.group(3)} in the rebuilt model"
    return " ".join(message.split())[:300]


def from_pretrained(
    path: str | os.PathLike[str], model_class: str | type[nn.Module] | None = None, *,
    dtype: str | torch.dtype | None = None, **kwargs: Any
) -> PreTrainedModel:
    """Load a model saved by :func:`save_pretrained`, or a plain Hugging Face model directory.

    Args:
        path: the directory, or an embedded default name such as ``"minilm-l6"``.
        model_class: the transformers class (or its name); defaults to the class recorded in
            the manifest, then ``config.architectures``, then ``AutoModel``.
        dtype: the floating dtype to build in (e.g. ``torch.bfloat16`` or ``"float16"``); default: the
            dtype the manifest records (the one the model was saved in), else transformers' default.
        **kwargs: passed to ``from_pretrained`` for plain HF directories (e.g. ``num_labels``).

    Example:
        >>> import tempfile
        >>> from transformers import BertConfig, BertModel
        >>> from surgery import convert
        >>> from surgery.strategies.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> model = BertModel(cfg)
        >>> _ = convert(model, HeadPruningStrategy(heads={1: [0, 3]}))
        >>> out = save_pretrained(model, Path(tempfile.mkdtemp()) / "m")
        >>> from_pretrained(out).encoder.layer[1].attention.self.num_attention_heads
        2
    """
    from surgery.assets import resolve_model_path

    where = resolve_model_path(path)
    manifest = _read_manifest(where)
    config_kwargs = {k: kwargs.pop(k) for k in ("num_labels", "id2label", "label2id") if k in kwargs}
    if manifest is not None and (config_kwargs or kwargs):
        raise ModelLoadError(
            f"{where} was saved by surgery; extra loading options {sorted({*config_kwargs, *kwargs})} cannot be "
            "applied when replaying its steps (load it as saved)"
        )
    try:
        config = AutoConfig.from_pretrained(where, **config_kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read a model config from {where}: {' '.join(str(exc).split())[:200]}") from None
    cls = resolve_model_class(model_class or (manifest or {}).get("model_class"), config)
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype, "from_pretrained")
    if manifest is None:
        try:
            model = cls.from_pretrained(where, config=config, **kwargs)
        except (OSError, ValueError, RuntimeError) as exc:
            detail = " ".join(str(exc).split())[:200]
            raise ModelLoadError(f"cannot load model weights from {where}: {detail}") from None
        set_source_dir(model, str(where))
        set_steps(model, [])
        return model
    weights = where / WEIGHTS_NAME
    if not weights.exists():
        raise ModelLoadError(f"{weights} is missing; the directory has a surgery manifest but no weights")
    # PreTrainedModel classes build from a config with _from_config, AutoModel* factories with from_config.
    build = getattr(cls, "_from_config", None) or cls.from_config
    attn = manifest.get("attn_implementation")
    model = build(config, **({"attn_implementation": attn} if attn else {}))
    _replay(model, manifest["steps"], where)
    wanted = kwargs.get("dtype") or manifest.get("dtype")
    if wanted:
        # Before loading, so the file's tensors copy in exactly (no rounding through another dtype).
        model.to(_dtype(wanted, str(where / MANIFEST_NAME)))
        model.config.dtype = next(model.parameters()).dtype
    try:
        missing, unexpected = load_model(model, str(weights), strict=False)
    except RuntimeError as exc:
        raise ModelLoadError(f"{weights}: {_first_mismatch(str(exc))}; the manifest's steps do not rebuild "
                             "the saved shapes (was it edited, or saved by a different strategy version?)") from None
    if missing or unexpected:
        detail = f"missing {sorted(missing)[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
        raise ModelLoadError(f"{weights} does not match the rebuilt model: {detail}")
    model.eval()
    set_steps(model, manifest["steps"])
    set_source_dir(model, str(where))
    return model
