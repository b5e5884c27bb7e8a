"""Batches padded to a block multiple where the runtime was measured to run that faster.

* a served graph (ONNX Runtime, OpenVINO) that pads gives the outputs it gives unpadded, trimmed to the batch;
* ``Runtime.align`` records the multiple in the export record, and loading serves it; torch does not pad;
* compress measures it on the unchanged model, times every model at the padded length, and saves the artefact
  padded, its digests taken after the record says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surgery.compress.candidates import file_digests
from surgery.runtimes import get_runtime
from surgery.runtimes.shared import alignment
from surgery.runtimes.shared.alignment import MAX_PAD_SHARE, Alignment, pad_batch, padded_length
from surgery.testing import TinySpec, tiny_inputs, tiny_model, tiny_task_data


def needs(runtime: str) -> None:
    reason = get_runtime(runtime, require_available=False).unavailable()
    if reason is not None:
        pytest.skip(f"{runtime}: {reason}")


def test_padding_never_adds_more_than_its_share_and_lands_on_the_multiple() -> None:
    for multiple in alignment.MULTIPLES:
        for length in range(1, 600):
            padded = padded_length(length, multiple)
            assert padded >= length and padded - length <= MAX_PAD_SHARE * length
            assert padded == length or padded % multiple == 0


def test_a_padded_batch_is_masked_beyond_its_own_length_also_without_a_mask() -> None:
    batch = {"input_ids": torch.full((2, 30), 7), "token_type_ids": None}
    padded, length = pad_batch(batch, 16)
    assert length == 30 and padded["input_ids"].shape == (2, 32) and padded["token_type_ids"] is None
    assert padded["attention_mask"][:, :30].all() and not padded["attention_mask"][:, 30:].any()
    assert (padded["input_ids"][:, 30:] == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [pytest.param("onnxruntime", marks=pytest.mark.onnx),
                                     pytest.param("openvino", marks=pytest.mark.openvino)])
@pytest.mark.parametrize("task", ["base", "seq-cls"])
def test_a_served_graph_that_pads_gives_the_unpadded_outputs(runtime: str, task: str, tmp_path: Path) -> None:
    needs(runtime)
    spec = TinySpec("bert", task=task)
    model = tiny_model(spec).eval()
    served = get_runtime(runtime).prepare(model, tmp_path / "artefact", threads=1)
    inputs = tiny_inputs(spec, batch=3, seq=30)
    inputs["attention_mask"][1, 20:] = 0
    name = "last_hidden_state" if task == "base" else "logits"
    with torch.inference_mode():
        plain = getattr(served(**inputs), name)
        served.pad_to_multiple_of = 16
        padded = getattr(served(**inputs), name)
        no_mask = getattr(served(input_ids=inputs["input_ids"]), name)
        served.pad_to_multiple_of = None
        no_mask_plain = getattr(served(input_ids=inputs["input_ids"]), name)
    assert padded.shape == plain.shape  # per-token outputs trimmed back to the batch's 30 tokens
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(no_mask, no_mask_plain, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.onnx
def test_align_records_the_multiple_and_loading_serves_it(tmp_path: Path) -> None:
    needs("onnxruntime")
    runtime = get_runtime("onnxruntime")
    model = tiny_model(TinySpec("bert")).eval()
    artefact = runtime.write_artefact(model, tmp_path / "artefact", threads=1)
    assert runtime.aligns and runtime.read_record(artefact.directory).pad_to_multiple_of is None
    runtime.align(artefact.directory, 16)
    assert runtime.read_record(artefact.directory).pad_to_multiple_of == 16
    assert runtime.load(artefact.directory, config=model.config, threads=1).pad_to_multiple_of == 16
    runtime.align(artefact.directory, None)
    assert runtime.load(artefact.directory, config=model.config, threads=1).pad_to_multiple_of is None
    torch_runtime = get_runtime("torch")
    assert not torch_runtime.aligns
    with pytest.raises(NotImplementedError):
        torch_runtime.align(tmp_path, 16)


@pytest.mark.slow
@pytest.mark.openvino
def test_compress_times_at_the_padded_length_and_saves_the_artefact_padded(
        timed_by_tables: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # On OpenVINO, whose conversion of a tiny model takes a tenth of an ONNX trace: how compress times and saves a
    # padded artefact is the graph runtimes' one code (surgery.runtimes.shared.graph_runtime); ONNX Runtime's padded
    # serving is checked by the tests above and below.
    needs("openvino")
    from surgery.compress import plan as plan_module
    from surgery.compress.compress_report import SpeedupTarget
    from surgery.compress.compress_run import compress
    from surgery.compress.latency_source import MeasuredLatency
    from surgery.compress.plan import plan_compress

    seen: list[int] = []

    def measured(served: torch.nn.Module, *, vocab_size: int, batch_size: int, seq_len: int, threads: int | None,
                 **_: object) -> Alignment:
        seen.append(seq_len)
        padded = -(-seq_len // 16) * 16 + 16  # a length no rule of the data gives, so its use is seen
        return Alignment(seq_len=seq_len, multiple=16, padded_len=padded, speedups={padded: 1.2})

    monkeypatch.setattr(plan_module, "measure_alignment", measured)
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    events: list = []
    plan = plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=1.5), runtime="openvino",
                         progress=events.append)
    assert plan.alignment is not None and plan.alignment.multiple == 16 and plan.seq_len == seen[0]
    assert any(e.task == "compress: alignment" for e in events)
    timed: list[int | None] = []
    tabled = MeasuredLatency.speedup  # the tables' (timed_by_tables)

    def speedup(self: MeasuredLatency, *args: object, **kwargs: object) -> object:
        timed.append(self.pad_to_multiple_of)
        return tabled(self, *args, **kwargs)

    monkeypatch.setattr(MeasuredLatency, "speedup", speedup)
    result = compress(model, tiny_task_data(), speedup=1.5, runtime="openvino", threads=1)
    assert result.report.alignment is not None and result.report.alignment["multiple"] == 16
    assert timed and set(timed) == {16}  # every speed measured as the artefact is served
    assert any("artefact pads each batch" in n for n in result.report.notes)
    assert result.artefact is not None
    runtime = get_runtime("openvino")
    assert runtime.read_record(result.artefact).pad_to_multiple_of == 16
    assert result.report.artefact == file_digests(result.artefact) == result.report.winner_result().artefact


@pytest.mark.slow
@pytest.mark.onnx
def test_export_records_an_asked_multiple_and_serves_it(tmp_path: Path) -> None:
    needs("onnxruntime")
    from surgery.runtimes.export_config import ExportConfig, export

    spec = TinySpec("bert")
    model = tiny_model(spec).eval()
    report = export(model, tmp_path / "graph", ExportConfig(runtime="onnxruntime", seq=8, pad_to_multiple_of=16))
    assert report.pad_to_multiple_of == 16 and "as asked" in (report.padding or "")
    runtime = get_runtime("onnxruntime")
    served = runtime.load(tmp_path / "graph", config=model.config, threads=1)
    assert served.pad_to_multiple_of == 16
    inputs = tiny_inputs(spec, batch=2, seq=15)
    with torch.inference_mode():
        out = served(**inputs).last_hidden_state
        reference = model(**inputs).last_hidden_state
    assert out.shape == reference.shape  # served padded to 16, trimmed back to the batch's 15 tokens
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.onnx
def test_export_auto_measures_at_the_calibration_length_and_records_what_it_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs("onnxruntime")
    from surgery.runtimes.export_config import ExportConfig, export

    seen: list[tuple[int, int]] = []

    def measured(served: torch.nn.Module, *, vocab_size: int, batch_size: int, seq_len: int, threads: int | None,
                 **_: object) -> Alignment:
        seen.append((batch_size, seq_len))
        return Alignment(seq_len=seq_len, multiple=8, padded_len=-(-seq_len // 8) * 8,
                         speedups={-(-seq_len // 8) * 8: 1.2}, intervals={-(-seq_len // 8) * 8: (1.1, 1.3)})

    monkeypatch.setattr(alignment, "measure_alignment", measured)
    spec = TinySpec("bert")
    model = tiny_model(spec).eval()
    batches = [tiny_inputs(spec, batch=4, seq=13), tiny_inputs(spec, batch=4, seq=11)]
    config = ExportConfig(runtime="onnxruntime-int8", seq=8, pad_to_multiple_of="auto", int8_mode="static")
    report = export(model, tmp_path / "graph", config, calibration=batches)
    assert seen == [(4, 12)]  # the largest batch, at the batches' mean padded length
    assert report.pad_to_multiple_of == 8 and (report.padding or "").startswith("measured at a batch of 4 x 12")

    # No padding measured to pay: none recorded, and the record says why.
    monkeypatch.setattr(alignment, "measure_alignment",
                        lambda served, **kw: Alignment(seq_len=kw["seq_len"], padded_len=kw["seq_len"],
                                                       speedups={16: 1.0}, intervals={16: (0.95, 1.05)}))
    report = export(model, tmp_path / "again", config, calibration=batches)
    assert report.pad_to_multiple_of is None and "no padding" in (report.padding or "")


def test_export_refuses_padding_where_it_cannot_apply() -> None:
    from pydantic import ValidationError

    from surgery.runtimes.export_config import ExportConfig

    with pytest.raises(ValidationError, match="serves batches as given"):
        ExportConfig(runtime="torch", pad_to_multiple_of=16)
    with pytest.raises(ValidationError, match="sentence-transformers runs the artefact as given"):
        ExportConfig(runtime="onnxruntime", format="sentence-transformers", pad_to_multiple_of=16)
    with pytest.raises(ValidationError, match="from 2 to"):
        ExportConfig(runtime="onnxruntime", pad_to_multiple_of=1)
    assert ExportConfig(runtime="onnxruntime", pad_to_multiple_of="auto").pad_to_multiple_of == "auto"


def test_export_pad_flag_errors_are_one_line_before_torch(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    code, err, imported = run_cli(["export", "minilm-l6", "--out", str(tmp_path / "o"),
                                   "--pad-to-multiple-of", "sixteen"], tmp_path)
    assert code == 2 and "--pad-to-multiple-of takes auto or a whole number" in err and "torch" not in imported
    assert len(err.strip().splitlines()) == 1
    code, err, _ = run_cli(["export", "minilm-l6", "--out", str(tmp_path / "o"), "--runtime", "openvino",
                            "--pad-to-multiple-of", "auto"], tmp_path)
    assert code == 2 and "give --calibration FILE or --data FILE" in err and len(err.strip().splitlines()) == 1
