"""What loaded weights must be: complete for the encoder, all of the model's, the right shapes, finite.

transformers loads a plain directory leniently: a tensor the checkpoint lacks is randomly initialised,
a tensor the model has no place for is dropped, each with a log line at most. For surgery that is
silent corruption: ``apply`` would save a "compressed" random model with exit status 0. So after a
plain directory is loaded (``output_loading_info=True``), :func:`check_loading_info` refuses in one
line:

* missing encoder weights (every key of the base model except its pooler), listed;
* tensors for a module of the encoder that the model does not have (a layer the config lacks);
* tensors whose shape differs from the model built from ``config.json``, naming the tensor and both
  shapes (transformers' own message only points at a report printed elsewhere).

A trained head that config.json names (a classifier) must be complete too. Only a task head may be
new: the one :func:`surgery.persist.task_heads.choose_class` allowed, and a pooler the
checkpoint does not hold (the pooler feeds only a sequence classifier's head), which is returned so
the caller can announce it. Tensors of another task's head (an MLM head when a classifier is loaded)
are dropped as transformers does. :func:`check_finite` refuses NaN or infinite weights, for plain and
surgery-saved directories alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgery.core.errors import ModelLoadError
from surgery.persist.task_heads import SHOWN


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:SHOWN])
    return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def _encoder_path(model: nn.Module, key: str) -> str | None:
    """``key`` relative to the base model when it names one of the base model's modules, else None."""
    base = getattr(model, "base_model", model)
    prefix = getattr(model, "base_model_prefix", "")
    inner = key.removeprefix(f"{prefix}.") if prefix and base is not model else key
    children = {name for name, _ in base.named_children()}
    return inner if inner.split(".", 1)[0] in children else None


def check_loading_info(model: nn.Module, info: Mapping[str, Any], where: Path, *, new_head: Iterable[str] = ()
                       ) -> list[str]:
    """Refuse missing, unexpected or mis-shaped encoder tensors; return the newly initialised pooler keys.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> info = {"missing_keys": ["encoder.layer.1.output.dense.weight"], "unexpected_keys": []}
        >>> check_loading_info(model, info, Path("m"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: m lacks 1 encoder weight(s) (encoder.layer.1.output.dense.weight), which ...
    """
    mismatched = sorted(info.get("mismatched_keys") or [], key=str)
    if mismatched:
        key, saved, built = mismatched[0][:3]
        more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
        raise ModelLoadError(f"{where}: {key} has shape {list(saved)} in the file but {list(built)} in the model "
                             f"built from config.json{more}; the weights do not belong to this config (another "
                             "checkpoint's, or config.json or num_labels was changed)")
    # Keys outside the encoder are a head's: choose_class has checked that the head is there, or that a new
    # one was asked for (tied keys such as an MLM decoder's bias are reported missing, yet filled by tying).
    allowed = set(new_head)
    missing = sorted(k for k in info.get("missing_keys") or [] if k not in allowed and _encoder_path(model, k))
    pooler = [k for k in missing if (_encoder_path(model, k) or "").startswith("pooler.")]
    lacking = [k for k in missing if k not in pooler]
    if lacking:
        raise ModelLoadError(f"{where} lacks {len(lacking)} encoder weight(s) ({_listed(lacking)}), which would be "
                             "randomly initialised; the weights are damaged or belong to a smaller model, "
                             "re-download or re-save it")
    _check_trained_head(model, info, where, allowed)
    foreign = sorted(k for k in info.get("unexpected_keys") or [] if _encoder_path(model, k) is not None)
    if foreign:
        raise ModelLoadError(f"{where} holds {len(foreign)} tensor(s) the model built from config.json has no place "
                             f"for ({_listed(foreign)}); config.json does not describe these weights (e.g. fewer "
                             "layers), use the config they were saved with")
    return pooler


def _check_trained_head(model: nn.Module, info: Mapping[str, Any], where: Path, allowed: set[str]) -> None:
    """Refuse missing head tensors of a trained head (a classifier) that config.json names and that was loaded.

    :func:`surgery.persist.task_heads.choose_class` refuses it from the safetensors header already; this
    catches the weights it cannot read before loading (a pickled ``pytorch_model.bin``).
    """
    from surgery.persist.task_heads import damaged_head, is_trained_head

    named = [str(n) for n in getattr(getattr(model, "config", None), "architectures", None) or []]
    if not named or named[0] != type(model).__name__ or not is_trained_head(named[0]):
        return
    missing = sorted(k for k in info.get("missing_keys") or [] if k not in allowed and _encoder_path(model, k) is None)
    if missing:
        raise damaged_head(where, named[0], missing)


def check_finite(model: nn.Module, where: Path) -> None:
    """Refuse a model with NaN or infinite weights, naming the first such tensor.

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     layer.weight[0, 0] = float("nan")
        >>> check_finite(layer, Path("m"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: m: weight holds 1 NaN or infinite value(s); ...
    """
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and tensor.device.type != "meta":
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise ModelLoadError(f"{where}: {name} holds {bad} NaN or infinite value(s); the weights are damaged, "
                                     "re-download or re-save the model")
