"""One training stack on the Hugging Face Trainer: task loss, optional distillation, per-epoch history.

:class:`SurgeryTrainer` is a ``transformers.Trainer`` whose ``compute_loss`` computes the task
cross-entropy on class logits and, with a frozen teacher, adds the logit KL and the mapped
hidden-state MSE of :mod:`surgery.training.distill`. Because it is a plain Trainer, torchrun and
accelerate run it data-parallel unchanged (the teacher is an ordinary module on every rank).
SHRP's trainer, recovery after surgery and DoE's prompt tuning are all this class.

Two switches make recovery cheaper on a CPU: ``bf16=True`` in :func:`training_arguments` is the
Trainer's own mixed precision (autocast to bf16 through accelerate, fp32 master weights), which the
caller turns on only where the device multiplies bf16 natively; and :func:`with_teacher_logits`
computes the frozen teacher's logits once per run, as a dataset column that ``compute_loss`` reads
instead of running the teacher at every step of every epoch.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

from surgery.core.distributed import per_process_batch
from surgery.core.errors import ConfigError
from surgery.data.task_data import MODEL_COLUMNS, PaddingCollator, TaskData
from surgery.training.distill import DistillConfig, distillation_loss, hidden_state_loss, recording_layer_outputs

#: The dataset column (and batch key) holding the teacher's cached logits.
TEACHER_LOGITS = "teacher_logits"


class LogitTask(Protocol):
    """How batches become class logits (a prompt template and verbalizer, for instance)."""

    def prepare(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def class_logits(self, outputs: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor: ...


@dataclass
class EpochStats:
    """Running figures of the current epoch (reset by :class:`EpochHistory` at each epoch's start)."""

    loss_sum: float = 0.0
    kd_sum: float = 0.0
    steps: int = 0
    correct: int = 0
    seen: int = 0

    def summary(self) -> dict[str, float | None]:
        return {"loss": self.loss_sum / self.steps if self.steps else None,
                "kd": self.kd_sum / self.steps if self.steps else None,
                "train_acc": self.correct / self.seen if self.seen else None}

    def reset(self) -> None:
        self.loss_sum = self.kd_sum = 0.0
        self.steps = self.correct = self.seen = 0

    def gathered(self) -> EpochStats:
        """The figures summed over every process of a torchrun group (each holds its share of the batches).

        Without a process group, or alone in one, the figures themselves. Every process must call it.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self
        totals = torch.tensor([self.loss_sum, self.kd_sum, self.steps, self.correct, self.seen], dtype=torch.float64)
        dist.all_reduce(totals)
        loss_sum, kd_sum, steps, correct, seen = totals.tolist()
        return EpochStats(loss_sum, kd_sum, int(steps), int(correct), int(seen))


def device_of(module: nn.Module) -> torch.device | None:
    """The one device that ``module``'s parameters and buffers are on; None with none, or spread over several
    (a device map: where those go is their owner's choice).

    Example:
        >>> device_of(nn.Linear(2, 2))
        device(type='cpu')
        >>> device_of(nn.ReLU()) is None
        True
    """
    devices = {t.device for t in (*module.parameters(), *module.buffers())}
    return devices.pop() if len(devices) == 1 else None


def training_device() -> torch.device:
    """The device the HF Trainer trains on here (:func:`training_arguments` sets ``use_cpu`` by the same test): the
    GPU where torch sees one, else the CPU. What a training step is timed on, so that an estimate prices the
    training that follows.

    Example:
        >>> training_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def moved_to(device: torch.device, *modules: nn.Module) -> Iterator[None]:
    """``modules`` on ``device`` inside the block, each handed back after (also after an error) to the one device it
    was on (:func:`device_of`; one spread over several devices is left where the block put it).

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> with moved_to(torch.device("cpu"), layer):
        ...     device_of(layer).type
        'cpu'
    """
    homes = [device_of(m) for m in modules]
    for module in modules:
        module.to(device)
    try:
        yield
    finally:
        for module, home in zip(modules, homes, strict=True):
            if home is not None:
                module.to(home)


@contextmanager
def dropout_disabled(model: nn.Module) -> Iterator[None]:
    """Every ``nn.Dropout`` of ``model`` at p=0 inside the block (restored after), whatever its mode.

    Switching the dropout modules to eval mode is not enough: attention implementations read the
    probability as ``dropout.p if self.training`` from their *own* mode (Hugging Face's attention
    classes, the Expert Attention layer), so attention-probability dropout would stay on.

    Example:
        >>> drop = nn.Dropout(0.5).train()
        >>> with dropout_disabled(drop):
        ...     bool((drop(torch.ones(8)) == 1).all())
        True
        >>> drop.p
        0.5
    """
    saved = [(m, m.p) for m in model.modules() if isinstance(m, nn.Dropout)]
    try:
        for m, _ in saved:
            m.p = 0.0
        yield
    finally:
        for m, p in saved:
            m.p = p


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP/DataParallel wrapper (or the model itself)."""
    return getattr(model, "module", model)


def restore_forward(model: nn.Module) -> None:
    """Undo accelerate's mixed-precision wrapping of ``model.forward``, in place.

    With ``bf16=True`` the Trainer's accelerator replaces the model's ``forward`` by one that runs
    under bf16 autocast (keeping the original as ``_original_forward``) and leaves it so after
    training: every later forward (evaluation, ONNX or OpenVINO export, timing) would still run in
    bf16. Measured: a layer's output stayed bf16 after a bf16 recovery until this was added.

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> layer._original_forward = layer.forward
        >>> layer.forward = lambda x: x
        >>> restore_forward(layer)
        >>> "forward" in vars(layer), layer(torch.zeros(1, 2)).shape
        (False, torch.Size([1, 2]))
    """
    inner = unwrap(model)
    if "_original_forward" in vars(inner):
        del inner._original_forward
        vars(inner).pop("forward", None)


class SurgeryTrainer(Trainer):
    """A ``Trainer`` for surgery: CE on class logits, plus distillation from ``teacher`` when given.

    Args:
        teacher: the frozen model before surgery (same task head); None trains on labels only.
        distill: temperature, KL weight ``alpha``, hidden-state weight and layer map.
        task: turns batches into class logits (DoE's MLM prompts); default ``outputs.logits``.
        dropout: False switches every dropout off while training, attention-probability dropout
            included (prompt tuning of a frozen encoder is steadier without it).

    Example:
        >>> import copy, datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "labels": [0, 2]})
        >>> with scratch_dir() as tmp:
        ...     trainer = SurgeryTrainer(model=model, args=training_arguments(tmp, epochs=1, batch_size=2),
        ...                              train_dataset=rows, data_collator=PaddingCollator(None),
        ...                              teacher=copy.deepcopy(model))
        ...     _ = trainer.train()
        >>> trainer.stats.steps
        1
    """

    def __init__(self, *args: Any, teacher: nn.Module | None = None, distill: DistillConfig | None = None,
                 task: LogitTask | None = None, dropout: bool = True, **kwargs: Any) -> None:
        # The Trainer moves the model to its device (a GPU where there is one) when it is built, and
        # compute_loss moves the teacher there: both go back after train() (see train()).
        model = kwargs.get("model", args[0] if args else None)
        self.model_home = device_of(model) if isinstance(model, nn.Module) else None
        self.teacher_home = (teacher, device_of(teacher)) if teacher is not None else None
        super().__init__(*args, **kwargs)
        self.remove_callback(PrinterCallback)  # progress goes through surgery's events, not raw log dicts
        # compute_loss returns a per-batch mean (not a sum over num_items_in_batch), so the Trainer must
        # scale it for gradient accumulation and must not rescale it across devices itself.
        self.model_accepts_loss_kwargs = False
        self.teacher = teacher
        if teacher is not None:
            # Frozen by running it in eval mode under no_grad; its requires_grad flags are the caller's
            # (a teacher is often copied again to make the next student, which must stay trainable).
            teacher.eval()
        self.distill = distill or DistillConfig()
        self.task = task
        self.dropout = dropout
        self.stats = EpochStats()

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``, after which the model's forward is its own again (see :func:`restore_forward`), and
        the model and the teacher are back on the devices they were on when the trainer was built.

        A caller's CPU model trained on a machine with a GPU comes back on the CPU: the judging, export and timing
        that follow (and a user's own CPU inputs) find it where they left it, and the teacher (often the user's
        original model) does not stay on the GPU either.
        """
        try:
            return super().train(*args, **kwargs)
        finally:
            restore_forward(self.model)
            homes = [(self.model, self.model_home)]
            if self.teacher is not None:
                given, home = self.teacher_home or (None, None)
                # A teacher attached during training (SHRP's snapshot of the model) goes where the model goes.
                homes.append((self.teacher, home if given is self.teacher else self.model_home))
            for module, home in homes:
                if home is not None and device_of(module) != home:
                    module.to(home)

    def _teacher_on(self, device: torch.device) -> nn.Module:
        assert self.teacher is not None
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        return self.teacher

    def dropout_context(self, model: nn.Module) -> AbstractContextManager[None]:
        """Where the student's forward runs: every dropout off unless ``dropout`` (see :func:`dropout_disabled`)."""
        return nullcontext() if self.dropout else dropout_disabled(model)

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        with self.dropout_context(model):
            return self.task_loss(model, inputs, return_outputs)

    def task_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False) -> Any:
        """The task cross-entropy (plus distillation, given a teacher) of one batch."""
        batch = self.task.prepare(inputs) if self.task is not None else dict(inputs)
        cached = batch.pop(TEACHER_LOGITS, None)  # the teacher's logits, computed once (with_teacher_logits)
        labels = batch.get("labels")
        features = {k: v for k, v in batch.items() if k != "labels"}
        cfg = self.distill
        hidden = self.teacher is not None and cfg.hidden_weight > 0
        with recording_layer_outputs(model) if hidden else nullcontext([]) as s_layers:
            outputs = model(**features)
        logits = self.task.class_logits(outputs, batch) if self.task is not None else outputs["logits"]
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else logits.sum() * 0.0
        kd = None
        if cached is not None and not hidden:
            kd = distillation_loss(logits, cached.to(logits.device), cfg.temperature)
            loss = (1.0 - cfg.alpha) * loss + cfg.alpha * kd if labels is not None else kd
        elif self.teacher is not None:
            teacher = self._teacher_on(logits.device)
            with torch.no_grad(), recording_layer_outputs(teacher) if hidden else nullcontext([]) as t_layers:
                t_out = teacher(**features)
                t_logits = self.task.class_logits(t_out, batch) if self.task is not None else t_out["logits"]
            kd = distillation_loss(logits, t_logits, cfg.temperature)
            loss = (1.0 - cfg.alpha) * loss + cfg.alpha * kd if labels is not None else kd
            if hidden:
                loss = loss + cfg.hidden_weight * hidden_state_loss(
                    s_layers, t_layers, cfg.layer_map, features.get("attention_mask"))
        if model.training:
            s = self.stats
            s.steps += 1
            s.loss_sum += float(loss.detach())
            s.kd_sum += float(kd.detach()) if kd is not None else 0.0
            if labels is not None:
                s.correct += int((logits.detach().argmax(-1) == labels).sum())
                s.seen += int(labels.numel())
        if return_outputs:
            outputs["logits"] = logits
            return loss, outputs
        return loss


