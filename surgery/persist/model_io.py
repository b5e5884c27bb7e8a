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
import pickle  # only for its exception type: nothing is unpickled here
import re
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from pydantic import ValidationError
from safetensors.torch import load_model, save_model
from torch import nn
from transformers import PreTrainedModel

from surgery.core.errors import ConfigError, ModelLoadError, OutputPathError, SurgeryError
from surgery.core.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    ManifestStep,
    int8_float_of,
    parse_manifest,
    set_int8_float,
    set_source_dir,
    set_steps,
    source_dir_of,
    steps_of,
)
from surgery.core.registry import get_method
from surgery.core.strategy import Strategy
from surgery.persist.atomic import atomic_directory, check_separate
from surgery.persist.config_values import load_config, without_remote_code
from surgery.persist.task_heads import HeadWarning, choose_class, record_new_head, warn_choice
from surgery.persist.untrusted import (
    check_safetensors_dir,
    read_json_file,
    refuse_custom_code,
    require_safetensors,
    safetensors_shapes,
)
from surgery.persist.weight_checks import check_finite, check_loading_info

__all__ = ["WEIGHTS_NAME", "atomic_directory", "build_manifest", "from_pretrained", "output_directory",
           "resolve_model_class", "save_pretrained"]

WEIGHTS_NAME = "model.safetensors"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


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
        **({"int8_float": int8_float_of(model)} if int8_float_of(model) else {}),
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


