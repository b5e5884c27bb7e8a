"""Side-by-side inference benchmarks: throughput, latency, parameters, FLOPs and peak memory.

Method (what :func:`bench_models` does, in this order):

1. **One process, same inputs.** Every model gets the same random batch: ``input_ids`` drawn
   uniformly from the vocabulary all models share (seeded) and an ``attention_mask`` of ones, so
   every sequence has the full length and no model can profit from padding. Or, at a serving shape
   (``batches``, :mod:`surgery.measure.serving`), batches of the user's own texts, each padded to its
   own longest: round ``r`` runs the ``r``-th batch on every model. Models run in eval mode
   under ``torch.inference_mode``; their previous train/eval mode is restored afterwards.
   The device is checked first (``cuda`` without a GPU, an unknown name) and so is ``seq_len``
   against each model's ``max_position_embeddings``: one-line errors, not tracebacks.
2. **Counting, outside the timed region.** Parameters come from :func:`surgery.count_params` (with
   and without embeddings). FLOPs per batch come from one forward under
   :class:`torch.utils.flop_counter.FlopCounterMode`, which counts matrix multiplications (one
   multiply-add = 2 FLOPs); torch has no formula for the CPU flash-attention kernel that SDPA picks,
   so one is added here (the same formula torch uses for the CUDA kernels). Element-wise work
   (softmax, GELU, LayerNorm) is not counted, as is usual.
3. **Peak memory, outside the timed region.** On CUDA: ``torch.cuda.max_memory_allocated`` during
   one forward. On CPU there is no allocator high-water mark, so one forward runs under
   ``torch.profiler`` with ``profile_memory=True`` and the allocator's alloc/free events are summed in
   time order; the maximum is the activation peak (the profiler's native ``USDT`` chatter on
   stderr is sent to ``/dev/null`` for that one forward). Both report ``weights_bytes + activation_peak_bytes``
   (parameters and buffers, plus the most tensor memory the forward held at once). It is tensor
   memory, not process RSS, which would mix every model in the process.
4. **Timing, interleaved.** ``warmup`` untimed rounds, then ``repeats`` rounds; each round runs one
   batch on every model, and the order rotates each round (A B C, B C A, ...), so drifting machine
   load and cache effects hit all models alike. Each batch is timed with ``time.perf_counter`` (with
   a CUDA synchronise on GPU). Throughput is the median over rounds of ``batch_size / latency``;
   latency p50/p95 are percentiles of the per-batch times (the figures of a small batch, at most
   :data:`SMALL_BATCH`, which ``surgery bench`` shows first; their ratios are ``p50_speedup`` and
   ``p95_speedup``).
5. **Ratios against the first model** (the reference): speedup (ratio of median throughputs), the
   paired speedup (median and quartiles of the same-round throughput ratios, which cancels most
   load from other processes), parameter and FLOP ratios, the FLOP-bound speedup
   ``reference FLOPs / model FLOPs`` and the fraction of it that was realised. The paired speedup
   gets a 95% percentile-bootstrap interval over rounds (:mod:`surgery.measure.stats`).
6. **Warnings as data**: a model that is smaller (parameters or FLOPs) but not faster, timings that
   vary a lot between rounds, a machine whose load exceeds its CPU count, and a paired speedup whose
   interval is wider than +-5% (with the rounds likely to narrow it).

Steps 1, 4 and the paired ratios of 5 are :func:`surgery.measure.timing.time_models`, the one routine
that times models side by side: ``bench_models`` adds the counts of steps 2-3 around it, and everything
else that times a model (``surgery compress``'s latency table and speedups, the job estimate) calls it
alone, so all time the same way.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.core.errors import ConfigError
from surgery.core.report import ParamCount
from surgery.core.run import count_params
from surgery.measure.flops import count_flops
from surgery.measure.machine import MachineInfo
from surgery.measure.memory import memory_use
from surgery.measure.serving import LengthSummary
from surgery.measure.stats import Interval, bootstrap_median, interval_warning, paired_ratios
from surgery.measure.timing import (
    batch_length,
    check_device,
    check_seq_len,
    make_inputs,
    shared_vocab,
    time_models,
    torch_threads,
)
from surgery.persist.atomic import atomic_write

#: A model counts as "smaller" when it has at most this fraction of the reference's parameters or FLOPs.
SMALLER_BELOW = 0.95
#: ... and as "not faster" when its speedup is below ``1 + NOT_FASTER_MARGIN``.
NOT_FASTER_MARGIN = 0.05
#: Relative spread (interquartile range / median) of per-round throughput above which timings are noisy.
NOISY_SPREAD = 0.15
#: A batch of at most this many sequences is an online service's: its latency per batch (p50, p95) is the figure.
SMALL_BATCH = 8


class BenchSettings(BaseModel):
    """How a benchmark was run, and on what."""

    batch_size: int
    seq_len: int
    repeats: int
    warmup: int
    device: str
    threads: int
    seed: int
    torch_version: str
    cpu_count: int | None
    machine: str
    load_average_before: float | None = None
    load_average_after: float | None = None
    lengths: str = Field(default="fixed", description="fixed: every sequence seq_len tokens; data: texts drawn from "
                         "the data, each batch padded to its own longest (seq_len is then the longest batch)")
    length_summary: LengthSummary | None = Field(default=None, description="data: the timed batches' lengths")

    @property
    def small_batch(self) -> bool:
        """Whether latency per batch (p50/p95), not throughput, is the figure a service of this shape reads."""
        return self.batch_size <= SMALL_BATCH


class ModelBench(BaseModel):
    """Measurements of one model."""

    name: str
    model_class: str
    runtime: str = Field(default="torch", description="torch, or onnxruntime for an exported graph")
    attention: str | None = Field(default=None, description="config._attn_implementation (eager, sdpa ...)")
    params: ParamCount
    flops_per_batch: int
    throughput: float = Field(description="samples/s, median over rounds")
    throughput_rounds: list[float] = Field(description="samples/s of each timed round")
    latency_p50_ms: float
    latency_p95_ms: float
    weights_bytes: int
    activation_peak_bytes: int | None
    peak_memory_bytes: int | None
    memory_method: str
    accuracy: float | None = Field(default=None, description="accuracy on labelled data, when given")

    @property
    def throughput_spread(self) -> float:
        """Interquartile range of per-round throughput relative to its median (0 = perfectly stable)."""
        return _spread(self.throughput_rounds)


class Comparison(BaseModel):
    """One model against the reference (the first model)."""

    name: str
    reference: str
    speedup: float = Field(description="throughput / reference throughput (ratio of the medians)")
    paired_speedup: float = Field(description="median over rounds of the same-round throughput ratio")
    paired_speedup_iqr: tuple[float, float] = Field(description="quartiles (25%, 75%) of the same-round ratios")
    paired_speedup_ci: tuple[float, float] | None = Field(
        default=None, description="95% bootstrap confidence interval of the paired speedup (surgery.measure.stats)")
    p50_speedup: float | None = Field(default=None, description="reference p50 latency / p50 latency")
    p95_speedup: float | None = Field(default=None, description="reference p95 latency / p95 latency")
    params_ratio: float = Field(description="total parameters / reference")
    params_ratio_without_embeddings: float
    flops_ratio: float = Field(description="FLOPs per batch / reference")
    flop_bound_speedup: float = Field(description="reference FLOPs / FLOPs: the speedup if time followed FLOPs")
    fraction_of_flop_bound: float = Field(description="speedup / flop_bound_speedup")
    memory_ratio: float | None = None


class BenchReport(BaseModel):
    """Result of :func:`bench_models`: settings, per-model measurements, ratios and warnings."""

    settings: BenchSettings
    models: list[ModelBench]
    comparisons: list[Comparison]
    warnings: list[str]
    machine: MachineInfo | None = Field(default=None, description="the CPU (model, int8-relevant flags), library "
                                        "versions and threads it ran on; None in reports written before it was kept")

    def model(self, name: str) -> ModelBench:
        """The measurements of the model called ``name``."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def write_json(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the report as indented JSON to ``path`` atomically (parent directories are created).

        An existing file is replaced only with ``overwrite``.
        """
        return atomic_write(path, json.dumps(self.model_dump(mode="json"), indent=2) + "\n", overwrite=overwrite)


# -- warnings -----------------------------------------------------------------------------------
def not_faster_warning(comparison: Comparison) -> str | None:
    """A warning when a model is smaller than the reference but not faster, else ``None``.

    "Smaller" means at most 95% of the reference's parameters or FLOPs; "not faster" means a speedup
    below 1.05x by both estimates, the ratio of medians and the paired one (timing noise on a shared
    machine easily reaches a few percent).

    Example:
        >>> c = Comparison(name="pruned", reference="base", speedup=0.98, paired_speedup=0.99,
        ...                paired_speedup_iqr=(0.97, 1.01), params_ratio=0.6, params_ratio_without_embeddings=0.5,
        ...                flops_ratio=0.55, flop_bound_speedup=1 / 0.55, fraction_of_flop_bound=0.98 * 0.55)
        >>> not_faster_warning(c)
        'pruned has 40% fewer parameters and 45% fewer FLOPs than base but is not faster (speedup 0.98x, paired 0.99x)'
    """
    fewer = []
    if comparison.params_ratio <= SMALLER_BELOW:
        fewer.append(f"{1 - comparison.params_ratio:.0%} fewer parameters")
    if comparison.flops_ratio <= SMALLER_BELOW:
        fewer.append(f"{1 - comparison.flops_ratio:.0%} fewer FLOPs")
    if not fewer or max(comparison.speedup, comparison.paired_speedup) >= 1 + NOT_FASTER_MARGIN:
        return None
    return (f"{comparison.name} has {' and '.join(fewer)} than {comparison.reference} but is not faster "
            f"(speedup {comparison.speedup:.2f}x, paired {comparison.paired_speedup:.2f}x)")


def paired_interval(comparison: Comparison, rounds: int) -> Interval:
    """The paired speedup of ``comparison`` with its bootstrap interval (:class:`surgery.measure.stats.Interval`)."""
    low, high = comparison.paired_speedup_ci or (comparison.paired_speedup,) * 2
    return Interval(estimate=comparison.paired_speedup, low=low, high=high, level=0.95, rounds=rounds)


def noise_warning(bench: ModelBench) -> str | None:
    """A warning when a model's per-round throughput varies by more than 15% (IQR / median)."""
    spread = bench.throughput_spread
    if spread <= NOISY_SPREAD:
        return None
    return (f"timings of {bench.name} vary by {spread:.0%} between rounds (IQR/median); the machine is busy or "
            "repeats are too few, so read its ratios with care")