class EpochHistory(TrainerCallback):
    """Per-epoch figures (train loss/accuracy, optional evaluation accuracy), progress events, best epoch.

    ``evaluate(model) -> float`` measures the model after each epoch; with ``keep_best`` the
    tensors of ``keep_best`` are restored at the end of training to those of the best epoch
    (early stopping's choice; of equal epochs the later, trained longer). With ``patience`` training stops
    once that many epochs in a row have measured below the best (a plateau at the best goes on: on a few
    hundred examples accuracy moves in coarse steps, and equal is not worse). ``emit(task, completed, total, **info)``
    receives progress.

    Example:
        >>> EpochHistory(EpochStats()).history
        []
    """

    def __init__(self, stats: EpochStats, *, evaluate: Callable[[nn.Module], float] | None = None,
                 keep_best: list[nn.Parameter] | None = None, emit: Callable[..., None] | None = None,
                 label: str = "train", patience: int | None = None) -> None:
        self.stats, self.evaluate, self.keep_best, self.patience = stats, evaluate, keep_best, patience
        self.emit = emit or (lambda *a, **k: None)
        self.label = label
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, list[torch.Tensor]] | None = None
        self.best_epoch: int | None = None
        self.stopped_early = False
        self.steps_per_epoch: int | None = None
        self.epochs = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        self.steps_per_epoch = len(loader) if loader is not None and hasattr(loader, "__len__") else None
        self.epochs = int(args.num_train_epochs)
        if args.max_steps > 0 and self.steps_per_epoch:  # a step budget: the epochs it starts
            self.epochs = -(-args.max_steps // self.steps_per_epoch)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stats.reset()

    def _task(self) -> str:
        return f"{self.label} epoch {len(self.history) + 1}/{self.epochs}"

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.process_index == 0:
            self.emit(self._task(), self.stats.steps, self.steps_per_epoch, **self.stats.summary())

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Each process counted its own batches; the epoch's figures are those of all of them.
        info: dict[str, Any] = {"epoch": len(self.history) + 1, **self.stats.gathered().summary()}
        if self.evaluate is not None:
            info["accuracy"] = self.evaluate(unwrap(kwargs["model"]))
            if self.best is None or info["accuracy"] >= self.best[0]:
                saved = [] if self.keep_best is None else [p.detach().clone() for p in self.keep_best]
                self.best, self.best_epoch = (info["accuracy"], saved), info["epoch"]
            if self.patience is not None and info["epoch"] - (self.best_epoch or 0) >= self.patience:
                control.should_training_stop = True  # the Trainer ends after this epoch's callbacks
                self.stopped_early = state.global_step < state.max_steps
        if args.process_index == 0:
            self.emit(self._task(), self.steps_per_epoch or self.stats.steps, self.steps_per_epoch, **info)
        self.history.append(info)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.best is not None and self.keep_best is not None:
            with torch.no_grad():
                for p, saved in zip(self.keep_best, self.best[1], strict=True):
                    p.copy_(saved)


class TimeLimit(TrainerCallback):
    """Ends a Trainer run at the first step that ends past ``seconds`` of wall-clock time from construction.

    A budget's backstop: a run sized in steps from a timed step can still overrun when the machine gets
    busier than when the step was timed (a distillation tier sized at 0.65 s a step ran at 1.06 s under
    load, 225 s past its share of a 20-minute budget). The Trainer finishes the step, then calls the
    epoch's callbacks (so an epoch cut short is still measured), then stops. Build it before anything
    the limit should cover (caching the teacher's outputs, for one).

    Example:
        >>> TimeLimit(0.0).over(), TimeLimit(3600.0).over()
        (True, False)
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.perf_counter() + seconds
        self.reached = False

    def over(self) -> bool:
        """Whether the limit has passed."""
        return time.perf_counter() >= self.deadline

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.over():
            control.should_training_stop = True
            self.reached = True


def accumulation_steps(batch_size: int, micro_batch: int | None) -> int:
    """Micro-batches one optimiser step of ``batch_size`` rows is split into so that each holds at most
    ``micro_batch`` rows: the fewest that divide it evenly (every micro-batch the same size, so the mean of
    their mean losses is the batch's mean loss). 1 without a ``micro_batch`` or where the batch fits.

    Example:
        >>> [accumulation_steps(32, None), accumulation_steps(32, 40), accumulation_steps(32, 5)]
        [1, 1, 8]
        >>> accumulation_steps(30, 4)  # 10 micro-batches of 3: the fewest equal ones of at most 4 rows
        10
    """
    if micro_batch is None or micro_batch >= batch_size:
        return 1
    return next(a for a in range(1, batch_size + 1) if batch_size % a == 0 and batch_size // a <= max(micro_batch, 1))


def training_arguments(output_dir: str, *, epochs: int, batch_size: int = 32, learning_rate: float = 5e-5,
                       weight_decay: float = 0.0, warmup_ratio: float = 0.0, seed: int = 0, bf16: bool = False,
                       micro_batch: int | None = None, **overrides: Any) -> TrainingArguments:
    """Trainer settings for surgery's runs: no checkpoints, no logging to stdout, linear decay, CPU without CUDA.

    ``bf16`` is the Trainer's mixed precision (bf16 autocast, fp32 weights), on a CPU as on CUDA: turn it
    on only where the device has native bf16 products (a CPU without them runs bf16 slower than fp32);
    the caller decides (``surgery.compress.training_tier.bf16_training``: the GPU's bf16 where torch sees one, else
    the CPU's).

    ``batch_size`` is the global batch: under ``torchrun`` each process takes its share of it, so a
    multi-process run trains like a one-process run (:mod:`surgery.core.distributed`).

    ``warmup_ratio`` is a fraction of the training steps (transformers 5 takes it as a float ``warmup_steps``).

    ``micro_batch``: the most rows one forward and backward may take (bounded memory on long sequences); a
    process's share of the batch is then run in equal micro-batches whose gradients accumulate into one
    optimiser step (the Trainer's ``gradient_accumulation_steps``, :func:`accumulation_steps`): the same step,
    in less memory.

    Example:
        >>> training_arguments("/tmp/x", epochs=2).num_train_epochs
        2
        >>> args = training_arguments("/tmp/x", epochs=1, batch_size=32, micro_batch=6)
        >>> args.per_device_train_batch_size, args.gradient_accumulation_steps
        (4, 8)
    """
    share = per_process_batch(batch_size)  # batch_size is the global batch (surgery.core.distributed)
    accumulate = accumulation_steps(share, micro_batch)
    values: dict[str, Any] = dict(
        output_dir=output_dir, num_train_epochs=epochs, per_device_train_batch_size=share // accumulate,
        gradient_accumulation_steps=accumulate, per_device_eval_batch_size=share, learning_rate=learning_rate,
        weight_decay=weight_decay,
        warmup_steps=warmup_ratio, lr_scheduler_type="linear", save_strategy="no", eval_strategy="no",
        logging_strategy="no", report_to=[], seed=seed, data_seed=seed, disable_tqdm=True,
        remove_unused_columns=False, use_cpu=training_device().type == "cpu", dataloader_num_workers=0, bf16=bf16,
    )
    values.update(overrides)
    return TrainingArguments(**values)


def train_columns(task: TaskData) -> Any:
    """The training split with only the model-input columns (what the collator pads)."""
    columns = [c for c in MODEL_COLUMNS if c in task.train.column_names]
    return task.train.select_columns(columns)


class TeacherLogitsCollator:
    """``inner``'s batch plus the rows' cached teacher outputs (``column``: the logits by default), stacked as that
    column (float32).

    Example:
        >>> rows = [{"input_ids": [2, 5], "teacher_logits": [0.5, -1.0]},
        ...         {"input_ids": [2], "teacher_logits": [1.0, 0.0]}]
        >>> TeacherLogitsCollator(PaddingCollator(None))(rows)["teacher_logits"].shape
        torch.Size([2, 2])
    """

    def __init__(self, inner: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]], *,
                 column: str = TEACHER_LOGITS) -> None:
        self.inner = inner
        self.column = column

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        cached = [r[self.column] for r in rows]
        batch = self.inner([{k: v for k, v in r.items() if k != self.column} for r in rows])
        batch[self.column] = torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in cached])
        return batch


def with_teacher_logits(teacher: nn.Module, rows: Any, collator: Callable[[list[dict[str, Any]]], Any], *,
                        batch_size: int = 64, bf16: bool = False) -> Any:
    """``rows`` (a ``datasets.Dataset``) with a ``teacher_logits`` column: one inference pass of ``teacher``
    (:func:`with_teacher_outputs` of its logits).

    Example:
        >>> import datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "labels": [0, 2]})
        >>> cached = with_teacher_logits(tiny_model(TinySpec("bert", task="seq-cls")), rows, PaddingCollator(None))
        >>> len(cached[TEACHER_LOGITS][0])
        3
    """
    return with_teacher_outputs(teacher, rows, collator, batch_size=batch_size, bf16=bf16)


def with_teacher_outputs(teacher: nn.Module, rows: Any, collator: Callable[[list[dict[str, Any]]], Any], *,
                         column: str = TEACHER_LOGITS,
                         outputs: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor] | None = None,
                         batch_size: int = 64, bf16: bool = False) -> Any:
    """``rows`` (a ``datasets.Dataset``) with a ``column`` of the teacher's ``outputs(teacher, features)`` per row (a
    ``[rows, width]`` tensor; default: its logits), from one inference pass.

    The teacher is frozen and runs in eval mode, so its outputs for a row are the same at every epoch:
    computing them once costs one forward pass over the data instead of one per step of every epoch
    (a quarter to a third of a distillation step's time). ``bf16`` runs the pass under the same bf16 autocast the
    training uses; the outputs are stored in float32.

    Example:
        >>> import datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]]})
        >>> first = lambda model, features: model(**features)["last_hidden_state"][:, 0]
        >>> cached = with_teacher_outputs(tiny_model(TinySpec("bert")), rows, PaddingCollator(None),
        ...                               column="first", outputs=first)
        >>> len(cached["first"]), len(cached["first"][0]) == tiny_model(TinySpec("bert")).config.hidden_size
        (2, True)
    """
    was = teacher.training
    teacher.eval()
    device = next(teacher.parameters()).device
    out: list[list[float]] = []
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for start in range(0, len(rows), batch_size):
                chunk = rows.select(range(start, min(start + batch_size, len(rows))))
                batch = collator([dict(r) for r in chunk])
                features = {k: v.to(device) for k, v in batch.items() if k != "labels" and torch.is_tensor(v)}
                value = outputs(teacher, features) if outputs is not None else teacher(**features)["logits"]
                out.extend(value.float().cpu().tolist())
    finally:
        teacher.train(was)
    import datasets

    # Stored as float32 (a list of Python floats would be kept as float64: twice the memory for an embedding's width).
    return rows.add_column(column, out, feature=datasets.Sequence(datasets.Value("float32")))


def masked_copies(rows: Any, copies: int, *, mask_id: int, rate: float, seed: int = 0,
                  keep: Sequence[int] = ()) -> Any:
    """``rows`` followed by ``copies`` copies of them with a share ``rate`` of their tokens replaced by ``mask_id``.

    Distillation on a few thousand examples learns them and stops generalising; masked copies, labelled by the
    teacher's logits on the masked text itself, show the student more of the teacher's function at the cost of
    one teacher pass per copy (TinyBERT's augmentation replaces words instead, with a language model). Tokens in
    ``keep`` (the special tokens) and padding are never masked; the first token of a row never is either.

    Example:
        >>> import datasets
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 6, 7, 3]], "labels": [1]})
        >>> out = masked_copies(rows, 2, mask_id=4, rate=0.5, keep=[2, 3])
        >>> len(out), out[0]["input_ids"], out[1]["input_ids"][0], out[1]["input_ids"][-1], out[2]["labels"]
        (3, [2, 5, 6, 7, 3], 2, 3, 1)
    """
    import datasets
    import numpy as np

    kept = set(int(k) for k in keep)
    parts = [rows]
    for copy_index in range(copies):
        rng = np.random.default_rng([seed, copy_index])

        def mask(row: dict[str, Any], rng: Any = rng) -> dict[str, Any]:
            ids = list(row["input_ids"])
            attended = row.get("attention_mask") or [1] * len(ids)
            draws = rng.random(len(ids))
            row["input_ids"] = [mask_id if i > 0 and attended[i] and t not in kept and draws[i] < rate else t
                                for i, t in enumerate(ids)]
            return row

        parts.append(rows.map(mask, desc=None, load_from_cache_file=False))
    return datasets.concatenate_datasets(parts)


@contextmanager
def scratch_dir(prefix: str = "surgery-train-") -> Iterator[str]:
    """A temporary output directory for a Trainer that saves nothing (it still wants one)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield tmp


