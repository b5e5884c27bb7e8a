"""A model's ``config.json`` is input: checked before any model is built from it.

transformers builds whatever a config says: ``num_attention_heads: 0`` ends in ZeroDivisionError,
``-4`` is accepted and saved, ``num_hidden_layers: 100000`` builds for minutes, ``layer_norm_eps:
NaN`` gives NaN outputs, and an ``_attn_implementation`` naming a hub kernel asks transformers to
fetch code. :func:`load_config` reads the file as untrusted input (a regular file, size and nesting
capped, :mod:`surgery.untrusted`), lets transformers parse it into the family's config class, and
then checks the values it will build from, read through that class as transformers reads them
(``getattr`` with the family's stock defaults and attribute names, e.g. DistilBERT's ``dim``):

* sizes are positive integers (not strings, floats or booleans), the hidden size is divisible by the
  number of heads, at most :data:`MAX_LAYERS` layers;
* the parameter count estimated from the config (embeddings plus per layer ``4 h^2 + 3 h i``, an
  upper bound for every supported family) is at most :data:`MAX_PARAMS` (20 billion, far above any
  encoder, below what would exhaust a machine before a message);
* epsilons are finite and positive, dropout probabilities in [0, 1], the initializer range finite;
* ``_attn_implementation`` is one of transformers' built-in implementations (the manifest's list).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from surgery.core.errors import ConfigError, ModelLoadError
from surgery.core.manifest import ATTENTION_IMPLEMENTATIONS
from surgery.persist.untrusted import read_json_file

#: The largest model surgery builds from a config: 20 billion parameters (80 GB in fp32).
MAX_PARAMS = 20_000_000_000
#: The most sequences in one batch anything takes, CLI and Python configs alike: a typo (an extra zero or six)
#: is refused in one line instead of running for days.
MAX_BATCH = 65_536
#: The deepest encoder surgery builds (published encoders have 48 layers at most).
MAX_LAYERS = 1024
#: Sizes every supported family has (through its attribute_map where it names them differently).
SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "max_position_embeddings")
#: Further sizes of some families, checked where the family has them.
FAMILY_SIZES = ("intermediate_size", "hidden_dim", "embedding_size", "global_attn_every_n_layers",
                "relative_attention_num_buckets", "local_attention")
#: Integers that may be zero or negative by design (-1: "use the default"), but must be integers.
SIGNED = ("type_vocab_size", "position_buckets", "max_relative_positions", "pad_token_id")
#: The dtypes a config may name (transformers reads "auto" and torch's floating dtype names).
DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
EPSILONS = ("layer_norm_eps", "norm_eps")
PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                 "seq_classif_dropout", "qa_dropout", "classifier_dropout", "embedding_dropout", "mlp_dropout",
                 "pooler_dropout")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_raw_config(raw: Any, file: Path) -> None:
    """Checks on the file's own mapping, before transformers reads it (it would act on them)."""
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{file} must hold a JSON object (a mapping of settings), not a {type(raw).__name__}")
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key)
        if value is not None and value not in DTYPES:
            raise ModelLoadError(f"{file}: {key} {value!r} is not one of {', '.join(DTYPES)}; fix config.json")
    for key in ("_attn_implementation", "attn_implementation"):
        value = raw.get(key)
        if value is not None and value not in ATTENTION_IMPLEMENTATIONS:
            raise ModelLoadError(f"{file}: {key} {value!r} is not one of transformers' built-in attention "
                                 f"implementations ({', '.join(ATTENTION_IMPLEMENTATIONS)}); surgery loads no "
                                 "attention kernels from elsewhere, set it to one of them or remove it")


