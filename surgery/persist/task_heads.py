"""Which task head a checkpoint really holds, decided from its safetensors key names.

A Hugging Face directory names its class in ``config.json`` (``architectures``), but the weights
need not contain that class's head: sentence-transformers checkpoints list ``MPNetForMaskedLM``,
``BertForMaskedLM``, ... and ship only the encoder. Loading the named class would silently give a
randomly initialised head that strategies (DoE's MLM mode, above all) would then trust.

The head's parameter names are not written down per family here: they are read off the class
itself. The class is built on the ``meta`` device (no memory, no initialisation), and its head is
every state-dict key outside its base model (``base_model_prefix``), less the keys tied to other
weights (a decoder tied to the word embeddings is not stored). A checkpoint *has* the head when
every one of those keys is in its safetensors header; only the header is read, never the tensors.

Rules, applied by :func:`surgery.persist.model_io.from_pretrained` to plain Hugging Face directories:

* class from ``architectures``, head missing: load the first listed class whose head is present,
  else the family's masked-LM or sequence classifier if present, else the bare model, and warn in
  one line (:class:`HeadWarning`);
* class named in ``architectures`` a trained task head (``...ForSequenceClassification`` and the
  like, :data:`TRAINED_HEADS`), its tensors missing in part or whole: refuse as damaged weights,
  whatever class is asked for, except the bare model (no head is made up then);
* class asked for explicitly, head missing: refuse (``ModelLoadError``) unless the caller opts
  into a new head (``allow_new_head=True``); the model then records which keys were made up
  (:func:`new_head_keys`), so strategies can refuse to treat them as trained.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig

from surgery.core.errors import ConfigError, ModelLoadError

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: A safetensors header is a few hundred kB even for large models; anything bigger is not one.
MAX_HEADER_BYTES = 100 * 2**20
#: Task classes tried, in order, when the named class's head is missing.
FALLBACK_TASKS = ("AutoModelForMaskedLM", "AutoModelForSequenceClassification")
_NEW_HEAD_ATTR = "_surgery_new_head_keys"
#: Class-name endings of heads trained for a task. Unlike a masked-LM head (sentence-transformers checkpoints
#: name one and ship only the encoder), such a head is part of what the checkpoint is: without its tensors
#: the weights are damaged, and a random head in their place would be scored and saved as the model.
TRAINED_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForMultipleChoice", "ForQuestionAnswering")
#: Names listed in a message before "and N more".
SHOWN = 4


class HeadWarning(UserWarning):
    """A checkpoint lacks the head its config names, so another class was loaded."""


def is_trained_head(name: str | None) -> bool:
    """Whether a class name is a task head trained for its task (a classifier, not a masked LM).

    Example:
        >>> is_trained_head("BertForSequenceClassification"), is_trained_head("MPNetForMaskedLM")
        (True, False)
    """
    return bool(name) and str(name).endswith(TRAINED_HEADS)


def damaged_head(where: str | Path, name: str, missing: list[str]) -> ModelLoadError:
    """The one-line refusal of weights that lack tensors of the trained head config.json names."""
    shown = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
    return ModelLoadError(f"{where}: config.json names {name} but the weights lack {len(missing)} of its head "
                          f"tensor(s) ({shown}); the checkpoint is damaged (a random head would replace the trained "
                          "one), re-download or re-save the model")


def weights_file(directory: str | Path) -> Path:
    """The file that lists a directory's tensors: the safetensors index when sharded, else model.safetensors."""
    where = Path(directory)
    return where / SAFETENSORS_INDEX if (where / SAFETENSORS_INDEX).exists() else where / SAFETENSORS_FILE


def safetensors_keys(file: str | Path) -> set[str]:
    """Tensor names in a ``.safetensors`` file, from its JSON header only (no tensor is read).

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> path = Path(tempfile.mkdtemp()) / "w.safetensors"
        >>> save_file({"a.weight": torch.zeros(2)}, str(path))
        >>> safetensors_keys(path)
        {'a.weight'}
    """
    path = Path(file)
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= MAX_HEADER_BYTES:
                raise ModelLoadError(f"{path} is not a safetensors file (bad header length); re-save the weights")
            header = json.loads(handle.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read the safetensors header of {path}: {exc}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path} is not a safetensors file (its header is not a JSON object)")
    return {key for key in header if key != "__metadata__"}


def checkpoint_keys(directory: str | Path) -> set[str] | None:
    """Tensor names of a model directory's safetensors weights (sharded or not); None without any.

    Legacy LayerNorm names (``gamma``/``beta``) are given as transformers renames them on load.
    """
    where = Path(directory)
    index = where / SAFETENSORS_INDEX
    if index.exists():
        try:
            keys: Iterable[str] = json.loads(index.read_text())["weight_map"].keys()
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{index} has no readable weight_map ({exc}); re-save the model") from None
    elif (where / SAFETENSORS_FILE).exists():
        keys = safetensors_keys(where / SAFETENSORS_FILE)
    else:
        return None
    renamed = {".gamma": ".weight", ".beta": ".bias"}
    return {next((k[: -len(old)] + new for old, new in renamed.items() if k.endswith(old)), k) for k in keys}