@dataclass
class TrainResult:
    """What :func:`fit` did: per-epoch history and the trainer's final global step."""

    history: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0


def fit(model: nn.Module, task: TaskData, args: TrainingArguments, *, teacher: nn.Module | None = None,
        distill: DistillConfig | None = None, logit_task: LogitTask | None = None, dropout: bool = True,
        optimizer: torch.optim.Optimizer | None = None, history: EpochHistory | None = None,
        cache_teacher: bool = False, masked: int = 0, mask_rate: float = 0.15,
        callbacks: Sequence[TrainerCallback] = ()) -> TrainResult:
    """Train ``model`` on ``task``'s training split with :class:`SurgeryTrainer`; the model ends in eval mode.

    ``cache_teacher`` computes the teacher's logits once (:func:`with_teacher_logits`) where only logits
    are distilled (no hidden-state term, no prompt ``logit_task``), instead of at every step. ``masked``
    adds that many copies of the training rows with ``mask_rate`` of their tokens masked
    (:func:`masked_copies`), labelled by the cached teacher logits: it needs the cache and a tokenizer
    with a mask token. ``callbacks`` join the Trainer's (a :class:`TimeLimit`, for one).
    """
    rows, collator = train_columns(task), PaddingCollator(task.tokenizer)
    cfg = distill or DistillConfig()
    cached = cache_teacher and teacher is not None and logit_task is None and cfg.hidden_weight == 0
    if masked > 0:
        mask_id = getattr(task.tokenizer, "mask_token_id", None)
        if not cached or mask_id is None:
            raise ConfigError("training: masked copies are labelled by the teacher's cached logits on them: they "
                              "need a teacher, logit distillation only (hidden_weight 0) and a tokenizer with a "
                              "mask token; set the masked copies to 0")
        rows = masked_copies(rows, masked, mask_id=int(mask_id), rate=mask_rate, seed=int(args.seed),
                             keep=list(getattr(task.tokenizer, "all_special_ids", []) or []))
    if cached:
        rows = with_teacher_logits(teacher, rows, collator, batch_size=max(args.per_device_train_batch_size, 32),
                                   bf16=bool(args.bf16))
        collator = TeacherLogitsCollator(collator)  # type: ignore[assignment]
    trainer = SurgeryTrainer(model=model, args=args, train_dataset=rows, data_collator=collator, teacher=teacher,
                             distill=distill, task=logit_task, dropout=dropout, optimizers=(optimizer, None))
    if history is not None:
        history.stats = trainer.stats
        trainer.add_callback(history)
    for callback in callbacks:
        trainer.add_callback(callback)
    output = trainer.train()
    model.eval()
    return TrainResult(history=history.history if history is not None else [], steps=int(output.global_step))

