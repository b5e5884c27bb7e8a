"""Measuring a latency table on the user's runtime, batch shape and threads; timing a result side by side.

Method (what :func:`measure_latency_table` does):

1. **Probe models.** From the user's own model (same class, so the embeddings, pooler and task head
   are the real ones) build small encoders that share its non-layer weights and hold ``probe_layers``
   (``k``) copies of its widest layer (the template: H heads, FFN width W), cut by the anatomy adapter:

   * ``base`` and ``fewest``: one and ``k`` layers of one head and FFN width 0, whose difference
     gives ``base``, everything outside the layers (not zero layers: DeBERTa-v2's encoder cannot run
     without one);
   * ``heads h``: the first ``h`` heads and the full FFN, for ``h`` in a grid (1, H/4, H/2, 3H/4, H);
   * ``width w``: all heads and FFN width ``w``, for ``w`` in a grid (0, W/8, W/4, W/2, 3W/4);
   * ``heads h width w``: both cut, pairing the smaller grid points in order (1 with W/8, H/4 with
     W/4, ...), so small layers are measured as small layers;
   * ``odd width w``: all heads and a width just above a multiple of 64 (W/8 - 63, W/2 - 63): matrix
     kernels work in blocks, and a width of 154 took as long as 192 on MiniLM in PyTorch;
   * ``model``: the user's model itself.

   Each dimension is cut with the other one full, as a search cuts a full model: measured that
   way, attention and FFN costs include what they cost beside each other (cache traffic, the
   attention kernel's fixed work), which probes of attention alone got wrong by 5-8% on MiniLM.
   Several identical layers per probe raise the per-layer signal over the fixed cost. For an ONNX
   runtime every probe is written and loaded by the runtime (int8 calibrated on random tokens) and
   timed with the same threads.
2. **Timing, interleaved.** :func:`surgery.measure.timing.time_models` runs every probe once per round, in an
   order that rotates round by round. A probe shorter than :data:`MIN_TIMED_SECONDS` runs several
   times in a row per round: on a busy machine a short run either escapes other processes or waits a
   whole scheduler slice, so its time would not scale with load as the model's does. Other processes
   slow whole rounds down, so each probe's time is read off a two-way median polish of the log times
   (probe level + round level): a round that load slowed by 30% is recognised by all its probes
   together and counts as the typical round.
3. **Solving.** Every probe is ``base + k * (layer(h) + ffn(w))``: a least-squares fit over all
   probes (:func:`fit_additive`, relative errors) gives ``base``, the layer without FFN at each grid
   head count and ``ffn`` at each grid width, each resting on several probes; it is solved with the
   odd widths rounded up to each block size of :data:`FFN_STEPS`, and the best fit's block becomes
   the table's ``ffn_step``. The layer without FFN
   is split by a straight line over ``h`` whose intercept is ``overhead`` (what a layer costs
   whatever its width; attention at 0 heads is 0 by definition). Finally every per-layer number is
   scaled so that the table predicts the user's model exactly (``measured['scale']``, 1 when layers
   add up perfectly): probes fix the shape, the model the level.

The table is cached (:mod:`surgery.compress.latency_cache`). :func:`measured_speedups` times results
against the original side by side through :func:`surgery.measure.timing.time_models`, the routine
``surgery bench`` times with.
"""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from surgery.anatomy import adapter_for
from surgery.compress.latency_cache import (
    CHECK_REPEATS,
    CHECK_TOLERANCE,
    cache_path,
    default_cache_dir,
    model_key,
    model_shape,
    read_cached,
    try_write_cached,
)
from surgery.compress.latency_table import FallbackCosts, LatencyTable, round_up
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError, SurgeryError
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.measure.machine import machine_info
from surgery.measure.serving import LengthSummary
from surgery.measure.stats import Interval
from surgery.measure.timing import (
    Batch,
    Timing,
    batch_length,
    check_seq_len,
    load_average,
    make_inputs,
    shared_vocab,
    time_models,
    torch_threads,
)
from surgery.runtimes.shared.alignment import padded

if TYPE_CHECKING:
    from surgery.runtimes import Runtime

#: Fractions of the template layer's heads (0 stands for one head, the fewest a kept layer has; the
#: solver needs it and the full count).
HEAD_FRACTIONS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Fractions of the template layer's FFN width (width 0 has a probe of its own).
WIDTH_FRACTIONS: tuple[float, ...] = (0.125, 0.25, 0.5, 0.75, 1.0)
#: FFN block sizes the fit tries: a width costs as much as the next multiple (1: exactly its own).
FFN_STEPS: tuple[int, ...] = (1, 16, 32, 64)
PROBE_LAYERS = 2
REPEATS = 7
WARMUP = 1
#: A timed unit at least this long: short probes run back to back this many times over.
MIN_TIMED_SECONDS = 0.05
#: Random-token calibration for the smoothed int8 probes: smoothing changes no timing, only scales.
PROBE_CALIBRATION_BATCH = 8


@dataclass(frozen=True)
class Probe:
    """One probe model: ``layers`` copies of the template layer cut to ``heads`` and ``ffn_width``."""

    name: str
    layers: int
    heads: int
    ffn_width: int


def grid(full: int, fractions: Sequence[float]) -> list[int]:
    """Sizes at ``fractions`` of ``full`` (rounded, at least 1, at most ``full``), sorted and distinct.

    Example:
        >>> grid(12, HEAD_FRACTIONS), grid(1536, WIDTH_FRACTIONS), grid(4, HEAD_FRACTIONS)
        ([1, 3, 6, 9, 12], [192, 384, 768, 1152, 1536], [1, 2, 3, 4])
    """
    return sorted({min(full, max(1, round(full * f))) for f in fractions})


