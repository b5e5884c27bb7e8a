"""Sentence embeddings exactly as a sentence-transformers directory defines them.

A sentence-transformers directory lists its modules in ``modules.json``: a ``Transformer`` (the
encoder), a ``Pooling`` module configured by ``<path>/config.json`` and optionally ``Normalize``.
:func:`read_sentence_config` reads those files (JSON only, nothing imported or unpickled) into a
:class:`SentenceConfig`; :func:`pool` turns token states into the sentence embedding the same way
``sentence_transformers.models.Pooling`` and ``Normalize`` do, so a student pooled here is compared
with its teacher on the embedding its users actually get.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from surgery.core.errors import ModelLoadError
from surgery.persist.config_values import SENTENCE_CONFIG, check_max_seq_length
from surgery.persist.untrusted import MAX_JSON_BYTES, check_links_inside, path_inside, read_json_file, read_regular

MODULES_FILE = "modules.json"
# sentence-transformers' own settings (prompts, similarity function, versions): copied as it is.
ST_CONFIG_FILE = "config_sentence_transformers.json"
# What surgery saves next to a changed model. Not modules.json on purpose: stock sentence-transformers
# would then load the directory with AutoModel, which cannot rebuild pruned or converted layers and
# would initialise the missing weights at random instead of failing.
SURGERY_FILE = "sentence_embedding.json"
# sentence-transformers' module type names, old ("sentence_transformers.models.Pooling") and new spellings.
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
# Pooling modes in the order sentence-transformers concatenates them when several are on.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_MODE_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


@dataclass(frozen=True)
class SentenceConfig:
    """How a model's token states become its sentence embedding.

    Example:
        >>> cfg = SentenceConfig(modes=("mean",), normalize=True)
        >>> cfg.describe()
        'mean pooling, L2-normalised'
    """

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False
    source: str | None = None  # the directory it was read from; None when given by hand

    def describe(self) -> str:
        return f"{'+'.join(self.modes)} pooling" + (", L2-normalised" if self.normalize else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _module_kind(entry: dict[str, Any]) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def is_sentence_transformers_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` defines sentence embeddings: ``modules.json``, or surgery's ``sentence_embedding.json``.

    Example:
        >>> is_sentence_transformers_dir("/nonexistent")
        False
    """
    return (Path(path) / MODULES_FILE).is_file() or (Path(path) / SURGERY_FILE).is_file()


def write_sentence_config(config: SentenceConfig, out_dir: str | os.PathLike[str]) -> Path:
    """Record ``config`` in ``out_dir/sentence_embedding.json`` (read back by :func:`read_sentence_config`).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_sentence_config(SentenceConfig(modes=("cls",), normalize=True), d)
        >>> read_sentence_config(d).describe()
        'cls pooling, L2-normalised'
    """
    data = {k: v for k, v in config.to_dict().items() if k != "source"}
    file = Path(out_dir) / SURGERY_FILE
    file.write_text(json.dumps(data, indent=2) + "\n")
    return file


