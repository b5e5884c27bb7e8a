"""``surgery export``: a saved model as a runtime runs it (``--runtime``: ONNX Runtime, OpenVINO, int8 ...), checked.

The settings become one :class:`surgery.runtimes.export_config.ExportConfig` (validated once, the same
object the Python API takes) and :func:`surgery.runtimes.export_config.export` writes the artefact.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from typer.testing import CliRunner
    >>> import surgery
    >>> from surgery.cli.app import app
    >>> from surgery.testing import TinySpec, tiny_model
    >>> root = Path(tempfile.mkdtemp())
    >>> saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), root / "m")
    >>> result = CliRunner().invoke(app, ["export", str(saved), "--out", str(root / "onnx"), "--seq", "8"])
    >>> result.exit_code, sorted(p.name for p in (root / "onnx").iterdir())
    (0, ['.surgery-manifest.json', 'model.onnx', 'surgery-onnx.json'])
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from surgery.cli.console import CliState, note, quiet_datasets, stderr, stdout
from surgery.cli.inputs import has_tokenizer, load_tokenizer, read_model_config
from surgery.cli.options import (
    MAX_BATCH,
    Calibration,
    CalibrationTexts,
    EvalData,
    Int8Fp32,
    LabelColumn,
    Overwrite,
    TextColumn,
    TextPairColumn,
)
from surgery.cli.outputs import decide_outputs
from surgery.core.errors import ConfigError
from surgery.data.data_diagnosis import (
    CALIBRATION_FORMATS,
    TABLE_FORMATS,
    TABLE_SUFFIXES,
    DataWarning,
    calibration_warning,
    check_input_file,
)
from surgery.persist.assets import resolve_model_path
from surgery.persist.config_values import check_length, check_opset, check_tolerance, threads_warning
from surgery.runtimes.shared.names import CALIBRATION_TEXTS, SMOOTH_ALPHA, TASKS

FORMATS = ("graph", "onnx", "sentence-transformers", "stock")
#: --runtime's default (what a --format stock export compares with to tell that --runtime was given).
DEFAULT_RUNTIME = "onnxruntime"
#: Tokens --calibration texts are cut at when --max-length is not given (what they always were).
CALIBRATION_LENGTH = 64

if TYPE_CHECKING:  # surgery.runtimes.onnx.onnx_graph imports torch; `surgery --help` must not
    from surgery.runtimes.onnx.onnx_graph import ExportReport
    from surgery.runtimes.openvino.openvino_ir import OpenVinoExportReport


def int8_label(report: ExportReport) -> str:
    """How the graph was quantized, e.g. ``int8 (dynamic, per-channel weights)``."""
    kept = f", {', '.join(report.int8_fp32)} in fp32 ({report.int8_fp32_nodes} products)" if report.int8_fp32 else ""
    smooth = report.int8_smoothing
    smoothed = f", activations smoothed (alpha {smooth.alpha:g}, {smooth.modules} products)" if smooth else ""
    scales = "channel" if report.int8_per_channel is not False else "tensor"
    return (f"int8 ({report.int8_mode or 'dynamic'}, per-{scales} weights"
            f"{smoothed}{kept})")


def export_view(report: ExportReport, out: Path) -> RenderableType:
    """What was written and how closely it agrees with PyTorch."""
    rows = [
        ("graph", f"{report.onnx_file} ({report.onnx_bytes / 2**20:,.1f} MiB), opset {report.opset}, "
                  f"{int8_label(report) if report.int8 else 'fp32'}"),
        *record_rows(report),
    ]
    if report.fused_attention is not None:
        info = report.fused_attention
        rows.append(("fused attention", f"{len(info.layers)} of {len(info.layers) + len(info.unfused_layers)} layers "
                                        f"(num_heads {'/'.join(map(str, info.num_heads)) or '-'})"
                                        + (f"; layers {info.unfused_layers} unfused: {info.reason}"
                                           if info.unfused_layers else "")))
    if report.optimized is not None:
        fused = {k: v for k, v in report.optimized.items() if k in FUSED_OPS}
        rows.append(("optimized", ", ".join(f"{k} x{v}" for k, v in fused.items()) or "no fused operators"))
    if report.int8_drift is not None:
        rows.append(("int8 drift", f"on real tokens: max abs {report.int8_drift.max_abs_diff:.2e}, min cosine "
                                   f"{report.int8_drift.min_cosine:.6f}"))
    if report.int8_smoothing is not None:
        smooth = report.int8_smoothing
        rows.append(("calibration", f"{smooth.calibration_tokens:,} tokens in {smooth.calibration_batches} batches; "
                                    f"largest activation outlier {smooth.outlier_ratio:.1f}x the median channel"))
    elif report.int8:
        rows.append(("calibration", "none: activations quantized as they are; --calibration YOUR_TEXTS smooths "
                                    "them first (more faithful int8, see docs/deploy.md)"))
    if report.accuracy_torch is not None:
        rows.append(("accuracy", f"PyTorch fp32 {report.accuracy_torch:.2%}, this graph {report.accuracy_onnx:.2%}"))
    rows.append(("export time", f"{report.export_seconds:.1f} s"))
    return Group(_rows(f"Exported to {out}", rows))


def record_rows(report: Any) -> list[tuple[str, str]]:
    """The rows every export report shows: task, inputs, steps, the fp32 parity check and how batches are padded."""
    rows = [
        ("task", f"{report.task}: {report.model_class} -> {report.output}"),
        ("inputs", ", ".join(report.inputs) + " (dynamic batch and sequence)"),
        ("steps", ", ".join(report.steps) or "none"),
        ("parity (fp32)", f"max abs {report.parity.max_abs_diff:.2e}, min cosine {report.parity.min_cosine:.6f} "
                          f"on a padded {report.parity_batch[0]}x{report.parity_batch[1]} batch "
                          f"(tolerance {report.tolerance:g})"),
    ]
    if getattr(report, "padding", None):
        rows.append(("padding", str(report.padding)))
    return rows


def pad_multiple(value: str | None) -> int | str | None:
    """``--pad-to-multiple-of``: ``auto`` or a whole number of tokens; anything else is a one-line error.

    Example:
        >>> pad_multiple("auto"), pad_multiple("16"), pad_multiple(None)
        ('auto', 16, None)
    """
    if value is None or value == "auto":
        return value
    if not value.isdigit():
        raise ConfigError(f"--pad-to-multiple-of takes auto or a whole number of tokens (16, 64 ...), got {value!r}")
    return int(value)


#: Operators that ONNX Runtime's optimizer creates by fusing several nodes.
FUSED_OPS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization",
             "LayerNormalization", "SimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "FusedMatMul",
             "Gemm", "QAttention", "BiasSoftmax", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm")


def export_command(
    ctx: typer.Context,
    model_dir: Annotated[str | None, typer.Argument(help="Model directory, or an embedded name such as minilm-l6 "
                                                    "(not needed with --runtime list).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory to write model.onnx, the tokenizer and "
                                             "surgery-onnx.json to (new or empty).")] = None,
    runtime: Annotated[str, typer.Option("--runtime", help="How the model will run, and so what is written: "
                                         "onnxruntime (model.onnx), onnxruntime-int8, openvino (an OpenVINO IR), "
                                         "openvino-int8 (NNCF int8, needs --calibration), torch-bf16 ... (`surgery "
                                         "export --runtime list` lists them with their availability here).")
                       ] = DEFAULT_RUNTIME,
    int8: Annotated[bool, typer.Option("--int8", hidden=True, help="Replaced by --runtime onnxruntime-int8.")] = False,
    format: Annotated[str, typer.Option("--format", help="graph (or onnx, its old name): the runtime's artefact "
                                        "(model.onnx, openvino_model.xml ...) and its report; sentence-transformers: "
                                        "a directory stock SentenceTransformer(DIR, backend='onnx' or 'openvino') "
                                        "loads, for a sentence-embedding model; stock: a plain Hugging Face "
                                        "directory that AutoModel loads without surgery (uniform FFN width, dropped "
                                        "layers, all heads).")] = "graph",
    per_tensor: Annotated[bool, typer.Option("--per-tensor", help="With --runtime onnxruntime-int8: one "
                                             "weight scale per tensor instead of per output channel (less faithful, "
                                             "same speed).")] = False,
    int8_fp32: Int8Fp32 = None,
    calibration: Calibration = None,
    calibration_texts: CalibrationTexts = CALIBRATION_TEXTS,
    smooth_alpha: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="With an int8 runtime and "
                                                       "--calibration: SmoothQuant's migration strength (default: "
                                                       f"onnxruntime-int8 {SMOOTH_ALPHA}, openvino-int8 0.95).")
                            ] = None,
    optimize: Annotated[bool, typer.Option("--optimize", help="Write the graph after ONNX Runtime's offline "
                                           "optimizations (fusions).")] = False,
    fuse_attention: Annotated[bool, typer.Option("--fuse-attention/--no-fuse-attention", help="Each layer's "
                                                 "attention as one ONNX Runtime MultiHeadAttention operator with "
                                                 "its own head count (default); --no-fuse-attention writes "
                                                 "MatMul + Softmax (plain ONNX, for other runtimes).")] = True,
    int8_mode: Annotated[str, typer.Option("--int8-mode", help="With --runtime onnxruntime-int8: dynamic "
                                           "(activation scales per batch) or static (calibrated on --calibration, "
                                           "QDQ).")] = "dynamic",
    task: Annotated[str, typer.Option(help=f"Head to export: {', '.join(TASKS)} (auto: as saved).")] = "auto",
    batch: Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Parity batch: sequences.")] = 4,
    seq: Annotated[int, typer.Option(min=2, help="Parity batch: tokens per sequence (padded).")] = 32,
    tolerance: Annotated[float, typer.Option(help="fp32 parity: the largest max-abs difference accepted is "
                                             "tolerance x max(1, largest |PyTorch output| on real tokens) "
                                             "(finite, positive).")] = 1e-4,
    opset: Annotated[int | None, typer.Option(help="ONNX opset (default: the exporter's).")] = None,
    data: Annotated[str | None, typer.Option("--data", help="Labelled data; records the accuracy of PyTorch and "
                                             "of the graph on its held-out split (or rotten-tomatoes).")] = None,
    eval_data: EvalData = None,
    text_column: TextColumn = "text",
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = "label",
    max_length: Annotated[int | None, typer.Option(
        "--max-length", min=1, help="Tokens the exported tokenizer cuts texts at, and so the length --data is judged "
        "at; default: the model's own (sentence_bert_config.json's max_seq_length, else the tokenizer's, else its "
        f"positions). --calibration texts are cut at it too (default {CALIBRATION_LENGTH}).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="ONNX Runtime threads for the checks.")] = None,
    pad_to_multiple_of: Annotated[str | None, typer.Option(
        "--pad-to-multiple-of", help="Graph runtimes: serve each batch padded to a multiple of this many tokens, where "
        "that adds at most an eighth of its length (OpenVINO int8 ran 63 tokens 16% slower than 64 on an AVX-512 "
        "VNNI CPU). auto: time the artefact at the length of your --calibration texts (or --data) as it is and "
        "padded to 8/16/32/64, and pad only where that was measured faster here.")] = None,
    overwrite: Overwrite = False,
) -> None:
    """Export a model for a runtime (ONNX Runtime, OpenVINO, int8 ...), parity-checked, or as a stock HF directory."""
    import surgery

    if int8:
        raise ConfigError("--int8 is replaced by --runtime onnxruntime-int8 (one name per runtime, as bench and "
                          "compress take it)")
    if runtime == "list":
        stdout().print(runtimes_view())
        return
    if model_dir is None or out is None:
        raise ConfigError("export: give the model and --out (surgery export MODEL_DIR --out DIR), or --runtime list "
                          "to list the runtimes")
    if format not in FORMATS:
        raise ConfigError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    check_opset(opset)
    check_tolerance(tolerance)
    pad = pad_multiple(pad_to_multiple_of)
    check_input_file(calibration, "--calibration", CALIBRATION_FORMATS)
    if (too_many := threads_warning(threads)) is not None:
        note(too_many)
    for flag, given in (("--data", data), ("--eval-data", eval_data)):  # a typo: one line, before torch is imported
        check_input_file(given, flag, TABLE_FORMATS, TABLE_SUFFIXES)
    if format == "stock":
        export_stock(model_dir, out, overwrite=overwrite,
                     onnx_flags=[flag for flag, given in (("--runtime", runtime != DEFAULT_RUNTIME),
                                                          ("--calibration", calibration), ("--opset", opset),
                                                          ("--optimize", optimize), ("--data", data),
                                                          ("--task", task != "auto"),
                                                          ("--pad-to-multiple-of", pad is not None)) if given])
        return
    from pydantic import ValidationError

    from surgery.runtimes.export_config import ExportConfig

    # Every setting validated once, before anything is loaded: a setting of another runtime is one line.
    try:
        config = ExportConfig(runtime=runtime, format="sentence-transformers" if format == "sentence-transformers"
                              else "graph", task=task, calibration_texts=calibration_texts,
                              smooth_alpha=smooth_alpha, per_tensor=per_tensor, int8_fp32=tuple(int8_fp32 or ()),
                              int8_mode=int8_mode, optimize=optimize, fuse_attention=fuse_attention, opset=opset,
                              batch=batch, seq=seq, tolerance=tolerance, threads=threads,
                              pad_to_multiple_of=pad, overwrite=overwrite)
    except ValidationError as exc:  # the validators' own sentences, without pydantic's echo of every setting
        raise ConfigError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from None
    if pad == "auto" and calibration is None and data is None:
        raise ConfigError("--pad-to-multiple-of auto times the artefact at your texts' length: give --calibration "
                          "FILE or --data FILE, or a multiple (--pad-to-multiple-of 16)")
    if format == "sentence-transformers" and data is not None:
        raise ConfigError("--format sentence-transformers exports the encoder for sentence embeddings; drop --data")
    source = resolve_model_path(model_dir)
    target = cast(Path, decide_outputs([source, data, eval_data, calibration], out=("--out", out),
                                       overwrite=overwrite).directory)
    # After the cheap checks (a runtime's module imports torch), before anything is loaded: an unavailable
    # runtime (a missing extra, a CPU without the instructions) is one line.
    from surgery.runtimes import get_runtime
    from surgery.runtimes.export_config import export

    chosen = get_runtime(config.runtime)
    if calibration is not None and not chosen.needs_calibration:
        raise ConfigError(f"--calibration sets int8 activation scales; --runtime {runtime} does not use them: pick "
                          "an int8 runtime (onnxruntime-int8, openvino-int8) or drop --calibration")
    chosen.check_calibration(calibration is not None)
    model_config = read_model_config(source)
    check_length(model_config, seq, "--seq", source)
    if max_length is not None:
        check_length(model_config, max_length, "--max-length", source)
    needs = "--data" if data is not None else "--calibration" if calibration is not None else None
    tokenizer = load_tokenizer(source, required_by=needs)
    calibration_batches = calibration_texts_batches(ctx, calibration, tokenizer, max_texts=calibration_texts,
                                                    max_length=max_length or CALIBRATION_LENGTH,
                                                    text_column=text_column)
    batches = None
    if data is not None:
        from surgery.cli.prepare import DataFiles, DataOptions, load_task
        from surgery.runtimes.shared.tokenizer import serving_max_length, source_max_seq_length

        # Judged at the length the exported tokenizer cuts at (the export's own rule, so the two cannot differ):
        # an accuracy measured at 64 tokens is not the accuracy of a tokenizer that cuts at 512.
        ships = serving_max_length(model_config, tokenizer, max_length or source_max_seq_length(str(source)))
        config = config.model_copy(update={"max_length": ships})
        options = dataclasses.replace(DataOptions.from_command(ctx), max_length=ships)
        with quiet_datasets(ctx.ensure_object(CliState).debug):
            task_data = load_task(DataFiles(data, eval_data), tokenizer, options, model=(source, model_config))
        note(f"--data judged at {task_data.info['max_length']} tokens, the length the exported tokenizer cuts at")
        batches = task_data.loader("eval")
    elif max_length is not None:
        config = config.model_copy(update={"max_length": max_length})
    model = surgery.from_pretrained(source)
    sentence = None
    if format == "sentence-transformers":
        from surgery.embedding import read_sentence_config

        sentence = read_sentence_config(source)
        if sentence is None:
            raise ConfigError(f"--format sentence-transformers: {source} is not a sentence-embedding model (no "
                              "modules.json or sentence_embedding.json); use --format graph")
    with stderr().status(f"exporting for {runtime} and checking it against PyTorch"):
        report = export(model, target, config, tokenizer=tokenizer, calibration=calibration_batches, data=batches,
                        sentence_config=sentence)
    subfolder = chosen.sentence_backend or ""
    stdout().print(report_view(report, target / subfolder if sentence is not None else target))
    if sentence is not None:
        stdout().print(f"sentence-transformers directory: SentenceTransformer({str(target)!r}, backend="
                       f"'{subfolder}') loads it ({sentence.describe()}); needs sentence-transformers[{subfolder}], "
                       "not surgery", markup=False)


def runtimes_view() -> RenderableType:
    """Every registered runtime, what it is, and whether it runs here (else why, and the fix)."""
    from surgery.runtimes import available_runtimes, runtime_class
    from surgery.runtimes.runtime_registry import refused_runtimes

    table = Table(title="Runtimes (--runtime NAME)", title_justify="left")
    for column in ("runtime", "what", "here"):
        table.add_column(column)
    for name, reason in available_runtimes().items():
        try:
            what = runtime_class(name).description
        except ConfigError:
            what = ""
        table.add_row(name, Text(what), Text("available" if reason is None else reason))
    for label, why in refused_runtimes().items():  # a plugin's entry point that was not registered, and why
        table.add_row(Text(label), Text("not registered"), Text(why))
    return table


def report_view(report: object, out: Path) -> RenderableType:
    """The view of whichever report the export returned (ONNX, OpenVINO, or another runtime's artefact)."""
    from surgery.runtimes.onnx.onnx_graph import ExportReport
    from surgery.runtimes.openvino.openvino_ir import OpenVinoExportReport

    if isinstance(report, ExportReport):
        return export_view(report, out)
    if isinstance(report, OpenVinoExportReport):
        return openvino_view(report, out)
    return artefact_view(report, out)


def _rows(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, Text(value))
    return table


def openvino_view(report: OpenVinoExportReport, out: Path) -> RenderableType:
    """What the OpenVINO export wrote and how closely it agrees with PyTorch."""
    rows = [
        ("IR", f"{report.xml_file} + .bin ({report.ir_bytes / 2**20:,.1f} MiB), {report.precision}, run held to "
               f"{report.inference_precision_hint}"),
        *record_rows(report),
    ]
    if report.int8_drift is not None and report.int8_quantization is not None:
        quant = report.int8_quantization
        rows.append(("int8 drift", f"on real tokens: max abs {report.int8_drift.max_abs_diff:.2e}, mean cosine "
                                   f"{report.int8_drift.mean_cosine or 0:.6f}, min {report.int8_drift.min_cosine:.6f}"))
        rows.append(("calibration", f"NNCF {quant.model_type}, SmoothQuant alpha {quant.smooth_quant_alpha:g}: "
                                    f"{quant.calibration_texts} texts, {quant.calibration_tokens:,} tokens"))
    if report.accuracy_torch is not None:
        rows.append(("accuracy", f"PyTorch fp32 {report.accuracy_torch:.2%}, this IR {report.accuracy_openvino:.2%}"))
    rows.append(("export time", f"{report.export_seconds:.1f} s" + (f" + {report.quantize_seconds:.1f} s quantizing"
                                                                   if report.quantize_seconds else "")))
    return _rows(f"Exported to {out} (OpenVINO)", rows)


def artefact_view(artefact: Any, out: Path) -> RenderableType:
    """What a runtime without its own report wrote (``torch-bf16`` ...), and its drift from fp32 PyTorch."""
    parity = artefact.parity
    return _rows(f"Exported to {out} ({artefact.runtime})", [
        ("files", ", ".join(artefact.files)),
        ("task", f"{artefact.task} -> {artefact.output}"),
        ("against fp32", f"max abs {parity['max_abs_diff']:.2e}, mean cosine {parity['mean_cosine']:.6f}"),
        *((key, str(value)) for key, value in artefact.info.items()),
    ])


def export_stock(model_dir: str, out: Path, *, overwrite: bool, onnx_flags: list[str]) -> None:
    """``surgery export --format stock``: the model as a plain Hugging Face directory (no surgery needed to load)."""
    import surgery

    if onnx_flags:
        raise ConfigError(f"--format stock writes PyTorch weights; {', '.join(onnx_flags)} belong to the ONNX formats, "
                          "drop them")
    source = resolve_model_path(model_dir)
    target = cast(Path, decide_outputs([source], out=("--out", out), overwrite=overwrite).directory)
    from surgery.compress.stock_export import save_stock  # imports torch: after the output checks

    read_model_config(source)
    saved = save_stock(surgery.from_pretrained(source), target, overwrite=overwrite, tokenizer=load_tokenizer(source))
    loaders = "AutoModel.from_pretrained(DIR)" + (" and SentenceTransformer(DIR)" if (saved / "modules.json").is_file()
                                                  else "")
    stdout().print(f"stock Hugging Face directory {saved}: {loaders} load it without surgery", markup=False)


def calibration_texts_batches(ctx: typer.Context, calibration: str | None, tokenizer: object, *, max_texts: int,
                              max_length: int, text_column: str) -> list | None:
    """``--calibration``'s texts (a seeded sample of ``max_texts``) as tokenized batches; None without it."""
    if calibration is None:
        return None
    from surgery.embedding.texts import read_texts
    from surgery.runtimes.shared.smooth import text_calibration_batches

    with quiet_datasets(ctx.ensure_object(CliState).debug):
        texts = read_texts(calibration, text_column=text_column)
    batches = text_calibration_batches(texts, tokenizer, max_texts=max_texts, max_length=max_length)
    given = sum(len(b["input_ids"]) for b in batches)
    if (few := calibration_warning(given, sum(int(b["attention_mask"].sum()) for b in batches))) is not None:
        warnings.warn(few, DataWarning, stacklevel=2)
    return batches


def bench_tokenizer(paths: list[str], needed_by: str = "--calibration") -> object:
    """The tokenizer of the last of ``paths`` that has one (the model under test before its reference)."""
    from surgery.core.errors import ModelLoadError

    sources = [resolve_model_path(p) for p in paths]
    source = next((s for s in reversed(sources) if has_tokenizer(s)), None)
    if source is None:
        raise ModelLoadError(f"{needed_by} needs a tokenizer, but none of {', '.join(paths)} has tokenizer files")
    return load_tokenizer(source)


def bench_data(ctx: typer.Context, paths: list[str], data: str, *, text_column: str, label_column: str,
               max_length: int) -> Any:
    """``data`` tokenized with the first model's tokenizer that exists (a TaskData: its held-out split gives the
    labelled batches accuracy is read on, its texts the batches ``--lengths data`` times)."""
    from surgery.cli.prepare import DataFiles, DataOptions, load_task

    tokenizer = bench_tokenizer(paths, "--data")
    with quiet_datasets(ctx.ensure_object(CliState).debug):
        # Not DataOptions.from_command: bench's --batch-size is the benchmark's, not the data loader's.
        options = DataOptions(text_column=text_column, label_column=label_column, max_length=max_length)
        # Labels as the first model's head reads them (a classifier compared with its compressed copy).
        first = resolve_model_path(paths[0])
        return load_task(DataFiles(data), tokenizer, options, model=(first, read_model_config(first)))
