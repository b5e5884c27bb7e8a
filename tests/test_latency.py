"""The machine fingerprint, the latency table's measurement and cache, and the side-by-side speedup.

Timing tiny models says nothing about real speed, so the tests check what timing noise cannot move:
the solver recovers a known table exactly from synthetic probe times; measured tables of every family
have the grids and the monotone predictions the search relies on; a cache hit times nothing and a
corrupt cache file is measured again; every bench report carries its machine. One small model checks
that FFN and attention time grow with width where an 8-fold FLOP difference dwarfs the noise.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.compress import latency_measure
from surgery.compress.latency_cache import default_cache_dir
from surgery.compress.latency_measure import (
    Probe,
    build_probe,
    measure_latency_table,
    measured_speedups,
    probes,
    solve_table,
)
from surgery.compress.latency_table import LatencyTable, round_up
from surgery.compress.structure import LayerShape, Structure
from surgery.core.errors import ConfigError
from surgery.measure.bench import bench_models
from surgery.measure.machine import INT8_FLAGS, SPEED_FLAGS, MachineInfo, machine_info, parse_cpuinfo
from surgery.measure.stats import median_polish
from surgery.strategies import FFNPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model
from tests.helpers import few_latency_probes, identical_graphs_traced_once

FAST = dict(batch_size=2, seq_len=8, threads=1, repeats=3, cache=False)


@pytest.fixture(autouse=True)
def short_timed_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny probes take well under a millisecond; repeating them to 50 ms per round would only cost time."""
    monkeypatch.setattr(latency_measure, "MIN_TIMED_SECONDS", 0.002)

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
physical id\t: 0
core id\t\t: 0

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
physical id\t: 0
core id\t\t: 1
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp sve i8mm bf16 sve2
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


# -- the machine --------------------------------------------------------------------------------
def test_machine_info_has_the_cpu_its_flags_versions_and_a_stable_fingerprint() -> None:
    info = machine_info()
    assert info.cpu_model and info.arch and info.system and info.torch_version == torch.__version__
    assert set(info.flags) <= set(SPEED_FLAGS) and info.int8_flags == [f for f in INT8_FLAGS if f in info.flags]
    assert info.torch_threads == torch.get_num_threads() and info.usable_cpus and info.usable_cpus >= 1
    assert len(info.fingerprint) == 12 and info.fingerprint == machine_info().fingerprint
    assert info.fingerprint == info.model_copy(update={"torch_threads": 99, "torch_version": "0"}).fingerprint
    assert info.fingerprint != info.model_copy(update={"flags": [*info.flags, "amx_int8"]}).fingerprint
    assert info.cpu_model in info.summary()


