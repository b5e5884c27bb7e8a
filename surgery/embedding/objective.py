"""The embedding objective: distil the teacher's sentence embeddings into the student, without labels.

The loss is ``mse_weight · MSE(e_s, e_t) + cosine_weight · (1 − cos(e_s, e_t))`` on the pooled (and, if
the model's config says so, normalised) sentence embeddings of student and teacher, plus optionally
``hidden_weight`` times the mapped token-level hidden-state MSE of :func:`surgery.training.hidden_state_loss`
and ``similarity_weight`` times :func:`neighbour_loss`, which matches each text's in-batch neighbour
distribution to the teacher's (the sentence-transformers distillation examples use the embedding
MSE; the cosine term keeps the direction, and the neighbour term the ranking, which is what
retrieval reads). The teacher is the model before surgery.

:class:`EmbeddingDistillTrainer` is :class:`surgery.training.SurgeryTrainer` with this loss, so it
composes with trainers that add terms on top (SHRP's balance loss) by ordinary inheritance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError
from surgery.core.manifest import steps_of
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.data.task_data import PaddingCollator
from surgery.embedding.evaluate import embed_batch
from surgery.embedding.pooling import SentenceConfig
from surgery.training import (
    EpochHistory,
    EpochStats,
    RecoveryConfig,
    RecoveryResult,
    SurgeryTrainer,
    default_layer_map,
    hidden_state_loss,
    recording_layer_outputs,
    scratch_dir,
    train_columns,
)
from surgery.training.recover import recovery_arguments, refit_before_training, time_limit
from surgery.training.trainer import TeacherLogitsCollator, masked_copies, with_teacher_outputs

if TYPE_CHECKING:
    from surgery.embedding.texts import TextData


#: The dataset column (and batch key) holding the teacher's cached sentence embeddings.
TEACHER_EMBEDDING = "teacher_embedding"

#: The token-level hidden-state weight of embedding recovery when the caller leaves ``hidden_weight``
#: unset and the student kept every layer. Measured on MiniLM-L6 (experiments/embeddings/results/embed_16k_seeds.md,
#: 16k texts, 3 seeds): against the embedding loss alone it was ahead in every paired run, at both
#: cuts measured (head+FFN at 1.8x: +0.003 mean cosine, +0.014 recall@10; at 4x: +0.003, +0.008), for
#: ~5 % more training time. After layer-drop it measured level (-0.001 / -0.003, one seed,
#: experiments/embeddings/results/embed_4k_layerdrop.md), so there the default stays 0.
EMBEDDING_HIDDEN_WEIGHT = 1.0


def embedding_hidden_weight(config: RecoveryConfig, *, layers_dropped: bool = False) -> float:
    """The hidden-state weight embedding recovery uses: ``config.hidden_weight`` if it was set, else
    :data:`EMBEDDING_HIDDEN_WEIGHT` when the student kept every layer and 0 after a layer-drop (the
    task objective's default stays 0).

    Example:
        >>> embedding_hidden_weight(RecoveryConfig()), embedding_hidden_weight(RecoveryConfig(hidden_weight=0.0))
        (1.0, 0.0)
        >>> embedding_hidden_weight(RecoveryConfig(), layers_dropped=True)
        0.0
    """
    if "hidden_weight" in config.model_fields_set:
        return config.hidden_weight
    return 0.0 if layers_dropped else EMBEDDING_HIDDEN_WEIGHT


class EmbeddingDistillConfig(BaseModel):
    """Weights of the embedding objective.

    Example:
        >>> EmbeddingDistillConfig().cosine_weight
        1.0
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mse_weight: float = Field(default=1.0, ge=0.0, description="weight of the MSE between sentence embeddings")
    cosine_weight: float = Field(default=1.0, ge=0.0, description="weight of 1 - cosine between sentence embeddings")
    hidden_weight: float = Field(default=0.0, ge=0.0, description="weight of the token-level hidden-state MSE")
    layer_map: dict[int, int] | None = Field(default=None, description="student layer -> teacher layer for the "
                                             "hidden-state MSE; default: derived from the recorded steps")
    similarity_weight: float = Field(default=0.0, ge=0.0, description="weight of the in-batch neighbour KL "
                                     "(neighbour_loss); 0: off")
    similarity_temperature: float = Field(default=0.05, gt=0.0, description="temperature of the neighbour KL")


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, *, mse_weight: float = 1.0,
                   cosine_weight: float = 1.0) -> torch.Tensor:
    """``mse_weight · MSE + cosine_weight · mean(1 − cos)`` between two batches of sentence embeddings.

    Example:
        >>> e = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(embedding_loss(e, e)), float(embedding_loss(e, -e, mse_weight=0.0))
        (0.0, 2.0)
    """
    s, t = student.float(), teacher.float()
    loss = s.new_zeros(())
    if mse_weight > 0:
        loss = loss + mse_weight * F.mse_loss(s, t)
    if cosine_weight > 0:
        loss = loss + cosine_weight * (1.0 - F.cosine_similarity(s, t, dim=-1)).mean()
    return loss


