"""A label-free importance objective for sentence-embedding models.

Michel et al.'s head importance is ``E|∂L/∂ξ_h|`` for a task loss L. Without labels, and with the
teacher equal to the model when importance is scored (so any distillation loss has zero gradient),
surgery scores how much a unit moves the sentence embedding instead: L = ⟨r, e(x)⟩ for a fresh
Gaussian direction r per instance, whose gradient magnitude estimates the norm of the embedding's
Jacobian with respect to the unit's gate (E|⟨r, J⟩| ∝ ‖J‖ for Gaussian r). Units the embedding
barely depends on score low and are pruned first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from surgery.core.errors import DataError
from surgery.embedding.pooling import SentenceConfig, pool


def embedding_sensitivity(config: SentenceConfig, *, seed: int = 0) -> Callable[[Any, Mapping[str, torch.Tensor]],
                                                                                torch.Tensor]:
    """An importance objective: random projections of the pooled sentence embedding (seeded, so scores repeat).

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> batch = tiny_inputs(spec)
        >>> objective = embedding_sensitivity(SentenceConfig(normalize=True))
        >>> objective(tiny_model(spec)(**batch), batch).shape
        torch.Size([])
    """
    gen = torch.Generator().manual_seed(seed)

    def objective(outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        hidden = getattr(outputs, "last_hidden_state", None)
        if hidden is None:
            raise DataError("embedding importance needs the encoder's last_hidden_state; score a bare encoder "
                            "(AutoModel), not a task model")
        mask = batch.get("attention_mask")
        if mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        emb = pool(hidden, mask, config)
        direction = torch.randn(emb.shape, generator=gen).to(emb.device, emb.dtype)
        return (emb * direction).sum()

    return objective
