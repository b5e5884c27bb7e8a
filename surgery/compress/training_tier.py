"""The training tier: recovery from the original in the time the budget has left, on the tier that pays most.

Two tiers follow the least-squares refit (which every candidate already had):

* ``blockwise``: block-wise reconstruction (:mod:`surgery.training.blockwise`): each layer of the
  cut model trained to reproduce the original layer's output on cached calibration batches;
* ``distil``: end-to-end distillation from the original with the HF Trainer
  (:func:`surgery.training.recover`), the teacher's logits computed once per run, in as many
  optimiser steps as fit (a budget may end inside an epoch), at most :data:`MAX_EPOCHS` epochs. Each
  epoch is measured on ``data``'s eval split; the run stops once :data:`PATIENCE` epochs in a row measure
  below the best, and the best epoch's parameters are kept. compress hands over the search part of its
  dev split as that eval split, never the part its pick holds out.

Both train in bf16 autocast where the CPU multiplies bf16 natively (the same check the ``torch-bf16``
runtime makes: avx512_bf16 or AMX, or CUDA), fp32 elsewhere. Each tier's time is estimated from
timed steps on this machine and announced (a ``compress: training tier`` progress event carrying the
estimate) before it runs; the tiers run in :data:`TIER_ORDER`, the order of accuracy won back per
budget minute measured in experiments/recovery_tiers, each taking what it needs of the time left.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.devices import synchronize
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.scoring.importance import batches_on, model_device
from surgery.training import RecoveryConfig, RecoveryResult, accuracy, recover
from surgery.training.blockwise import BlockwiseConfig, layer_step_seconds, reconstruct_layers
from surgery.training.refit import task_calibration_batches
from surgery.training.trainer import moved_to, training_device

#: The HF Trainer's cost over a bare step (data loading, optimiser, logging, evaluation each epoch).
TRAINER_OVERHEAD = 1.3
#: A block-wise step's cost over its timed forward and backward (Adam's update, the batch cycle).
BLOCKWISE_OVERHEAD = 1.2
#: Distillation epochs at most, however long the budget: a bound for a long budget on little data. The budget or
#: :data:`PATIENCE` ends a run first on the runs measured (experiments/deep_cuts: 6 epochs left 4-10 minutes of a
#: 20-minute budget unspent while the judged accuracy still rose).
MAX_EPOCHS = 40
#: Epochs in a row that measure below the best on the eval split before distillation stops (it keeps the best, of
#: equal ones the later). A plateau at the best goes on: text-source seed 0 at 12x stopped at epoch 11 of 18 when
#: 3 epochs equal to the best counted against it, with 6 of its 20 minutes unspent.
PATIENCE = 3
#: Masked copies of the training rows distillation adds (where the tokenizer has a mask token), labelled by the
#: teacher's logits on them: each costs one teacher pass and makes an epoch that much longer. Off: 2 copies at
#: --speedup 12 --budget 20 (experiments/deep_cuts, fe5437f) kept 93.62% against 93.88% without (rt-fresh-rotten-plot
#: seed 1) and 92.00% against 90.16% (rt-sentiment seed 1, another winner): within noise on two runs.
MASKED_COPIES = 0
#: Masked copies of the training texts embedding distillation adds (where the tokenizer has a mask token), each
#: labelled by the teacher's embedding of the masked text (computed once where no hidden-state term runs the
#: teacher at every step).
EMBEDDING_MASKED_COPIES = 0
#: Weight of the hidden-state MSE in a task model's distillation: each layer of the cut model against the original's
#: (CoFi's layer distillation, :func:`surgery.training.hidden_state_loss`), beside the logit KL. The teacher then
#: runs at every step (its logits are no longer cached once). 0: logits only. The embedding objective has its own
#: (:func:`surgery.embedding.objective.embedding_hidden_weight`). Off: at 1 on three tasks at --speedup 12 --budget 20
#: (experiments/deep_cuts, 34682c8 against be719fd, a VNNI/BF16 CPU) -0.44 ± 1.04 points, and longer runs.
TASK_HIDDEN_WEIGHT = 0.0
#: Fewer distillation steps than this are not worth a Trainer's setup and a re-judging of the model.
MIN_DISTIL_STEPS = 8
#: Calibration batches block-wise reconstruction caches (bounded memory: one layer's inputs and targets at a time).
BLOCKWISE_BATCHES = 16
#: The tiers, by accuracy won back per budget minute, the first gets the time first. experiments/recovery_tiers
#: (rt-sentiment, a cut to 1/12 of the projections, fp32, one seed): block-wise 1.82 dev points per minute,
#: one distillation epoch 1.15 (on test level, 0.61 and 0.62); distillation after block-wise still added 2.25.
TIER_ORDER: tuple[str, ...] = ("blockwise", "distil")


def bf16_training() -> bool:
    """Whether training may run in bf16 on the device it runs on: the GPU where torch sees one (the HF Trainer
    trains there) if it has bf16 products (compute capability 8.0 and up), else this CPU if it has avx512_bf16 or
    AMX (:func:`~surgery.runtimes.shared.runtime.bf16_cpu_missing`).

    Elsewhere bf16 runs slower than fp32 (a CPU without native bf16 products), or the Trainer refuses it (a GPU
    before Ampere), so training stays in fp32 there.

    Example:
        >>> isinstance(bf16_training(), bool)
        True
    """
    import torch

    from surgery.runtimes.shared.runtime import bf16_cpu_missing, cuda_bf16

    if torch.cuda.is_available():  # the Trainer trains there, whatever the CPU has
        return cuda_bf16()
    return bf16_cpu_missing() is None


class TierEstimate(BaseModel):
    """A tier's time on this machine, from timed steps: ``seconds`` for the run ``steps`` describes.

    ``timed`` False: its steps were not timed because even its untimed part (the forwards it cannot do without,
    :func:`tier_floors`) did not fit the time left; ``seconds`` is then that floor, ``step_seconds`` a lower bound.
    """

    tier: str
    seconds: float
    step_seconds: float
    steps: int
    fixed_seconds: float = 0.0  # paid once whatever the steps (caching the teacher's outputs)
    bf16: bool = False
    timed: bool = True
    micro_batch: int | None = None  # rows per forward and backward where a step's batch is split (distillation)


def timed_distil_step(student: nn.Module, data: Any, batch_size: int, *, bf16: bool = False,
                      micro_batch: int | None = None) -> float:
    """Seconds of one distillation step of ``student`` (forward and backward under the training's precision).

    The teacher's logits are cached once per run, so its forward is not part of a step. The second of two
    steps is timed (the first pays for allocations); gradients are cleared after. With ``micro_batch`` the
    step runs as training runs it, in equal micro-batches (:func:`~surgery.training.trainer.accumulation_steps`):
    one is timed, times their number, so that the timing holds no more activations than training does.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> timed_distil_step(tiny_model(TinySpec("bert", task="seq-cls")), tiny_task_data(8), 4) > 0
        True
        >>> timed_distil_step(tiny_model(TinySpec("bert", task="seq-cls")), tiny_task_data(8), 4, micro_batch=1) > 0
        True
    """
    from surgery.compress.mask_fisher import micro_batches
    from surgery.training.trainer import accumulation_steps

    loader = data.loader("train", batch_size=batch_size)
    device = model_device(student)
    batch = next(batches_on(loader, device))
    rows = int(batch["input_ids"].shape[0])
    parts = accumulation_steps(rows, micro_batch)
    inputs = {k: v for k, v in micro_batches([batch], rows // parts)[0].items() if k != "labels"}
    was = student.training
    student.train()
    elapsed = 0.0
    try:
        for _ in range(2):
            synchronize(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = student(**inputs)
            main = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
            main.float().square().mean().backward()
            synchronize(device)
            elapsed = time.perf_counter() - start
    finally:
        student.zero_grad(set_to_none=True)
        student.train(was)
    return elapsed * parts


def timed_forward(model: nn.Module, batch: dict[str, Any], *, bf16: bool = False) -> float:
    """Seconds of one inference forward of ``model`` on ``batch`` (the second of two)."""
    device = model_device(model)
    inputs = {k: v.to(device) for k, v in batch.items() if k != "labels" and torch.is_tensor(v)}
    elapsed = 0.0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for _ in range(2):
            synchronize(device)
            start = time.perf_counter()
            model(**inputs)
            synchronize(device)
            elapsed = time.perf_counter() - start
    return elapsed


def masked_copies_for(data: Any) -> int:
    """The masked copies distillation on ``data`` adds where its tokenizer has a mask token: :data:`MASKED_COPIES`
    for a task, :data:`EMBEDDING_MASKED_COPIES` for the embedding objective.

    Example:
        >>> from surgery.testing import tiny_task_data
        >>> masked_copies_for(tiny_task_data(8)) in (0, MASKED_COPIES)
        True
    """
    if getattr(getattr(data, "tokenizer", None), "mask_token_id", None) is None:
        return 0
    return MASKED_COPIES if getattr(data, "objective", "task") == "task" else EMBEDDING_MASKED_COPIES


def teacher_each_step(student: nn.Module, teacher: nn.Module, data: Any) -> bool:
    """Whether distillation of ``student`` runs the teacher at every step: where a hidden-state term reads its
    layers (a task's :data:`TASK_HIDDEN_WEIGHT`; the embedding objective's own weight, on for a student that kept
    every layer), else the teacher's outputs are computed once per run.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> teacher_each_step(model, model, tiny_task_data(8)) == (TASK_HIDDEN_WEIGHT > 0)
        True
    """
    if getattr(data, "objective", "task") == "task":
        return TASK_HIDDEN_WEIGHT > 0
    from surgery.embedding.objective import embedding_hidden_weight

    dropped = adapter_for(student).num_layers < adapter_for(teacher).num_layers
    return embedding_hidden_weight(RecoveryConfig(), layers_dropped=dropped) > 0


def estimate_distil(student: nn.Module, teacher: nn.Module, data: Any, batch_size: int, *,
                    bf16: bool = False, micro_batch: int | None = None,
                    teacher_forward: float | None = None) -> TierEstimate:
    """One epoch of distillation: timed step x steps per epoch x Trainer overhead, plus the teacher's one pass
    (an epoch and a pass per masked copy, :func:`masked_copies_for`, on top). ``micro_batch``: the rows one
    backward may take (:func:`timed_distil_step`); ``teacher_forward``: the teacher's forward on a batch, timed
    already (else timed here).

    Example:
        >>> import copy
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> estimate_distil(model, copy.deepcopy(model), tiny_task_data(8), 4).steps
        2
    """
    loader = data.loader("train", batch_size=batch_size)
    steps = len(loader) * (1 + masked_copies_for(data))
    if teacher_forward is None:
        teacher_forward = timed_forward(teacher, next(iter(loader)), bf16=bf16)
    step = timed_distil_step(student, data, batch_size, bf16=bf16, micro_batch=micro_batch) * TRAINER_OVERHEAD
    return distil_estimate(steps, step, teacher_forward, each_step=teacher_each_step(student, teacher, data),
                           bf16=bf16, micro_batch=micro_batch)


def distil_estimate(steps: int, step: float, teacher_forward: float, *, each_step: bool, bf16: bool = False,
                    micro_batch: int | None = None, timed: bool = True) -> TierEstimate:
    """An epoch of ``steps`` student steps of ``step`` seconds with the teacher's forward counted where distillation
    runs it: at every step where its layers' outputs are targets (``each_step``: :func:`teacher_each_step`), else
    once per row (its outputs cached for the run).

    Example:
        >>> cached, live = (distil_estimate(10, 1.0, 0.5, each_step=each) for each in (False, True))
        >>> cached.seconds, live.seconds, cached.fixed_seconds, live.step_seconds
        (15.0, 15.0, 5.0, 1.5)
    """
    if each_step:
        step, teacher_pass = step + teacher_forward, 0.0
    else:
        teacher_pass = teacher_forward * steps
    return TierEstimate(tier="distil", seconds=round(step * steps + teacher_pass, 3), step_seconds=step, steps=steps,
                        fixed_seconds=round(teacher_pass, 3), bf16=bf16, micro_batch=micro_batch, timed=timed)


def tier_floors(data: Any, batch_size: int, batches: int, student_forward: float, teacher_forward: float, *,
                bf16: bool = False, each_step: bool = False) -> dict[str, TierEstimate]:
    """Each tier's least possible time, from two inference forwards on one batch (no backward, little memory):
    distillation's teacher pass and :data:`MIN_DISTIL_STEPS` steps of at least a forward and a backward (no
    cheaper than two forwards); block-wise reconstruction's walks up both models (the part of
    :func:`estimate_blockwise` that is not its steps). A tier whose floor does not fit the time left is not timed:
    a timed step at a long length is itself a minute and gigabytes (BERT-base widths, 32 x 512 tokens).

    Example:
        >>> from surgery.testing import tiny_task_data
        >>> floors = tier_floors(tiny_task_data(8), 4, 16, student_forward=1.0, teacher_forward=2.0)
        >>> floors["distil"].seconds, floors["blockwise"].seconds, floors["distil"].timed
        (20.0, 96.0, False)
    """
    steps = len(data.loader("train", batch_size=batch_size)) * (1 + masked_copies_for(data))
    epoch = distil_estimate(steps, 2 * student_forward, teacher_forward, each_step=each_step, bf16=bf16, timed=False)
    walks = 2 * batches * (student_forward + teacher_forward)
    least = epoch.fixed_seconds + MIN_DISTIL_STEPS * epoch.step_seconds
    return {"distil": epoch.model_copy(update={"seconds": round(least, 3)}),
            "blockwise": TierEstimate(tier="blockwise", seconds=round(walks, 3), step_seconds=0.0, steps=0,
                                      fixed_seconds=round(walks, 3), bf16=bf16, timed=False)}


def task_hidden_weight(data: Any) -> float:
    """The hidden-state weight distillation on ``data`` uses: :data:`TASK_HIDDEN_WEIGHT` for a task, 0 for the
    embedding objective (which sets its own).

    Example:
        >>> from surgery.testing import tiny_task_data
        >>> task_hidden_weight(tiny_task_data(8)) == TASK_HIDDEN_WEIGHT
        True
    """
    return TASK_HIDDEN_WEIGHT if getattr(data, "objective", "task") == "task" else 0.0


def estimate_blockwise(student: nn.Module, teacher: nn.Module, batches: list[dict[str, Any]],
                       config: BlockwiseConfig, forwards: tuple[float, float] | None = None) -> TierEstimate:
    """Block-wise reconstruction: per layer ``config.steps`` timed layer steps, plus caching and walking up both models.
    ``forwards``: the student's and the teacher's inference forward on ``batches[0]``, timed already (else here).

    Example:
        >>> import copy
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2)).eval()
        >>> estimate_blockwise(model, copy.deepcopy(model), [tiny_inputs(TinySpec("bert"))], BlockwiseConfig()).steps
        400
    """
    per_layer = layer_step_seconds(student, batches[0], bf16=config.bf16)
    layers = len(per_layer) if config.layers is None else len(config.layers)
    step = sum(per_layer) / len(per_layer) * BLOCKWISE_OVERHEAD
    # Each model runs about twice per batch: one pass records the layer calls, the walk up is another.
    if forwards is None:
        forwards = (timed_forward(student, batches[0]), timed_forward(teacher, batches[0]))
    fixed = 2 * len(batches) * sum(forwards)
    steps = config.steps * layers
    return TierEstimate(tier="blockwise", seconds=round(step * steps + fixed, 3), step_seconds=step, steps=steps,
                        fixed_seconds=round(fixed, 3), bf16=config.bf16)


def distil_steps_that_fit(seconds: float, estimate: TierEstimate) -> int:
    """Optimiser steps of distillation that fit in ``seconds`` (0 when fewer than :data:`MIN_DISTIL_STEPS` do).

    Example:
        >>> e = TierEstimate(tier="distil", seconds=110.0, step_seconds=1.0, steps=100, fixed_seconds=10.0)
        >>> distil_steps_that_fit(60.0, e), distil_steps_that_fit(15.0, e), distil_steps_that_fit(1e9, e)
        (50, 0, 4000)
    """
    steps = math.floor((seconds - estimate.fixed_seconds) / estimate.step_seconds) if estimate.step_seconds > 0 else 0
    steps = min(steps, MAX_EPOCHS * estimate.steps)
    return steps if steps >= MIN_DISTIL_STEPS else 0


def distil(student: nn.Module, teacher: nn.Module, data: Any, *, epochs: int, batch_size: int, seed: int = 0,
           max_steps: int | None = None, bf16: bool = False, max_seconds: float | None = None,
           progress: ProgressCallback | None = None, micro_batch: int | None = None) -> RecoveryResult:
    """Distil the original into the cut model (surgery's recovery, HF Trainer, teacher's logits cached once).

    Where ``data`` has a labelled eval split, every epoch is measured on it: the run stops after
    :data:`PATIENCE` epochs below the best and keeps the best epoch's parameters. The training rows come
    with :func:`masked_copies_for` masked copies. ``max_seconds`` ends it at the first step past that much wall-clock
    time, whatever ``max_steps`` says. ``micro_batch``: the most rows one forward and backward takes (each step's
    gradients accumulated over equal micro-batches).
    """
    measured = has_eval_split(data)
    # Set only for a task: the embedding objective chooses its own weight where the caller set none.
    hidden = {"hidden_weight": weight} if (weight := task_hidden_weight(data)) > 0 else {}
    config = RecoveryConfig(epochs=epochs, batch_size=batch_size, seed=seed, max_steps=max_steps, bf16=bf16,
                            max_seconds=max_seconds, micro_batch=micro_batch,
                            keep_best=measured, patience=PATIENCE if measured else None,
                            masked_copies=masked_copies_for(data), **hidden)
    return recover(student, teacher, data, config, progress=progress)


def has_eval_split(data: Any) -> bool:
    """Whether ``data`` has an eval split whose accuracy a tier can measure (a task's labelled examples)."""
    return getattr(data, "objective", "task") == "task" and getattr(data, "eval", None) is not None


def dev_accuracy(model: nn.Module, data: Any) -> float | None:
    """Accuracy on ``data``'s eval split in PyTorch (None without one, or without labels)."""
    if not has_eval_split(data):
        return None
    return accuracy(model, data.loader("eval", batch_size=32))


def train_tiers(student: nn.Module, teacher: nn.Module, data: Any, seconds_left: float, *, batch_size: int,
                seed: int = 0, progress: ProgressCallback | None = None,
                order: tuple[str, ...] = TIER_ORDER, bf16: bool | None = None,
                micro_batch: int | None = None) -> dict[str, Any]:
    """Run the recovery tiers on ``student`` in place, in ``order``, each while the time left fits its estimate.

    Returns what compress.json records under ``training``: the precision, every tier's estimate, and
    for each tier that ran its estimated and actual seconds and the dev accuracy (PyTorch) before and after
    it; ``tiers_run`` lists them, ``note`` says why none ran. ``epochs`` and ``epoch_seconds_estimated``
    describe the distillation tier (0 epochs when it did not run).

    Memory and time are bounded before anything is trained: a tier whose floor (:func:`tier_floors`, from two
    inference forwards) does not fit the time left is not timed (its estimate says ``timed: false``), and
    distillation's forward and backward take at most ``micro_batch`` rows at once (default: those of the longest
    calibration batch that fit :data:`~surgery.compress.mask_fisher.BACKWARD_ACTIVATION_BYTES`,
    :func:`~surgery.compress.mask_fisher.rows_within`), each step's gradients accumulated over them.

    Example:
        >>> import copy
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> out = train_tiers(model, copy.deepcopy(model), tiny_task_data(8), 0.0, batch_size=4)
        >>> out["tiers_run"], out["note"].startswith("no recovery tier fits")
        ([], True)
    """
    # Timed and trained where the Trainer trains (the GPU where torch sees one), then handed back: a step timed on
    # the CPU while the Trainer then trains on a GPU priced the tiers many times over their cost.
    with moved_to(training_device(), student, teacher):
        return _train_tiers(student, teacher, data, seconds_left, batch_size=batch_size, seed=seed, progress=progress,
                            order=order, bf16=bf16, micro_batch=micro_batch)


def _train_tiers(student: nn.Module, teacher: nn.Module, data: Any, seconds_left: float, *, batch_size: int,
                 seed: int, progress: ProgressCallback | None, order: tuple[str, ...], bf16: bool | None,
                 micro_batch: int | None) -> dict[str, Any]:
    emit = progress or no_progress
    measuring = time.perf_counter()
    use_bf16 = bf16_training() if bf16 is None else bf16
    training: dict[str, Any] = {"bf16": use_bf16, "seconds_left": round(seconds_left, 1), "order": list(order),
                                "estimates": {}, "tiers": [], "tiers_run": [], "epochs": 0}
    if seconds_left <= 0:  # not even the forwards the floors need: at 512 tokens on BERT-base widths half a minute
        training["note"] = f"no recovery tier fits: the budget has no time left ({seconds_left:.0f} s)"
        return training
    blockwise_cfg = BlockwiseConfig(bf16=use_bf16, seed=seed)
    batches = task_calibration_batches(data, BLOCKWISE_BATCHES, batch_size=batch_size)
    if micro_batch is None:
        from surgery.compress.mask_fisher import rows_within

        micro_batch = rows_within(student, max(int(b["input_ids"].shape[1]) for b in batches))
    micro = micro_batch if micro_batch < batch_size else None
    training["micro_batch"] = micro
    forwards = (timed_forward(student, batches[0], bf16=use_bf16), timed_forward(teacher, batches[0], bf16=use_bf16))
    floors = tier_floors(data, batch_size, len(batches), *forwards, bf16=use_bf16,
                         each_step=teacher_each_step(student, teacher, data))
    estimates: dict[str, TierEstimate] = {}
    for tier in ("distil", "blockwise"):
        if tier not in order or floors[tier].seconds > seconds_left - (time.perf_counter() - measuring):
            estimates[tier] = floors[tier]
        elif tier == "distil":
            estimates[tier] = estimate_distil(student, teacher, data, batch_size, bf16=use_bf16, micro_batch=micro,
                                              teacher_forward=forwards[1])
        else:
            estimates[tier] = estimate_blockwise(student, teacher, batches, blockwise_cfg, forwards)
    training["estimates"] = {k: v.model_dump() for k, v in estimates.items()}
    training["epoch_seconds_estimated"] = round(estimates["distil"].step_seconds * estimates["distil"].steps, 2)
    left = seconds_left - (time.perf_counter() - measuring)  # the timed steps came out of the budget too
    current = None
    for index, tier in enumerate(order):
        estimate = estimates[tier]
        if not estimate.timed:
            continue
        if tier == "distil":
            steps = distil_steps_that_fit(left, estimate)
            if steps == 0:
                continue
            seconds = estimate.fixed_seconds + steps * estimate.step_seconds
        else:
            if estimate.seconds > left:
                continue
            steps, seconds = estimate.steps, estimate.seconds
        emit(ProgressEvent("compress: training tier", index, len(order),
                           {"tier": tier, "estimated_s": round(seconds, 3), "steps": steps,
                            "precision": "bf16" if use_bf16 else "fp32"}))
        if current is None:
            current = dev_accuracy(student, data)
        started = time.perf_counter()
        record: dict[str, Any] = {"tier": tier, "estimated_seconds": round(seconds, 2), "steps": steps,
                                  "accuracy_before": current}
        # The estimate sized the tier to the time left; the limit holds it there when the machine gets busier.
        limit = max(left, 0.0)
        if tier == "blockwise":
            result = reconstruct_layers(student, teacher, batches,
                                        blockwise_cfg.model_copy(update={"max_seconds": limit}), progress=emit)
            record.update(error=result.error, kept=result.kept, time_limit_reached=result.time_limit_reached)
        else:
            epochs = steps / estimate.steps
            run = distil(student, teacher, data, epochs=math.ceil(epochs), batch_size=batch_size, seed=seed,
                         max_steps=steps, bf16=use_bf16, max_seconds=limit, progress=emit, micro_batch=micro)
            # Per epoch: training accuracy against the eval split's (a gap says the data, not the steps, is short).
            curve = [{k: None if h.get(k) is None else round(float(h[k]), 4) for k in ("train_acc", "accuracy", "kd")}
                     for h in run.history]
            record.update(steps=run.steps, epochs_run=len(run.history), best_epoch=run.best_epoch,
                          stopped_early=run.stopped_early, curve=curve, hidden_weight=run.hidden_weight,
                          time_limit_reached=run.time_limit_reached)
            training["epochs"] = round(epochs, 3)
        record["seconds"] = round(time.perf_counter() - started, 2)
        current = dev_accuracy(student, data)
        record["accuracy_after"] = current
        left -= record["seconds"]
        training["tiers"].append(record)
        training["tiers_run"].append(tier)
    if not training["tiers_run"]:
        cheapest = min(estimates.values(), key=lambda e: e.seconds)
        at_least = "" if cheapest.timed else "at least "
        training["note"] = (f"no recovery tier fits: the cheapest ({cheapest.tier}) takes {at_least}about "
                            f"{cheapest.seconds:.0f} s and the budget has {max(seconds_left, 0):.0f} s left")
    return training