def neighbour_loss(student: torch.Tensor, teacher: torch.Tensor, *, temperature: float = 0.05) -> torch.Tensor:
    """Mean over texts of ``KL(p_teacher ‖ p_student)``, where ``p(j | i) = softmax_j(cos(e_i, e_j) / temperature)``
    over the other texts ``j ≠ i`` of the batch.

    Retrieval ranks neighbours by cosine, so this term trains the student to order each text's
    in-batch neighbours as the teacher does, which the per-text MSE and cosine terms do not see (two
    students with the same per-text error can order neighbours differently). It is the relational
    distillation of Park et al. (2019, "Relational Knowledge Distillation") in a listwise form; a low
    temperature weights the nearest neighbours most, as recall@k does. Batches of one give 0.

    Example:
        >>> e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> float(neighbour_loss(e, e))
        0.0
        >>> float(neighbour_loss(e[[0, 2, 1]], e)) > 0  # text 0 now has its nearest neighbour swapped
        True
    """
    n = student.shape[0]
    if n < 2:
        return student.new_zeros(()).float()
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    eye = torch.eye(n, dtype=torch.bool, device=s.device)
    # A text is not its own neighbour: -inf on the diagonal drops it from both distributions.
    s_logits = (s @ s.T / temperature).masked_fill(eye, float("-inf"))
    t_logits = (t @ t.T / temperature).masked_fill(eye, float("-inf"))
    log_s = F.log_softmax(s_logits, dim=-1).masked_fill(eye, 0.0)
    log_t = F.log_softmax(t_logits, dim=-1).masked_fill(eye, 0.0)
    return (log_t.exp() * (log_t - log_s)).sum(dim=-1).mean()


class EmbeddingDistillTrainer(SurgeryTrainer):
    """A :class:`~surgery.training.SurgeryTrainer` whose loss is the embedding objective against ``teacher``.

    Batches need no labels. ``compute_loss`` returns outputs with ``sentence_embedding`` (and
    ``logits`` None, so trainers that count accuracy on logits skip it).

    Example:
        >>> import copy, datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.training import scratch_dir, training_arguments
        >>> model = tiny_model(TinySpec("bert"))
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]]})
        >>> with scratch_dir() as tmp:
        ...     trainer = EmbeddingDistillTrainer(
        ...         model=model, args=training_arguments(tmp, epochs=1, batch_size=2), train_dataset=rows,
        ...         data_collator=PaddingCollator(None), teacher=copy.deepcopy(model),
        ...         sentence_config=SentenceConfig(normalize=True))
        ...     _ = trainer.train()
        >>> trainer.stats.steps
        1
    """

    def __init__(self, *args: Any, teacher: nn.Module, sentence_config: SentenceConfig,
                 embedding: EmbeddingDistillConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, teacher=teacher, **kwargs)
        self.sentence_config = sentence_config
        self.embedding = embedding or EmbeddingDistillConfig()

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        with self.dropout_context(model):
            return self.distill_loss(model, inputs, return_outputs)

    def distill_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False) -> Any:
        """The embedding objective (plus the optional hidden-state MSE) of one batch."""
        features = {k: v for k, v in inputs.items() if k != "labels"}  # labels, if any, are not used
        cfg = self.embedding
        hidden = cfg.hidden_weight > 0
        cached = features.pop(TEACHER_EMBEDDING, None)  # computed once (distillation_rows) where nothing else is read
        with recording_layer_outputs(model) if hidden else nullcontext([]) as s_layers:
            student, _ = embed_batch(model, features, self.sentence_config)
        t_layers: list[Any] = []
        if cached is not None and not hidden:
            target = cached.to(student.device)
        else:
            teacher_model = self._teacher_on(student.device)
            with torch.no_grad(), recording_layer_outputs(teacher_model) if hidden else nullcontext([]) as t_layers:
                target, _ = embed_batch(teacher_model, features, self.sentence_config)
        kd = embedding_loss(student, target, mse_weight=cfg.mse_weight, cosine_weight=cfg.cosine_weight)
        if cfg.similarity_weight > 0:
            kd = kd + cfg.similarity_weight * neighbour_loss(student, target, temperature=cfg.similarity_temperature)
        loss = kd
        if hidden:
            loss = loss + cfg.hidden_weight * hidden_state_loss(s_layers, t_layers, cfg.layer_map,
                                                                features.get("attention_mask"))
        if model.training:
            self.stats.steps += 1
            self.stats.loss_sum += float(loss.detach())
            self.stats.kd_sum += float(kd.detach())
        outputs = {"sentence_embedding": student, "logits": None}
        return (loss, outputs) if return_outputs else loss