def write_sentence_transformers_files(config: SentenceConfig, out_dir: str | os.PathLike[str],
                                      dimension: int, *, source: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write the stock sentence-transformers module files of ``config``: ``modules.json`` (Transformer,
    Pooling, and Normalize if on), ``1_Pooling/config.json`` and ``sentence_bert_config.json``; and
    ``source``'s ``config_sentence_transformers.json`` (prompts, similarity function), if it has one.

    The pooling modes are written as the legacy per-mode booleans, which every sentence-transformers
    version reads, when they are in the order those booleans concatenate; otherwise as the
    ``pooling_mode`` list of the current format. :func:`read_sentence_config` reads the files back.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_sentence_transformers_files(SentenceConfig(normalize=True, max_seq_length=128), d, 384)
        >>> read_sentence_config(d).describe(), read_sentence_config(d).max_seq_length
        ('mean pooling, L2-normalised', 128)
    """
    root = Path(out_dir)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if config.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    canonical = tuple(m for m in POOLING_MODES if m in config.modes) == config.modes
    pooling: dict[str, Any] = {"word_embedding_dimension": dimension}
    if canonical:
        pooling.update({key: mode in config.modes for mode, key in _MODE_KEYS.items()})
    else:
        pooling["pooling_mode"] = list(config.modes)
    (root / "1_Pooling").mkdir(parents=True, exist_ok=True)
    files = [root / MODULES_FILE, root / "1_Pooling" / "config.json", root / SENTENCE_CONFIG]
    contents: list[Any] = [modules, pooling, {"max_seq_length": config.max_seq_length or 512,
                                             "do_lower_case": config.do_lower_case}]
    for file, content in zip(files, contents, strict=True):
        file.write_text(json.dumps(content, indent=2) + "\n")
    extra = Path(source) / ST_CONFIG_FILE if source else None
    if extra is not None and extra.is_file():
        check_links_inside(Path(source))  # copied as it is: never a file from outside the source directory
        files.append(root / ST_CONFIG_FILE)
        files[-1].write_bytes(read_regular(extra, MAX_JSON_BYTES))
    return files


def _read_json(file: Path) -> Any:
    # A regular file of bounded size and nesting (a FIFO, /dev/zero or a 100,000-deep file is one line too).
    return read_json_file(file, what=file.name, fix="repair or remove it")


def read_sentence_config(path: str | os.PathLike[str]) -> SentenceConfig | None:
    """The pooling and normalisation of a sentence-transformers directory; None if it is not one.

    Only ``Transformer`` + ``Pooling`` (+ ``Normalize``) pipelines are supported; a directory with
    other modules (``Dense``, ``LayerNorm`` ...) raises a one-line :class:`ModelLoadError`.

    Example:
        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "modules.json").write_text(json.dumps([
        ...     {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        ...     {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        >>> (d / "1_Pooling").mkdir()
        >>> _ = (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
        >>> read_sentence_config(d).describe()
        'cls pooling'
    """
    root = Path(path)
    if not (root / MODULES_FILE).is_file():
        if not (root / SURGERY_FILE).is_file():
            return None
        check_links_inside(root)
        return _read_surgery_file(root)
    check_links_inside(root)  # every file below is read by a name inside the directory, never through a link out
    modules = _read_json(root / MODULES_FILE)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelLoadError(f"{root / MODULES_FILE} must be a list of module entries")
    kinds = [_module_kind(m) for m in modules]
    unsupported = [k for k in kinds if k not in (_TRANSFORMER, _POOLING, _NORMALIZE)]
    if unsupported or kinds[:1] != [_TRANSFORMER] or kinds.count(_POOLING) != 1:
        raise ModelLoadError(
            f"{root / MODULES_FILE}: modules {kinds}; surgery supports Transformer, Pooling and optionally "
            "Normalize (in that order); remove the other modules or use the task objective"
        )
    pooling = modules[kinds.index(_POOLING)]
    # The module's folder is named in modules.json: data, not a place to go (../x, /etc, a link out are refused).
    folder = str(pooling.get("path", ""))
    path_inside(root, folder, named_in=root / MODULES_FILE)
    pooling_file = path_inside(root, Path(folder) / "config.json", named_in=root / MODULES_FILE)
    if not pooling_file.is_file():
        raise ModelLoadError(f"{pooling_file} is missing; a sentence-transformers Pooling module needs its config")
    pooling_config = _read_json(pooling_file)
    if not isinstance(pooling_config, dict):
        raise ModelLoadError(f"{pooling_file} must hold a JSON object (the pooling modes); repair or remove it")
    modes = pooling_modes(pooling_config, str(pooling_file))
    st_config = root / SENTENCE_CONFIG
    extra = _read_json(st_config) if st_config.is_file() else {}
    if not isinstance(extra, dict):
        raise ModelLoadError(f"{st_config} must hold a JSON object (max_seq_length, do_lower_case); repair or remove "
                             "it")
    return SentenceConfig(
        modes=modes,
        normalize=_NORMALIZE in kinds[kinds.index(_POOLING):],
        max_seq_length=check_max_seq_length(extra.get("max_seq_length"), st_config),
        do_lower_case=bool(extra.get("do_lower_case", False)),
        source=str(root),
    )


def _read_surgery_file(root: Path) -> SentenceConfig:
    data = _read_json(root / SURGERY_FILE)
    if not isinstance(data, dict):
        raise ModelLoadError(f"{root / SURGERY_FILE} must hold a mapping")
    modes = pooling_modes({"pooling_mode": data.get("modes") or "mean"}, str(root / SURGERY_FILE))
    return SentenceConfig(modes=modes, normalize=bool(data.get("normalize", False)),
                          max_seq_length=check_max_seq_length(data.get("max_seq_length"), root / SURGERY_FILE),
                          do_lower_case=bool(data.get("do_lower_case")),
                          source=str(root))


def pooling_modes(config: dict[str, Any], where: str = "pooling config") -> tuple[str, ...]:
    """The enabled pooling modes of a ``1_Pooling/config.json`` mapping, in concatenation order.

    Example:
        >>> pooling_modes({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})
        ('cls', 'mean')
        >>> pooling_modes({"pooling_mode": "max"})
        ('max',)
    """
    named = config.get("pooling_mode")  # the current format: one mode name or a list of them
    if named is not None:
        modes = (named,) if isinstance(named, str) else tuple(named)
        unknown = [m for m in modes if m not in POOLING_MODES]
        if unknown or not modes:
            raise ModelLoadError(f"{where}: pooling_mode {named!r} is not one of {POOLING_MODES}")
        return modes  # concatenated in the order given, as sentence-transformers does
    # The legacy format: one boolean per mode; none enabled means mean, as sentence-transformers reads it.
    return tuple(m for m in POOLING_MODES if config.get(_MODE_KEYS[m])) or ("mean",)


def pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor, config: SentenceConfig) -> torch.Tensor:
    """The sentence embedding of a batch, as sentence-transformers' Pooling (+ Normalize) computes it.

    Follows ``sentence_transformers`` 5/6 for padded batches: ``cls`` takes the first real token,
    ``max`` ignores padding, ``weightedmean`` weighs real tokens 1, 2, ... from the first real one,
    and several modes are concatenated in :data:`POOLING_MODES` order.

    Example:
        >>> h = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [9.0, 9.0]]])
        >>> pool(h, torch.tensor([[1, 1, 0]]), SentenceConfig(modes=("max", "mean")))
        tensor([[3., 4., 2., 2.]])
    """
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
    batch, length = token_embeddings.shape[:2]
    first = attention_mask.to(torch.int32).argmax(1)  # first real token (0 with right padding)
    parts: list[torch.Tensor] = []
    for mode in config.modes:
        if mode == "cls":
            parts.append(token_embeddings[torch.arange(batch), first])
        elif mode == "max":
            parts.append(token_embeddings.masked_fill(mask == 0, float("-inf")).amax(1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = mask.sum(1).clamp(min=1e-9)
            parts.append((token_embeddings * mask).sum(1) / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":
            weights = torch.arange(1, length + 1, device=mask.device, dtype=mask.dtype).view(1, -1, 1)
            weighted = mask * (weights - first.view(-1, 1, 1).to(mask.dtype))
            parts.append((token_embeddings * weighted).sum(1) / weighted.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":
            values, back = attention_mask.flip(1).max(1)
            last = length - 1 - torch.where(values == 0, length - 1, back)
            parts.append((token_embeddings * mask)[torch.arange(batch), last])
        else:
            raise ModelLoadError(f"pooling mode {mode!r} is not one of {POOLING_MODES}")
    out = torch.cat(parts, dim=1)
    return F.normalize(out, p=2, dim=1) if config.normalize else out
