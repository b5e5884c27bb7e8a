"""``surgery compress`` on tiny models of every family: the search, the candidates, the budget, the guard, the CLI.

Times here come from latency tables built from the model's shape (a cost per head and per FFN
neuron), through :class:`TableLatency`: the search and the pick are tested on numbers that do not
depend on this machine's load. The measurement itself is tested with ``latency_measure``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.compress.candidates import apply_removal
from surgery.compress.compress_report import DropTarget, SpeedupTarget
from surgery.compress.compress_run import compress
from surgery.compress.latency_table import LatencyTable
from surgery.compress.mask_fisher import UnitCosts, unit_costs
from surgery.compress.removal_path import Removal, search_path
from surgery.compress.shape_table import shape_latency_table
from surgery.compress.structure import LayerShape, Structure
from surgery.core.errors import DataError
from surgery.embedding import SentenceConfig, load_text_data
from surgery.testing import FAMILIES, TinySpec, tiny_model, tiny_task_data
from tests.helpers import (
    EMBEDDING_TEXTS,
    labelled_rows,
    saved_classifier,
    st_dir,
    tables_for,
    tiny_tokenizer,
    write_rows,
)

runner = CliRunner(env={"COLUMNS": "200"})


def fisher_costs(family: str, layers: int = 3) -> tuple[torch.nn.Module, UnitCosts]:
    model = tiny_model(TinySpec(family, task="seq-cls", layers=layers))
    batches = list(tiny_task_data().loader("train", batch_size=8))
    return model, unit_costs(model, batches, objective="task")


# -- importance and the search --------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_search_meets_each_predicted_target_and_is_monotone(family: str) -> None:
    model, costs = fisher_costs(family)
    assert all(bool((v >= 0).all()) for v in [*costs.heads.values(), *costs.neurons.values()])
    table = shape_latency_table(model)
    path = search_path(costs, table, Structure.from_model(model))
    previous: set[tuple[str, int, int]] = set()
    steps = []
    for goal in (1.2, 1.5, 2.0, 3.0):
        k = path.first_reaching(goal)
        assert k is not None, f"{family}: the path ends at {path.speedup_at(len(path.steps)):.2f}x"
        structure = path.structure_at(k)
        assert table.predict_ms(Structure.from_model(model)) / table.predict_ms(structure) >= goal
        removal = path.removal_at(k)
        units = {("h", layer, u) for layer, us in removal.heads.items() for u in us}
        units |= {("n", layer, u) for layer, us in removal.neurons.items() for u in us}
        units |= {("l", layer, -1) for layer in removal.layers}
        gone = set(removal.layers)
        assert {u for u in previous if u[1] not in gone} <= units  # a faster point cuts a superset
        previous = units
        steps.append(k)
    assert steps == sorted(steps)
    for k in range(1, len(path.steps) + 1):  # predicted time never rises along the path
        assert path.speedup_at(k) >= path.speedup_at(k - 1) - 1e-9


def test_search_cuts_unevenly_where_that_pays() -> None:
    start = Structure((LayerShape(4, 32), LayerShape(4, 32), LayerShape(4, 32)))
    ones = torch.ones(4)
    costs = UnitCosts("task", 10, heads={0: ones, 1: ones * 0.01, 2: ones},
                      neurons={0: torch.ones(32), 1: torch.full((32,), 0.001), 2: torch.ones(32)},
                      layers={0: 100.0, 1: 100.0, 2: 100.0})
    table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="u", base_ms=0.1, overhead_ms=0.1,
                         attention_ms={h: h for h in range(1, 5)}, ffn_ms={w: w / 8 for w in range(1, 33)})
    path = search_path(costs, table, start, stop_speedup=1.4)
    final = path.structure_at(len(path.steps))
    assert final.layers[1] is not None and final.layers[1].ffn_width < 32 and final.layers[1].heads < 4
    assert final.layers[0] == LayerShape(4, 32) and final.layers[2] == LayerShape(4, 32)


@pytest.mark.parametrize("family", ["bert", "deberta-v2", "modernbert"])
def test_stock_search_gives_uniform_widths_and_keeps_every_head(family: str) -> None:
    model, costs = fisher_costs(family, layers=4)
    path = search_path(costs, shape_latency_table(model), Structure.from_model(model), stock=True)
    assert path.speedup_at(len(path.steps)) > 2.0
    for k in range(len(path.steps) + 1):
        kept = path.structure_at(k).kept
        assert len({s.ffn_width for s in kept}) == 1 and all(s.heads == 4 for s in kept)
    assert {s.kind for s in path.steps} <= {"uniform-neurons", "layer"}


def test_layer_costs_are_measured_with_the_layer_skipped() -> None:
    model, costs = fisher_costs("bert")
    batches = list(tiny_task_data().loader("train", batch_size=8))[:4]

    def mean_loss(m: torch.nn.Module) -> float:
        with torch.no_grad():
            return sum(float(m(**b).loss) * len(b["labels"]) for b in batches) / sum(len(b["labels"]) for b in batches)

    full = mean_loss(model)
    copy_ = tiny_model(TinySpec("bert", task="seq-cls", layers=3))
    apply_removal(copy_, Removal(layers=[1]))
    skipped = mean_loss(copy_)
    assert costs.layers[1] == pytest.approx(max(skipped - full, 0.0), rel=1e-4, abs=1e-6)


# -- the run ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_compress_reaches_the_speedup_and_the_model_reloads_bit_exact(family: str, tmp_path: Path) -> None:
    model = tiny_model(TinySpec(family, task="seq-cls", layers=3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = surgery.compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.6), latency=tables_for(model))
    report = result.report
    winner = report.winner_result()
    assert winner is not None and winner.measured_speedup >= 1.6 and not report.warnings
    families = {"unchanged", "path", "units-path", "uniform-path", "uniform-layer-drop"}
    assert {c.origin for c in report.candidates} >= families
    built = [c.removal for c in report.candidates if not any(n.startswith("the same cut as") for n in c.notes)]
    assert all(a != b for i, a in enumerate(built) for b in built[i + 1:])  # each cut built and timed once
    assert report.reference.startswith("the original model in torch")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched
    assert Structure.from_model(result.model).kept == Structure.from_json(winner.structure).kept
    out = surgery.save_pretrained(result.model, tmp_path / "m")
    reloaded = surgery.from_pretrained(out)
    batch = next(iter(tiny_task_data().loader("eval", batch_size=8)))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        assert torch.equal(result.model.eval()(**inputs).logits, reloaded.eval()(**inputs).logits)
    strategies = [s["strategy"] for s in surgery.core.manifest.steps_of(reloaded)]
    assert set(strategies) <= {"head-prune", "ffn-prune", "layer-drop"} and strategies


def test_max_drop_picks_the_fastest_within_it() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=3))
    report = compress(model, tiny_task_data(), target=DropTarget(max_drop=5.0), latency=tables_for(model)).report
    winner = report.winner_result()
    # 12 held-out examples bound no drop to 5 points (with no disagreement the adjusted Wald interval reaches 16.6):
    # the pick reads the held-out point estimate and says the interval was too wide, nothing else.
    assert winner is not None and winner.drop <= 5.0 and winner.held_out is not None
    assert report.warnings and all("more dev data narrows the interval" in w for w in report.warnings)
    within = [c for c in report.candidates if c.measured_speedup is not None and c.drop <= 5.0]
    assert winner.measured_speedup == max(c.measured_speedup for c in within)
    # points along the path are found by a search whose bracket shrinks to at most 3/4 per probe (bisection
    # steered by the Fisher estimates): logarithmically many are judged, not every one
    judged = [c for c in report.candidates if c.origin == "path"]
    assert len(judged) <= math.ceil(math.log(len(report.path) + 1, 4 / 3)) + 2


def test_max_drop_bisection_stops_where_its_bracket_is_finer_than_the_tables_resolution(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.compress import candidate_run

    model = tiny_model(TinySpec("bert", task="seq-cls", layers=3))
    report = compress(model, tiny_task_data(), target=DropTarget(max_drop=5.0), latency=tables_for(model)).report
    paths = {"path": report.path, "units-path": report.units_path, "uniform-path": report.uniform_path}

    def speed(family: str, k: int) -> float:
        return report.unchanged_speedup if k == 0 else paths[family][k - 1]["predicted_speedup"]

    log, ends = report.judging["search_log"], report.judging["bisection"]
    assert log and set(ends) == set(paths) and report.winner != "unchanged"
    for probe in log:  # every point built had a bracket wider than the resolution to split
        lo, hi = probe["bracket"]
        assert speed(probe["family"], hi) > speed(probe["family"], lo) * (1 + candidate_run.BISECTION_RESOLUTION)
    for family, end in ends.items():  # and every search ended inside it
        lo, hi = end["bracket"]
        assert hi <= lo or end["predicted_speedups"][1] <= end["predicted_speedups"][0] * 1.03
        assert end["predicted_speedups"][0] == pytest.approx(speed(family, lo), abs=1e-3)
    # a resolution wider than the whole path's range builds no point at all: the unchanged model stays
    monkeypatch.setattr(candidate_run, "BISECTION_RESOLUTION", 100.0)
    coarse = compress(model, tiny_task_data(), target=DropTarget(max_drop=5.0), latency=tables_for(model)).report
    assert not coarse.judging["search_log"] and coarse.winner == "unchanged"
    assert all(end["bracket"][0] == 0 for end in coarse.judging["bisection"].values())


def embedding_data() -> Any:
    data = load_text_data(EMBEDDING_TEXTS, tiny_tokenizer(), batch_size=8)
    data.sentence_config = SentenceConfig(normalize=True)
    return data


def test_the_guard_fires_on_a_forced_loss_and_reports_fidelity() -> None:
    model = tiny_model(TinySpec("bert", layers=3))
    report = compress(model, embedding_data(), target=SpeedupTarget(speedup=1.5, max_drop=0.0),
                      latency=tables_for(model)).report
    assert report.objective == "embedding" and report.metric.startswith("mean cosine")
    winner = report.winner_result()
    assert winner is not None and winner.mean_cosine < 1.0 and winner.recall_at_10 is not None
    assert any("more than --max-drop 0" in w for w in report.warnings)


def test_a_missed_speedup_is_a_warning_not_a_silent_pick() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2))
    report = compress(model, tiny_task_data(), target=SpeedupTarget(speedup=40.0), latency=tables_for(model)).report
    assert any(w.startswith("target missed") for w in report.warnings)


@pytest.mark.slow
def test_the_budget_bounds_the_candidates_and_the_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.compress import training_tier

    handed: list[int] = []
    real_tiers = training_tier.train_tiers

    def spy(student: Any, teacher: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(len(data.eval))
        return real_tiers(student, teacher, data, *args, **kwargs)

    monkeypatch.setattr(training_tier, "train_tiers", spy)
    # A tiny model's accuracy is flat, so patience never ends its distillation: the epoch bound does.
    monkeypatch.setattr(training_tier, "MAX_EPOCHS", 3)
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=3))
    tight = compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5), budget_minutes=1e-4,
                     latency=tables_for(model)).report
    assert len(tight.candidates) == 1 and any(n.startswith("skipped candidate") for n in tight.notes)
    assert tight.winner == "unchanged" and not tight.training and any(w.startswith("target missed") for w in
                                                                      tight.warnings)
    roomy = compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5), budget_minutes=2.0,
                     latency=tables_for(model)).report
    assert roomy.training is not None and roomy.training["epochs"] >= 1
    assert roomy.winner.endswith("+distil") and roomy.winner_result().tier == "distil"
    assert roomy.training["epochs"] * roomy.training["epoch_seconds_estimated"] <= roomy.training["seconds_left"]
    # compress.json says which tiers ran, each one's estimate and actual time, and dev accuracy before and after.
    assert roomy.training["tiers_run"] and [t["tier"] for t in roomy.training["tiers"]] == roomy.training["tiers_run"]
    for tier in roomy.training["tiers"]:
        assert tier["estimated_seconds"] > 0 and tier["seconds"] > 0
        assert tier["accuracy_before"] is not None and tier["accuracy_after"] is not None
    assert roomy.training["judged_after"] == roomy.winner_result().accuracy
    # The tiers measured their epochs on the search part of dev only, never on the examples the pick held out.
    split = roomy.judging["split"]
    assert handed and set(handed) == {split["search"]}  # each finalist trained on it
    assert split["pick"] > 0 and split["search"] < len(tiny_task_data().eval)
    assert roomy.seconds <= 120.0
    untrained = compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5), budget_minutes=2.0,
                         latency=tables_for(model), train=False).report
    assert untrained.training is None and untrained.winner_result().tier != "distil"
    assert "training turned off: the refit tier only" in untrained.notes


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_ws(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compress")
    saved_classifier(root / "classifier", layers=3)  # its head names the data's labels (neg/pos)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(EMBEDDING_TEXTS) + "\n")
    return {"classifier": root / "classifier", "data": write_rows(root / "train.csv", labelled_rows(64)),
            "st": st_dir(root / "st", {"pooling_mode_mean_tokens": True}, True), "corpus": corpus}


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("runtime", ["torch", "onnxruntime-int8"])
def test_cli_compress_saves_the_model_and_its_report(cli_ws: dict[str, Path], tmp_path: Path, runtime: str,
                                                     timed_by_tables: None) -> None:
    if runtime != "torch":
        pytest.importorskip("onnxruntime")
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(cli_ws["classifier"]), "--data", str(cli_ws["data"]),
                                 "--speedup", "1.5", "--runtime", runtime, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "compress: candidates" in result.stderr and "winner:" in result.stdout
    report = json.loads((out / "compress.json").read_text())
    assert report["winner"] and report["latency_table"]["runtime"] == runtime and report["candidates"]
    assert (out / "onnx" / "model.onnx").is_file() == (runtime != "torch")
    if runtime == "onnxruntime-int8":  # the int8 tables run at 40% of fp32: the unchanged model alone is 2.5x
        unchanged = next(c for c in report["candidates"] if c["origin"] == "unchanged")
        assert unchanged["runtime"] == runtime and unchanged["measured_speedup"] == pytest.approx(2.5)
        assert report["unchanged_speedup"] == pytest.approx(2.5) and unchanged["accuracy"] is not None
    winner = next(c for c in report["candidates"] if c["name"] == report["winner"])
    reloaded = surgery.from_pretrained(out)
    kept = [LayerShape(**s) for s in winner["structure"] if s is not None]
    assert Structure.from_model(reloaded).kept == kept
    assert (out / "tokenizer_config.json").exists()
    # OUT says what it holds, how fast and how accurate the winner measured, and how to serve it; inspect says the same.
    readme = (out / "README.md").read_text()
    serve = str(out / "onnx") if runtime != "torch" else str(out)
    assert f"- Serve: `{serve}`" in readme and f"{winner['measured_speedup']:.2f}x faster" in readme
    assert "```python" in readme and (f"{serve}/model.onnx" in readme) == (runtime != "torch")
    inspected = runner.invoke(app, ["inspect", str(out)])
    measured = next(line for line in readme.splitlines() if line.startswith("- Measured:"))
    assert inspected.exit_code == 0 and " ".join(measured.split()) in " ".join(inspected.stdout.split())
    if (out / "pareto.png").exists() is False:
        assert any("matplotlib" in n for n in report["notes"])


def test_cli_dry_run_changes_nothing(cli_ws: dict[str, Path], tmp_path: Path, timed_by_tables: None) -> None:
    before = digest(cli_ws["classifier"])
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(cli_ws["classifier"]), "--data", str(cli_ws["data"]),
                                 "--speedup", "2", "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    preview = json.loads(result.stdout)
    assert preview["would_cut"]["predicted_speedup"] >= 2.0 and preview["predicted_ms_original"] > 0
    assert not out.exists() and digest(cli_ws["classifier"]) == before


def test_cli_strict_exits_3_when_the_guard_fires(cli_ws: dict[str, Path], tmp_path: Path,
                                                 timed_by_tables: None) -> None:
    args = ["compress", str(cli_ws["st"]), "--data", str(cli_ws["corpus"]), "--speedup", "1.5", "--max-drop", "0"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "a"), "--strict"])
    assert result.exit_code == 3, result.output
    assert "objective: embedding" in result.stderr and "more than --max-drop 0" in result.stderr
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "b")]).exit_code == 0


def test_cli_bad_input_exits_2_in_one_line_before_loading(cli_ws: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import surgery.cli.prepare as prepare

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded inputs despite bad settings")

    monkeypatch.setattr(prepare, "prepare_inputs", never)
    model, data, out = str(cli_ws["classifier"]), str(cli_ws["data"]), str(tmp_path / "o")
    cases = [
        (["--data", data, "--out", out], "give a target"),
        (["--data", data, "--out", out, "--speedup", "0.5"], "--speedup must be more than 1"),
        (["--data", data, "--out", out, "--speedup", "2", "--runtime", "tensorrt"], "--runtime 'tensorrt'"),
        (["--data", data, "--out", out, "--speedup", "2", "--budget", "0"], "--budget must be a positive"),
        (["--data", data, "--out", out, "--speedup", "2", "--objective", "ranking"], "--objective 'ranking'"),
        (["--data", data, "--speedup", "2"], "--out is required"),
        (["--data", data, "--out", str(cli_ws["classifier"]), "--speedup", "2"], "error: "),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["compress", model, *args])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, result.stderr)
    missing = runner.invoke(app, ["compress", str(tmp_path / "nope"), "--data", data, "--speedup", "2", "--out", out])
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")
    assert not (tmp_path / "o").exists()


def test_missing_held_out_data_fails_before_any_work() -> None:
    class NoTiming:
        def table(self, model: torch.nn.Module, runtime: str) -> Any:
            raise AssertionError("measured before checking the data")

    data = tiny_task_data()
    data.eval = None
    with pytest.raises(DataError, match="no held-out data"):
        compress(tiny_model(TinySpec("bert", task="seq-cls")), data, target=SpeedupTarget(speedup=2),
                 latency=NoTiming())  # type: ignore[arg-type]