def sentence_config_of(data: TextData) -> SentenceConfig:
    """The pooling the objective uses: the data's, else masked mean without normalisation."""
    return data.sentence_config or SentenceConfig()


def embedding_trainer(model: nn.Module, teacher: nn.Module, data: TextData, args: Any, *,
                      embedding: EmbeddingDistillConfig | None = None,
                      trainer_class: type[EmbeddingDistillTrainer] = EmbeddingDistillTrainer,
                      rows: Any = None, collator: Callable[[list[dict[str, Any]]], Any] | None = None,
                      **kwargs: Any) -> EmbeddingDistillTrainer:
    """A trainer of the embedding objective on ``data``'s training texts (``trainer_class`` may add terms), or on
    ``rows`` with their ``collator`` (:func:`distillation_rows`).

    Dropout is off unless ``dropout=True`` is passed: the targets are the teacher's deterministic
    embeddings, and with dropout on, a student that already matches its teacher sees a training
    loss ~100× its evaluation loss (measured on the tiny test models) and learns to chase noise.
    """
    kwargs.setdefault("dropout", False)
    return trainer_class(model=model, args=args, train_dataset=train_columns(data) if rows is None else rows,
                         data_collator=collator or PaddingCollator(data.tokenizer), teacher=teacher,
                         sentence_config=sentence_config_of(data), embedding=embedding, **kwargs)


def distillation_rows(teacher: nn.Module, data: TextData, config: RecoveryConfig, *, hidden_weight: float
                      ) -> tuple[Any, Callable[[list[dict[str, Any]]], Any]]:
    """The rows embedding distillation reads and their collator: ``data``'s training texts, then
    ``config.masked_copies`` copies of them with ``config.mask_rate`` of their tokens masked
    (:func:`surgery.training.trainer.masked_copies`: the teacher's embedding of the masked text is its target), with the
    teacher's sentence embeddings computed once (:data:`TEACHER_EMBEDDING`) where the loss reads nothing else of
    it (``config.cache_teacher`` and no hidden-state term).

    Masked copies show the student more of the teacher's function than a few thousand texts do, for one teacher
    pass each (on the emb-8x rows of experiments/deep_cuts the training loss still fell after six epochs while the
    held-out fidelity stayed 4 points short); compress adds none (experiments/deep_cuts/README.md, session 18).

    Example:
        >>> from transformers import BertTokenizer
        >>> from surgery.embedding.texts import load_text_data
        >>> from surgery.testing import TinySpec, tiny_model
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
        ...                                                        "a", "b"])})
        >>> data = load_text_data([f"a b {'a ' * i}" for i in range(4)], tok, batch_size=2)
        >>> rows, collator = distillation_rows(tiny_model(TinySpec("bert")), data,
        ...                                    RecoveryConfig(masked_copies=2), hidden_weight=0.0)
        >>> len(rows) == 3 * len(data.train), collator([rows[0], rows[-1]])[TEACHER_EMBEDDING].shape[0]
        (True, 2)
    """
    rows, collator = train_columns(data), PaddingCollator(data.tokenizer)
    if config.masked_copies > 0:
        mask_id = getattr(data.tokenizer, "mask_token_id", None)
        if mask_id is None:
            raise ConfigError("recovery: masked copies need a tokenizer with a mask token, and this one has none; "
                              "set masked_copies to 0")
        rows = masked_copies(rows, config.masked_copies, mask_id=int(mask_id), rate=config.mask_rate,
                             seed=config.seed, keep=list(getattr(data.tokenizer, "all_special_ids", []) or []))
    if config.cache_teacher and hidden_weight == 0:
        sentence = sentence_config_of(data)
        rows = with_teacher_outputs(teacher, rows, collator, column=TEACHER_EMBEDDING,
                                    outputs=lambda model, features: embed_batch(model, features, sentence)[0],
                                    batch_size=max(config.batch_size, 32), bf16=config.bf16)
        return rows, TeacherLogitsCollator(collator, column=TEACHER_EMBEDDING)
    return rows, collator


