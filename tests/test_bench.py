"""surgery.measure.bench on tiny models: fields, ratios, exact FLOP accounting and the warnings."""

from __future__ import annotations

import math

import pytest
import torch

import surgery
from surgery.measure.bench import (
    BenchSettings,
    Comparison,
    ModelBench,
    bench_dirs,
    bench_models,
    load_warning,
    noise_warning,
    not_faster_warning,
)
from surgery.measure.flops import count_flops
from surgery.measure.timing import make_inputs
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import TinySpec, tiny_model

FAST = {"batch_size": 2, "seq_len": 8, "repeats": 3, "warmup": 1}


def _pair(spec: TinySpec, strategy: surgery.Strategy) -> tuple[torch.nn.Module, torch.nn.Module]:
    base, pruned = tiny_model(spec), tiny_model(spec)
    surgery.convert(pruned, strategy)
    return base, pruned


def test_report_fields_are_sane() -> None:
    base, pruned = _pair(TinySpec("bert"), FFNPruningStrategy(neurons={0: list(range(20))}))
    pruned.train()
    report = bench_models({"base": base, "pruned": pruned}, threads=1, **FAST)
    assert [m.name for m in report.models] == ["base", "pruned"]
    assert [m.attention for m in report.models] == ["eager", "eager"]
    assert report.settings.threads == 1 and report.settings.batch_size == 2
    for m, model in zip(report.models, (base, pruned), strict=True):
        assert m.params == surgery.count_params(model)
        assert len(m.throughput_rounds) == 3 and m.throughput > 0
        assert 0 < m.latency_p50_ms <= m.latency_p95_ms
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # position ids etc.
        assert m.weights_bytes == 4 * m.params.total + buffers  # float32 parameters
        assert m.activation_peak_bytes is not None and m.activation_peak_bytes > 0
        assert m.peak_memory_bytes == m.weights_bytes + m.activation_peak_bytes
    assert pruned.training and not base.training  # previous mode restored
    [c] = report.comparisons
    assert (c.name, c.reference) == ("pruned", "base")


def test_ratios_are_consistent() -> None:
    base, pruned = _pair(TinySpec("roberta", task="seq-cls"), HeadPruningStrategy(heads={0: [0, 1], 1: [3]}))
    report = bench_models({"a": base, "b": pruned}, **FAST)
    a, b = report.models
    [c] = report.comparisons
    assert math.isclose(c.speedup, b.throughput / a.throughput)
    same_round = sorted(x / y for x, y in zip(b.throughput_rounds, a.throughput_rounds, strict=True))
    assert math.isclose(c.paired_speedup, same_round[1])  # median of 3 rounds
    assert c.paired_speedup_iqr[0] <= c.paired_speedup <= c.paired_speedup_iqr[1]
    assert math.isclose(c.params_ratio, b.params.total / a.params.total)
    assert math.isclose(c.params_ratio_without_embeddings, b.params.without_embeddings / a.params.without_embeddings)
    assert math.isclose(c.flops_ratio * c.flop_bound_speedup, 1.0)
    assert math.isclose(c.fraction_of_flop_bound, c.speedup / c.flop_bound_speedup)
    assert c.params_ratio < 1 and c.flops_ratio < 1


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_pruned_flops_drop_exactly_as_counted(attention: str) -> None:
    spec = TinySpec("bert", heads=4, head_dim=8, layers=2, ffn=37)
    h, hd, batch, seq = spec.hidden, spec.head_dim, 3, 11
    inputs = make_inputs(99, batch_size=batch, seq_len=seq)
    base = tiny_model(spec)
    base.config._attn_implementation = attention
    flops = count_flops(base, inputs)

    ffn = tiny_model(spec)
    ffn.config._attn_implementation = attention
    surgery.convert(ffn, FFNPruningStrategy(neurons={0: [1, 2, 3], 1: [0]}))
    # each of the 4 neurons: one row of the up and one column of the down projection, 2 FLOPs per MAC
    assert flops - count_flops(ffn, inputs) == 4 * 2 * 2 * batch * seq * h

    heads = tiny_model(spec)
    heads.config._attn_implementation = attention
    surgery.convert(heads, HeadPruningStrategy(heads={1: [0, 2]}))
    # each head: hd rows of q, k, v and hd columns of o, plus its q.k^T and attn.v matmuls
    per_head = 4 * 2 * batch * seq * h * hd + 2 * 2 * batch * seq * seq * hd
    assert flops - count_flops(heads, inputs) == 2 * per_head