def estimated_params(config: Any) -> int:
    """An upper estimate of the parameters a config describes: embeddings plus ``4 h^2 + 3 h i`` per layer.

    Example:
        >>> from transformers import BertConfig
        >>> round(estimated_params(BertConfig()) / 1e6)  # bert-base has 110M
        138
    """
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    width = int(getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", None) or 4 * hidden)
    embed = int(getattr(config, "embedding_size", None) or hidden)
    tables = sum(int(getattr(config, name, 0) or 0) for name in ("vocab_size", "max_position_embeddings",
                                                                  "type_vocab_size"))
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    return tables * embed + embed * hidden + layers * (4 * hidden * hidden + 3 * hidden * width)


def check_config_values(config: Any, where: Path) -> None:
    """Refuse, in one line naming the field, a config that transformers would build wrongly or not at all.

    Example:
        >>> from transformers import BertConfig
        >>> check_config_values(BertConfig(num_attention_heads=5), Path("m/config.json"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: m/config.json: hidden_size 768 is not divisible by ...
    """
    def bad(name: str, need: str) -> ModelLoadError:
        value = getattr(config, name, None)
        return ModelLoadError(f"{where}: {name} must be {need}, got {value!r} ({type(value).__name__}); fix "
                              "config.json (the family's default is used where the key is absent)")

    for name in SIZES:
        if not _is_int(getattr(config, name, None)) or getattr(config, name) <= 0:
            raise bad(name, "a positive integer")
    for name in FAMILY_SIZES:
        value = getattr(config, name, None)
        if value is not None and (not _is_int(value) or value <= 0):
            raise bad(name, "a positive integer")
    for name in SIGNED:
        if getattr(config, name, None) is not None and not _is_int(getattr(config, name)):
            raise bad(name, "an integer")
    for name in EPSILONS:
        value = getattr(config, name, None)
        if value is not None and not (_is_number(value) and math.isfinite(value) and 0 < value < 1):
            raise bad(name, "a finite number between 0 and 1")
    for name in PROBABILITIES:
        value = getattr(config, name, None)
        if value is not None and not (_is_number(value) and 0 <= value <= 1):
            raise bad(name, "a probability between 0 and 1")
    value = getattr(config, "initializer_range", None)
    if value is not None and not (_is_number(value) and math.isfinite(value) and value >= 0):
        raise bad("initializer_range", "a finite number >= 0")
    pad, vocab = getattr(config, "pad_token_id", None), config.vocab_size
    if _is_int(pad) and not -vocab <= pad < vocab:
        raise ModelLoadError(f"{where}: pad_token_id {pad} is not a row of the {vocab}-token vocabulary; fix "
                             "config.json (pad_token_id or vocab_size)")
    hidden, heads = config.hidden_size, config.num_attention_heads
    if hidden % heads:
        raise ModelLoadError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; "
                             "every head needs the same width, fix config.json")
    if config.num_hidden_layers > MAX_LAYERS:
        raise ModelLoadError(f"{where}: num_hidden_layers {config.num_hidden_layers} is more than the {MAX_LAYERS} "
                             "layers surgery builds; fix config.json")
    params = estimated_params(config)
    if params > MAX_PARAMS:
        raise ModelLoadError(f"{where} describes about {params / 1e9:.0f} billion parameters, more than the "
                             f"{MAX_PARAMS // 10**9} billion surgery builds (hidden_size {hidden}, "
                             f"{config.num_hidden_layers} layers, vocab_size {config.vocab_size}); fix config.json")
    implementation = getattr(config, "_attn_implementation_internal", None)
    if implementation is not None and implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ModelLoadError(f"{where}: attention implementation {implementation!r} is not one of "
                             f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")


def usable_positions(config: Any) -> int | None:
    """The tokens a model can take: its position table, less RoBERTa's positions before the first token.

    Example:
        >>> from transformers import RobertaConfig
        >>> usable_positions(RobertaConfig(max_position_embeddings=514, pad_token_id=1))
        512
    """
    positions = getattr(config, "max_position_embeddings", None)
    if not _is_int(positions) or positions <= 0:
        return None
    # RoBERTa-style position ids start after the padding index.
    pad = getattr(config, "pad_token_id", None)
    offset = pad + 1 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta") and _is_int(pad) else 0
    return positions - offset


def check_length(config: Any, length: int, flag: str, name: str | Path) -> None:
    """Refuse a token count beyond the positions the model has (it would fail inside the forward pass).

    Example:
        >>> from transformers import BertConfig
        >>> check_length(BertConfig(max_position_embeddings=128), 1000, "--max-length", "m")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --max-length 1000 exceeds the 128 positions m supports; ...
    """
    limit = usable_positions(config)
    if limit is not None and length > limit:
        raise ConfigError(f"{flag} {length} exceeds the {limit} positions {name} supports; use {flag} {limit} or less")


#: sentence-transformers' settings of the Transformer module: the length texts are cut to, lower-casing.
SENTENCE_CONFIG = "sentence_bert_config.json"


def check_max_seq_length(value: Any, where: Path | str, field: str = "max_seq_length") -> int | None:
    """``value`` as a sentence-transformers ``max_seq_length``: None when absent, else a positive integer.

    sentence-transformers cuts every text at this many tokens; ``"abc"`` would end in a traceback and
    ``-5`` or ``0`` would be dropped silently (serving then cuts somewhere else than the file says).

    Example:
        >>> check_max_seq_length(256, "m/sentence_bert_config.json"), check_max_seq_length(None, "m")
        (256, None)
        >>> check_max_seq_length(-5, "m/sentence_bert_config.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: m/sentence_bert_config.json: max_seq_length must be a positive integer...
    """
    if value is None:
        return None
    if not _is_int(value) or value <= 0:
        raise ModelLoadError(f"{where}: {field} must be a positive integer (the tokens sentence-transformers cuts "
                             f"texts at), got {value!r} ({type(value).__name__}); fix it or remove the key")
    return int(value)


def sentence_max_seq_length(directory: str | os.PathLike[str]) -> int | None:
    """``max_seq_length`` of ``directory/sentence_bert_config.json``, checked; None without the file or the key.

    Example:
        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / SENTENCE_CONFIG).write_text(json.dumps({"max_seq_length": 128}))
        >>> sentence_max_seq_length(d), sentence_max_seq_length(d / "none")
        (128, None)
    """
    file = Path(directory) / SENTENCE_CONFIG
    if not file.is_file():
        return None
    raw = read_json_file(file, what=SENTENCE_CONFIG, fix="fix or remove it")
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{file} must hold a JSON object (max_seq_length, do_lower_case), not a "
                             f"{type(raw).__name__}; fix or remove it")
    return check_max_seq_length(raw.get("max_seq_length"), file)


