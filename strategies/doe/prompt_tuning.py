"""Prompt tuning (Lester et al. 2021) in two modes, as DoE uses it.

* **MLM mode**: the model's own MLM head predicts a verbalizer word at ``[MASK]`` inside a text
  template (DoE Table 3); only the soft prompt trains.
* **Classifier mode**: for encoders shipped without an MLM head (our real MiniLM); the soft prompt
  and the classification head train, the encoder stays frozen.

:class:`PromptTask` turns batches into class logits for either mode, so training, evaluation and
attribution (``P`` = the gold class logit) share one definition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError, DataError
from surgery.data.task_data import TaskData
from surgery.persist.task_heads import new_head_keys
from surgery.scoring.importance import batches_on
from surgery.strategies.doe.soft_prompt import prompt_of
from surgery.training import EpochHistory, EpochStats, accuracy, fit, scratch_dir, training_arguments

Mode = Literal["mlm", "classifier"]

#: DoE Table 3: template (``{text}``/``{text1}``/``{text2}`` and ``<mask>``) and verbalizer words.
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sst2": ("Text: {text}. The sentiment of the text is <mask>.", ("negative", "positive")),
    "imdb": ("Text: {text}. The sentiment of the text is <mask>.", ("negative", "positive")),
    "agnews": ("Text: {text}. The topic of the text is <mask>.", ("World", "Sports", "Business", "Science")),
    "mrpc": ("Text1: {text1}. Text2: {text2}. The two texts are <mask>.", ("different", "equivalent")),
    "cb": ("Premise: {premise}. Hypothesis: {hypothesis}. The premise and hypothesis have a relationship of "
           "<mask>.", ("implication", "contradiction", "neutrality")),
    # Rotten Tomatoes labels sort as fresh, rotten.
    "rotten-tomatoes": ("Text: {text}. The sentiment of the text is <mask>.", ("positive", "negative")),
}


@dataclass
class PromptTask:
    """How a model answers a classification task: its mode, and in MLM mode the template ids.

    In MLM mode every batch is rewritten to ``first + prefix + text + suffix + last`` (``first`` and
    ``last`` are the special tokens the tokenizer put around the text; ``suffix`` holds the mask
    token) and the class logits are the MLM logits of the verbalizer ids at the mask.

    Example:
        >>> task = PromptTask("mlm", mask_token_id=4, verbalizer_ids=[10, 11], suffix_ids=[4])
        >>> task.prepare({"input_ids": torch.tensor([[2, 7, 3]]), "labels": torch.tensor([1])})["input_ids"]
        tensor([[2, 7, 4, 3]])
    """

    mode: Mode
    mask_token_id: int | None = None
    verbalizer_ids: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    suffix_ids: list[int] = field(default_factory=list)
    pad_token_id: int = 0

    def prepare(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch as the model sees it (templated in MLM mode)."""
        batch = dict(batch)
        if self.mode != "mlm":
            return batch
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        lengths = mask.sum(1).tolist() if mask is not None else [ids.shape[1]] * ids.shape[0]
        rows = []
        for row, n in zip(ids.tolist(), lengths, strict=True):
            row = row[: int(n)]
            rows.append(row[:1] + self.prefix_ids + row[1:-1] + self.suffix_ids + row[-1:])
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), self.pad_token_id, dtype=ids.dtype)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.as_tensor(r, dtype=ids.dtype)
            att[i, : len(r)] = 1
        batch["input_ids"], batch["attention_mask"] = out.to(ids.device), att.to(ids.device)
        batch.pop("token_type_ids", None)
        return batch

    def model_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inputs for ``model(**...)``: without ``labels`` (the losses here are computed on class logits)."""
        return {k: v for k, v in batch.items() if k != "labels"}

    def class_logits(self, outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[B, classes]`` logits: the classifier's, or the verbalizer's MLM logits at the mask."""
        logits = outputs.logits
        if self.mode != "mlm":
            return logits
        at = batch["input_ids"] == self.mask_token_id
        if not bool((at.sum(1) == 1).all()):
            raise DataError("MLM prompt tuning: every input must hold exactly one mask token")
        picked = logits[at]  # [B, vocab]
        return picked[:, self.verbalizer_ids]

    def objective(self, outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """DoE's attribution target: the sum of the gold class logits P(y|x)."""
        return self.class_logits(outputs, batch).gather(1, batch["labels"].view(-1, 1)).sum()

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
        return model(**self.model_inputs(batch))



def make_task(model: nn.Module, *, mode: Mode | Literal["auto"] = "auto", tokenizer: Any = None,
              label_names: list[str] | None = None, template: str | None = None,
              verbalizer: list[str] | None = None, task_name: str | None = None) -> PromptTask:
    """Build the :class:`PromptTask` for ``model``.

    ``mode="auto"`` picks MLM mode when the model has an MLM head (its logits span the vocabulary)
    and a tokenizer is given, classifier mode otherwise. An MLM head that was newly initialised at
    load time (:func:`surgery.persist.task_heads.new_head_keys`) is refused in every mode: it is not trained.
    MLM mode takes ``template`` and ``verbalizer`` (one word per label, in label order),
    defaulting to DoE Table 3 for ``task_name``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> make_task(tiny_model(TinySpec("bert", task="seq-cls"))).mode
        'classifier'
    """
    has_mlm = "MaskedLM" in type(model).__name__
    made_up = new_head_keys(model)
    if has_mlm and made_up and mode != "classifier":
        # A head that was not in the checkpoint is random: its verbalizer logits would be noise.
        raise ConfigError(f"MLM prompt tuning needs a trained MLM head, but the head of {type(model).__name__} was "
                          f"newly initialised ({made_up[0]} was not in the checkpoint); load the model with the "
                          "task head it has, or use mode='classifier' on a sequence classifier")
    if mode == "auto":
        mode = "mlm" if has_mlm and tokenizer is not None else "classifier"
    if mode == "classifier":
        if has_mlm:
            raise ConfigError("classifier prompt tuning needs a sequence-classification model, not a masked LM")
        return PromptTask("classifier")
    if not has_mlm:
        raise ConfigError(f"MLM prompt tuning needs a model with an MLM head; {type(model).__name__} has none "
                          "(use mode='classifier')")
    if tokenizer is None or tokenizer.mask_token_id is None:
        raise ConfigError("MLM prompt tuning needs the model's tokenizer (with a mask token)")
    default_template, default_words = TEMPLATES.get(task_name or "sst2", TEMPLATES["sst2"])
    template = template or default_template
    words = list(verbalizer or default_words)
    if label_names is not None and len(words) != len(label_names):
        raise ConfigError(f"verbalizer has {len(words)} words but the task has {len(label_names)} labels "
                          f"({label_names}); pass one word per label")
    if "{text}" not in template or "<mask>" not in template:
        raise ConfigError("MLM template must contain {text} and <mask> (single-text tasks)")
    before, after = template.split("{text}", 1)
    suffix_text, _, tail = after.partition("<mask>")

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text.strip() else []

    ids = []
    for word in words:
        pieces = enc(" " + word) or enc(word)
        ids.append(pieces[0])
    return PromptTask("mlm", mask_token_id=int(tokenizer.mask_token_id), verbalizer_ids=ids,
                      prefix_ids=enc(before), suffix_ids=[*enc(suffix_text), int(tokenizer.mask_token_id), *enc(tail)],
                      pad_token_id=int(tokenizer.pad_token_id or 0))


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The task head's parameters (classifier mode trains them), pooler included.

    A BERT-style pooler belongs to the head: it was trained for next-sentence prediction, and a
    sentence-embedding checkpoint (mean-pooled, like MiniLM) never trained it for its own task.
    """
    return list(adapter_for(model).task_head_parameters().values())


def head_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the head's tensors, by parameter name."""
    return {n: p.detach().clone() for n, p in adapter_for(model).task_head_parameters().items()}


def trainable(model: nn.Module, task: PromptTask, *, lr: float, head_lr: float,
              what: Literal["prompt", "all"] = "prompt") -> list[tuple[list[nn.Parameter], float]]:
    """Freeze ``model`` except what prompt tuning (or full fine-tuning) trains; return (params, lr) groups.

    Prompt tuning trains the soft prompt at ``lr`` and, in classifier mode, the head at ``head_lr``.
    """
    for p in model.parameters():
        p.requires_grad_(what == "all")
    if what == "all":
        return [(list(model.parameters()), lr)]
    prompt = prompt_of(model)
    if prompt is None:
        raise ConfigError("prompt tuning needs a soft prompt on the model; convert it with 'soft-prompt' first")
    groups = [([prompt.weight], lr)]
    if task.mode == "classifier":
        groups.append((head_parameters(model), head_lr))
    for ps, _ in groups:
        for p in ps:
            p.requires_grad_(True)
    return groups


def with_prompt_mask(model: nn.Module, task: PromptTask) -> Callable[[Mapping[str, torch.Tensor]], Any]:
    """``token_mask`` for :func:`surgery.scoring.importance.linear_input_scores` on a prompted model."""
    prompt = prompt_of(model)

    def mask(batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        m = batch.get("attention_mask")
        if m is None:
            m = torch.ones(batch["input_ids"].shape, dtype=torch.long, device=batch["input_ids"].device)
        return prompt.expand_mask(m) if prompt is not None else m

    return mask


def prepared(data: Iterable[Mapping[str, Any]], task: PromptTask, device: torch.device,
             max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
    return [task.prepare(b) for b in batches_on(data, device, max_batches)]


def evaluate(model: nn.Module, task: PromptTask, data: Iterable[Mapping[str, Any]]) -> float:
    """Accuracy in percent over ``data`` (:func:`surgery.training.accuracy` on the task's class logits)."""
    value = accuracy(model, data, prepare=task.prepare, class_logits=task.class_logits)
    if math.isnan(value):
        raise DataError("evaluation data is empty")
    return 100.0 * value


def train(
    model: nn.Module,
    task: PromptTask,
    data: TaskData,
    groups: list[tuple[list[nn.Parameter], float]],
    *,
    epochs: int,
    batch_size: int = 32,
    seed: int = 0,
    eval_data: Iterable[Mapping[str, Any]] | None = None,
    on_epoch: Callable[[int, float, float | None], None] | None = None,
    weight_decay: float = 0.0,
) -> list[dict[str, float]]:
    """Minimise cross-entropy on the class logits, updating only ``groups`` ((params, lr) pairs; AdamW, linear decay).

    Runs on :class:`surgery.training.SurgeryTrainer` with dropout off (prompt tuning of a frozen
    encoder is steadier without it). Keeps the parameters of the best epoch on ``eval_data``
    (early stopping's choice) when given. Returns per-epoch ``{"epoch", "loss", "accuracy"}``.
    """
    optimizer = torch.optim.AdamW([{"params": ps, "lr": lr} for ps, lr in groups], weight_decay=weight_decay)
    params = [p for ps, _ in groups for p in ps]

    def emit(label: str, completed: int, total: int | None, **info: Any) -> None:
        if on_epoch is not None and "epoch" in info:
            on_epoch(info["epoch"], info["loss"] or 0.0, info.get("accuracy"))

    history = EpochHistory(EpochStats(), evaluate=None if eval_data is None else lambda m: evaluate(m, task, eval_data),
                           keep_best=params if eval_data is not None else None, emit=emit, label="prompt tuning")
    with scratch_dir("surgery-prompt-") as tmp:
        args = training_arguments(tmp, epochs=epochs, batch_size=batch_size, learning_rate=groups[0][1],
                                  weight_decay=weight_decay, seed=seed)
        fit(model, data, args, logit_task=task, dropout=False, optimizer=optimizer, history=history)
    return [{"epoch": h["epoch"], "loss": h["loss"] or 0.0, **({"accuracy": h["accuracy"]} if "accuracy" in h else {})}
            for h in history.history]
