"""What every graph exporter shares (ONNX, OpenVINO): the module to export, its inputs, the parity batch and
the agreement it is judged by, the fields every export records, and a batch as a graph's feeds.

Each runtime's own exporter (:mod:`surgery.runtimes.onnx.onnx_graph`,
:mod:`surgery.runtimes.openvino.openvino_ir`) builds on these; nothing here needs onnx or openvino.

Example:
    >>> from surgery.testing import TinySpec, tiny_model
    >>> export_target(tiny_model(TinySpec("bert")))[1:]
    ('last_hidden_state', 'base')
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.core.errors import ConfigError, SurgeryError
from surgery.core.manifest import steps_of
from surgery.persist.config_values import check_tolerance
from surgery.runtimes.shared.names import TASKS

_TASK_CLASS_SUFFIX = {"seq-cls": "ForSequenceClassification", "mlm": "ForMaskedLM"}
#: Sentences of varied length for the parity batch when a tokenizer is given (padding included).
SAMPLE_TEXTS = (
    "The film is a quiet, patient portrait of a family that never quite says what it means.",
    "Terrible.",
    "An uneven but often funny comedy whose best jokes land in the first half hour.",
    "I would watch it again.",
    "Neither the script nor the actors can rescue a plot this thin, and the ending drags on.",
    "A small gem.",
)


class ExportParityError(SurgeryError):
    """A served graph's output (ONNX Runtime, OpenVINO) differs from PyTorch's beyond the parity limit.

    The limit is the tolerance scaled by the output's magnitude (:func:`check_parity`).
    """


class Agreement(BaseModel):
    """How closely one output agrees with a reference output on the same batch."""

    max_abs_diff: float = Field(description="largest absolute element-wise difference")
    min_cosine: float = Field(description="smallest cosine similarity between the two outputs of any one example")
    mean_cosine: float | None = Field(default=None, description="mean over examples of that cosine")


class ExportRecord(BaseModel):
    """What every graph export records about the exported model: task, class, inputs and output, the steps.

    Each runtime's record (:class:`~surgery.runtimes.onnx.onnx_graph.ExportReport`,
    :class:`~surgery.runtimes.openvino.openvino_ir.OpenVinoExportReport`) adds its own fields and names its file
    (:attr:`record_file`), the field its artefact's accuracy on data goes in (:attr:`accuracy_field`) and the
    agreement that describes the artefact as it runs (:meth:`served_agreement`).
    """

    #: The file the record is saved as, next to the graph.
    record_file: ClassVar[str]
    #: What the record is called in the one-line error when it is missing or damaged.
    record_kind: ClassVar[str] = "export record"
    #: The field holding the accuracy of the written graph on labelled data.
    accuracy_field: ClassVar[str]

    task: str
    model_class: str
    model_type: str | None
    source_dtype: str
    inputs: list[str]
    output: str
    dynamic_axes: dict[str, list[str]]
    steps: list[str] = Field(description="the surgery steps the model went through, in order")
    versions: dict[str, str]
    parity_batch: tuple[int, int]
    tolerance: float
    pad_to_multiple_of: int | None = Field(default=None, description="the served model pads each batch to a "
                                           "multiple of this where that adds at most an eighth of its length "
                                           "(measured to pay on the machine it was chosen on: "
                                           "surgery.runtimes.shared.alignment); None: batches run as given")
    padding: str | None = Field(default=None, description="how pad_to_multiple_of was chosen: asked, or measured "
                                "and what the measurement gave (None: not decided)")

    def served_agreement(self) -> Agreement:
        """How closely the artefact, as it runs, agrees with PyTorch fp32: its int8 or bf16 drift, else its parity."""
        raise NotImplementedError

    def write(self, out_dir: Path) -> Path:
        """Save the record as :attr:`record_file` in ``out_dir``."""
        path = Path(out_dir) / self.record_file
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> Self:
        """The record saved next to an exported graph; a one-line error when it is missing or damaged."""
        path = Path(directory) / cls.record_file
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is missing or not an {cls.record_kind} ({exc}); export the model "
                              "again") from None


def export_record(model: nn.Module, module: nn.Module, *, task: str, source_dtype: str, inputs: list[str],
                  output: str, versions: dict[str, str], parity_batch: tuple[int, int], tolerance: float
                  ) -> dict[str, Any]:
    """The :class:`ExportRecord` fields of ``module`` (the fp32 copy exported) from ``model`` (its source)."""
    return dict(task=task, model_class=type(module).__name__, model_type=getattr(module.config, "model_type", None),
                source_dtype=source_dtype, inputs=inputs, output=output,
                dynamic_axes={name: ["batch", "sequence"] for name in inputs},
                steps=[str(s.get("strategy")) for s in steps_of(model)], versions=versions,
                parity_batch=parity_batch, tolerance=tolerance)


class SingleOutput(nn.Module):
    """The model called with keyword inputs, returning one named output tensor (what the graph returns)."""

    def __init__(self, model: nn.Module, output: str, inputs: list[str]) -> None:
        super().__init__()
        self.model = model
        self.output = output
        self.inputs = inputs

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return getattr(self.model(**kwargs, return_dict=True), self.output)


def export_target(model: nn.Module, task: str = "auto") -> tuple[nn.Module, str, str]:
    """The module to export for ``task``, the name of its output and the resolved task.

    ``auto`` exports the model as it is (``logits`` for a task head, ``last_hidden_state`` for a bare
    encoder); ``base`` exports the encoder inside a task model; ``seq-cls``/``mlm`` require that head.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> _, output, task = export_target(tiny_model(TinySpec("bert", task="seq-cls")))
        >>> output, task
        ('logits', 'seq-cls')
    """
    if task not in TASKS:
        raise ConfigError(f"export: task {task!r} is not one of {', '.join(TASKS)}")
    name = type(model).__name__
    has_head = next((t for t, suffix in _TASK_CLASS_SUFFIX.items() if name.endswith(suffix)), None)
    if task == "auto":
        task = has_head or "base"
    if task == "base":
        base = getattr(model, "base_model", model) if has_head else model
        return base, "last_hidden_state", "base"
    if has_head != task:
        raise ConfigError(
            f"export: task {task!r} needs a {_TASK_CLASS_SUFFIX[task]} model but this is a {name}; export it with "
            "--task base (or auto), or train that head first (surgery apply ... --data FILE)")
    return model, "logits", task


def input_names(model: nn.Module) -> list[str]:
    """``input_ids``, ``attention_mask`` and, where the family uses segment ids, ``token_type_ids``."""
    names = ["input_ids", "attention_mask"]
    accepts = "token_type_ids" in inspect.signature(model.forward).parameters
    if accepts and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        names.append("token_type_ids")
    return names


def parity_inputs(config: Any, names: list[str], *, batch: int, seq: int, tokenizer: Any = None,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """A ``batch x seq`` batch with right padding: tokenized sample sentences, or random ids without a tokenizer.

    Without a tokenizer, example ``b`` keeps ``seq - b * seq // (2 * batch)`` tokens, starting with the
    family's CLS/BOS id, so every batch of two or more has padded positions.

    Example:
        >>> from surgery.testing import TinySpec, tiny_config
        >>> batch = parity_inputs(tiny_config(TinySpec("bert")), ["input_ids", "attention_mask"], batch=3, seq=8)
        >>> batch["attention_mask"].sum(-1).tolist()
        [8, 7, 6]
    """
    if tokenizer is not None:
        texts = [SAMPLE_TEXTS[i % len(SAMPLE_TEXTS)] for i in range(batch)]
        # On a copy: the call leaves its fixed padding and truncation in a fast tokenizer's backend.
        enc = copy.deepcopy(tokenizer)(texts, padding="max_length", truncation=True, max_length=seq,
                                       return_tensors="pt")
        out = {name: enc[name] if name in enc else torch.zeros_like(enc["input_ids"]) for name in names}
        return {k: v.long() for k, v in out.items()}
    gen = torch.Generator().manual_seed(seed)
    vocab = int(config.vocab_size)
    ids = torch.randint(min(5, vocab - 1), vocab, (batch, seq), generator=gen)
    start = next((v for v in (getattr(config, "cls_token_id", None), getattr(config, "bos_token_id", None))
                  if v is not None), None)
    if start is not None:
        ids[:, 0] = int(start)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(1, batch):
        mask[b, max(1, seq - b * seq // (2 * batch)):] = 0
    pad = getattr(config, "pad_token_id", None)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, int(pad) if pad is not None else 0))
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in names:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def _real_tokens(output: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``output`` in float64 with padded positions zeroed, for per-token outputs (``[batch, sequence, ...]``)."""
    out = output.detach().double()
    if mask is not None and out.dim() >= 3 and tuple(out.shape[:2]) == tuple(mask.shape):
        out = out * mask.to(torch.bool).reshape(*mask.shape, *([1] * (out.dim() - 2)))
    return out