def probes(heads: int, width: int, layers: int, floor: int = 0) -> list[Probe]:
    """The probes for a template layer of ``heads`` heads and FFN ``width`` (see the module doc).

    ``floor`` is the narrowest FFN a probe has (1 for a runtime that cannot run an FFN of width 0:
    OpenVINO's zero-sized products return an empty output), for the base and width-0 probes.

    Example:
        >>> [(p.name, p.layers, p.heads, p.ffn_width) for p in probes(4, 8, 2)][:3]
        [('base', 1, 1, 0), ('fewest', 2, 1, 0), ('heads 1', 2, 1, 8)]
        >>> [p.name for p in probes(4, 8, 2)][3:]  # doctest: +NORMALIZE_WHITESPACE
        ['heads 2', 'heads 3', 'heads 4', 'width 0', 'width 1', 'width 2', 'width 4', 'width 6',
         'heads 1 width 1', 'heads 2 width 2', 'heads 3 width 4']
    """
    widths = [w for w in grid(width, WIDTH_FRACTIONS) if w < width] if width else []
    fewer = [h for h in grid(heads, HEAD_FRACTIONS) if h < heads]
    return [Probe("base", 1, 1, floor), Probe("fewest", layers, 1, floor),
            *(Probe(f"heads {h}", layers, h, width) for h in grid(heads, HEAD_FRACTIONS)),
            *(Probe(f"width {w}", layers, heads, w) for w in (dict.fromkeys([floor, *widths]) if width else [])),
            *(Probe(f"heads {h} width {w}", layers, h, w) for h, w in zip(fewer, widths, strict=False)),
            *(Probe(f"odd width {w - max(FFN_STEPS) + 1}", layers, heads, w - max(FFN_STEPS) + 1)
              for w in widths[::2] if w > max(FFN_STEPS))]


def template_layer(model: nn.Module) -> int:
    """The index of the layer with the most heads (then the widest FFN, then the lowest index).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.anatomy import adapter_for
        >>> model = tiny_model(TinySpec("bert", layers=3))
        >>> adapter_for(model).keep_heads(0, [0])
        >>> template_layer(model)
        1
    """
    shapes = Structure.from_model(model).kept
    return max(range(len(shapes)), key=lambda i: (shapes[i].heads, shapes[i].ffn_width, -i))


def build_probe(model: nn.Module, probe: Probe, template: int) -> nn.Module:
    """A copy of ``model`` whose layers are ``probe.layers`` copies of layer ``template``, cut to the probe.

    Everything outside the layers (embeddings, pooler, task head) shares the model's tensors, so a
    probe of a large model costs the memory of its few layers only; the model is not changed.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=3))
        >>> probe = build_probe(model, Probe("heads 1", 2, 1, 0), template=0)
        >>> Structure.from_model(probe).to_json(), len(model.encoder.layer)
        ([{'heads': 1, 'ffn_width': 0}, {'heads': 1, 'ffn_width': 0}], 3)
        >>> probe.embeddings.word_embeddings.weight is model.embeddings.word_embeddings.weight
        True
    """
    layers = adapter_for(model).layers()
    inside = {id(t) for t in chain(layers.parameters(), layers.buffers())}
    memo: dict[int, Any] = {id(t): t for t in chain(model.parameters(), model.buffers()) if id(t) not in inside}
    memo.update({id(layer): nn.Identity() for layer in layers})  # placeholders, dropped below
    shell = copy.deepcopy(model, memo)
    adapter = adapter_for(shell)
    kept = adapter.layers()
    del kept[:]
    for _ in range(probe.layers):
        kept.append(copy.deepcopy(layers[template]))
    for index in range(probe.layers):
        adapter.keep_heads(index, range(probe.heads))
        adapter.keep_neurons(index, range(probe.ffn_width))
    return shell.eval()


def _width_weights(width: int, grid_widths: Sequence[int]) -> dict[int, float]:
    """How a width's FFN time mixes the grid's (the table's linear interpolation, 0 at width 0)."""
    if width <= 0:
        return {}
    if width in grid_widths:
        return {width: 1.0}
    points = [0, *grid_widths]
    upper = next((i for i, w in enumerate(points) if w > width), len(points) - 1)
    lo, hi = points[upper - 1], points[upper]
    t = (width - lo) / (hi - lo)
    return {k: v for k, v in ((lo, 1.0 - t), (hi, t)) if k > 0}