def load_warning(settings: BenchSettings) -> str | None:
    """A warning when the machine's 1-minute load average exceeded its CPU count during the run."""
    loads = [x for x in (settings.load_average_before, settings.load_average_after) if x is not None]
    if not loads or not settings.cpu_count or max(loads) <= settings.cpu_count:
        return None
    return (f"load average reached {max(loads):.1f} on {settings.cpu_count} CPUs: other processes competed for the "
            "CPU; interleaving spreads that over all models, but absolute throughput is lower than on an idle machine")


# -- measuring ----------------------------------------------------------------------------------
def _spread(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    median = statistics.median(values)
    return (q3 - q1) / median if median else 0.0


def _counts(model: nn.Module, inputs: Mapping[str, torch.Tensor], device: torch.device) -> tuple[Any, ...]:
    # A model whose weights live outside torch (an ONNX Runtime graph) reports its own counts.
    own = getattr(model, "bench_counts", None)
    if callable(own):
        return own(inputs)
    return (count_params(model), count_flops(model, inputs), *memory_use(model, inputs, device))


def _compare(model: ModelBench, ref: ModelBench) -> Comparison:
    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    flops_ratio = ratio(model.flops_per_batch, ref.flops_per_batch)
    bound = ratio(ref.flops_per_batch, model.flops_per_batch)
    speedup = ratio(model.throughput, ref.throughput)
    paired = paired_ratios(ref.throughput_rounds, model.throughput_rounds, per_second=True)
    q1, _, q3 = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else (paired[0],) * 3
    interval = bootstrap_median(paired)
    memory = (ratio(model.peak_memory_bytes, ref.peak_memory_bytes)
              if model.peak_memory_bytes is not None and ref.peak_memory_bytes is not None else None)
    return Comparison(
        name=model.name,
        reference=ref.name,
        speedup=speedup,
        paired_speedup=statistics.median(paired),
        paired_speedup_iqr=(q1, q3),
        paired_speedup_ci=(interval.low, interval.high),
        p50_speedup=ratio(ref.latency_p50_ms, model.latency_p50_ms),
        p95_speedup=ratio(ref.latency_p95_ms, model.latency_p95_ms),
        params_ratio=ratio(model.params.total, ref.params.total),
        params_ratio_without_embeddings=ratio(model.params.without_embeddings, ref.params.without_embeddings),
        flops_ratio=flops_ratio,
        flop_bound_speedup=bound,
        fraction_of_flop_bound=ratio(speedup, bound),
        memory_ratio=memory,
    )


def bench_models(
    models: Mapping[str, nn.Module],
    *,
    batch_size: int = 32,
    seq_len: int = 64,
    repeats: int = 10,
    warmup: int = 2,
    device: str = "cpu",
    threads: int | None = None,
    seed: int = 0,
    batches: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> BenchReport:
    """Benchmark ``models`` side by side in this process and compare each with the first one.

    See the module docstring for the method. Models are moved to ``device`` and put in eval mode
    while measured (their previous mode is restored afterwards; the device is not).

    Args:
        models: name -> Hugging Face encoder; the first entry is the reference for all ratios.
        batch_size: sequences per batch.
        seq_len: tokens per sequence (all real tokens, no padding).
        repeats: timed rounds; each round runs one batch on every model.
        warmup: untimed rounds before them.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        threads: torch intra-op threads during the benchmark (default: leave as is).
        seed: seed of the random input ids.
        batches: the batches to time on instead of one random full-length batch: texts drawn from the
            user's data, each padded to its own longest (:func:`surgery.measure.serving.serving_batches`);
            round ``r`` runs ``batches[r % len(batches)]``. FLOPs and memory are counted on the batch of
            median length, and ``seq_len`` is read off the batches (their longest).

    Returns:
        A :class:`BenchReport` with settings, per-model measurements, comparisons and warnings.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.strategies import FFNPruningStrategy
        >>> import surgery
        >>> base, pruned = tiny_model(TinySpec("bert")), tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(pruned, FFNPruningStrategy(neurons={0: list(range(30))}))
        >>> report = bench_models({"base": base, "pruned": pruned}, batch_size=2, seq_len=8, repeats=3, warmup=1)
        >>> report.comparisons[0].flops_ratio < 1
        True
    """
    if batches is not None:
        if not batches:
            raise ConfigError("bench: batches is empty; pass at least one batch (or none for a random one)")
        seq_len = max(batch_length(b) for b in batches)
    check_rounds(models, batch_size=batch_size, seq_len=seq_len, repeats=repeats, warmup=warmup, what="bench")
    if threads is not None and threads < 1:
        raise ConfigError(f"bench: threads must be at least 1, got {threads}")
    dev = check_device(device)
    check_seq_len(models, seq_len)
    modes = {name: m.training for name, m in models.items()}
    try:
        with torch_threads(threads):
            for model in models.values():
                model.to(dev).eval()
            timed = list(batches) if batches is not None else [
                make_inputs(shared_vocab(models), batch_size=batch_size, seq_len=seq_len, seed=seed)]
            middle = sorted(timed, key=batch_length)[len(timed) // 2]
            inputs = {k: v.to(dev) for k, v in middle.items()}
            counted = {name: _counts(m, inputs, dev) for name, m in models.items()}
    finally:
        for name, model in models.items():
            model.train(modes[name])
    timing = time_models(models, timed, repeats=repeats, warmup=warmup, device=dev, threads=threads)
    times = timing.seconds
    settings = BenchSettings(
        batch_size=batch_size, seq_len=seq_len, repeats=repeats, warmup=warmup, device=str(dev),
        threads=timing.threads, seed=seed, torch_version=torch.__version__, cpu_count=os.cpu_count(),
        machine=f"{platform.system()} {platform.machine()}"
        + (f", {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else ""),
        load_average_before=timing.load_average[0], load_average_after=timing.load_average[1],
        lengths="fixed" if batches is None else "data",
        length_summary=None if batches is None else LengthSummary.of(timed),
    )
    benches = []
    for name, (params, flops, weights, act_peak, peak, method) in counted.items():
        rounds = [shape[0] / t for shape, t in zip(timing.batch_shapes, times[name], strict=True)]
        config = getattr(models[name], "config", None)
        benches.append(ModelBench(
            name=name, model_class=type(models[name]).__name__, runtime=getattr(models[name], "runtime", "torch"),
            attention=getattr(config, "_attn_implementation", None), params=params, flops_per_batch=flops,
            throughput=statistics.median(rounds), throughput_rounds=rounds,
            latency_p50_ms=timing.latency_ms(name, 50), latency_p95_ms=timing.latency_ms(name, 95),
            weights_bytes=weights, activation_peak_bytes=act_peak, peak_memory_bytes=peak, memory_method=method,
        ))
    comparisons = [_compare(b, benches[0]) for b in benches[1:]]
    warnings = [w for w in [load_warning(settings), *(noise_warning(b) for b in benches),
                            *(not_faster_warning(c) for c in comparisons),
                            *(interval_warning(c.name, paired_interval(c, settings.repeats)) for c in comparisons)]
                if w]
    return BenchReport(settings=settings, models=benches, comparisons=comparisons, warnings=warnings,
                       machine=timing.machine)


def check_rounds(models: Mapping[str, Any], *, batch_size: int, seq_len: int, repeats: int, warmup: int,
                 what: str) -> None:
    """Refuse, in one line beginning with ``what``, no models or a batch shape or round count below its least.

    Example:
        >>> check_rounds({"a": None}, batch_size=2, seq_len=8, repeats=0, warmup=0, what="timing")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: timing: repeats must be at least 1, got 0
    """
    if not models:
        raise ConfigError(f"{what}: pass at least one model")
    for field, value, least in (("batch_size", batch_size, 1), ("seq_len", seq_len, 1), ("repeats", repeats, 1),
                                ("warmup", warmup, 0)):
        if value < least:
            raise ConfigError(f"{what}: {field} must be at least {least}, got {value}")


def model_names(paths: Sequence[str | os.PathLike[str]], names: Sequence[str] | None = None) -> list[str]:
    """Display names of the models at ``paths``, checked to be one per path and distinct."""
    labels = [str(p) for p in paths] if names is None else list(names)
    if len(labels) != len(paths):
        raise ConfigError(f"bench: got {len(paths)} paths but {len(labels)} names; give one name per path")
    if len(set(labels)) != len(labels):
        raise ConfigError(f"bench: model names must be distinct, got {labels}")
    return labels


def bench_dirs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    names: Sequence[str] | None = None,
    model_class: str | None = None,
    allow_pickle: bool = False,
    **kwargs: Any,
) -> BenchReport:
    """Load saved models (directories or embedded names like ``"minilm-l6"``) and bench them side by side.

    Args:
        paths: model directories; the first is the reference.
        names: display names (default: the paths as given).
        model_class: transformers class name for every model (default: as each directory records).
        allow_pickle: see :func:`surgery.from_pretrained`.
        **kwargs: passed to :func:`bench_models` (``batch_size``, ``seq_len``, ``repeats`` ...).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> out = surgery.save_pretrained(tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()) / "m")
        >>> bench_dirs([out], names=["tiny"], batch_size=2, seq_len=8, repeats=2, warmup=0).models[0].name
        'tiny'
    """
    labels = model_names(paths, names)
    if "device" in kwargs:
        check_device(kwargs["device"])  # before minutes of loading
    return bench_models(load_dirs(paths, labels, model_class=model_class, allow_pickle=allow_pickle), **kwargs)


def load_dirs(paths: Sequence[str | os.PathLike[str]], names: Sequence[str] | None = None, *,
              model_class: str | None = None, allow_pickle: bool = False) -> dict[str, nn.Module]:
    """The models at ``paths`` by name (:func:`model_names`), loaded by :func:`surgery.from_pretrained`."""
    from surgery.persist.model_io import from_pretrained

    return {label: from_pretrained(path, model_class=model_class, allow_pickle=allow_pickle)
            for label, path in zip(model_names(paths, names), paths, strict=True)}
