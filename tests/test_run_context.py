"""Run state per run, the two kinds of method, and the data a method declares it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

import surgery
from surgery.core.errors import DataError, ModelLoadError, PlanError
from surgery.core.strategy import Strategy
from surgery.orchestration.pipeline import Pipeline, PipelineSession
from surgery.strategies import HeadPruningStrategy, ShrpPipeline
from surgery.testing import TinySpec, tiny_model


def test_a_context_taking_strategy_reports_through_the_context() -> None:
    model = tiny_model(TinySpec("bert"))
    strategy = HeadPruningStrategy(ratio=0.5, importance="magnitude")
    first = surgery.convert(model, strategy).metrics
    assert first["importance_kind"] == "magnitude" and "importance" in first
    assert not hasattr(strategy, "metrics") and not hasattr(strategy, "progress")


def test_a_pipeline_is_its_own_kind_with_a_schedule_not_a_plan(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    shrp = ShrpPipeline(num_layers=1)
    assert isinstance(shrp, Pipeline) and not isinstance(shrp, Strategy)
    preview = surgery.preview(model, shrp)
    assert preview["steps"] == ["expert-attention", "top1-prune"] and "not a replayable plan" in preview["note"]
    assert surgery.preview(model, HeadPruningStrategy(heads={0: [1]}))["strategy"] == "head-prune"
    with pytest.raises(PlanError, match="shrp is a pipeline"):
        surgery.apply_plan(model, shrp, {})


def test_convert_checks_the_declared_data_need_once_with_one_line() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    with pytest.raises(DataError, match="shrp trains the model and needs labelled task data") as caught:
        surgery.convert(model, ShrpPipeline(num_layers=1), data=[{"input_ids": None}])
    assert "\n" not in str(caught.value)
    with pytest.raises(DataError, match="top1-prune: data must be TaskData or an iterable"):
        surgery.convert(model, surgery.get_method("top1-prune")(), data="texts.txt")


def test_a_manifest_naming_a_pipeline_is_refused_on_load(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert"))
    surgery.convert(model, HeadPruningStrategy(heads={0: [1]}))
    out = surgery.save_pretrained(model, tmp_path / "m")
    manifest = out / "surgery.json"
    manifest.write_text(manifest.read_text().replace('"head-prune"', '"shrp"'))
    with pytest.raises(ModelLoadError, match="names 'shrp', a pipeline, not a replayable step"):
        surgery.from_pretrained(out)


def test_a_session_step_records_like_convert() -> None:
    model = tiny_model(TinySpec("bert"))
    session = PipelineSession(model)
    report = session.step(HeadPruningStrategy(heads={0: [1]}))
    assert [s.strategy for s in surgery.inspect(model).steps] == ["head-prune"]
    assert report.changes[0].after == 3 and session.merged_metrics() == {"step0:head-prune": report.metrics}