def concrete_class(cls: Any, config: PretrainedConfig) -> type[nn.Module]:
    """The transformers class an ``AutoModel*`` factory builds for ``config`` (other classes as given)."""
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls
    try:
        with torch.device("meta"):  # the factory's own choice, built without memory or initialisation
            return type(cls.from_config(config))
    except (ValueError, KeyError, AttributeError):
        raise ModelLoadError(f"{getattr(cls, '__name__', cls)} has no class for model type "
                             f"{config.model_type!r}; pass a concrete transformers class") from None


def head_keys(cls: type[nn.Module], config: PretrainedConfig) -> set[str]:
    """State-dict keys of ``cls``'s task head: outside the base model and not tied to other weights.

    Example:
        >>> from surgery.testing import TinySpec, tiny_config
        >>> from transformers import RobertaForMaskedLM, RobertaModel
        >>> sorted(head_keys(RobertaForMaskedLM, tiny_config(TinySpec("roberta"))))[:2]
        ['lm_head.bias', 'lm_head.dense.bias']
        >>> head_keys(RobertaModel, tiny_config(TinySpec("roberta")))
        set()
    """
    with torch.device("meta"):
        model = cls._from_config(config)  # type: ignore[attr-defined]
    if model.base_model is model:
        return set()
    prefix = f"{type(model).base_model_prefix}."
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return {key for key in model.state_dict() if not key.startswith(prefix) and key not in tied}


def missing_head_keys(cls: type[nn.Module], config: PretrainedConfig, keys: set[str]) -> list[str]:
    """The head keys of ``cls`` that a checkpoint with tensor names ``keys`` lacks (sorted)."""
    return sorted(head_keys(cls, config) - keys)


@dataclass
class ClassChoice:
    """The class to load a plain HF directory as, and a one-line note when it is not the named one."""

    cls: type[nn.Module]
    note: str | None = None
    new_head: list[str] | None = None


def _fallbacks(config: PretrainedConfig, named: list[str]) -> list[type[nn.Module]]:
    out: list[type[nn.Module]] = []
    for name in [*named, *FALLBACK_TASKS]:
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        try:
            concrete = concrete_class(cls, config)
        except ModelLoadError:
            continue
        if concrete not in out:
            out.append(concrete)
    return out


def choose_class(directory: str | Path, config: PretrainedConfig, requested: Any, *, explicit: bool,
                 allow_new_head: bool = False) -> ClassChoice:
    """Check that ``requested``'s head is in the checkpoint; pick another class or refuse if it is not.

    ``explicit``: the caller named the class (refused when its head is missing, unless
    ``allow_new_head``); otherwise it came from ``config.architectures`` and the directory loads as
    the first class whose head it holds, down to the bare model, with a note saying so. A directory
    without safetensors weights cannot be inspected and loads as requested.

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from transformers import MPNetForMaskedLM
        >>> d = Path(tempfile.mkdtemp())
        >>> model = tiny_model(TinySpec("mpnet"))        # encoder only, like sentence-transformers
        >>> model.save_pretrained(d)
        >>> model.config.architectures = ["MPNetForMaskedLM"]
        >>> choice = choose_class(d, model.config, MPNetForMaskedLM, explicit=False)
        >>> choice.cls.__name__, choice.note.split(";")[0]
        ('MPNetModel', 'config.json names MPNetForMaskedLM but the weights hold no MPNetForMaskedLM head')
    """
    keys = checkpoint_keys(directory)
    if keys is None:
        return ClassChoice(requested)
    cls = concrete_class(requested, config)
    _check_trained_head(directory, config, keys, cls)
    missing = missing_head_keys(cls, config, keys)
    if not missing:
        return ClassChoice(requested)
    lacks = f"the weights in {directory} hold no {cls.__name__} head (missing {missing[0]}"
    lacks += f" and {len(missing) - 1} more)" if len(missing) > 1 else ")"
    if explicit:
        if allow_new_head:
            return ClassChoice(requested, note=f"{lacks}; its head is new and randomly initialised", new_head=missing)
        raise ModelLoadError(f"{lacks}; load the bare model (AutoModel) or a class whose head the checkpoint "
                             "has, or opt into a new randomly initialised head (allow_new_head=True)")
    named = [str(n) for n in getattr(config, "architectures", None) or []]
    for other in _fallbacks(config, named):
        if other is not cls and not missing_head_keys(other, config, keys):
            return ClassChoice(other, note=f"config.json names {cls.__name__} but the weights hold no "
                               f"{cls.__name__} head; loaded {other.__name__}, whose weights they hold "
                               f"(missing {missing[0]})")
    bare = concrete_class(transformers.AutoModel, config)
    return ClassChoice(bare, note=f"config.json names {cls.__name__} but the weights hold no {cls.__name__} head; "
                       f"loaded the bare {bare.__name__} (missing {missing[0]})")


