"""Tiny random encoders of every supported family, for tests of surgery and of plugins.

The structure and bookkeeping are real (the families' own config and model classes); only the
numbers are random. Use :func:`tiny_model` directly, or :func:`tiny_specs` with hypothesis.

Example:
    >>> model = tiny_model(TinySpec("deberta-v2", heads=2, head_dim=4, layers=2, ffn=9))
    >>> type(model).__name__
    'DebertaV2Model'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import transformers
from torch import nn

FAMILIES: tuple[str, ...] = (
    "bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "deberta-v2", "modernbert",
)
Task = Literal["base", "seq-cls", "mlm"]
VOCAB = 99


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny model: family, heads, head dimension, layers and FFN width."""

    family: str
    heads: int = 4
    head_dim: int = 8
    layers: int = 2
    ffn: int = 37
    task: Task = "base"
    seed: int = 0

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


_CLASS_PREFIX = {
    "bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "distilbert": "DistilBert",
    "electra": "Electra", "mpnet": "MPNet", "deberta-v2": "DebertaV2", "modernbert": "ModernBert",
}
_TASK_SUFFIX = {"base": "Model", "seq-cls": "ForSequenceClassification", "mlm": "ForMaskedLM"}


def tiny_config(spec: TinySpec, **overrides: Any) -> transformers.PretrainedConfig:
    """The family's own config class, filled in with tiny sizes (``overrides`` win)."""
    h, common = spec.hidden, {"vocab_size": VOCAB, "num_labels": 3}
    if spec.family == "distilbert":
        kw = dict(dim=h, n_layers=spec.layers, n_heads=spec.heads, hidden_dim=spec.ffn, max_position_embeddings=64)
    else:
        kw = dict(hidden_size=h, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  intermediate_size=spec.ffn, max_position_embeddings=72)
    if spec.family in ("roberta", "xlm-roberta", "mpnet"):
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if spec.family == "electra":
        kw.update(embedding_size=max(8, h // 2))  # exercises ELECTRA's embedding projection
    if spec.family == "deberta-v2":
        # As real DeBERTa-v3 checkpoints configure it: relative attention, c2p|p2c, shared
        # key/query position projections, bucketed positions, layer-normed relative embeddings.
        kw.update(relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True,
                  position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
                  position_biased_input=False, type_vocab_size=0)
    if spec.family == "modernbert":
        kw.update(global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, cls_token_id=1, sep_token_id=2)
    if spec.family == "mpnet":
        kw.update(relative_attention_num_buckets=32)
    kw.update(common)
    kw.update(overrides)
    config_cls = getattr(transformers, f"{_CLASS_PREFIX[spec.family]}Config")
    config = config_cls(**kw)
    config._attn_implementation = "eager"
    return config


def tiny_model(spec: TinySpec, **overrides: Any) -> nn.Module:
    """A randomly initialised tiny model of ``spec``, in eval mode."""
    torch.manual_seed(spec.seed)
    cls = getattr(transformers, f"{_CLASS_PREFIX[spec.family]}{_TASK_SUFFIX[spec.task]}")
    model = cls(tiny_config(spec, **overrides))
    with torch.no_grad():  # some families initialise LayerNorm/bias to exact constants; perturb them
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def tiny_inputs(spec: TinySpec, batch: int = 3, seq: int = 7, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random token ids with right padding on all but the first sequence."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=gen)
    ids[:, 0] = 1 if spec.family == "modernbert" else 0 if spec.family in ("roberta", "xlm-roberta", "mpnet") else 2
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(1, batch):
        mask[b, seq - b:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def main_output(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's main output tensor (logits for task models, last hidden state otherwise)."""
    out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def tiny_specs(families: tuple[str, ...] = FAMILIES, tasks: tuple[Task, ...] = ("base", "seq-cls")) -> Any:
    """A hypothesis strategy over :class:`TinySpec` (imported lazily: hypothesis is a test dependency)."""
    from hypothesis import strategies as st

    return st.builds(
        TinySpec,
        family=st.sampled_from(families),
        heads=st.integers(2, 4),
        head_dim=st.sampled_from([4, 8]),
        layers=st.integers(1, 3),
        ffn=st.integers(5, 24),
        task=st.sampled_from(tasks),
        seed=st.integers(0, 2**16),
    )


def removal_maps(spec: TinySpec, units: int, *, keep_one: bool = True) -> Any:
    """A hypothesis strategy over uneven ``{layer: [units to remove]}`` maps for a model of ``spec``.

    Every layer gets its own random subset of ``range(units)`` (possibly empty); with ``keep_one``
    at least one unit stays in every layer. Use ``units=spec.heads`` for heads, ``spec.ffn`` for
    FFN neurons.

    Example:
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=5, database=None)
        ... @given(removal_maps(TinySpec("bert", heads=2, layers=3), 2))
        ... def check(removal):
        ...     assert sorted(removal) == [0, 1, 2] and all(len(v) < 2 for v in removal.values())
        >>> check()
    """
    from hypothesis import strategies as st

    per_layer = st.lists(st.integers(0, units - 1), unique=True, max_size=units - 1 if keep_one else units)
    maps = st.fixed_dictionaries({layer: per_layer.map(sorted) for layer in range(spec.layers)})
    return maps.map(lambda m: dict(sorted(m.items())))  # layers in order, as a plan lists them


def tiny_task_data(n: int = 48, *, seed: int = 0, batch_size: int = 8) -> Any:
    """Labelled TaskData of ``n`` random token sequences (3 labels by a rule on the first tokens), half held out.

    Example:
        >>> data = tiny_task_data(16)
        >>> data.num_labels, len(data.train), len(data.eval)
        (3, 16, 8)
    """
    import datasets

    from surgery.data.task_data import TaskData

    gen = torch.Generator().manual_seed(seed)
    ids = [[2, *torch.randint(5, VOCAB, (4 + i % 5,), generator=gen).tolist(), 3] for i in range(n)]
    labels = [(row[1] + row[2]) % 3 for row in ids]
    train = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})
    held = datasets.Dataset.from_dict({"input_ids": ids[: n // 2], "labels": labels[: n // 2]})
    return TaskData(train, held, ["a", "b", "c"], batch_size=batch_size)


def tiny_cut_pair(spec: TinySpec, layer: int, removal: dict[str, list[int]]) -> tuple[nn.Module, nn.Module]:
    """A tiny teacher (in eval mode) and a copy with ``removal`` cut from ``layer``: a refit's or a recovery's input.

    Example:
        >>> teacher, student = tiny_cut_pair(TinySpec("bert", ffn=37), 0, {"neurons": list(range(10))})
        >>> teacher.training, student.encoder.layer[0].intermediate.dense.out_features
        (False, 27)
    """
    import copy

    from surgery.anatomy import adapter_for

    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    adapter_for(student).remove_units(layer, removal)
    return teacher, student

