"""``surgery apply`` for sentence-embedding models: choose the objective, load unlabelled text, evaluate.

The objective is ``embedding`` for a sentence-transformers directory (``modules.json``, or surgery's
``sentence_embedding.json``) without a task head, ``task`` otherwise; ``--set objective=...``
overrides the choice, and the command line says which it took and why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformers import PretrainedConfig

from surgery.cli.inputs import SEQUENCE_CLASSIFIER_SUFFIX, recorded_class
from surgery.core.errors import ConfigError
from surgery.embedding.pooling import SentenceConfig, read_sentence_config

ObjectiveName = Literal["embedding", "task"]
OBJECTIVES: tuple[str, ...] = ("embedding", "task")
# Built-in strategies that train or score with the embedding objective on unlabelled texts. A plugin
# strategy opts in with a class attribute ``objectives = ("task", "embedding")``.
def supports_embedding(strategy: type) -> bool:
    """Whether ``strategy`` (a strategy class) can work with the embedding objective.

    Example:
        >>> from surgery.strategies.shrp import ShrpPipeline
        >>> from surgery.strategies.doe import DoEPipeline
        >>> supports_embedding(ShrpPipeline), supports_embedding(DoEPipeline)
        (True, False)
    """
    return "embedding" in getattr(strategy, "objectives", ("task",))


@dataclass(frozen=True)
class Objective:
    """The training objective ``surgery apply`` uses, why, and (for embeddings) how to pool."""

    name: ObjectiveName
    reason: str
    sentence: SentenceConfig | None = None

    @property
    def is_embedding(self) -> bool:
        return self.name == "embedding"

    def note(self) -> str:
        return f"objective: {self.name} ({self.reason})"


def pop_objective(settings: dict[str, Any]) -> str | None:
    """Remove and check the ``objective`` setting (it selects the objective, not a strategy setting).

    Example:
        >>> s = {"objective": "embedding", "ratio": 0.5}
        >>> pop_objective(s), s
        ('embedding', {'ratio': 0.5})
    """
    value = settings.pop("objective", None)
    if value is not None and value not in OBJECTIVES:
        raise ConfigError(f"--set objective={value!r}: choose one of {', '.join(OBJECTIVES)}")
    return value


def choose_objective(source: Path, config: PretrainedConfig, requested: str | None,
                     strategy: type | None = None) -> Objective:
    """The objective for the model in ``source`` and ``strategy`` (a class): ``requested`` if given, else detected.

    Example:
        >>> from transformers import BertConfig
        >>> choose_objective(Path("/nonexistent"), BertConfig(), None).note()
        'objective: task (not a sentence-transformers directory; --set objective=embedding to distil embeddings)'
        >>> class Compress:
        ...     objective_flag = "--objective "
        >>> choose_objective(Path("/nonexistent"), BertConfig(), None, Compress).note()
        'objective: task (not a sentence-transformers directory; --objective embedding to distil embeddings)'
    """
    # The flag that picks it, named in the note: apply takes --set objective=..., compress its own --objective.
    flag = getattr(strategy, "objective_flag", "--set objective=")
    name, _ = recorded_class(source, config)
    head = bool(name) and name.endswith(SEQUENCE_CLASSIFIER_SUFFIX)
    sentence = read_sentence_config(source)
    if requested == "task":
        return Objective("task", f"{flag}task")
    if requested == "embedding":
        if sentence is None:
            return Objective("embedding", f"{flag}embedding; no pooling config found, so masked-mean "
                             "pooling without normalisation", SentenceConfig(modes=("mean",)))
        return Objective("embedding", f"{flag}embedding; {sentence.describe()}", sentence)
    if sentence is None:
        return Objective("task", f"not a sentence-transformers directory; {flag}embedding to distil "
                         "embeddings")
    if head:
        return Objective("task", f"the model has a task head ({name}); {flag}embedding to distil its "
                         "embeddings instead")
    if strategy is not None and not supports_embedding(strategy):
        return Objective("task", f"a sentence-transformers model, but {getattr(strategy, 'name', strategy)} "
                         "trains a classifier only")
    return Objective("embedding", f"a sentence-transformers model without a task head: distil its "
                     f"{sentence.describe()} embeddings; {flag}task to train a classifier", sentence)


def load_embedding_data(data: str, tokenizer: Any, objective: Objective, *, eval_data: str | None,
                        text_column: str, max_length: int | None, seed: int, max_train: int | None,
                        batch_size: int) -> Any:
    """Unlabelled text data (labels, if any, ignored) carrying the objective's pooling."""
    from surgery.embedding.texts import load_text_data

    return load_text_data(data, tokenizer, eval_data=eval_data, text_column=text_column, max_length=max_length,
                          seed=seed, max_train=max_train, batch_size=batch_size, sentence_config=objective.sentence)


def teacher_copy(model: Any) -> Any:
    """A frozen copy of the model before surgery: the teacher of the evaluation."""
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def evaluate_against(teacher: Any, student: Any, data: Any, tokenizer: Any, max_length: int) -> dict[str, Any]:
    """The embedding evaluation of ``student`` against ``teacher`` on the held-out texts, as report metrics."""
    from surgery.embedding.evaluate import evaluate_embeddings

    k = min(10, len(data.eval_texts) - 1)  # recall@10, or less on a tiny held-out split
    report = evaluate_embeddings(student, teacher, tokenizer, data.eval_texts, data.sentence_config,
                                 max_length=max_length, k=k)
    return report.model_dump(mode="json")
