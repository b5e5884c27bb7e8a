"""One input-preparation sequence for the commands that change a model (``apply``, ``experts build``, plugins).

:func:`prepare_inputs` reads, in this order and each checked before the next is loaded: the
model's config (a supported family, no custom code), the objective, the tokenizer, every data set
(task data, or unlabelled texts for the embedding objective) and the model itself (safe loading:
pickled weights only with ``--allow-pickle``, a new classification head only on a plain Hugging
Face directory), then notes each choice on stderr. The commands check their cheap inputs (paths,
settings) before calling it, so a typo fails before anything is loaded.

This module imports transformers (through :mod:`surgery.cli.embedding_apply`): commands import it inside
their bodies, so that ``surgery --help`` stays light.

Example:
    >>> import tempfile
    >>> import surgery
    >>> from surgery.testing import TinySpec, tiny_model
    >>> saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()) / "m")
    >>> inputs = prepare_inputs(CliState(), saved, {}, DataOptions(), required_by="--data",
    ...                         strategy=surgery.get_method("head-prune"))  # notes go to stderr
    >>> type(inputs.model).__name__, inputs.data, inputs.is_embedding
    ('BertModel', {}, False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from surgery.cli.console import CliState, note, quiet_datasets
from surgery.cli.embedding_apply import Objective, choose_objective, load_embedding_data
from surgery.cli.inputs import load_model, load_tokenizer, read_model_config
from surgery.persist.config_values import check_length

if TYPE_CHECKING:
    from torch import nn

    from surgery.data.task_data import TaskData


@dataclass(frozen=True)
class DataFiles:
    """One data set named on the command line: training data and, optionally, separate evaluation data."""

    train: str
    eval: str | None = None


@dataclass(frozen=True)
class DataOptions:
    """How data files are read: the shared data flags (``--text-column`` ... ``--max-train``) of a command.

    Example:
        >>> DataOptions(max_length=128).label_column
        'label'
    """

    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    #: None: the model's own limit, capped by what the data needs (chosen by the data loader).
    max_length: int | None = None
    batch_size: int = 32
    seed: int = 0
    max_train: int | None = None

    @classmethod
    def from_command(cls, ctx: typer.Context) -> DataOptions:
        """The data flags a command was called with (flags the command does not have keep their defaults).

        Example:
            >>> import click
            >>> ctx = typer.Context(click.Command("x"))
            >>> ctx.params = {"max_length": 16, "out": "o"}
            >>> DataOptions.from_command(ctx).max_length
            16
        """
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in ctx.params.items() if k in names})


@dataclass
class Inputs:
    """What :func:`prepare_inputs` loaded: the model, its tokenizer, each data set by name, and the objective."""

    source: Path
    model: nn.Module
    tokenizer: Any
    data: dict[str, Any]
    #: None where the command has no choice of objective (``experts``: task data, classifiers).
    objective: Objective | None = None

    @property
    def is_embedding(self) -> bool:
        return self.objective is not None and self.objective.is_embedding


def model_head_labels(source: Path, model_config: Any) -> list[str] | None:
    """The label names (in id order) of the classification head ``source`` loads with; None without one.

    A directory that loads as a sequence classifier (its manifest's class, else the class whose head
    its weights hold) reads data labels through its ``id2label``; any other gets a new head from the data.
    """
    from surgery.cli.inputs import SEQUENCE_CLASSIFIER_SUFFIX, recorded_class
    from surgery.data.task_data import head_label_names

    name, _ = recorded_class(source, model_config)
    return head_label_names(model_config) if name and name.endswith(SEQUENCE_CLASSIFIER_SUFFIX) else None


def check_task_head(source: Path, model_config: Any) -> None:
    """Refuse labelled data for a model whose head is not a single-label classifier (multi-label, regression,
    token classification ...): the one check of every command that judges task data (apply, compress, export
    and bench with --data)."""
    from surgery.cli.inputs import recorded_class
    from surgery.persist.task_heads import check_judged_head

    check_judged_head(source, recorded_class(source, model_config)[0], model_config)


def load_task(files: DataFiles, tokenizer: Any, options: DataOptions, *, model: tuple[Path, Any] | None = None,
              labels_from_head: bool = True) -> TaskData:
    """Labelled task data from ``files``, read with ``options`` (the CLI's single call of ``load_task_data``).

    ``model``: the model directory and its config: labels are read the way its classification head
    reads them (:func:`model_head_labels`; not with ``labels_from_head=False``), and a default max
    length follows its limit.
    """
    from surgery.data.task_data import load_task_data

    if model is not None:
        check_task_head(*model)
    head = model_head_labels(*model) if model is not None and labels_from_head else None
    return load_task_data(
        files.train, tokenizer, eval_data=files.eval, text_column=options.text_column,
        text_pair_column=options.text_pair_column, label_column=options.label_column,
        max_length=options.max_length, seed=options.seed, max_train=options.max_train,
        batch_size=options.batch_size, head_labels=head, model_config=model[1] if model is not None else None,
    )


def data_note(label: str, data: Any) -> str:
    """The note line saying how much data was read, and which labels it has.

    Example:
        >>> from types import SimpleNamespace
        >>> data_note("data", SimpleNamespace(info={"train_size": 1200, "eval_size": 300}, label_names=["neg", "pos"]))
        'data: 1,200 train / 300 eval examples, labels neg, pos'
    """
    labels = f"labels {', '.join(data.label_names[:8])}" if data.label_names else "unlabelled texts"
    return f"{label}: {data.info['train_size']:,} train / {data.info['eval_size']:,} eval examples, {labels}"


def load_data_set(state: CliState, files: DataFiles, tokenizer: Any, options: DataOptions, objective: Any, *,
                  model: tuple[Path, Any], labels_from_head: bool = True) -> Any:
    """One data set read as :func:`prepare_inputs` reads it: texts for an embedding ``objective``, else task data
    (``compress`` reads it again when its length is capped)."""
    with quiet_datasets(state.debug):
        if objective is not None and objective.is_embedding:
            return load_embedding_data(files.train, tokenizer, objective, eval_data=files.eval,
                                       text_column=options.text_column, max_length=options.max_length,
                                       seed=options.seed, max_train=options.max_train, batch_size=options.batch_size)
        return load_task(files, tokenizer, options, model=model, labels_from_head=labels_from_head)


def prepare_inputs(state: CliState, source: Path, data: Mapping[str, DataFiles], options: DataOptions, *,
                   required_by: str, strategy: type | None = None, requested_objective: str | None = None,
                   data_label: str = "{name}", check: Callable[[nn.Module, dict[str, Any]], None] | None = None,
                   labels_from_head: bool = True) -> Inputs:
    """Load a command's model, tokenizer and data in one order, and note each choice.

    Args:
        state: the global options (``--debug`` shows datasets' progress bars, ``--allow-pickle``).
        source: the model directory (already resolved).
        data: the data sets by name (empty: no data); the first decides the classification head.
        options: how the data files are read.
        required_by: the flag named when there is data but the model directory has no tokenizer.
        strategy: the strategy class the objective is chosen for (``apply``); without one the
            objective is the task, unannounced (``experts``, which trains classifiers only).
        requested_objective: ``--set objective=...``, if given.
        data_label: the note's name of a data set, with ``{name}`` its key (e.g. ``"task {name}"``).
        check: the method's own check that the model and the data fit together (e.g. doe's
            :func:`~surgery.strategies.doe.check_tasks`), run before anything is noted.
        labels_from_head: read data labels through the model's classification head, if it has one
            (:func:`model_head_labels`). False where every data set trains its own head (``experts``:
            tasks with different labels), so each is numbered from its own labels.
    """
    import torch

    model_config = read_model_config(source)  # an unsupported family fails here, before anything is read
    if data and options.max_length is not None:
        check_length(model_config, options.max_length, "--max-length", source)
    objective = None if strategy is None else choose_objective(source, model_config, requested_objective, strategy)
    embedding = objective is not None and objective.is_embedding
    torch.manual_seed(options.seed)
    tokenizer = load_tokenizer(source, required_by=required_by if data else None)
    loaded: dict[str, Any] = {name: load_data_set(state, files, tokenizer, options, objective,
                                                  model=(source, model_config), labels_from_head=labels_from_head)
                              for name, files in data.items()}
    first = next(iter(loaded.values()), None)
    model = load_model(source, model_config, None if embedding else first, allow_pickle=state.allow_pickle)
    if check is not None:
        check(model.model, loaded)
    # Noted only once the inputs are known to fit together.
    if objective is not None:
        note(objective.note())
    for name, d in loaded.items():
        note(data_note(data_label.format(name=name), d))
        chosen = d.info.get("text_length") or {}
        if options.max_length is None and chosen.get("why"):  # a length the user did not give: say which and why
            note(f"{data_label.format(name=name)}: texts cut at {chosen['why']}")
    if model.note:
        note(model.note)
    return Inputs(source=source, model=model.model, tokenizer=tokenizer, data=loaded, objective=objective)