def recover_embeddings(model: nn.Module, teacher: nn.Module, data: TextData, config: RecoveryConfig, *,
                       progress: ProgressCallback | None = None) -> RecoveryResult:
    """Recovery after surgery with the embedding objective: distil ``teacher``'s sentence embeddings into ``model``.

    The token-level hidden-state MSE (mapped through any ``layer-drop`` steps, as in
    :func:`surgery.training.recover`) is on at :data:`EMBEDDING_HIDDEN_WEIGHT` for a student that kept
    every layer, unless ``config.hidden_weight`` is set (0 turns it off); ``config.similarity_weight`` switches on
    the in-batch neighbour KL (:func:`neighbour_loss`, at ``similarity_temperature``); ``temperature``
    and ``alpha`` (logit settings) are unused. Accuracies stay None: there are no labels.

    Example:
        >>> import copy
        >>> from transformers import BertTokenizer
        >>> from surgery.embedding.texts import load_text_data
        >>> from surgery.testing import TinySpec, tiny_model
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])})
        >>> data = load_text_data([f"a b {'a ' * i}" for i in range(8)], tok, batch_size=2)
        >>> model = tiny_model(TinySpec("bert"))
        >>> recover_embeddings(model, copy.deepcopy(model), data, RecoveryConfig(epochs=1, batch_size=2)).steps
        2
    """
    emit = progress or no_progress
    start = time.perf_counter()
    limit = time_limit(config)
    layer_map = None
    layers, teacher_layers = adapter_for(model).num_layers, adapter_for(teacher).num_layers
    hidden_weight = embedding_hidden_weight(config, layers_dropped=layers < teacher_layers)
    if hidden_weight > 0:
        layer_map = config.layer_map or default_layer_map(layers, teacher_layers,
                                                          steps_of(model)[len(steps_of(teacher)):])
    embedding = EmbeddingDistillConfig(hidden_weight=hidden_weight, layer_map=layer_map,
                                       similarity_weight=config.similarity_weight,
                                       similarity_temperature=config.similarity_temperature)
    history = EpochHistory(EpochStats(), emit=lambda task_, c, n, **info: emit(ProgressEvent(task_, c, n, info)),
                           label="recovery")
    refit = refit_before_training(model, teacher, data, config)
    steps = 0
    if config.epochs > 0:
        with scratch_dir("surgery-recover-") as tmp:
            rows, collator = distillation_rows(teacher, data, config, hidden_weight=hidden_weight)
            trainer = embedding_trainer(model, teacher, data, recovery_arguments(tmp, config), embedding=embedding,
                                        rows=rows, collator=collator)
            history.stats = trainer.stats
            trainer.add_callback(history)
            if limit is not None:
                trainer.add_callback(limit)
            steps = int(trainer.train().global_step)
            model.eval()
    return RecoveryResult(epochs=config.epochs, steps=steps, seconds=time.perf_counter() - start,
                          hidden_weight=hidden_weight, layer_map=layer_map, history=history.history, refit=refit,
                          time_limit_reached=limit is not None and limit.reached)