def fit_additive(seconds: Mapping[str, float], probe_list: Sequence[Probe], ffn_step: int = 1
                 ) -> tuple[float, dict[int, float], dict[int, float], float]:
    """Least-squares fit of ``probe = base + layers * (layer(heads) + ffn(width))`` to the probes' times.

    Returns milliseconds: ``base``, a layer at each grid head count without its FFN (overhead and
    attention together), the FFN at each grid width (width 0 costs nothing), and the fit's root mean
    square relative error. Every probe informs the numbers of its own head count and width, so each
    number rests on several probes and the timing noise of one probe spreads thin; errors are
    relative (weights ``1 / time``), so short and long probes count alike. A width off the grid
    (``odd`` probes) counts as the next multiple of ``ffn_step``, interpolated between grid widths as
    the table does. Negative solutions (noise at tiny sizes) are clipped to 0.

    Example:
        >>> plan = [p for p in probes(2, 4, 2) if not p.name.startswith("odd")]
        >>> exact = {p.name: 0.001 * (3 + p.layers * (1 + p.heads + 0.5 * p.ffn_width)) for p in plan}
        >>> base, layer_heads, ffn, error = fit_additive(exact, plan)
        >>> round(base, 6), {h: round(t, 6) for h, t in layer_heads.items()}, {w: round(t, 6) for w, t in ffn.items()}
        (3.0, {1: 2.0, 2: 3.0}, {1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0})
    """
    heads = sorted({p.heads for p in probe_list})
    widths = sorted({p.ffn_width for p in probe_list if p.ffn_width > 0 and not p.name.startswith("odd")})
    columns = 1 + len(heads) + len(widths)
    rows, targets = [], []
    for p in probe_list:
        row = [0.0] * columns
        row[0] = 1.0
        row[1 + heads.index(p.heads)] = float(p.layers)
        for width, share in _width_weights(round_up(p.ffn_width, ffn_step), widths).items():
            row[1 + len(heads) + widths.index(width)] = p.layers * share
        weight = 1.0 / seconds[p.name]
        rows.append([v * weight for v in row])
        targets.append(seconds[p.name] * 1000 * weight)
    matrix, target = torch.tensor(rows, dtype=torch.float64), torch.tensor(targets, dtype=torch.float64)[:, None]
    solution = torch.linalg.lstsq(matrix, target).solution
    error = float(((matrix @ solution - target) / 1000).pow(2).mean().sqrt())
    clipped = [max(0.0, v) for v in solution[:, 0].tolist()]
    return (clipped[0], dict(zip(heads, clipped[1:1 + len(heads)], strict=True)),
            dict(zip(widths, clipped[1 + len(heads):], strict=True)), error)


def solve_table(seconds: Mapping[str, float], probe_list: Sequence[Probe], structure: Structure, **fields: Any
                ) -> LatencyTable:
    """The :class:`LatencyTable` from the probes' steady times (seconds) and the model's (``"model"``).

    ``fields`` are the table's descriptive fields (runtime, batch shape, threads, model key, machine,
    measured); ``measured`` gains the probes' milliseconds, the layer scale and the model's
    prediction before it.
    """
    # The FFN block size that explains the odd-width probes best (1: none; ties go to the smaller).
    fits = {step: fit_additive(seconds, probe_list, step) for step in FFN_STEPS}
    ffn_step = min(fits, key=lambda step: (round(fits[step][3], 4), step))
    base, layer_heads, ffn, _ = fits[ffn_step]
    sizes = sorted(layer_heads)
    intercept = statistics.linear_regression(sizes, [layer_heads[h] for h in sizes])[1] if len(sizes) > 1 else 0.0
    overhead = min(max(intercept, 0.0), min(layer_heads.values()))
    attention = {h: t - overhead for h, t in layer_heads.items()}
    measured = dict(fields.pop("measured", {}))
    raw = LatencyTable(base_ms=base, overhead_ms=overhead, attention_ms=attention, ffn_ms=ffn or {0: 0.0},
                       ffn_step=ffn_step, measured=measured, **fields)
    predicted = raw.predict_ms(structure)
    model_ms = seconds["model"] * 1000
    # Probes fix the table's shape, the user's model its level (see the module doc, step 3).
    scale = (model_ms - raw.base_ms) / (predicted - raw.base_ms) if predicted > raw.base_ms and model_ms > \
        raw.base_ms else 1.0
    measured.update({"probes_ms": {name: t * 1000 for name, t in seconds.items()}, "scale": scale,
                     "fit_error_by_ffn_step": {step: fit[3] for step, fit in fits.items()},
                     "model_ms": model_ms, "model_predicted_ms_before_scale": predicted})
    return raw.model_copy(update={
        "overhead_ms": raw.overhead_ms * scale,
        "attention_ms": {h: t * scale for h, t in raw.attention_ms.items()},
        "ffn_ms": {w: t * scale for w, t in raw.ffn_ms.items()},
        "measured": measured,
    })


def resolve_runtime(name: str | Runtime, what: str = "latency") -> Runtime:
    """The registered runtime called ``name`` (:mod:`surgery.runtimes`), refused in one line when unknown or
    unavailable on this machine; a :class:`~surgery.runtimes.Runtime` already resolved is returned as it is.

    Example:
        >>> resolve_runtime("torch").name
        'torch'
        >>> torch_runtime = resolve_runtime("torch")
        >>> resolve_runtime(torch_runtime) is torch_runtime
        True
        >>> resolve_runtime("tensorrt-doc")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: latency: runtime 'tensorrt-doc' is not one of torch, torch-bf16, ...
    """
    from surgery.runtimes import Runtime, get_runtime

    if isinstance(name, Runtime):
        return name
    try:
        return get_runtime(name)
    except SurgeryError as exc:  # ConfigError or MissingDependencyError: keep its class, say who asked
        raise type(exc)(f"{what}: {exc}") from None


def probe_calibration_batches(model: nn.Module, seq_len: int) -> list[dict[str, torch.Tensor]]:
    """Random-token batches for calibrating int8 graphs whose speed, not accuracy, is wanted.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> [tuple(b["input_ids"].shape) for b in probe_calibration_batches(tiny_model(TinySpec("bert")), 16)]
        [(8, 16)]
    """
    return [make_inputs(int(model.config.vocab_size), batch_size=PROBE_CALIBRATION_BATCH, seq_len=seq_len, seed=1)]


