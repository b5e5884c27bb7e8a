"""Sentence-embedding models: pooling as sentence-transformers defines it, unlabelled text, evaluation.

Example:
    >>> from surgery.embedding import SentenceConfig, pool
    >>> import torch
    >>> pool(torch.ones(1, 3, 2), torch.tensor([[1, 1, 0]]), SentenceConfig(normalize=True)).tolist()
    [[0.7071067690849304, 0.7071067690849304]]
"""

from __future__ import annotations

from surgery.embedding.evaluate import (
    EmbeddingReport,
    ProbeResult,
    ProbeTask,
    TeacherCache,
    embed_texts,
    evaluate_embeddings,
    linear_probe_accuracy,
    mean_cosine,
    retrieval_agreement,
)
from surgery.embedding.pooling import SentenceConfig, is_sentence_transformers_dir, pool, read_sentence_config
from surgery.embedding.texts import TextData, load_text_data, read_texts

__all__ = [
    "EmbeddingReport",
    "ProbeResult",
    "ProbeTask",
    "SentenceConfig",
    "TeacherCache",
    "TextData",
    "embed_texts",
    "evaluate_embeddings",
    "is_sentence_transformers_dir",
    "linear_probe_accuracy",
    "load_text_data",
    "mean_cosine",
    "pool",
    "read_sentence_config",
    "read_texts",
    "retrieval_agreement",
]