def _check_trained_head(directory: str | Path, config: PretrainedConfig, keys: set[str], cls: type[nn.Module]
                        ) -> None:
    """Refuse a checkpoint whose config names a trained head (a classifier) that its weights lack in part or whole.

    Loading the bare encoder (no head at all) from it stays possible: nothing random is made up then.
    """
    named = [str(n) for n in getattr(config, "architectures", None) or []]
    if not named or not is_trained_head(named[0]) or not head_keys(cls, config):
        return
    trained = getattr(transformers, named[0], None)
    if not (isinstance(trained, type) and issubclass(trained, transformers.PreTrainedModel)
            and isinstance(config, trained.config_class)):
        return  # not a transformers class of this family: loading reports the name
    missing = missing_head_keys(trained, config, keys)
    if missing:
        raise damaged_head(weights_file(directory), named[0], missing)


def loaded_class_name(directory: str | Path, config: PretrainedConfig) -> str | None:
    """The class name a plain HF directory loads as without an explicit class (None: no ``architectures``).

    That is ``architectures[0]`` when the weights hold its head, else what :func:`choose_class` picks.
    Names that are not transformers model classes are returned as they are (loading reports them).
    """
    named = [str(n) for n in getattr(config, "architectures", None) or []]
    if not named:
        return None
    cls = getattr(transformers, named[0], None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        return named[0]
    return choose_class(directory, config, cls, explicit=False).cls.__name__


#: What surgery judges task data with: the accuracy of a single-label sequence classifier's argmax.
SUPPORTED_HEADS = ("a single-label sequence classifier (...ForSequenceClassification, 2 or more labels), or an "
                   "encoder without a trained head (a new classifier is made from the data's labels)")


def unjudged_head(class_name: str | None, config: Any) -> str | None:
    """What a model's head is when task data cannot be judged on it by argmax accuracy; None when it can.

    Multi-label (``problem_type``), regression (``num_labels == 1`` or ``problem_type``) and per-token
    or span heads predict something else than one class per text: an argmax "accuracy" on them is
    meaningless, and their labels are not the data's.

    Example:
        >>> from transformers import BertConfig
        >>> unjudged_head("BertForSequenceClassification", BertConfig(num_labels=1))
        'a regression head (num_labels 1)'
        >>> unjudged_head("BertForSequenceClassification", BertConfig(num_labels=3)) is None
        True
        >>> unjudged_head("BertForTokenClassification", BertConfig())
        'a token classifier (BertForTokenClassification: one label per token, not per text)'
    """
    name = str(class_name or "")
    problem = getattr(config, "problem_type", None)
    if name.endswith("ForTokenClassification"):
        return f"a token classifier ({name}: one label per token, not per text)"
    if name.endswith(("ForQuestionAnswering", "ForMultipleChoice")):
        return f"a {name.rsplit('For', 1)[-1]} head ({name})"
    if not name.endswith("ForSequenceClassification"):
        return None  # a bare encoder or a pre-training head: a new classifier comes from the data
    if problem == "multi_label_classification":
        return "a multi-label classifier (problem_type multi_label_classification)"
    if problem == "regression":
        return "a regression head (problem_type regression)"
    if int(getattr(config, "num_labels", 2) or 0) < 2:
        return f"a regression head (num_labels {getattr(config, 'num_labels', None)})"
    return None


def check_judged_head(where: str | Path, class_name: str | None, config: Any) -> None:
    """Refuse, in one line, task data for a model whose head is not a single-label classifier (:func:`unjudged_head`).

    Example:
        >>> from transformers import BertConfig
        >>> check_judged_head("m", "BertForSequenceClassification",
        ...                   BertConfig(problem_type="multi_label_classification"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: m is a multi-label classifier (...); surgery judges labelled data by ...
    """
    what = unjudged_head(class_name, config)
    if what is not None:
        raise ConfigError(f"{where} is {what}; surgery judges labelled data by single-label accuracy, which "
                          f"supports {SUPPORTED_HEADS}; use such a model, or drop --data")


def record_new_head(model: nn.Module, keys: list[str]) -> None:
    """Remember on ``model`` that its parameters ``keys`` were newly initialised, not loaded."""
    setattr(model, _NEW_HEAD_ATTR, list(keys))


def new_head_keys(model: nn.Module) -> list[str]:
    """The head parameters of ``model`` that were newly initialised at load time ([] if none or unknown).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> new_head_keys(tiny_model(TinySpec("bert", task="mlm")))
        []
    """
    return list(getattr(model, _NEW_HEAD_ATTR, None) or [])


def warn_choice(choice: ClassChoice) -> None:
    """Emit the choice's note as one :class:`HeadWarning` line (the CLI shows warnings as one line)."""
    if choice.note:
        warnings.warn(choice.note, HeadWarning, stacklevel=3)