def timing_batches(vocab_size: int, *, batch_size: int, seq_len: int, batches: Sequence[Batch] | None = None
                   ) -> list[Batch]:
    """What a latency measurement times on: ``batches`` (texts drawn from the data at a serving shape,
    :func:`surgery.measure.serving.serving_batches`), or one random full-length ``batch_size`` x ``seq_len`` batch.

    Example:
        >>> [tuple(b["input_ids"].shape) for b in timing_batches(99, batch_size=2, seq_len=8)]
        [(2, 8)]
    """
    return list(batches) if batches else [make_inputs(vocab_size, batch_size=batch_size, seq_len=seq_len)]


def shape_fields(batches: Sequence[Batch] | None) -> dict[str, Any]:
    """The length policy of ``batches`` and their lengths' summary, as a table and its cache key record them
    (nothing for one random full-length batch, so that keys of tables measured so keep matching).

    Example:
        >>> shape_fields(None)
        {}
        >>> shape_fields([make_inputs(99, batch_size=1, seq_len=5)])["lengths"]
        'data'
    """
    if not batches:
        return {}
    return {"lengths": "data", "length_summary": LengthSummary.of(batches).model_dump(mode="json")}


def runtime_model(model: nn.Module, runtime: str | Runtime, work_dir: Path, *, threads: int | None,
                  calibration: Sequence[Mapping[str, torch.Tensor]] | None = None, task: str = "auto") -> nn.Module:
    """``model`` as it runs in ``runtime`` (a name, or the runtime resolved): :meth:`surgery.runtimes.Runtime.prepare`
    (its artefact, loaded).

    An int8 runtime calibrates on ``calibration`` (random tokens when not given: a probe's speed does
    not depend on its scales); ``torch-bf16`` gives a bf16 copy; ``torch`` the fp32 model.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> runtime_model(model, "torch", Path("unused"), threads=1).config is model.config
        True
    """
    served = resolve_runtime(runtime)
    if served.needs_calibration and not calibration:
        calibration = probe_calibration_batches(model, 16)
    return served.prepare(model, work_dir, task=task, calibration=calibration if served.needs_calibration else None,
                          threads=threads)


def cache_disagreement(table: LatencyTable, model: nn.Module, *, runtime: str, batch_size: int, seq_len: int,
                       threads: int | None, repeats: int = CHECK_REPEATS, batches: Sequence[Batch] | None = None,
                       served: nn.Module | None = None, pad_to_multiple_of: int | None = None) -> str | None:
    """Why a cached table may not be used for ``model`` here: its prediction is off the model's own time.

    The model is timed in ``runtime`` at the table's batch shape (``batches``: the table's drawn batches) (a
    few rounds, one export for an ONNX
    runtime: far less than measuring a table) and compared with what the table predicts for it; more
    than ``1 + CHECK_TOLERANCE`` times apart (a tampered or foreign file, a changed library) and the table
    is measured again. None when they agree. ``served``: the model already as it runs in ``runtime`` (written
    once for the run), timed as it is.

    Example:
        >>> from surgery.compress.shape_table import shape_latency_table
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2))
        >>> table = shape_latency_table(model).model_copy(update={"batch_size": 2, "seq_len": 8})
        >>> off = table.model_copy(update={"base_ms": 1e6})
        >>> cache_disagreement(off, model, runtime="torch", batch_size=2, seq_len=8, threads=1)  # doctest: +ELLIPSIS
        'the cached table predicts ... ms for this model, measured ... ms now (more than 1.5x apart)'
    """
    # Timed as the table's own "model" probe was (back-to-back calls of at least MIN_TIMED_SECONDS
    # per unit, the same threads and inputs), so that the two numbers compare.
    predicted = table.predict_ms(Structure.from_model(model))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with tempfile.TemporaryDirectory(prefix="surgery-cache-check-") as tmp, torch_threads(threads):
            timed = {"model": padded(runtime_model(model, runtime, Path(tmp), threads=threads) if served is None
                                     else served, pad_to_multiple_of)}
            inputs = timing_batches(int(model.config.vocab_size), batch_size=batch_size, seq_len=seq_len,
                                    batches=batches)
            timing = time_models(timed, inputs, repeats=repeats, warmup=1, device=device, least=MIN_TIMED_SECONDS)
            del timed, served  # an ONNX Runtime session holds its file open until released
    finally:
        model.train(was_training)
    measured = statistics.median(timing.seconds["model"]) * 1000.0
    if measured > 0 and predicted > 0 and max(predicted / measured, measured / predicted) <= 1 + CHECK_TOLERANCE:
        return None
    return (f"the cached table predicts {predicted:.3g} ms for this model, measured {measured:.3g} ms now (more "
            f"than {1 + CHECK_TOLERANCE:g}x apart)")


def _check_settings(model: nn.Module, runtime: str, *, batch_size: int, seq_len: int, threads: int | None,
                    repeats: int, what: str) -> None:
    resolve_runtime(runtime, what)
    for field, value, least in (("batch_size", batch_size, 1), ("seq_len", seq_len, 1), ("repeats", repeats, 3)):
        if value < least:
            raise ConfigError(f"{what}: {field} must be at least {least}, got {value}")
    if threads is not None and threads < 1:
        raise ConfigError(f"{what}: threads must be at least 1, got {threads}")
    check_seq_len({"the model": model}, seq_len, what)


