"""Turn command-line input into library objects: strategy settings, checked paths, tokenizer, data, model.

Everything here raises :class:`surgery.core.errors.SurgeryError` subclasses with one-line messages, so the
command line can print them as ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import surgery
from surgery.core.distributed import is_main_process
from surgery.core.errors import ConfigError, DataError, ModelLoadError, OutputPathError
from surgery.core.manifest import MANIFEST_NAME
from surgery.core.registry import adapter_class_for
from surgery.persist.atomic import check_creatable, output_lock, prepare_output
from surgery.persist.tokenizer_files import TOKENIZER_FILES, has_tokenizer, read_tokenizer
from surgery.persist.untrusted import read_regular, refuse_custom_code

if TYPE_CHECKING:  # torch, transformers and datasets are imported when a command needs them, not for --help
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.data.task_data import TaskData

SEQUENCE_CLASSIFIER_SUFFIX = "ForSequenceClassification"


# -- strategy settings -------------------------------------------------------------------
#: Largest settings file read (--config): real ones are a few hundred bytes.
MAX_SETTINGS_BYTES = 2**20


class SettingsSyntaxError(ConfigError):
    """A settings file that parses but is ambiguous or unsafe: a key given twice, a YAML alias."""


class _StrictLoader(yaml.SafeLoader):
    """YAML without aliases (a billion-laughs file expands exponentially) and without duplicate keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise SettingsSyntaxError(f"line {mark.line + 1}: YAML aliases (*name) are not accepted in settings; "
                                      "write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise SettingsSyntaxError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice; keep "
                                          "one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise SettingsSyntaxError(f"key {key!r} is given twice; keep one")
    return dict(pairs)


def load_settings_text(text: str, *, as_json: bool) -> Any:
    """Parse settings as JSON or YAML, refusing duplicate keys and YAML aliases.

    Example:
        >>> load_settings_text("ratio: 0.5\\nratio: 0.7", as_json=False)
        Traceback (most recent call last):
        ...
        surgery.cli.inputs.SettingsSyntaxError: line 2: key 'ratio' is given twice; keep one
    """
    if as_json:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds no Python objects


def parse_value(text: str) -> Any:
    """Read one ``--set`` value: JSON first, then YAML flow syntax, else the text itself.

    YAML 1.1 reads ``yes``/``no``/``on``/``off`` as booleans; only ``true`` and ``false`` are taken
    as booleans here, so a setting named like ``mode=on`` stays the string ``"on"``.

    Example:
        >>> parse_value("0.5"), parse_value("1e-3"), parse_value("[1, 2]"), parse_value("{0: [1, 2]}")
        (0.5, 0.001, [1, 2], {0: [1, 2]})
        >>> parse_value("magnitude"), parse_value("on"), parse_value("true")
        ('magnitude', 'on', True)
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = load_settings_text(text, as_json=False)
    except (yaml.YAMLError, RecursionError):
        return text
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        return text
    if value is None and text.strip().lower() not in ("null", "~"):
        return text  # an empty value is the empty string, not None
    return value


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings from repeated ``--set`` options (later ones win).

    Example:
        >>> parse_sets(["ratio=0.25", "scope=layer", "layers=[0, 1]"])
        {'ratio': 0.25, 'scope': 'layer', 'layers': [0, 1]}
    """
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set ratio=0.5")
        try:
            values[key] = parse_value(raw.strip())
        except SettingsSyntaxError as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from None
    return values


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read strategy settings from a ``.json``, ``.yaml`` or ``.yml`` file holding one mapping."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist; pass a .json or .yaml file with the strategy settings")
    suffix = file.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"config file {file}: unsupported format {suffix or '(none)'}; use .json, .yaml or .yml")
    try:
        text = read_regular(file, MAX_SETTINGS_BYTES).decode("utf-8")
        values = load_settings_text(text, as_json=suffix == ".json")
    except RecursionError:
        raise ConfigError(f"config file {file} nests too deeply; settings are a flat mapping") from None
    except (ModelLoadError, SettingsSyntaxError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ConfigError(f"config file {file} cannot be read: {detail}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {file} must hold a mapping of setting names to values, "
                          f"not a {type(values).__name__}")
    return {str(k): v for k, v in values.items()}


def strategy_settings(config_file: str | Path | None, sets: Sequence[str]) -> dict[str, Any]:
    """Settings from ``--config`` overlaid with ``--set`` values."""
    values = read_config_file(config_file) if config_file is not None else {}
    values.update(parse_sets(sets))
    return values


# -- paths -------------------------------------------------------------------------------
def check_output_dir(out: str | Path, *, overwrite: bool, flag: str = "--out") -> Path:
    """Refuse, before any work, an output directory the save could not or must not replace (see surgery.cli.outputs).

    The rule is :func:`surgery.persist.atomic.output_problem`: a new path whose directories can be
    made, an empty directory, or with ``--overwrite`` a directory surgery wrote whole (its manifest
    lists exactly what it holds); never a file, a directory with anything surgery did not write, ``/``,
    the working directory, a home directory or an ancestor of one. A previous output stranded by an
    interrupted save is renamed back first.

    Example:
        >>> import tempfile
        >>> full = Path(tempfile.mkdtemp())
        >>> _ = (full / "mine.txt").write_text("x")
        >>> check_output_dir(full, overwrite=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: --out ... holds files surgery did not write (.../mine.txt is not a file ...
    """
    target = prepare_output(out, overwrite=overwrite, flag=flag)
    check_not_being_written(target)
    return target


def check_not_being_written(target: Path) -> None:
    """Refuse, before any work, an output that a live process is writing (it holds the save's lock).

    The save takes the lock only at its end, so without this a run would spend its whole search
    (an hour with ``--budget 60``) before hearing that another job writes the same ``--out``. The
    check takes the lock and lets it go at once (:func:`surgery.persist.atomic.output_lock`, whose
    refusal names the process); an output whose parent cannot hold a lock yet is left to the save. Only
    the process that writes results looks: the ranks of one torchrun job share their ``--out``.

    Example:
        >>> import tempfile
        >>> check_not_being_written(Path(tempfile.mkdtemp()) / "m") is None
        True
    """
    if not target.parent.is_dir() or not is_main_process():
        return
    try:
        with output_lock(target):
            pass
    except OSError:
        return  # an unwritable parent: the output checks and the save report it in their own words


def check_writable_file(path: Path | None, flag: str) -> Path | None:
    """Check, before any work, that a result file (``--report``, ``--json``) can be written; create nothing.

    Example:
        >>> import tempfile
        >>> a_file = Path(tempfile.mkstemp()[1])
        >>> check_writable_file(a_file / "report.json", "--report")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.OutputPathError: --report .../report.json: ... is a file, so the directory cannot be ...
    """
    if path is None:
        return None
    file = Path(path).expanduser().absolute()
    if file.is_dir():
        raise OutputPathError(f"{flag} {file} is a directory; pass a file path such as {file / 'report.json'}")
    if file.exists():
        if not os.access(file, os.W_OK):
            raise OutputPathError(f"{flag} {file} exists and is not writable; choose another file")
        return file
    check_creatable(file, flag)
    return file


# -- model and tokenizer -----------------------------------------------------------------
def read_model_config(path: Path) -> PretrainedConfig:
    """The HF config of a model directory, checked against the supported families (no weights read)."""
    from surgery.persist.config_values import load_config, sentence_max_seq_length

    refuse_custom_code(path)
    config = load_config(path)
    sentence_max_seq_length(path)  # a length that is not a positive integer: one line now, not ignored at export
    adapter_class_for(config.model_type)  # UnsupportedModelError names the supported types
    return config


def load_tokenizer(path: Path, *, required_by: str | None = None) -> Any:
    """The tokenizer saved in a model directory; None if it has none and nothing requires one."""
    if required_by and not has_tokenizer(path):
        raise ModelLoadError(
            f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); {required_by} needs the "
            "model's tokenizer, save it into the model directory (tokenizer.save_pretrained(dir))"
        )
    return read_tokenizer(path)