def agreement(reference: torch.Tensor, other: torch.Tensor, mask: torch.Tensor | None = None) -> Agreement:
    """Maximum absolute difference and the smallest per-example cosine of two same-shaped outputs.

    With an attention ``mask`` and per-token outputs (``[batch, sequence, ...]``), padded positions
    are left out: nothing downstream reads them (attention masks them as keys, pooling skips them),
    and their values are not a property of the model (int8 can move them far while every real token
    stays close).

    Example:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> found = agreement(a, a + 0.5)
        >>> found.max_abs_diff, round(found.min_cosine, 4)
        (0.5, 0.9487)
        >>> tokens = torch.ones(1, 2, 3)
        >>> agreement(tokens, tokens + torch.tensor([0.0, 9.0])[None, :, None], torch.tensor([[1, 0]])).max_abs_diff
        0.0
    """
    ref, got = _real_tokens(reference, mask), _real_tokens(other, mask)
    diff = float((ref - got).abs().max()) if ref.numel() else 0.0
    cosine = torch.nn.functional.cosine_similarity(ref.flatten(1), got.flatten(1), dim=1, eps=1e-12)
    return Agreement(max_abs_diff=diff, min_cosine=float(cosine.min()), mean_cosine=float(cosine.mean()))


def output_scale(reference: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The largest magnitude in ``reference`` on the positions :func:`agreement` compares (real tokens with a mask).

    The fp32 parity gate scales its tolerance by it (:func:`check_parity`). Padded positions do not count:
    their values are not a property of the model, so they must not widen the limit.

    Example:
        >>> tokens = torch.tensor([[[0.5, -2.0], [40.0, 0.0]]])
        >>> output_scale(tokens), output_scale(tokens, torch.tensor([[1, 0]]))
        (40.0, 2.0)
    """
    ref = _real_tokens(reference, mask)
    return float(ref.abs().max()) if ref.numel() else 0.0


def check_parity(expected: torch.Tensor, runtime: nn.Module, inputs: Mapping[str, torch.Tensor], *,
                 tolerance: float, what: str = "ONNX Runtime", hint: str = "pass a larger --tolerance if that is "
                 "acceptable") -> Agreement:
    """Run ``runtime`` on ``inputs`` and compare with ``expected``; a one-line error above the limit.

    The limit is ``tolerance * max(1, output_scale(expected, mask))``: fp32 rounding error grows with the
    magnitude of the values (a different summation order, as AVX-512 kernels use, moves all-MiniLM-L6-v2's
    hidden states, which reach 5.8, by 1.6e-4), so an absolute limit would be too tight for models with
    large outputs. Below magnitude 1 the limit is ``tolerance`` itself.

    Example:
        >>> from types import SimpleNamespace
        >>> class OffBy(nn.Module):  # stands in for a graph runtime that is off by 3e-4 everywhere
        ...     output = "last_hidden_state"
        ...     def __init__(self, reference: torch.Tensor) -> None:
        ...         super().__init__()
        ...         self.reference = reference
        ...     def forward(self, **inputs: torch.Tensor) -> SimpleNamespace:
        ...         return SimpleNamespace(last_hidden_state=self.reference + 3e-4)
        >>> inputs = {"input_ids": torch.ones(1, 2, dtype=torch.long), "attention_mask": torch.ones(1, 2)}
        >>> big = torch.full((1, 2, 4), 5.0)
        >>> check_parity(big, OffBy(big), inputs, tolerance=1e-4).max_abs_diff < 5e-4  # limit 5e-4
        True
        >>> check_parity(big / 10, OffBy(big / 10), inputs, tolerance=1e-4)
        Traceback (most recent call last):
        ...
        surgery.runtimes.shared.graph_export.ExportParityError: export: ONNX Runtime differs from PyTorch by \
3.00e-04 (max abs, min cosine 1.000000; outputs reach 0.5, so the limit is the tolerance 0.0001) on a padded \
1x2 batch; pass a larger --tolerance if that is acceptable
    """
    found = agreement(expected, getattr(runtime(**inputs), runtime.output))
    # The difference covers every position, padding included, as it always has (an fp32 graph should match
    # there too); the scale covers real tokens only, so padded positions' values cannot widen the limit.
    scale = output_scale(expected, inputs.get("attention_mask"))
    limit = tolerance * max(1.0, scale)
    if not found.max_abs_diff <= limit:  # also catches NaN
        batch, seq = inputs["input_ids"].shape
        rule = (f"so the limit is {limit:.2e} = tolerance {tolerance:g} x {scale:.3g}" if scale > 1.0
                else f"so the limit is the tolerance {tolerance:g}")
        raise ExportParityError(
            f"export: {what} differs from PyTorch by {found.max_abs_diff:.2e} (max abs, min cosine "
            f"{found.min_cosine:.6f}; outputs reach {scale:.3g}, {rule}) on a padded {batch}x{seq} batch; {hint}")
    return found


def check_export_settings(batch: int, seq: int, tolerance: float) -> None:
    """Refuse, in one line, a parity batch smaller than 1 x 2 or a tolerance that is not finite and positive.

    Example:
        >>> check_export_settings(4, 1, 1e-4)
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: export: seq must be at least 2, got 1
    """
    for field, value, least in (("batch", batch, 1), ("seq", seq, 2)):
        if value < least:
            raise ConfigError(f"export: {field} must be at least {least}, got {value}")
    check_tolerance(tolerance, "export: tolerance")  # inf would turn the parity gate off


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the named loggers (``""`` is the root logger) to ERROR for the block, then restore them.

    Example:
        >>> with quiet_loggers("onnxscript"):
        ...     logging.getLogger("onnxscript").level
        40
    """
    loggers = [logging.getLogger(name or None) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def graph_feeds(batch: Mapping[str, torch.Tensor | None], names: Sequence[str]) -> dict[str, Any]:
    """A tokenized batch as an exported graph's int64 inputs ``names`` (missing: ones for a mask, else zeros).

    Example:
        >>> feeds = graph_feeds({"input_ids": torch.tensor([[2, 5]])}, ["input_ids", "attention_mask"])
        >>> {k: v.tolist() for k, v in feeds.items()}
        {'input_ids': [[2, 5]], 'attention_mask': [[1, 1]]}
    """
    ids = batch["input_ids"]
    assert ids is not None
    feeds = {}
    for name in names:
        value = batch.get(name)
        if value is None:
            value = torch.ones_like(ids) if name == "attention_mask" else torch.zeros_like(ids)
        feeds[name] = value.detach().cpu().numpy().astype("int64", copy=False)
    return feeds