def _device(model: nn.Module, runtime: str) -> torch.device:
    device = next(model.parameters()).device
    served = resolve_runtime(runtime)
    if not served.runs_on(device.type):
        raise ConfigError(f"latency: {runtime} runs on {', '.join(served.devices)}, not {device.type}; move the model "
                          "there first (model.cpu())")
    return device


def measure_latency_table(
    model: nn.Module,
    *,
    runtime: str,
    batch_size: int,
    seq_len: int,
    threads: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache: bool = True,
    write_cache: bool = True,
    repeats: int = REPEATS,
    probe_layers: int = PROBE_LAYERS,
    reference_runtime: str | None = None,
    progress: ProgressCallback | None = None,
    batches: Sequence[Batch] | None = None,
    prepared: Mapping[str, nn.Module] | None = None,
    pad_to_multiple_of: int | None = None,
) -> LatencyTable:
    """Measure (or read from the cache) the latency table of ``model``'s shape on ``runtime`` here.

    See the module docstring for the method.

    Args:
        model: a supported encoder, as the user serves it (its task head and pooler count in ``base``).
        runtime: ``torch``, ``onnxruntime`` or ``onnxruntime-int8``.
        batch_size, seq_len: the batch shape to time (full-length sequences).
        threads: intra-op threads for torch and ONNX Runtime (default: torch's current count).
        cache_dir: where tables are kept (default :func:`~surgery.compress.latency_cache.default_cache_dir`).
        cache: read and write the cache (False: always measure, keep nothing).
        write_cache: with ``cache``, keep what is measured (False: read only, as ``--dry-run`` writes nothing).
        repeats: timed interleaved rounds (each runs every probe once), after one warm-up round.
        probe_layers: identical layers per probe (more: a stronger per-layer signal, longer rounds).
        reference_runtime: also time the model in this runtime in the same rounds (``reference_ms``),
            so that :meth:`LatencyTable.speedup` compares runtimes at one load: the level of two tables
            measured minutes apart on a busy machine differed by 25% (experiments/latency_prediction).
        progress: called with one event per probe exported and per timing round.
        batches: the batches to time on, at a serving shape: texts drawn from the data, each padded to its
            own longest (:func:`surgery.measure.serving.serving_batches`); round ``r`` runs the ``r``-th
            on every probe, so the table is the typical round's. ``batch_size`` and ``seq_len`` are then
            read off them (the batch, the longest); the lengths' summary is in the table and its cache key.
        prepared: probes already as they run in ``runtime``, by probe name (``"model"``: the model itself, as
            ``compress`` wrote it once for the whole run); they are timed as given, not written again.
        pad_to_multiple_of: the probes in ``runtime`` run each batch padded to this multiple, as an artefact that
            records it is served (:mod:`surgery.runtimes.shared.alignment`); the reference runs it as given.

    Returns:
        The :class:`LatencyTable`; ``measured`` says how it was measured, ``measured['cached']`` whether
        it came from the cache file ``measured['cache_file']``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=2))
        >>> table = measure_latency_table(model, runtime="torch", batch_size=2, seq_len=8, threads=1, cache=False,
        ...                               repeats=3)
        >>> sorted(table.attention_ms), sorted(table.ffn_ms)
        ([1, 2, 3, 4], [5, 9, 18, 28, 37])
        >>> table.runtime, table.threads, table.measured["cached"]
        ('torch', 1, False)
    """
    if batches:  # the shape is the drawn batches'
        batch_size, seq_len = int(batches[0]["input_ids"].shape[0]), max(batch_length(b) for b in batches)
    _check_settings(model, runtime, batch_size=batch_size, seq_len=seq_len, threads=threads, repeats=repeats,
                    what="latency")
    if reference_runtime is not None:
        resolve_runtime(reference_runtime)
        reference_runtime = None if reference_runtime == runtime else reference_runtime
    if probe_layers < 2:  # the base probe has one layer; the others must have more to tell base from a layer
        raise ConfigError(f"latency: probe_layers must be at least 2, got {probe_layers}")
    device = _device(model, runtime)
    threads = threads or torch.get_num_threads()
    shape = model_shape(model)
    machine = machine_info().model_copy(update={"torch_threads": threads})
    key = table_key(model, runtime=runtime, batch_size=batch_size, seq_len=seq_len, threads=threads, repeats=repeats,
                    probe_layers=probe_layers, reference_runtime=reference_runtime, batches=batches,
                    pad_to_multiple_of=pad_to_multiple_of)
    path = cache_path(cache_dir if cache_dir is not None else default_cache_dir(), key)
    stale = None
    if cache:
        found, stale = read_cached(path, key)
        if found is not None:  # a file is untrusted: used only if it predicts this model's own time here
            disagreement = cache_disagreement(found, model, runtime=runtime, batch_size=batch_size, seq_len=seq_len,
                                              threads=threads, batches=batches, served=(prepared or {}).get("model"),
                                              pad_to_multiple_of=pad_to_multiple_of)
            if disagreement is None:
                return found.model_copy(update={"machine": machine.model_dump(mode="json"),
                                                "measured": {**found.measured, "cached": True,
                                                             "cache_file": str(path)}})
            stale = f"{path}: {disagreement}"
    table = _measure(model, runtime=runtime, batch_size=batch_size, seq_len=seq_len, threads=threads,
                     repeats=repeats, probe_layers=probe_layers, device=device, progress=progress or no_progress,
                     reference_runtime=reference_runtime, batches=batches, prepared=prepared,
                     model_key=model_key(shape), machine=machine.model_dump(mode="json"),
                     pad_to_multiple_of=pad_to_multiple_of)
    cache_note = try_write_cached(path, key, table) if cache and write_cache else None
    return table.model_copy(update={"measured": {**table.measured, "cached": False,
                                                  "cache_file": str(path) if cache and not cache_note else None,
                                                  **({"cache_note": cache_note} if cache_note else {}),
                                                  **({"replaced_cache": stale} if stale else {})}})