def test_cpuinfo_of_an_amx_server_and_an_arm_server() -> None:
    intel = parse_cpuinfo(X86)
    assert intel["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+" and intel["cpu_family"] == "6/143"
    assert intel["physical_cores"] == 2 and not intel["hypervisor"]
    assert MachineInfo(**intel, arch="x86_64", system="Linux").int8_flags == [
        "avx2", "avx512f", "avx512_vnni", "amx_int8"]
    arm = parse_cpuinfo(ARM)
    assert arm["cpu_model"] == "ARM implementer 0x41 part 0xd4f" and arm["vendor"] == "0x41"
    assert arm["flags"] == ["asimd", "asimddp", "i8mm", "bf16", "sve", "sve2"]


def test_without_proc_cpuinfo_the_platform_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.measure import machine

    monkeypatch.setattr(machine.Path, "is_file", lambda self: False)
    monkeypatch.setattr(machine.platform, "system", lambda: "Windows")
    facts, source = machine._cpu_facts()
    assert facts["flags"] == [] and facts["cpu_model"] and source.startswith("platform")


def test_every_bench_report_carries_the_machine_and_the_cli_prints_it(tmp_path) -> None:
    report = bench_models({"tiny": tiny_model(TinySpec("bert"))}, batch_size=2, seq_len=8, repeats=1, warmup=0,
                          threads=1)
    saved = json.loads(report.write_json(tmp_path / "bench.json").read_text())
    assert saved["machine"]["cpu_model"] == machine_info().cpu_model and saved["machine"]["torch_threads"] == 1
    model = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    result = CliRunner().invoke(app, ["bench", str(model), "--batch-size", "2", "--seq-len", "8", "--repeats", "1",
                                      "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert f"CPU: {machine_info().cpu_model}" in result.output and "int8:" in result.output


# -- solving and timing -------------------------------------------------------------------------
def test_the_solver_recovers_a_known_table_from_exact_probe_times() -> None:
    heads, width, k, layers = 8, 40, 3, 5
    base, overhead = 0.004, 0.0005

    def layer(h: int, w: int) -> float:  # seconds
        return overhead + 0.0002 * h + 0.00001 * w

    plan = probes(heads, width, k)
    seconds = {p.name: base + p.layers * layer(p.heads, p.ffn_width) for p in plan}
    seconds["model"] = base + layers * layer(heads, width)
    structure = Structure((LayerShape(heads, width),) * layers)
    table = solve_table(seconds, plan, structure, runtime="torch", batch_size=1, seq_len=1, model_key="synthetic")
    assert table.base_ms == pytest.approx(4.0) and table.overhead_ms == pytest.approx(0.5)
    assert table.attention_ms == pytest.approx({h: 0.2 * h for h in (1, 2, 4, 6, 8)})
    assert table.ffn_ms == pytest.approx({w: 0.01 * w for w in (5, 10, 20, 30, 40)})
    assert table.measured["scale"] == pytest.approx(1.0)
    uneven = Structure((LayerShape(3, 17), None, LayerShape(8, 40), LayerShape(1, 0), None))
    expected = 1000 * (base + layer(3, 17) + layer(8, 40) + layer(1, 0))
    assert table.predict_ms(uneven) == pytest.approx(expected)


@pytest.mark.parametrize("block", [1, 64])
def test_the_solver_finds_the_block_size_of_the_ffn_kernels(block: int) -> None:
    plan = probes(4, 1024, 2)
    assert [p.ffn_width for p in plan if p.name.startswith("odd")] == [65, 449]

    def layer(h: int, w: int) -> float:  # seconds; an FFN costs as much as its width rounded up to the block
        return 0.0005 + 0.0002 * h + 0.00001 * round_up(w, block)

    seconds = {p.name: 0.003 + p.layers * layer(p.heads, p.ffn_width) for p in plan}
    seconds["model"] = 0.003 + 4 * layer(4, 1024)
    table = solve_table(seconds, plan, Structure((LayerShape(4, 1024),) * 4), runtime="torch", batch_size=1,
                        seq_len=1, model_key="synthetic")
    assert table.ffn_step == block and table.measured["fit_error_by_ffn_step"][block] < 1e-9
    odd = Structure((LayerShape(3, 300),))
    assert table.predict_ms(odd) == pytest.approx(1000 * (0.003 + layer(3, 300)))


def test_round_load_is_taken_out_of_every_probe() -> None:
    levels, rounds = median_polish({"a": [1.0, 1.6, 1.0, 1.1], "b": [2.0, 3.2, 2.0, 2.2], "c": [4.0, 6.4, 4.0, 4.4]})
    assert levels["b"] / levels["a"] == pytest.approx(2.0) and levels["c"] / levels["a"] == pytest.approx(4.0)
    assert rounds[1] / rounds[0] == pytest.approx(1.6)


@pytest.mark.parametrize("family", FAMILIES)
def test_probes_of_every_family_run_and_leave_the_model_alone(family: str) -> None:
    spec = TinySpec(family, task="seq-cls", layers=3)
    model = tiny_model(spec)
    before = main_output(model, tiny_inputs(spec))
    probe = build_probe(model, Probe("width 9", 4, 2, 9), template=1)
    assert Structure.from_model(probe).to_json() == [{"heads": 2, "ffn_width": 9}] * 4
    main_output(probe, tiny_inputs(spec))
    assert Structure.from_model(model) == Structure((LayerShape(4, 37),) * 3)
    assert torch.equal(main_output(model, tiny_inputs(spec)), before)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_tables_of_every_family_have_the_grids_and_monotone_predictions(family: str) -> None:
    model = tiny_model(TinySpec(family, task="seq-cls", layers=2))
    table = measure_latency_table(model, runtime="torch", **FAST)
    assert sorted(table.attention_ms) == [1, 2, 3, 4] and sorted(table.ffn_ms) == [5, 9, 18, 28, 37]
    assert table.base_ms >= 0 and table.overhead_ms >= 0 and table.measured["model_ms"] > 0
    assert table.machine["cpu_model"] == machine_info().cpu_model and table.threads == 1
    for grid in (table.attention_ms, table.ffn_ms):
        values = [grid[k] for k in sorted(grid)]
        assert all(v >= 0 for v in values) and values == sorted(values)
    by_width = [table.predict_ms(Structure((LayerShape(4, w), LayerShape(2, 10)))) for w in range(0, 45, 3)]
    by_heads = [table.predict_ms(Structure((LayerShape(h, 37), None))) for h in range(1, 6)]
    assert by_width == sorted(by_width) and by_heads == sorted(by_heads)
    assert table.predict_ms(Structure((None, None))) == table.base_ms


@pytest.mark.slow
def test_on_a_model_large_enough_to_time_width_and_heads_cost_time() -> None:
    model = tiny_model(TinySpec("bert", heads=8, head_dim=16, layers=2, ffn=1024))
    # The head probes differ by 1-2 ms on 50-65 ms (their FFNs are full width). A fresh clone's CI beside three
    # higher-priority benchmark processes (load 6-7) once solved every head to 0 ms, at 5 rounds as at 9: a table
    # that reads heads as free is measured once more, and two such tables in a row fail.
    for _ in range(2):
        table = measure_latency_table(model, runtime="torch", batch_size=8, seq_len=64, threads=1, repeats=5,
                                      cache=False)
        if table.attention_ms[8] > table.attention_ms[1]:
            break
    assert table.ffn_ms[1024] > 2 * table.ffn_ms[128]
    assert table.attention_ms[8] > table.attention_ms[1], table.measured["probes_ms"]
    full, half = Structure.from_model(model), Structure((LayerShape(4, 512),) * 2)
    assert table.predict_ms(full) > table.predict_ms(half) > table.base_ms


@pytest.mark.slow
@pytest.mark.onnx
def test_an_int8_onnxruntime_table_of_probes_with_ffns_of_width_zero(monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    # Fewer grid points: every probe is an export of seconds. The FFNs of width 0 (base, fewest, width 0)
    # go through smoothing and int8 quantization, which used to fail on their empty products.
    few_latency_probes(monkeypatch)
    # The width-0 floor is tried on the base probe itself: that probe is traced once (its graph, then smoothed
    # and quantized for each, is what a second trace writes).
    reused = identical_graphs_traced_once(monkeypatch)
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    table = measure_latency_table(model, runtime="onnxruntime-int8", reference_runtime="torch", **FAST)
    assert table.runtime == "onnxruntime-int8" and sorted(table.attention_ms) == [1, 4] and list(table.ffn_ms) == [37]
    assert table.measured["model_ms"] > 0
    assert set(table.measured["probes_ms"]) == {"base", "fewest", "heads 1", "heads 4", "width 0", "model", "reference"}
    # The original in PyTorch, timed in the same rounds, is what a speedup across runtimes divides.
    full = Structure.from_model(model)
    assert table.reference_runtime == "torch" and table.reference_ms == table.measured["probes_ms"]["reference"]
    assert table.reference_ms > 0
    assert table.speedup(full, full) == pytest.approx(table.reference_ms / table.predict_ms(full))
    assert len(reused) == 1  # the floor's try and the base probe: one module


# -- the cache ----------------------------------------------------------------------------------
def count_timing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    timing = latency_measure.time_models

    def counted(*args, **kwargs):
        calls.append(1)
        return timing(*args, **kwargs)

    monkeypatch.setattr(latency_measure, "time_models", counted)
    return calls


def test_a_cache_hit_times_nothing_and_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch) -> None:
    calls = count_timing(monkeypatch)
    few_latency_probes(monkeypatch)  # the cache key is under test, not the grid: each probe is an ONNX export
    # A hit is checked against the model's own time (tests/test_flags_and_cache.py); at 3 rounds on a
    # loaded machine that check may rightly refuse the table, which is not what this test is about.
    monkeypatch.setattr(latency_measure, "cache_disagreement", lambda *args, **kwargs: None)
    # Layers wide enough to cost measurable time in a few short rounds under load (as the ONNX Runtime cache test
    # below): at hidden 32, batch 2 x 8 tokens, a suite at nice 15 beside a benchmark (load 5-9) measured layers
    # costing nothing, and such a table is rightly not stored (the corrupt files below then stayed as written).
    wide = {"layers": 2, "head_dim": 32, "ffn": 512}
    model = tiny_model(TinySpec("bert", **wide))
    settings = {**FAST, "batch_size": 4, "seq_len": 32, "cache": True, "cache_dir": tmp_path}
    first = measure_latency_table(model, runtime="torch", **settings)
    timed = len(calls)
    assert timed > 0 and not first.measured["cached"]
    path = tmp_path / first.measured["cache_file"].rpartition("/")[2]
    assert path.is_file() and [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    again = measure_latency_table(tiny_model(TinySpec("bert", seed=3, **wide)), runtime="torch", **settings)
    assert len(calls) == timed and again.measured["cached"]
    assert again.model_dump(exclude={"measured"}) == first.model_dump(exclude={"measured"})
    # Another shape, thread count or batch is another key.
    measure_latency_table(tiny_model(TinySpec("bert", **{**wide, "ffn": 256})), runtime="torch", **settings)
    assert len(calls) == 2 * timed and len(list(tmp_path.iterdir())) == 2
    valid_key_bad_table = {"format": 1, "key": json.loads(path.read_text())["key"], "table": {"runtime": "torch"}}
    for garbage in (b"{not json", json.dumps(valid_key_bad_table).encode(), b"\x80\x04K."):  # the last: a pickle
        path.write_bytes(garbage)
        table = measure_latency_table(model, runtime="torch", **settings)
        assert not table.measured["cached"] and table.measured["replaced_cache"].startswith(str(path))
        assert LatencyTable.model_validate(json.loads(path.read_text())["table"]).model_key == first.model_key
    assert len(calls) == 5 * timed


def test_the_cache_lives_under_surgery_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "latency"
    monkeypatch.setenv("SURGERY_CACHE", "")
    assert default_cache_dir().parts[-3:] == (".cache", "surgery", "latency")


# -- bad input and the side-by-side speedup -----------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"runtime": "tensorrt"}, "latency: runtime 'tensorrt' is not one of torch, torch-bf16, "),  # the registry's
    ({"probe_layers": 1}, "latency: probe_layers must be at least 2, got 1"),
    ({"repeats": 1}, "latency: repeats must be at least 3, got 1"),
    ({"seq_len": 500}, "latency: --seq-len 500 exceeds the 72 positions the model supports; use --seq-len 72 or less"),
])
def test_bad_settings_are_one_line_errors(kwargs, message) -> None:
    settings = {"runtime": "torch", **FAST, **kwargs}
    with pytest.raises(ConfigError) as error:
        measure_latency_table(tiny_model(TinySpec("bert")), **settings)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.onnx
def test_measured_speedup_of_an_onnxruntime_graph_against_torch() -> None:
    pytest.importorskip("onnxruntime")
    model = tiny_model(TinySpec("distilbert"))
    reports = []
    speedup, interval = measured_speedups(model, {"candidate": model}, runtime="onnxruntime", batch_size=2,
                                          seq_len=8, threads=1, repeats=3, report=reports.append)["candidate"]
    assert speedup > 0 and interval.low <= speedup <= interval.high
    assert list(reports[0].seconds) == ["original [torch]", "candidate [onnxruntime]"]
    assert reports[0].speedup("candidate [onnxruntime]")[0] == speedup


def test_measured_speedup_times_the_candidate_against_the_original() -> None:
    original = tiny_model(TinySpec("bert", heads=8, head_dim=16, ffn=1024))
    cut = tiny_model(TinySpec("bert", heads=8, head_dim=16, ffn=1024))
    _ = surgery.convert(cut, FFNPruningStrategy(neurons={0: list(range(1000)), 1: list(range(1000))}))
    reports = []
    speedup, interval = measured_speedups(original, {"candidate": cut}, runtime="torch", batch_size=8, seq_len=32,
                                          threads=1, repeats=5, report=reports.append)["candidate"]
    assert speedup > 1.2 and interval.low <= speedup <= interval.high and interval.rounds == 5
    assert list(reports[0].seconds) == ["original [torch]", "candidate [torch]"]
    assert reports[0].machine is not None and reports[0].speedup("candidate [torch]")[0] == speedup


@pytest.mark.slow
@pytest.mark.openvino
def test_a_table_timed_on_another_graph_format_of_its_runtime_is_measured_again(tmp_path, monkeypatch) -> None:
    # The key holds the runtime's graph format (Runtime.cache_key): ONNX Runtime's changed when fused attention came.
    # Run on OpenVINO, whose conversion of a probe takes a tenth of an ONNX trace; the key is every runtime's.
    pytest.importorskip("openvino")
    import surgery.compress.latency_measure as latency_measure
    from surgery.runtimes.onnx.onnx_runtime import GRAPH_FORMAT, OnnxRuntimeRuntime
    from surgery.runtimes.openvino import openvino_ir
    from surgery.runtimes.openvino.openvino_runtime import OpenVinoRuntime

    assert OnnxRuntimeRuntime().cache_key()["graph_format"] == GRAPH_FORMAT
    calls = count_timing(monkeypatch)
    few_latency_probes(monkeypatch)  # the cache key is under test, not the grid
    # A hit is checked against the model's own time (tests/test_flags_and_cache.py); at 3 rounds on a
    # loaded machine that check may rightly refuse the table, which is not what this test is about.
    monkeypatch.setattr(latency_measure, "cache_disagreement", lambda *args, **kwargs: None)
    converted: list[int] = []
    convert = openvino_ir.convert_to_ir
    monkeypatch.setattr(openvino_ir, "convert_to_ir", lambda *a, **k: converted.append(1) or convert(*a, **k))
    # Layers wide enough to cost measurable time in a few short rounds under load: at hidden 32, batch 2 x 8 tokens,
    # a fresh-clone suite at nice 19 beside a benchmark measured layers costing nothing, and such a table is rightly
    # neither stored nor read back (the second call below then measured again).
    model = tiny_model(TinySpec("bert", layers=2, head_dim=32, ffn=512))
    settings = {**FAST, "batch_size": 4, "seq_len": 32, "cache": True, "cache_dir": tmp_path}
    first = measure_latency_table(model, runtime="openvino", **settings)
    timed, exported = len(calls), len(converted)
    assert measure_latency_table(model, runtime="openvino", **settings).measured["cached"] and len(calls) == timed
    assert len(converted) == exported  # a hit exports nothing
    # The exporter changed what it writes: the old table no longer says how fast it is.
    monkeypatch.setattr(OpenVinoRuntime, "graph_format", 2)
    again = measure_latency_table(model, runtime="openvino", **settings)
    assert not again.measured["cached"] and len(calls) == 2 * timed and first.model_key == again.model_key
    assert len(converted) == 2 * exported  # measured again on graphs exported again
