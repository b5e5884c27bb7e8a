"""Embedding evaluation against the teacher: mean cosine, retrieval agreement, linear probes.

* **mean cosine** between the student's and the teacher's embedding of each held-out text;
* **retrieval agreement** (recall@k): for every held-out text, the share of the teacher's k
  nearest neighbours (cosine, the text itself excluded) that the student also ranks in its top k;
* **linear probe**: logistic regression on frozen embeddings of a labelled task, student against
  teacher, trained and tested on the same split.

All functions return data; nothing is printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from surgery.core.errors import ConfigError, DataError
from surgery.embedding.pooling import SentenceConfig, pool

EXTRA_HINT = "pip install 'encoder-surgery[embeddings]'"


def encoder_of(model: nn.Module) -> nn.Module:
    """The bare encoder that produces token states (the model itself, or a task model's base model).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> type(encoder_of(tiny_model(TinySpec("bert", task="seq-cls")))).__name__
        'BertModel'
    """
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) else model


def embed_batch(model: nn.Module, batch: dict[str, torch.Tensor], config: SentenceConfig,
                **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Sentence embeddings of one batch (with gradients if enabled), and the encoder's raw output."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    out = encoder_of(model)(**inputs, **kwargs)
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones(inputs["input_ids"].shape, dtype=torch.long, device=inputs["input_ids"].device)
    return pool(out.last_hidden_state, mask, config), out


@torch.no_grad()
def embed_loader(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], config: SentenceConfig) -> torch.Tensor:
    """Sentence embeddings (float32, on CPU) of every batch of a loader, in order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    parts = []
    try:
        for batch in batches:
            emb, _ = embed_batch(model, {k: v.to(device) for k, v in batch.items()}, config)
            parts.append(emb.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(parts) if parts else torch.empty(0)


def embed_texts(model: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], config: SentenceConfig,
                *, max_length: int | None = None, batch_size: int = 64) -> torch.Tensor:
    """Sentence embeddings of ``texts``, tokenized with truncation to ``max_length``
    (default: the model's ``max_seq_length``, else 512) and padded per batch.

    Example:
        >>> from transformers import BertTokenizer
        >>> from surgery.testing import TinySpec, tiny_model
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])})
        >>> embed_texts(tiny_model(TinySpec("bert")), tok, ["a", "a a"], SentenceConfig()).shape
        torch.Size([2, 32])
    """
    limit = max_length or config.max_seq_length or 512
    # Longest first, so batches pad little; the order is restored at the end.
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = (tokenizer([texts[i] for i in order[s:s + batch_size]], truncation=True, max_length=limit,
                         padding=True, return_tensors="pt") for s in range(0, len(order), batch_size))
    emb = embed_loader(model, (dict(b) for b in batches), config)
    out = torch.empty_like(emb)
    out[torch.tensor(order)] = emb
    return out


def mean_cosine(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """Mean cosine similarity of matching rows.

    Example:
        >>> round(mean_cosine(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]])), 3)
        0.5
    """
    _check_pair(student, teacher)
    return float(F.cosine_similarity(student.float(), teacher.float(), dim=1).mean())


def _check_pair(student: torch.Tensor, teacher: torch.Tensor) -> None:
    if student.shape[0] != teacher.shape[0]:
        raise DataError(f"student has {student.shape[0]} embeddings, teacher {teacher.shape[0]}; embed the same texts")


def top_k_neighbours(emb: torch.Tensor, k: int, *, chunk: int = 1024) -> torch.Tensor:
    """Indices of each row's ``k`` nearest other rows by cosine similarity (the row itself excluded)."""
    unit = F.normalize(emb.float(), dim=1)
    rows = []
    for start in range(0, unit.shape[0], chunk):
        sims = unit[start:start + chunk] @ unit.T
        idx = torch.arange(start, min(start + chunk, unit.shape[0]))
        sims[torch.arange(len(idx)), idx] = float("-inf")
        rows.append(sims.topk(k, dim=1).indices)
    return torch.cat(rows)


def retrieval_agreement(student: torch.Tensor, teacher: torch.Tensor, k: int = 10) -> float:
    """Recall@k of the student's nearest neighbours against the teacher's, averaged over queries.

    Example:
        >>> emb = torch.randn(50, 8)
        >>> retrieval_agreement(emb, emb * 3.0, k=5)
        1.0
    """
    _check_pair(student, teacher)
    if k >= student.shape[0]:
        raise ConfigError(f"recall@{k} needs more than {k} texts; got {student.shape[0]}")
    s, t = top_k_neighbours(student, k), top_k_neighbours(teacher, k)
    hits = (s.unsqueeze(2) == t.unsqueeze(1)).any(2).sum(1)
    return float(hits.float().mean() / k)


def require_sklearn() -> Any:
    """``sklearn.linear_model.LogisticRegression``, or a one-line install hint."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise ConfigError(f"the linear probe needs scikit-learn; install it with {EXTRA_HINT}") from None
    return LogisticRegression


def linear_probe_accuracy(train_x: torch.Tensor, train_y: Sequence[Any], test_x: torch.Tensor,
                          test_y: Sequence[Any], *, seed: int = 0) -> float:
    """Test accuracy of a logistic regression trained on frozen embeddings.

    Example:
        >>> x = torch.cat([torch.randn(20, 4) + 3, torch.randn(20, 4) - 3])
        >>> y = [0] * 20 + [1] * 20
        >>> linear_probe_accuracy(x, y, x, y)
        1.0
    """
    logistic = require_sklearn()
    clf = logistic(max_iter=2000, random_state=seed)
    clf.fit(train_x.float().numpy(), list(train_y))
    return float(clf.score(test_x.float().numpy(), list(test_y)))


@dataclass(frozen=True)
class ProbeTask:
    """A labelled task for the linear probe, already split."""

    name: str
    train_texts: list[str]
    train_labels: list[Any]
    test_texts: list[str]
    test_labels: list[Any]


class ProbeResult(BaseModel):
    """Linear-probe accuracy of student and teacher on one task (``delta`` = student − teacher, points)."""

    task: str
    student: float
    teacher: float
    delta_points: float
    train_size: int
    test_size: int


class EmbeddingReport(BaseModel):
    """The embedding evaluation of a student against its teacher."""

    texts: int
    mean_cosine: float
    recall_at_k: float
    k: int
    probes: list[ProbeResult] = []

    def worst_probe_delta(self) -> float | None:
        return min((p.delta_points for p in self.probes), default=None)


class TeacherCache:
    """A model's embeddings (the teacher's, usually), computed once per text and reused for every student."""

    def __init__(self, teacher: nn.Module, tokenizer: PreTrainedTokenizerBase, config: SentenceConfig,
                 max_length: int | None = None) -> None:
        self.teacher, self.tokenizer, self.config, self.max_length = teacher, tokenizer, config, max_length
        self._rows: dict[str, torch.Tensor] = {}

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        missing = list(dict.fromkeys(t for t in texts if t not in self._rows))
        if missing:
            emb = embed_texts(self.teacher, self.tokenizer, missing, self.config, max_length=self.max_length)
            self._rows.update(zip(missing, emb, strict=True))
        return torch.stack([self._rows[t] for t in texts]) if texts else torch.empty(0)

    def known(self) -> list[str]:
        """The texts embedded so far, in the order they were first embedded."""
        return list(self._rows)

    def add(self, texts: Sequence[str], rows: torch.Tensor) -> None:
        """Embeddings of ``texts`` computed elsewhere (another process's cache of the same model), one row each."""
        if len(texts) != len(rows):
            raise ValueError(f"TeacherCache.add: {len(texts)} texts and {len(rows)} embeddings")
        self._rows.update(zip(texts, rows, strict=True))


def evaluate_embeddings(student: nn.Module, teacher: nn.Module | TeacherCache, tokenizer: PreTrainedTokenizerBase,
                        texts: Sequence[str], config: SentenceConfig, *, probes: Sequence[ProbeTask] = (),
                        k: int = 10, max_length: int | None = None, seed: int = 0) -> EmbeddingReport:
    """Compare ``student`` with ``teacher`` on held-out ``texts`` (cosine, recall@k) and on linear probes.

    Example:
        >>> from transformers import BertTokenizer
        >>> from surgery.testing import TinySpec, tiny_model
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])})
        >>> model = tiny_model(TinySpec("bert"))
        >>> texts = [" ".join("ab"[(i >> j) & 1] for j in range(5)) for i in range(32)]
        >>> r = evaluate_embeddings(model, model, tok, texts, SentenceConfig(), k=3)
        >>> round(r.mean_cosine, 4), r.recall_at_k
        (1.0, 1.0)
    """
    cache = teacher if isinstance(teacher, TeacherCache) else TeacherCache(teacher, tokenizer, config, max_length)
    # Every distinct text is embedded once per model (probe tasks may share texts with each other).
    student_cache = TeacherCache(student, tokenizer, config, max_length)
    every = [*texts, *(t for task in probes for t in (*task.train_texts, *task.test_texts))]
    student_cache.embed(every)
    cache.embed(every)
    student_embed = student_cache.embed

    s, t = student_embed(texts), cache.embed(texts)
    results = []
    for task in probes:
        s_train, s_test = student_embed(task.train_texts), student_embed(task.test_texts)
        t_train, t_test = cache.embed(task.train_texts), cache.embed(task.test_texts)
        acc_s = linear_probe_accuracy(s_train, task.train_labels, s_test, task.test_labels, seed=seed)
        acc_t = linear_probe_accuracy(t_train, task.train_labels, t_test, task.test_labels, seed=seed)
        results.append(ProbeResult(task=task.name, student=acc_s, teacher=acc_t, delta_points=100 * (acc_s - acc_t),
                                   train_size=len(task.train_texts), test_size=len(task.test_texts)))
    return EmbeddingReport(texts=len(texts), mean_cosine=mean_cosine(s, t), recall_at_k=retrieval_agreement(s, t, k),
                           k=k, probes=results)
