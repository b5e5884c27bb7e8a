"""Where compression gets its times: measured on this machine, or predicted from a table already in hand.

``MeasuredLatency`` measures the latency table and the side-by-side speedups on the target runtime
(:mod:`surgery.compress.latency_measure`). ``TableLatency`` answers both from given tables: every
speedup is the table's prediction, so it fits planning on a table measured elsewhere and tests that
must not depend on this machine's timing noise.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError

#: Side-by-side rounds of each measured speedup.
SPEEDUP_REPEATS = 20


class LatencySource(Protocol):
    """What compression asks about time: a model's latency table, and a measured speedup.

    A source may also answer ``speedups(original, candidates, *, runtime, reference_runtime, served)``
    (name -> model; ``served``: the names whose model is already the artefact as it runs; answers name ->
    (speedup, interval)), timing them all in one set of rounds: :func:`speedups_together` uses it where it
    exists.
    """

    def table(self, model: nn.Module, runtime: str) -> LatencyTable: ...

    def speedup(self, original: nn.Module, candidate: nn.Module, *, runtime: str, reference_runtime: str,
                served: nn.Module | None = None) -> tuple[float, list[float] | None]: ...


def speedups_together(source: LatencySource, original: nn.Module, candidates: Mapping[str, nn.Module], *,
                      runtime: str, reference_runtime: str, served: Collection[str] = ()
                      ) -> tuple[dict[str, tuple[float, list[float] | None]], bool]:
    """Each of ``candidates`` (name -> model; ``served``: names whose model is already the artefact as it runs in
    ``runtime``) against ``original``, and whether they were timed in one set of rounds: by the source's
    ``speedups`` where it has one, else one at a time.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="tiny", base_ms=1.0,
        ...                      overhead_ms=0.5, attention_ms={4: 2.0}, ffn_ms={37: 2.0})
        >>> model = tiny_model(TinySpec("bert"))
        >>> speedups_together(TableLatency({"torch": table}), model, {"a": model}, runtime="torch",
        ...                   reference_runtime="torch")
        ({'a': (1.0, None)}, True)
    """
    together = getattr(source, "speedups", None)
    if together is not None:
        return together(original, candidates, runtime=runtime, reference_runtime=reference_runtime,
                        served=served), True
    return {name: source.speedup(original, model, runtime=runtime, reference_runtime=reference_runtime,
                                 served=model if name in served else None)
            for name, model in candidates.items()}, False


@dataclass
class MeasuredLatency:
    """Times measured on this machine at one batch shape (tables cached under ``cache_dir``).

    Example:
        >>> MeasuredLatency(batch_size=8, seq_len=64).repeats
        20
    """

    batch_size: int
    seq_len: int
    threads: int | None = None
    cache_dir: Path | None = None
    repeats: int = SPEEDUP_REPEATS
    write_cache: bool = True  # False: a cached table is still read, nothing is written (--dry-run)
    table_repeats: int | None = None  # the latency table's timing rounds (None: its default; a budget asks fewer)
    #: the batches every table and speedup is timed on at a serving shape (texts drawn from the data, each padded
    #: to its own longest: :func:`surgery.measure.serving.serving_batches`); None: one random batch_size x seq_len
    batches: list[dict[str, Any]] | None = None
    #: probes already as they run (``"model"``: the run's unchanged model, written once), timed as given
    prepared: dict[str, nn.Module] = field(default_factory=dict)
    #: the runtime's models run each batch padded to this multiple, as the artefacts are served
    #: (:mod:`surgery.runtimes.shared.alignment`); the reference runs it as given. None: as given.
    pad_to_multiple_of: int | None = None

    def table(self, model: nn.Module, runtime: str) -> LatencyTable:
        from surgery.compress.latency_measure import measure_latency_table

        return measure_latency_table(model, runtime=runtime, batch_size=self.batch_size, seq_len=self.seq_len,
                                     threads=self.threads, cache_dir=self.cache_dir, write_cache=self.write_cache,
                                     batches=self.batches, prepared=self.prepared,
                                     pad_to_multiple_of=self.pad_to_multiple_of,
                                     **({"repeats": self.table_repeats} if self.table_repeats else {}))

    def speedup(self, original: nn.Module, candidate: nn.Module, *, runtime: str, reference_runtime: str,
                served: nn.Module | None = None) -> tuple[float, list[float] | None]:
        """``served``: the candidate already as it runs in ``runtime`` (the artefact it was judged on), timed as is."""
        return self.speedups(original, {"candidate": candidate if served is None else served}, runtime=runtime,
                             reference_runtime=reference_runtime,
                             served=() if served is None else ("candidate",))["candidate"]

    def speedups(self, original: nn.Module, candidates: Mapping[str, nn.Module], *, runtime: str,
                 reference_runtime: str, served: Collection[str] = ()) -> dict[str, tuple[float, list[float] | None]]:
        """Every one of ``candidates`` against ``original``, side by side in one set of rounds (their order is
        measured, not read from separate minutes' load); ``served``: names already the artefact as it runs."""
        from surgery.compress.latency_measure import measured_speedups

        out = measured_speedups(original, candidates, runtime=runtime, reference_runtime=reference_runtime,
                                batch_size=self.batch_size, seq_len=self.seq_len, threads=self.threads,
                                repeats=self.repeats, prepared=served, batches=self.batches,
                                pad_to_multiple_of=self.pad_to_multiple_of)
        return {name: (float(value), _bounds(interval)) for name, (value, interval) in out.items()}

    def ratios(self, model: nn.Module, runtimes: list[str], *, reference_runtime: str,
               prepared: Mapping[str, nn.Module] | None = None) -> dict[str, list[float]]:
        """The unchanged ``model`` in every runtime against it in ``reference_runtime``, side by side in one
        process: runtime -> ``[paired speedup, interval low, interval high]``; ``prepared``: runtimes whose form
        of the model is already written and loaded, timed as given."""
        from surgery.compress.latency_measure import runtime_ratios

        return runtime_ratios(model, runtimes, reference_runtime=reference_runtime, batch_size=self.batch_size,
                              seq_len=self.seq_len, threads=self.threads, repeats=self.repeats, batches=self.batches,
                              prepared=prepared)


def _bounds(interval: Any) -> list[float] | None:
    """An interval as ``[low, high]`` whatever its form (a pydantic Interval, a pair, None)."""
    if interval is None:
        return None
    if hasattr(interval, "low") and hasattr(interval, "high"):
        return [float(interval.low), float(interval.high)]
    low, high = interval
    return [float(low), float(high)]


@dataclass
class TableLatency:
    """Latency from tables given per runtime: speedups are the tables' predictions, nothing is timed.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="tiny", base_ms=1.0,
        ...                      overhead_ms=0.5, attention_ms={4: 2.0}, ffn_ms={37: 2.0})
        >>> source = TableLatency({"torch": table})
        >>> model = tiny_model(TinySpec("bert"))
        >>> source.speedup(model, model, runtime="torch", reference_runtime="torch")
        (1.0, None)
    """

    tables: Mapping[str, LatencyTable]
    measured: dict[str, Any] = field(default_factory=dict)

    def table(self, model: nn.Module, runtime: str) -> LatencyTable:
        if runtime not in self.tables:
            raise ConfigError(f"compress: no latency table for runtime {runtime!r}; have {sorted(self.tables)}")
        return self.tables[runtime]

    def speedup(self, original: nn.Module, candidate: nn.Module, *, runtime: str, reference_runtime: str,
                served: nn.Module | None = None) -> tuple[float, list[float] | None]:
        reference = self.table(original, reference_runtime).predict_ms(Structure.from_model(original))
        return reference / self.table(candidate, runtime).predict_ms(Structure.from_model(candidate)), None

    def speedups(self, original: nn.Module, candidates: Mapping[str, nn.Module], *, runtime: str,
                 reference_runtime: str, served: Collection[str] = ()) -> dict[str, tuple[float, list[float] | None]]:
        """The tables' predictions, as :meth:`speedup` gives them one at a time (nothing is timed)."""
        return {name: self.speedup(original, model, runtime=runtime, reference_runtime=reference_runtime)
                for name, model in candidates.items()}