#: Config keys that point at Python files of the source directory: surgery never runs them and never copies them,
#: so a saved config.json must not name them (transformers would look for files that are not there).
REMOTE_CODE_KEYS = ("auto_map",)


def without_remote_code(config: Any) -> Any:
    """``config`` without the entries that point at remote code files (``auto_map``); changed in place, returned.

    Example:
        >>> from transformers import BertConfig
        >>> config = BertConfig(auto_map={"AutoModel": "modeling_evil.EvilModel"})
        >>> "auto_map" in without_remote_code(config).to_dict()
        False
    """
    for key in REMOTE_CODE_KEYS:
        if key in vars(config):
            delattr(config, key)
    return config


def load_config(where: Path, **kwargs: Any) -> Any:
    """The checked HF config of a model directory (``kwargs`` such as ``num_labels`` go to transformers).

    Example:
        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "bert", "num_attention_heads": 0}))
        >>> load_config(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: .../config.json: num_attention_heads must be a positive integer, got 0 ...
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    file = where / "config.json"
    if file.exists():
        try:
            raw = read_json_file(file, what="config.json")
        except ModelLoadError as exc:
            raise ModelLoadError(f"cannot read a model config from {where}: {exc}") from None
        check_raw_config(raw, file)
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False, **kwargs)
    except StrictDataclassError as exc:  # transformers' own type checks of the config's fields
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"{file}: {detail}; fix config.json (the family's default is used where the key is "
                             "absent)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ModelLoadError(f"cannot read a model config from {where}: {' '.join(str(exc).split())[:200]}") from None
    check_config_values(config, file)
    return without_remote_code(config)  # transformers ignored it (trust_remote_code=False); no output names it


# -- command-line values ---------------------------------------------------------------------
# Checked before anything heavy is imported: these functions need only the standard library and a
# model directory's config.json, so a typo in a flag fails in a fraction of a second.

#: The ONNX opsets an export can be asked for: the dynamo exporter writes LayerNormalization, an opset-17
#: operator, so below 17 its down-conversion fails (and it used to write opset 18 silently); ONNX Runtime
#: 1.32 loads graphs up to opset 25 (26 is refused at load: "No Op registered for Gelu").
OPSET_RANGE = (17, 25)
#: Bytes per fp32 activation value, and how many FFN-wide tensors a forward pass holds at once (the
#: up-projection's output and its activation).
_FLOAT_BYTES = 4
_FFN_COPIES = 2


def check_opset(opset: int | None, flag: str = "--opset") -> int | None:
    """``opset`` if an export can write a graph of that opset, else a one-line ConfigError with the range.

    Example:
        >>> check_opset(17), check_opset(None)
        (17, None)
        >>> check_opset(14)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --opset 14 is not supported: choose 17 to 25 (or leave --opset out ...)
    """
    low, high = OPSET_RANGE
    if opset is not None and not low <= opset <= high:
        raise ConfigError(f"{flag} {opset} is not supported: choose {low} to {high} (or leave {flag} out for the "
                          "exporter's default)")
    return opset


def check_tolerance(tolerance: float, flag: str = "--tolerance") -> float:
    """Refuse a parity tolerance that is not a finite positive number (inf turns the check off; NaN passes nothing).

    Example:
        >>> check_tolerance(float("inf"))
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --tolerance must be a finite positive number (the largest fp32 difference \
accepted, times the output's magnitude where that is above 1), got inf
    """
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ConfigError(f"{flag} must be a finite positive number (the largest fp32 difference accepted, times "
                          f"the output's magnitude where that is above 1), got {tolerance}")
    return tolerance


def check_speedup(speedup: float | None) -> float | None:
    """A ``--speedup`` that can be met: finite and more than 1.

    Example:
        >>> check_speedup(float("inf"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --speedup must be more than 1 and finite (...), got inf
    """
    if speedup is not None and not (math.isfinite(speedup) and speedup > 1.0):
        raise ConfigError("--speedup must be more than 1 and finite (times faster than the original), got "
                          f"{speedup:g}")
    return speedup


def check_max_drop(max_drop: float | None) -> float | None:
    """A ``--max-drop`` in points of accuracy or fidelity: 0 to 100.

    Example:
        >>> check_max_drop(200)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --max-drop must be between 0 and 100 (...), got 200
    """
    if max_drop is not None and not 0.0 <= max_drop <= 100.0:  # also refuses NaN
        raise ConfigError("--max-drop must be between 0 and 100 (points of accuracy or of 100 x mean cosine), got "
                          f"{max_drop:g}")
    return max_drop


def machine_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one).

    Example:
        >>> machine_cores() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: The length policies ``--lengths`` takes (:class:`surgery.measure.serving.ServingShape`): ``fixed``, every
#: sequence ``--seq-len`` tokens; ``data``, texts drawn from ``--data``, each batch padded to its own longest.
LENGTHS: tuple[str, ...] = ("fixed", "data")


def check_lengths(value: str, flag: str = "--lengths") -> str:
    """``value`` if it is a length policy (:data:`LENGTHS`), else a one-line :class:`ConfigError`.

    Example:
        >>> check_lengths("data")
        'data'
        >>> check_lengths("random")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --lengths 'random' is not one of fixed, data (data: texts drawn from ...
    """
    if value not in LENGTHS:
        raise ConfigError(f"{flag} {value!r} is not one of {', '.join(LENGTHS)} (data: texts drawn from --data, "
                          "each batch padded to its longest)")
    return value


def threads_warning(threads: int | None, flag: str = "--threads") -> str | None:
    """A warning when ``threads`` exceeds the cores: the threads then wait on each other and every time is off.

    Example:
        >>> threads_warning(machine_cores() + 1).startswith("--threads")
        True
        >>> threads_warning(1) is None
        True
    """
    if threads is not None and threads < 1:
        raise ConfigError(f"{flag} must be at least 1, got {threads}")
    cores = machine_cores()
    if threads is None or threads <= cores:
        return None
    return (f"{flag} {threads} is more than the {cores} cores this process may use; the threads would wait on "
            f"each other and the times would not be this machine's best (use {flag} {cores} or less)")


def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the platform does not say.

    Example:
        >>> (physical_memory() or 1) > 0
        True
    """
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def activation_bytes(raw: dict[str, Any], batch: int, seq_len: int) -> int:
    """A lower bound of the bytes one forward pass holds at once for a batch shape, from a raw config.json.

    The largest single layer's live tensors: the FFN's up-projection and its activation
    (``batch x seq x width``, twice) and the attention scores (``batch x heads x seq x seq``), in fp32.

    Example:
        >>> activation_bytes({"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
        ...                  200_000, 128) // 2**30
        292
    """
    def size(*names: str, default: int) -> int:
        for name in names:
            value = raw.get(name)
            if _is_int(value) and value > 0:
                return value
        return default

    hidden = size("hidden_size", "dim", "d_model", default=1)
    width = size("intermediate_size", "hidden_dim", default=4 * hidden)
    heads = size("num_attention_heads", "n_heads", default=1)
    ffn = _FFN_COPIES * batch * seq_len * width
    scores = batch * heads * seq_len * seq_len
    return _FLOAT_BYTES * max(ffn, scores)


def check_batch_memory(model_dir: Path, batch: int, seq_len: int, flags: tuple[str, str] = ("--batch", "--seq-len")
                       ) -> None:
    """Refuse a timing shape whose activations alone exceed this machine's memory (before anything is loaded).

    Reads only ``model_dir/config.json`` (as untrusted JSON); an unreadable one is left to the loader,
    which reports it properly.

    Example:
        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text(json.dumps({"hidden_size": 384, "num_attention_heads": 12,
        ...                                                 "intermediate_size": 1536}))
        >>> check_batch_memory(d, 8, 128)
        >>> check_batch_memory(d, 10**9, 128)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --batch 1000000000 --seq-len 128: one forward pass needs about ... GiB ...
    """
    memory = physical_memory()
    try:
        raw = read_json_file(model_dir / "config.json", what="config.json")
    except ModelLoadError:
        return
    if memory is None or not isinstance(raw, dict):
        return
    positions = raw.get("max_position_embeddings")
    if _is_int(positions) and 0 < positions < seq_len:
        # the model's own limit says more than a memory figure, and it is known before anything loads
        raise ConfigError(f"{flags[1]} {seq_len} exceeds the {positions} positions the model supports; "
                          f"use {flags[1]} {positions} or less")
    need = activation_bytes(raw, batch, seq_len)
    if need > memory:
        raise ConfigError(f"{flags[0]} {batch} {flags[1]} {seq_len}: one forward pass needs about "
                          f"{need / 2**30:,.0f} GiB of activations, more than this machine's {memory / 2**30:,.0f} "
                          f"GiB; choose a smaller {flags[0]} or {flags[1]}")


# -- Python API arguments ----------------------------------------------------------------------
def check_model_argument(model: Any, what: str) -> None:
    """Refuse, in one line, a ``model`` argument that is not a loaded model of a supported family.

    A name or path is the common slip (``surgery.compress("minilm-l6", ...)``): the message says how
    to load it. Anything else gets the family check of :func:`surgery.anatomy.adapter_for`.

    Example:
        >>> check_model_argument("minilm-l6", "compress")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: compress: model must be a loaded model, ...: surgery.from_pretrained(...)
    """
    if isinstance(model, str | os.PathLike):
        raise ConfigError(f"{what}: model must be a loaded model, got the {type(model).__name__} {str(model)!r}; "
                          f"load it first: surgery.from_pretrained({str(model)!r})")
    from torch import nn

    from surgery.anatomy import adapter_for

    if not isinstance(model, nn.Module):
        raise ConfigError(f"{what}: model must be a torch nn.Module (a transformers encoder such as "
                          f"surgery.from_pretrained('minilm-l6') returns), got {type(model).__name__}")
    adapter_for(model)  # UnsupportedModelError names the supported families


def check_data_argument(data: Any, what: str, name: str = "data") -> None:
    """Refuse, in one line, data that is not loaded task or text data (a path, a list, a DataFrame).

    Example:
        >>> check_data_argument("train.csv", "compress")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: compress: data must be loaded data (TaskData or TextData), got the str ...
    """
    if data is None or callable(getattr(data, "loader", None)):
        return
    shown = f"the {type(data).__name__} {str(data)!r:.60}" if isinstance(data, str | os.PathLike) else \
        type(data).__name__
    raise ConfigError(f"{what}: {name} must be loaded data (TaskData or TextData), got {shown}; read a file with "
                      "surgery.data.task_data.load_task_data(path, tokenizer) or "
                      "surgery.embedding.load_text_data(path, tokenizer)")