def output_directory(model: nn.Module, out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` resolved, refused when it is, holds or lies inside the directory ``model`` was loaded from.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> output_directory(tiny_model(TinySpec("bert")), "/tmp/out").name
        'out'
    """
    out = Path(out_dir).expanduser().resolve()
    source = source_dir_of(model)
    if source and Path(source).expanduser().is_dir():
        try:
            check_separate(source, out, flag="output directory")
        except OutputPathError as exc:
            raise OutputPathError(f"{exc} (the model was loaded from there)") from None
    return out


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
        ['.surgery-manifest.json', 'config.json', 'model.safetensors', 'surgery.json']
    """
    if not isinstance(model, PreTrainedModel):
        raise ConfigError(f"save_pretrained needs a transformers model (a PreTrainedModel), got "
                          f"{type(model).__name__}; surgery saves Hugging Face encoders only")
    out = output_directory(model, out_dir)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        # Like transformers, record the class that was saved, on a copy so the caller's model is untouched.
        config = without_remote_code(copy.deepcopy(model.config))  # auto_map names files that are not copied
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
            family = getattr(cls, "config_class", None)
            if isinstance(family, type) and not isinstance(config, family):
                # GPT2Model built from a BERT config would fail deep inside transformers, or build nonsense.
                raise ModelLoadError(
                    f"model class {candidate!r} is for {getattr(family, 'model_type', family.__name__)!r} models, "
                    f"but the config is {getattr(config, 'model_type', None)!r}; name a "
                    f"{type(config).__name__.removesuffix('Config')} class (or fix surgery.json's model_class)"
                )
            return cls
        raise ModelLoadError(
            f"model class {candidate!r} is not a transformers model class; pass model_class= explicitly"
        )
    return transformers.AutoModel  # type: ignore[return-value]


def _read_manifest(path: Path) -> Manifest | None:
    file = path / MANIFEST_NAME
    if not file.exists():
        return None
    raw = read_json_file(file, what="surgery manifest", fix="the save is damaged, re-create it")
    return parse_manifest(raw, file)


def _replay(model: nn.Module, steps: list[ManifestStep], where: Path) -> None:
    for number, step in enumerate(steps):
        name = step.strategy
        try:
            cls = get_method(name)
        except SurgeryError:
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} used strategy {name!r}, which is not installed; "
                "install the package that provides it"
            ) from None
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} names {name!r}, a pipeline, not a replayable step; a saved "
                "model records its pipeline's steps instead; the manifest was edited or is damaged, re-save the model"
            )
        if step.plan_version > cls.plan_version:
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} ({name}) has plan_version {step.plan_version}, "
                f"newer than the installed strategy supports ({cls.plan_version}); upgrade its package"
            )
        try:
            cls(step.config).apply(model, step.plan)
        except (SurgeryError, ValidationError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                RuntimeError) as exc:
            # The file is input like any other: a hand-edited plan must not end in a traceback.
            detail = " ".join(str(exc).split())[:200]
            raise ModelLoadError(
                f"{where / MANIFEST_NAME}: step {number} ({name}) cannot be replayed ({type(exc).__name__}: {detail}); "
                "the manifest was edited or is damaged, re-save the model"
            ) from None


def _check_shapes(model: nn.Module, weights: Path) -> None:
    """Compare the file's tensor shapes with the rebuilt model's before loading, naming the first difference."""
    saved = safetensors_shapes(weights)
    state = model.state_dict()
    for key, shape in saved.items():
        if key in state and list(state[key].shape) != shape:
            raise ModelLoadError(
                f"{weights}: {key} has shape {shape} in the file but {list(state[key].shape)} in the rebuilt model; "
                "the manifest's steps do not rebuild the saved shapes (was it edited, or saved by a different "
                "strategy version?)"
            )


def from_pretrained(
    path: str | os.PathLike[str], model_class: str | type[nn.Module] | None = None, *, allow_pickle: bool = False,
    allow_new_head: bool = False, dtype: str | torch.dtype | None = None, **kwargs: Any,
) -> PreTrainedModel:
    """Load a model saved by :func:`save_pretrained`, or a plain Hugging Face model directory.

    Args:
        path: the directory, or an embedded default name such as ``"minilm-l6"``.
        model_class: the transformers class (or its name); defaults to the class recorded in
            the manifest, then ``config.architectures``, then ``AutoModel``. For a plain HF
            directory whose weights lack the head of the class ``architectures`` names, the class
            whose head they hold (or the bare model) loads instead, with a one-line
            :class:`surgery.persist.task_heads.HeadWarning`; an explicit class whose head is missing is refused.
        allow_new_head: accept an explicit ``model_class`` whose head is not in the weights (it is
            newly initialised and recorded, see :func:`surgery.persist.task_heads.new_head_keys`).
        allow_pickle: load a plain directory whose weights exist only as ``pytorch_model.bin`` (a
            pickle) with torch's weights-only loader; refused by default, since unpickling can run code.
        dtype: the floating dtype to build in (e.g. ``torch.bfloat16`` or ``"float16"``); default: the
            dtype the manifest records (the one the model was saved in), else transformers' default.
        **kwargs: passed to ``from_pretrained`` for plain HF directories (e.g. ``num_labels``).

    Code from the model directory never runs (``trust_remote_code`` is always off), and safetensors
    files are checked for truncation before they are read.

    Example:
        >>> import tempfile
        >>> from transformers import BertConfig, BertModel
        >>> from surgery import convert
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> model = BertModel(cfg)
        >>> _ = convert(model, HeadPruningStrategy(heads={1: [0, 3]}))
        >>> out = save_pretrained(model, Path(tempfile.mkdtemp()) / "m")
        >>> from_pretrained(out).encoder.layer[1].attention.self.num_attention_heads
        2
    """
    from surgery.persist.assets import resolve_model_path

    if kwargs.pop("trust_remote_code", False):
        raise ModelLoadError("trust_remote_code=True is not supported: surgery never runs code from a model directory")
    where = resolve_model_path(path)
    refuse_custom_code(where)
    manifest = _read_manifest(where)
    config_kwargs = {k: kwargs.pop(k) for k in ("num_labels", "id2label", "label2id") if k in kwargs}
    if manifest is not None and (config_kwargs or kwargs):
        raise ModelLoadError(
            f"{where} was saved by surgery; extra loading options {sorted({*config_kwargs, *kwargs})} cannot be "
            "applied when replaying its steps (load it as saved)"
        )
    config = load_config(where, **config_kwargs)
    cls = resolve_model_class(model_class or (manifest.model_class if manifest else None), config)
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype, "from_pretrained")
    if manifest is None:
        require_safetensors(where, allow_pickle=allow_pickle)
        check_safetensors_dir(where)
        choice = choose_class(where, config, cls, explicit=model_class is not None, allow_new_head=allow_new_head)
        if choice.cls is not cls:
            warn_choice(choice)
        cls = choice.cls
        attn = getattr(config, "_attn_implementation_internal", None)  # checked against the allow-list
        if attn is not None:
            kwargs.setdefault("attn_implementation", attn)
        try:
            # Mismatched shapes are reported by check_loading_info, naming the tensor.
            model, info = cls.from_pretrained(where, config=config, trust_remote_code=False,
                                              use_safetensors=None if allow_pickle else True,
                                              output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError) as exc:
            # UnpicklingError: torch's weights-only loader refused a pickle that asks for code (allow_pickle).
            detail = " ".join(str(exc).split())[:200]
            raise ModelLoadError(f"cannot load model weights from {where}: {detail}") from None
        pooler = check_loading_info(model, info, where, new_head=choice.new_head or [])
        check_finite(model, where)
        if pooler:
            warnings.warn(f"the weights in {where} hold no pooler ({pooler[0]}); it is new and randomly initialised",
                          HeadWarning, stacklevel=2)
        set_source_dir(model, str(where))
        set_steps(model, [])
        record_new_head(model, [*(choice.new_head or []), *pooler])
        return model
    weights = where / WEIGHTS_NAME
    if not weights.exists():
        raise ModelLoadError(f"{weights} is missing; the directory has a surgery manifest but no weights")
    # PreTrainedModel classes build from a config with _from_config, AutoModel* factories with from_config.
    build = getattr(cls, "_from_config", None) or cls.from_config
    attn = manifest.attn_implementation
    try:
        model = build(config, **({"attn_implementation": attn} if attn else {}))
    except (ValueError, ImportError) as exc:  # e.g. flash attention recorded, not installed here
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"{where / MANIFEST_NAME}: cannot build the model with attn_implementation "
                             f"{attn!r}: {detail}") from None
    _replay(model, manifest.steps, where)
    wanted = kwargs.get("dtype") or manifest.dtype
    if wanted:
        # Before loading, so the file's tensors copy in exactly (no rounding through another dtype).
        model.to(_dtype(wanted, str(where / MANIFEST_NAME)))
        model.config.dtype = next(model.parameters()).dtype
    _check_shapes(model, weights)
    try:
        missing, unexpected = load_model(model, str(weights), strict=False)
    except (RuntimeError, ValueError, OSError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"{weights} cannot be loaded into the rebuilt model: {detail}") from None
    if missing or unexpected:
        detail = f"missing {sorted(missing)[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
        raise ModelLoadError(f"{weights} does not match the rebuilt model: {detail}")
    check_finite(model, weights)
    model.eval()
    steps = [step.model_dump(mode="json") for step in manifest.steps]
    set_steps(model, steps)
    set_int8_float(model, manifest.int8_float)
    set_source_dir(model, str(where))
    return model