def table_key(model: nn.Module, *, runtime: str, batch_size: int, seq_len: int, threads: int | None,
              repeats: int = REPEATS, probe_layers: int = PROBE_LAYERS, reference_runtime: str | None = None,
              batches: Sequence[Batch] | None = None, pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """What a latency table measured here depends on: the key of its cache file (the serving shape included:
    batch, threads, and with ``batches`` drawn from data their length policy and lengths' summary).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> key = table_key(tiny_model(TinySpec("bert")), runtime="torch", batch_size=2, seq_len=8, threads=1)
        >>> key["runtime"], key["seq_len"], key["repeats"]
        ('torch', 8, 7)
    """
    threads = threads or torch.get_num_threads()
    machine = machine_info().model_copy(update={"torch_threads": threads})
    return {"shape": model_shape(model), "runtime": runtime, "batch_size": batch_size, "seq_len": seq_len,
            "threads": threads, "repeats": repeats, "probe_layers": probe_layers, "heads_grid": list(HEAD_FRACTIONS),
            "width_grid": list(WIDTH_FRACTIONS), "reference_runtime": reference_runtime,
            "machine": machine.fingerprint, "versions": machine.versions,
            "graph_format": (runtime_key := resolve_runtime(runtime).cache_key())["graph_format"],
            "runtime_key": runtime_key, **shape_fields(batches),
            # only where set: the keys of tables timed as given stay what they were
            **({"pad_to_multiple_of": pad_to_multiple_of} if pad_to_multiple_of else {})}


def table_cached(model: nn.Module, *, runtime: str, batch_size: int, seq_len: int, threads: int | None,
                 repeats: int = REPEATS, cache_dir: str | os.PathLike[str] | None = None,
                 batches: Sequence[Batch] | None = None, pad_to_multiple_of: int | None = None) -> bool:
    """Whether a cached table for this model, runtime and batch shape is on file here (the estimate's question:
    a cached table costs a check of the model's own time, not a measurement).

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> table_cached(tiny_model(TinySpec("bert")), runtime="torch", batch_size=2, seq_len=8, threads=1,
        ...              cache_dir=tempfile.mkdtemp())
        False
    """
    key = table_key(model, runtime=runtime, batch_size=batch_size, seq_len=seq_len, threads=threads, repeats=repeats,
                    batches=batches, pad_to_multiple_of=pad_to_multiple_of)
    return cache_path(cache_dir if cache_dir is not None else default_cache_dir(), key).is_file()


def _measure(model: nn.Module, *, runtime: str, batch_size: int, seq_len: int, threads: int, repeats: int,
             probe_layers: int, device: torch.device, progress: ProgressCallback, model_key: str,
             machine: dict[str, Any], reference_runtime: str | None, batches: Sequence[Batch] | None = None,
             prepared: Mapping[str, nn.Module] | None = None, pad_to_multiple_of: int | None = None) -> LatencyTable:
    started = time.perf_counter()
    structure = Structure.from_model(model)
    template = template_layer(model)
    shape = structure.layers[template]
    assert shape is not None  # Structure.from_model keeps every layer
    # Probes are prepared as the artefact will be: int8 ones quantized (random-token calibration), bf16 in bf16.
    calibration = probe_calibration_batches(model, seq_len)
    was_training = model.training
    model.eval()
    try:
        with tempfile.TemporaryDirectory(prefix="surgery-latency-") as tmp, torch_threads(threads):
            floor = zero_width_floor(model, runtime, template, Path(tmp) / "zero-width", threads, calibration)
            plan = probes(shape.heads, shape.ffn_width, probe_layers, floor)
            timed: dict[str, nn.Module] = {}
            if reference_runtime is not None:  # timed in the same rounds: one load for both runtimes
                timed["reference"] = runtime_model(model, reference_runtime, Path(tmp) / "reference",
                                                   threads=threads, calibration=calibration)
            for done, probe in enumerate([*plan, None]):
                name = "model" if probe is None else probe.name
                if prepared and name in prepared:  # written already (the run's unchanged model, the estimate's probe)
                    timed[name] = prepared[name]
                else:
                    source = model if probe is None else build_probe(model, probe, template)
                    timed[name] = runtime_model(source, runtime, Path(tmp) / str(done), threads=threads,
                                                calibration=calibration)
                progress(ProgressEvent("latency probes", done + 1, len(plan) + 1, {"probe": name}))
            inputs = timing_batches(int(model.config.vocab_size), batch_size=batch_size, seq_len=seq_len,
                                    batches=batches)
            timed = {name: m if name == "reference" else padded(m, pad_to_multiple_of) for name, m in timed.items()}
            total = WARMUP + repeats
            timing = time_models(timed, inputs, repeats=repeats, warmup=WARMUP, device=device,
                                 least=MIN_TIMED_SECONDS,
                                 on_round=lambda r: progress(ProgressEvent("latency timing", r, total)))
            del timed  # ONNX Runtime sessions hold their files open until released
    finally:
        model.train(was_training)
    seconds, round_load = timing.steady()
    measured = {
        "method": "probe encoders with identical layers, interleaved rounds, median polish of log times",
        "probe_layers": probe_layers, "template_layer": template, "narrowest_probe_ffn": floor,
        "repeats": repeats, "warmup": WARMUP, "calls_per_round": timing.calls, "round_load": round_load,
        "load_average": timing.load_average, "seconds": time.perf_counter() - started,
        "freed_buffers": timing.freed_buffers,
    }
    return solve_table(seconds, plan, structure, runtime=runtime, batch_size=batch_size, seq_len=seq_len,
                       threads=threads, **shape_fields(batches), model_key=model_key, machine=machine,
                       measured=measured, reference_runtime=reference_runtime,
                       reference_ms=seconds["reference"] * 1000 if reference_runtime is not None else None)


def zero_width_floor(model: nn.Module, runtime: str, template: int, work_dir: Path, threads: int | None,
                     calibration: Sequence[Mapping[str, torch.Tensor]]) -> int:
    """0 when ``runtime`` runs a layer whose FFN has width 0, else 1 (the narrowest FFN its probes then get).

    Tried on the base probe itself: OpenVINO 2026 turns a zero-sized product into an empty output,
    so its width-0 probes are measured at width 1 (a product of one neuron, negligible beside a layer).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> zero_width_floor(tiny_model(TinySpec("bert")), "torch", 0, Path("unused"), 1, [])
        0
    """
    try:
        runtime_model(build_probe(model, Probe("base", 1, 1, 0), template), runtime, work_dir, threads=threads,
                      calibration=calibration)
    except (RuntimeError, ValueError, SurgeryError):
        return 1
    return 0


def measured_speedups(
    original: nn.Module,
    candidates: Mapping[str, nn.Module],
    *,
    runtime: str,
    reference_runtime: str = "torch",
    batch_size: int,
    seq_len: int,
    threads: int | None = None,
    repeats: int = 15,
    calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
    report: Callable[[Timing], None] | None = None,
    prepared: Collection[str] = (),
    batches: Sequence[Batch] | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, tuple[float, Interval]]:
    """Each of ``candidates`` (name -> model) in ``runtime`` against ``original`` in ``reference_runtime``, all
    side by side in one set of interleaved rounds: name -> (paired speedup, its 95% interval).

    Timed apart, two candidates' speedups each carry the load of their own minutes; timed in the same
    rounds, their order is measured (a cut timed alone at 6.71x lost to the model it was cut from, timed
    alone at 6.78x). Names in ``prepared`` are already the artefacts as they run (the ones candidates were
    judged on), timed as they are; the rest, and the original, are prepared in their runtimes
    (:func:`runtime_model`). Timing is :func:`surgery.measure.timing.time_models`; each interval is the paired
    speedup's 95% bootstrap interval over rounds. ``report`` receives the whole
    :class:`~surgery.measure.timing.Timing` (rounds, machine) for a caller that keeps it; in it a candidate is
    named ``"NAME [RUNTIME]"`` and the original ``"original [REFERENCE]"``. ``batches``: the serving shape's
    batches to time on (:func:`timing_batches`), each round its own. ``pad_to_multiple_of``: the candidates run
    each batch padded to this multiple, as their artefacts are served (the original as given).

    Example:
        >>> import surgery
        >>> from surgery.strategies import FFNPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> original, cut = tiny_model(TinySpec("bert")), tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(cut, FFNPruningStrategy(neurons={0: list(range(30)), 1: list(range(30))}))
        >>> out = measured_speedups(original, {"cut": cut, "same": tiny_model(TinySpec("bert"))}, runtime="torch",
        ...                         batch_size=2, seq_len=8, threads=1, repeats=3)
        >>> sorted(out), all(i.low <= v <= i.high for v, i in out.values())
        (['cut', 'same'], True)
    """
    if not candidates:
        raise ConfigError("measured speedups: pass at least one candidate")
    _check_settings(original, runtime, batch_size=batch_size, seq_len=seq_len, threads=threads, repeats=repeats,
                    what="measured speedup")
    resolve_runtime(reference_runtime, "measured speedup")
    reference = f"original [{reference_runtime}]"
    names = {name: f"{name} [{runtime}]" for name in candidates}
    if reference in names.values():
        raise ConfigError(f"measured speedups: a candidate may not be named like the reference ({reference!r})")
    with tempfile.TemporaryDirectory(prefix="surgery-side-by-side-") as tmp:
        served = {reference: runtime_model(original, reference_runtime, Path(tmp) / "reference", threads=threads,
                                           calibration=calibration)}
        for i, (name, model) in enumerate(candidates.items()):
            served[names[name]] = padded(model if name in prepared else runtime_model(
                model, runtime, Path(tmp) / str(i), threads=threads, calibration=calibration), pad_to_multiple_of)
        device = next(original.parameters()).device
        inputs = timing_batches(shared_vocab(served), batch_size=batch_size, seq_len=seq_len, batches=batches)
        timing = time_models(served, inputs, repeats=repeats, warmup=2, threads=threads or torch.get_num_threads(),
                             device=device)
        del served  # artefact sessions hold their files open until released
    if report is not None:
        report(timing)
    return {name: timing.speedup(label) for name, label in names.items()}


def runtime_ratios(model: nn.Module, runtimes: Sequence[str], *, reference_runtime: str = "torch", batch_size: int,
                   seq_len: int, threads: int | None = None, repeats: int = 15,
                   calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
                   batches: Sequence[Batch] | None = None,
                   prepared: Mapping[str, nn.Module] | None = None) -> dict[str, list[float]]:
    """The unchanged ``model`` in each of ``runtimes`` against it in ``reference_runtime``, side by side.

    Every runtime's form of the model is prepared first (:func:`runtime_model`), then all are timed in
    the same interleaved rounds (:func:`~surgery.measure.timing.time_models`), so the load of the
    moment hits them alike, on ``batches`` at a serving shape (:func:`timing_batches`). Returns runtime ->
    ``[paired speedup, 95% low, 95% high]`` (the reference itself included, at 1). ``prepared``: runtimes
    whose form of the model is already written and loaded (``compress --runtime auto`` writes each once for
    the whole run), timed as given.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> ratios = runtime_ratios(tiny_model(TinySpec("bert")), ["torch"], batch_size=2, seq_len=8, threads=1,
        ...                         repeats=3)
        >>> ratios["torch"]
        [1.0, 1.0, 1.0]
    """
    _check_settings(model, reference_runtime, batch_size=batch_size, seq_len=seq_len, threads=threads,
                    repeats=repeats, what="runtime ratios")
    others = [r for r in dict.fromkeys(runtimes) if r != reference_runtime]
    with tempfile.TemporaryDirectory(prefix="surgery-runtimes-") as tmp:
        served = {name: (prepared or {}).get(name) or runtime_model(model, name, Path(tmp) / str(i), threads=threads,
                                                                    calibration=calibration)
                  for i, name in enumerate([reference_runtime, *others])}
        device = next(model.parameters()).device
        inputs = timing_batches(shared_vocab(served), batch_size=batch_size, seq_len=seq_len, batches=batches)
        timing = time_models(served, inputs, repeats=repeats, warmup=2, threads=threads or torch.get_num_threads(),
                             device=device)
        del served  # artefact sessions hold their files open until released
    out = {reference_runtime: [1.0, 1.0, 1.0]}
    for name in others:
        value, interval = timing.speedup(name)
        out[name] = [value, interval.low, interval.high]
    return {name: out[name] for name in runtimes if name in out}


def measure_fallback_costs(served_dir: Path, model: nn.Module, *, runtime: Runtime, batch_size: int, seq_len: int,
                           threads: int | None, repeats: int = REPEATS, batches: Sequence[Batch] | None = None,
                           pad_to_multiple_of: int | None = None) -> FallbackCosts:
    """What each op group costs in float on top of int8, measured on ``runtime``'s int8 artefact of ``model``.

    Probes (as the latency table's: interleaved rounds, :data:`MIN_TIMED_SECONDS` per call, median
    polish of log times): the artefact itself, and per part (``attention``, ``ffn-up``, ``ffn-down``,
    ``classifier``) the artefact with that part back in float in every layer (the runtime's
    :meth:`~surgery.runtimes.Runtime.with_float_groups`), loaded as the artefact is. A part's
    extra time, divided by the heads or neurons of all layers together, is its cost per unit
    (:class:`~surgery.compress.latency_table.FallbackCosts`). The cost is signed: a part can run
    faster in float than in int8 (on a CPU without VNNI, int8 products plus their quantize and
    dequantize steps lose to f32 ones: measured on MiniLM-L6 attention on an AVX2-only EPYC), and
    :func:`~surgery.compress.removal_path.buy_fallbacks` takes such a part for free. Noise around 0
    can only make a part that truly costs little look free, which the candidate's own timing then shows.
    ``batches``: the serving shape's batches, as the table's (:func:`timing_batches`); ``pad_to_multiple_of``: each
    batch padded to it, as the artefact is served.
    """
    from surgery.compress.latency_table import FALLBACK_UNITS
    from surgery.runtimes.shared.weight_products import precision_groups

    groups = precision_groups(model)
    structure = Structure.from_model(model)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="surgery-fallback-") as tmp, torch_threads(threads or 1):
        timed: dict[str, nn.Module] = {"int8": runtime.load(Path(served_dir), config=model.config, threads=threads)}
        #: What a float group runs in there, as the served model says (OpenVINO's compiled precision).
        precision = str(getattr(timed["int8"], "precision", "fp32"))
        for part in FALLBACK_UNITS:
            members = [g for g in groups if g == part or g.endswith(f".{part}")]
            if not members:
                continue
            copy = runtime.with_float_groups(Path(served_dir), model, members, Path(tmp) / part)
            timed[part] = runtime.load(copy, config=model.config, threads=threads)
        inputs = timing_batches(int(model.config.vocab_size), batch_size=batch_size, seq_len=seq_len, batches=batches)
        timed = {name: padded(m, pad_to_multiple_of) for name, m in timed.items()}
        timing = time_models(timed, inputs, repeats=repeats, warmup=WARMUP, device=device, least=MIN_TIMED_SECONDS)
        del timed
    seconds, round_load = timing.steady()
    per_unit = {}
    for part in (p for p in FALLBACK_UNITS if p in seconds):
        extra_ms = (seconds[part] - seconds["int8"]) * 1000
        kind = FALLBACK_UNITS[part]
        count = 1 if kind == "whole" else sum(s.heads if kind == "heads" else s.ffn_width for s in structure.kept)
        per_unit[part] = extra_ms / max(count, 1)
    return FallbackCosts(runtime=runtime.name, precision=precision, per_unit_ms=per_unit,
                         measured={"int8_ms": seconds["int8"] * 1000,
                                   "float_part_ms": {p: seconds[p] * 1000 for p in seconds if p != "int8"},
                                   "repeats": repeats, "round_load": round_load, "batch_size": batch_size,
                                   "seq_len": seq_len, "threads": threads, "load_average": load_average()})