def recorded_class(path: Path, config: PretrainedConfig) -> tuple[str | None, bool]:
    """The model class a directory will load as, and whether surgery saved it (has a manifest)."""
    manifest = path / MANIFEST_NAME
    if manifest.exists():
        try:
            name = json.loads(manifest.read_text()).get("model_class")
        except (OSError, ValueError, AttributeError):
            name = None  # from_pretrained reports the damaged manifest with its own message
        return (str(name) if name else None), True
    from surgery.persist.task_heads import loaded_class_name  # imports torch: not at module level (--help)

    return loaded_class_name(path, config), False  # the class whose head the weights really hold


@dataclass
class LoadedModel:
    """A model loaded for ``surgery apply``, with a note on how its class was chosen."""

    model: nn.Module
    note: str | None = None


def load_model(path: Path, config: PretrainedConfig, data: TaskData | None, *, allow_pickle: bool = False
               ) -> LoadedModel:
    """Load the model to operate on, choosing a sequence classifier when labelled data is given.

    The rule:

    * without data, the directory loads as recorded: the class in ``surgery.json``, else
      ``config.architectures[0]``, else the bare model (``AutoModel``);
    * with data and a recorded ``...ForSequenceClassification`` class, that class loads and its
      ``num_labels`` must equal the number of labels in the data;
    * with data and a plain Hugging Face directory of any other class (a bare encoder such as
      ``BertModel``, an MLM or pre-training head, or no ``architectures``), the family's
      sequence classifier loads (``AutoModelForSequenceClassification``): the encoder weights come
      from the directory and a new, seeded, randomly initialised head gets ``num_labels`` and the
      label names from the data; other heads are dropped;
    * with data and a surgery-saved directory of another class, it loads as recorded: its weights
      must match its recorded steps, so no head can be added.
    """
    from transformers import AutoModelForSequenceClassification

    name, saved_by_surgery = recorded_class(path, config)
    if data is None:
        return LoadedModel(surgery.from_pretrained(path, allow_pickle=allow_pickle))
    is_classifier = bool(name) and name.endswith(SEQUENCE_CLASSIFIER_SUFFIX)
    if is_classifier:
        if int(config.num_labels) != data.num_labels:
            raise DataError(
                f"{path} is a {name} with {config.num_labels} labels but the data has {data.num_labels} "
                f"({', '.join(data.label_names[:8])}); use data with the same labels, or start from the bare encoder"
            )
        return LoadedModel(surgery.from_pretrained(path, allow_pickle=allow_pickle))
    if saved_by_surgery:
        return LoadedModel(
            surgery.from_pretrained(path),
            note=f"{path} was saved by surgery as {name}; it is used as is (a classification head cannot be added "
            "to a saved surgery model)",
        )
    labels = list(data.label_names)
    model = surgery.from_pretrained(
        path,
        model_class=AutoModelForSequenceClassification,
        allow_pickle=allow_pickle,
        allow_new_head=True,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    # The config still names the directory's class; name the class it is now, so the saved
    # config.json tells plain transformers users what they get.
    model.config.architectures = [type(model).__name__]
    return LoadedModel(
        model,
        note=f"{path} has no sequence-classification head ({name or 'no architectures'}); loaded "
        f"{type(model).__name__} with a new randomly initialised head for {len(labels)} labels "
        f"({', '.join(labels[:8])})",
    )