def test_sdpa_and_eager_count_the_same_flops() -> None:
    # the CPU SDPA kernel has no formula in torch; bench adds one, which must agree with eager matmuls
    spec = TinySpec("bert")
    inputs = make_inputs(99, batch_size=2, seq_len=9)
    eager, sdpa = tiny_model(spec), tiny_model(spec)
    sdpa.config._attn_implementation = "sdpa"
    assert count_flops(eager, inputs) == count_flops(sdpa, inputs)


def _comparison(speedup: float, params_ratio: float, flops_ratio: float) -> Comparison:
    return Comparison(name="small", reference="big", speedup=speedup, paired_speedup=speedup,
                      paired_speedup_iqr=(speedup, speedup), params_ratio=params_ratio,
                      params_ratio_without_embeddings=params_ratio, flops_ratio=flops_ratio,
                      flop_bound_speedup=1 / flops_ratio, fraction_of_flop_bound=speedup * flops_ratio)


def test_not_faster_warning() -> None:
    message = not_faster_warning(_comparison(0.98, 0.6, 1.0))
    assert message == "small has 40% fewer parameters than big but is not faster (speedup 0.98x, paired 0.98x)"
    assert "45% fewer FLOPs" in (not_faster_warning(_comparison(1.02, 0.6, 0.55)) or "")
    assert not_faster_warning(_comparison(1.30, 0.6, 0.55)) is None  # smaller and faster
    assert not_faster_warning(_comparison(0.90, 1.0, 1.0)) is None  # not smaller: nothing promised
    paired_faster = _comparison(0.98, 0.6, 0.55).model_copy(update={"paired_speedup": 1.2})
    assert not_faster_warning(paired_faster) is None  # the steadier estimate shows the gain


def _bench(rounds: list[float]) -> ModelBench:
    return ModelBench(name="m", model_class="BertModel", params=surgery.ParamCount(total=10, without_embeddings=5),
                      flops_per_batch=1,
                      throughput=sorted(rounds)[len(rounds) // 2], throughput_rounds=rounds, latency_p50_ms=1.0,
                      latency_p95_ms=1.0, weights_bytes=40, activation_peak_bytes=None, peak_memory_bytes=None,
                      memory_method="test")


def test_noise_and_load_warnings() -> None:
    assert noise_warning(_bench([100.0, 101.0, 99.0, 100.0])) is None
    assert "vary by" in (noise_warning(_bench([50.0, 100.0, 150.0, 100.0])) or "")
    settings = BenchSettings(batch_size=1, seq_len=1, repeats=1, warmup=0, device="cpu", threads=1, seed=0,
                             torch_version="x", cpu_count=2, machine="x", load_average_before=1.0,
                             load_average_after=3.5)
    assert "load average reached 3.5 on 2 CPUs" in (load_warning(settings) or "")
    assert load_warning(settings.model_copy(update={"load_average_after": 1.5})) is None


def test_warnings_reach_the_report() -> None:
    # an unchanged copy is not smaller, so whatever the timings, no "not faster" warning may appear
    spec = TinySpec("bert")
    report = bench_models({"a": tiny_model(spec), "b": tiny_model(spec)}, **FAST)
    assert not any("not faster" in w for w in report.warnings)
    assert report.comparisons[0].flops_ratio == 1.0


def test_bench_dirs_and_bad_arguments(tmp_path) -> None:
    base, pruned = _pair(TinySpec("bert"), HeadPruningStrategy(heads={0: [1]}))
    a = surgery.save_pretrained(base, tmp_path / "a")
    b = surgery.save_pretrained(pruned, tmp_path / "b")
    report = bench_dirs([a, b], names=["base", "pruned"], **FAST)
    assert report.model("pruned").params == surgery.count_params(pruned)
    with pytest.raises(surgery.ConfigError, match="2 paths but 1 names"):
        bench_dirs([a, b], names=["x"])
    with pytest.raises(surgery.ConfigError, match="repeats must be at least 1"):
        bench_models({"a": base}, repeats=0)
    with pytest.raises(surgery.ConfigError, match="at least one model"):
        bench_models({})
