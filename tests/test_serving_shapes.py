"""Serving shapes: bench and compress time the batch, threads and text lengths a service runs.

On tiny models: ``bench --batch 1 --lengths data`` times batches of real texts, each padded to its own
longest, and leads with p50/p95 latency; ``compress --batch 1 --lengths data`` measures its latency
table at that shape and records it; the one timing routine (:func:`surgery.measure.timing.time_models`)
runs each round's batch on every model. (A bad ``--batch`` or ``--lengths`` is one line and exit 2
before torch is imported: tests/test_model_dir_paths.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surgery.measure import bench as bench_module
from surgery.measure.bench import bench_models
from surgery.measure.serving import LengthSummary, ServingShape, data_batches, serving_batches
from surgery.measure.timing import make_inputs, time_models
from surgery.testing import TinySpec, tiny_model
from tests.helpers import labelled_rows, runner, saved_classifier, write_rows


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    saved_classifier(root / "clf")
    saved_classifier(root / "small", layers=1)
    write_rows(root / "texts.csv", labelled_rows(60))  # 3 to 9 words a text: batches of many lengths
    return root


def test_each_round_runs_its_own_batch_on_every_model() -> None:
    short, long = make_inputs(99, batch_size=1, seq_len=4), make_inputs(99, batch_size=1, seq_len=12)
    seen: list[tuple[str, int]] = []

    class Spy(torch.nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.config = tiny_model(TinySpec("bert")).config

        def forward(self, **inputs: torch.Tensor) -> None:
            seen.append((self.name, int(inputs["input_ids"].shape[1])))

    timing = time_models({"a": Spy("a"), "b": Spy("b")}, [short, long], repeats=4, warmup=0, threads=1)
    assert timing.batch_shapes == [[1, 4], [1, 12], [1, 4], [1, 12]]
    # Round by round both models saw the same batch (the order rotates within a round).
    assert [sorted(seen[i:i + 2]) for i in range(0, 8, 2)] == [[("a", n), ("b", n)] for n in (4, 12, 4, 12)]


def test_data_batches_are_real_texts_each_padded_to_its_own_longest(served: Path) -> None:
    from surgery.cli.prepare import DataFiles, DataOptions, load_task
    from tests.helpers import tiny_tokenizer

    data = load_task(DataFiles(str(served / "texts.csv")), tiny_tokenizer(), DataOptions(max_length=32))
    batches = data_batches(data, batch_size=4, count=6, seed=0)
    assert len(batches) == 6 and all(set(b) <= {"input_ids", "attention_mask", "token_type_ids"} for b in batches)
    for b in batches:  # its longest text fills it; no batch is padded beyond its own longest
        assert int(b["attention_mask"].sum(dim=1).max()) == b["input_ids"].shape[1]
    assert len({b["input_ids"].shape[1] for b in batches}) > 1  # lengths vary, as the data's do
    again = data_batches(data, batch_size=4, count=6, seed=0)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(batches, again, strict=True))  # seeded
    summary = LengthSummary.of(batches)
    assert summary.batches == 6 and summary.texts == 24 and summary.padded_max == max(b["input_ids"].shape[1]
                                                                                      for b in batches)
    assert summary.text_mean < summary.padded_mean  # padding to the longest adds tokens
    shape = ServingShape(batch_size=4, threads=2, lengths="data")
    assert [b["input_ids"].shape for b in serving_batches(shape, data=data, count=6)] == \
        [b["input_ids"].shape for b in batches]


def test_bench_models_on_drawn_batches_reports_the_shape_and_latency_ratios() -> None:
    model = tiny_model(TinySpec("bert"))
    batches = [make_inputs(99, batch_size=1, seq_len=n) for n in (5, 9, 7)]
    report = bench_models({"a": model, "b": tiny_model(TinySpec("bert", layers=1))}, batch_size=1, repeats=3,
                          warmup=0, threads=1, batches=batches)
    assert report.settings.lengths == "data" and report.settings.seq_len == 9 and report.settings.small_batch
    assert report.settings.length_summary is not None and report.settings.length_summary.padded_p50 == 7
    c = report.comparisons[0]
    a, b = report.models
    assert c.p50_speedup == pytest.approx(a.latency_p50_ms / b.latency_p50_ms)
    assert c.p95_speedup == pytest.approx(a.latency_p95_ms / b.latency_p95_ms)


def test_the_latency_cache_key_holds_the_serving_shape() -> None:
    from surgery.compress.latency_measure import table_key

    model = tiny_model(TinySpec("bert"))
    fixed = table_key(model, runtime="torch", batch_size=1, seq_len=9, threads=1)
    short = [make_inputs(99, batch_size=1, seq_len=n) for n in (5, 9)]
    drawn = table_key(model, runtime="torch", batch_size=1, seq_len=9, threads=1, batches=short)
    longer = table_key(model, runtime="torch", batch_size=1, seq_len=9, threads=1,
                       batches=[make_inputs(99, batch_size=1, seq_len=n) for n in (8, 9)])
    assert "lengths" not in fixed  # tables measured at a fixed length keep their keys
    assert drawn["lengths"] == "data" and drawn["length_summary"]["padded_p50"] == 7
    assert len({str(sorted(k.items())) for k in (fixed, drawn, longer)}) == 3
    assert table_key(model, runtime="torch", batch_size=32, seq_len=9, threads=2) != fixed


def test_bench_at_batch_1_with_lengths_from_data_leads_with_p50_and_p95(served: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.cli.app import app

    timed: list[list[list[int]]] = []
    real = bench_module.time_models

    def spy(models, batches, **kwargs):  # type: ignore[no-untyped-def]
        timing = real(models, batches, **kwargs)
        timed.append(timing.batch_shapes)
        return timing

    monkeypatch.setattr(bench_module, "time_models", spy)
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", str(served / "small"), "--against", str(served / "clf"), "--batch", "1",
                                 "--threads", "1", "--lengths", "data", "--data", str(served / "texts.csv"),
                                 "--repeats", "6", "--warmup", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    # The table leads with latency per batch, and the ratios with p50/p95 speedups.
    header = next(line for line in result.stdout.splitlines() if "p50 ms" in line)
    assert header.index("p50 ms") < header.index("p95 ms") < header.index("samples/s")
    assert "p50 speedup" in result.stdout and "p95 speedup" in result.stdout
    assert "texts from the data, each batch padded to its longest" in result.stdout
    report = json.loads(out.read_text())
    settings = report["settings"]
    assert settings["lengths"] == "data" and settings["batch_size"] == 1 and settings["threads"] == 1
    assert settings["length_summary"]["batches"] == 7  # one drawn batch per round, warm-up included
    assert [shape[0] for shape in timed[0]] == [1] * 6 and len({shape[1] for shape in timed[0]}) > 1
    assert all(m["latency_p95_ms"] >= m["latency_p50_ms"] > 0 for m in report["models"])
    assert report["comparisons"][0]["p50_speedup"] > 0 and report["comparisons"][0]["p95_speedup"] > 0


@pytest.mark.slow
def test_compress_at_batch_1_measures_its_table_there_and_records_the_shape(served: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.cli.app import app
    from surgery.compress import latency_measure

    timed: list[tuple[list[str], list[list[int]]]] = []
    real = latency_measure.time_models

    def spy(models, batches, **kwargs):  # type: ignore[no-untyped-def]
        timing = real(models, batches, **kwargs)
        timed.append((list(models), timing.batch_shapes))
        return timing

    monkeypatch.setattr(latency_measure, "time_models", spy)
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))  # measured here, not read from a cache
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(served / "clf"), "--data", str(served / "texts.csv"), "--speedup",
                                 "1.2", "--batch", "1", "--threads", "1", "--lengths", "data", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "compress.json").read_text())
    shape = report["serving_shape"]
    assert shape["batch_size"] == 1 and shape["threads"] == 1 and shape["lengths"] == "data"
    assert report["config"]["lengths"] == "data" and shape["summary"]["batches"] > 1
    table = report["latency_table"]
    assert table["batch_size"] == 1 and table["threads"] == 1 and table["lengths"] == "data"
    assert table["length_summary"] == shape["summary"] and table["seq_len"] == shape["summary"]["padded_max"]
    # The table's rounds (its probes and the model itself) ran on batches of one text, of the data's lengths.
    probes = [rounds for names, rounds in timed if "model" in names and "base" in names]
    assert probes and all(b == 1 for b, _ in probes[0]) and len({n for _, n in probes[0]}) > 1
    assert max(n for _, n in probes[0]) <= shape["summary"]["padded_max"]
    # Every side-by-side speedup was timed at that shape too.
    sides = [rounds for names, rounds in timed if any(n.startswith("candidate") for n in names)]
    assert sides and all(b == 1 for rounds in sides for b, _ in rounds)
    assert "batch 1 of texts drawn from the data" in (out / "README.md").read_text()
