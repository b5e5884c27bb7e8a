"""ONNX Runtime pieces: the optional-dependency check, sessions, int8 quantization and graph optimization.

onnx, onnxruntime and onnxscript are an extra (``pip install 'encoder-surgery[onnx]'``); every
function here that needs them calls :func:`require_onnx` first, so a missing package is one line
that says what to install, never an ImportError traceback.
"""

from __future__ import annotations

import ast
import importlib
import os
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from surgery.core.errors import MissingDependencyError
from surgery.runtimes.shared.alignment import pad_batch, per_token_output, trim
from surgery.runtimes.shared.benched_model import BenchedRuntimeModel
from surgery.runtimes.shared.graph_export import graph_feeds, quiet_loggers
from surgery.runtimes.shared.names import ONNX_PACKAGES

INSTALL_HINT = "pip install 'encoder-surgery[onnx]'"


def require_onnx(feature: str = "ONNX export") -> None:
    """Raise a one-line :class:`MissingDependencyError` unless onnx, onnxruntime and onnxscript import.

    Example:
        >>> require_onnx()  # silent when the extra is installed
    """
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingDependencyError(
            f"{feature} needs {', '.join(missing)} (not installed); install the extra: {INSTALL_HINT}")


def make_session(path: str | os.PathLike[str], *, threads: int | None = None, optimized_to: Path | None = None,
                 level: str = "all") -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU with ``threads`` intra-op threads (default: torch's count).

    ``optimized_to`` makes ONNX Runtime write the graph after its optimizations at ``level``
    (``"basic"``, ``"extended"`` or ``"all"``) to that file.
    """
    require_onnx("ONNX Runtime inference")
    import onnxruntime as ort

    options = ort.SessionOptions()
    # The same thread count as torch, so a side-by-side benchmark compares runtimes, not core counts.
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if optimized_to is not None:
        options.optimized_model_filepath = str(optimized_to)
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def op_counts(path: str | os.PathLike[str]) -> dict[str, int]:
    """How many nodes of each operator type the ONNX graph at ``path`` has (main graph)."""
    require_onnx()
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(sorted(Counter(node.op_type for node in graph.node).items()))


def optimize_graph(src: Path, dst: Path, *, threads: int | None = None) -> dict[str, int]:
    """Write ONNX Runtime's offline-optimized graph of ``src`` to ``dst``; return its operator counts.

    The level is ``extended``: constant folding, redundant-node elimination and the transformer
    fusions (LayerNorm, SkipLayerNorm, Gelu/BiasGelu, Attention where the pattern matches, MatMul+Add
    into Gemm/FusedMatMul) that are portable across CPUs. ``all`` would add layout changes tied to
    this machine's instruction set, which a saved graph should not carry.
    """
    make_session(src, threads=threads, optimized_to=dst, level="extended")
    return op_counts(dst)


def nodes_in_modules(graph: Any, modules: Collection[str]) -> list[str]:
    """Names of the weight-product nodes (MatMul, Gemm) that the exporter traced inside any of ``modules``.

    ``torch.onnx.export(dynamo=True)`` records each node's module path in its
    ``pkg.torch.onnx.name_scopes`` metadata (``['', 'model', 'model.encoder', ...]``); ``modules``
    are qualified module names in that form.
    """
    wanted = set(modules)
    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
        if wanted.intersection(ast.literal_eval(scopes)):
            found.append(node.name)
    return found


@contextmanager
def prepared_for_quantization(src: Path, dst: Path, keep_fp32: Collection[str] = ()) -> Iterator[tuple[Path, list[str],
                                                                                                    list[str]]]:
    """``src`` as ONNX Runtime's quantizers can take it: a bare copy next to ``dst``, and the nodes to leave alone.

    Yields ``(bare graph, nodes kept in fp32 by keep_fp32, nodes to exclude)``; the copy is removed after
    the block. Shared by dynamic (:func:`quantize_int8`) and static
    (:func:`surgery.runtimes.onnx.static_int8.quantize_static_int8`) quantization, so both skip the same nodes.
    """
    import onnx

    # The exporter annotates intermediate shapes from its trace; where a routed layer's data-dependent
    # gather made one of those more specific than the graph, the quantizer's shape inference rejects
    # the graph. Without the annotations it infers them from the graph itself.
    proto = onnx.load(str(src))
    kept = nodes_in_modules(proto.graph, keep_fp32) if keep_fp32 else []
    # A product with an empty weight (an FFN pruned to width 0) has nothing to quantize, and the
    # quantizer fails on it; it stays as it is.
    empty = {t.name for t in proto.graph.initializer if 0 in t.dims}
    skipped = [n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and empty.intersection(n.input)]
    # ONNX's shape inference knows no com.microsoft operator, so it cannot type a fused MultiHeadAttention's
    # output nor anything downstream of it, and the static quantizer leaves untyped product inputs in fp32;
    # those outputs keep the exporter's annotation (always an fp32 tensor).
    contrib = {out for node in proto.graph.node if node.domain == "com.microsoft" for out in node.output}
    kept_info = [info for info in proto.graph.value_info if info.name in contrib]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept_info)
    bare = dst.with_name(dst.stem + ".bare.onnx")
    onnx.save(proto, str(bare))
    try:
        with quiet_loggers(""):  # the quantizers log a pre-processing hint on the root logger
            yield bare, kept, kept + skipped
    finally:
        bare.unlink(missing_ok=True)


def quantizer_options() -> dict[str, Any]:
    """``extra_options`` both quantizers get: products with a constant weight only, fp32 where types are unknown.

    Example:
        >>> quantizer_options()["MatMulConstBOnly"]
        True
    """
    require_onnx("int8 quantization")
    import onnx

    # Untyped tensors (downstream of a fused operator, see prepared_for_quantization) are fp32.
    return {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT}


def quantize_int8(src: Path, dst: Path, *, per_channel: bool = True, keep_fp32: Collection[str] = ()) -> list[str]:
    """ONNX Runtime dynamic quantization of ``src`` to ``dst``: int8 weights, activations quantized per batch.

    Signed int8 weights for MatMul/Gemm (and fused Attention) nodes whose second input is a constant
    weight, as in Optimum's ``AutoQuantizationConfig.avx512_vnni(is_static=False)``. Weights get one
    scale per output channel unless ``per_channel=False`` (one per tensor, what sentence-transformers'
    ``export_dynamic_quantized_onnx_model`` examples use): on all-MiniLM-L6-v2, per-channel scales
    kept mean cosine 0.992 and recall@10 0.853 against the fp32 embeddings where per-tensor kept
    0.958 and 0.715, at the same speed (2.53x against 2.49x over PyTorch fp32, one thread;
    docs/deploy.md "int8 granularity", experiments/int8/probe_int8_granularity.py). A fused
    ``MultiHeadAttention`` stays fp32; the projections around it are quantized.

    ``keep_fp32`` names modules (as in :func:`nodes_in_modules`) whose products stay in fp32; the
    names of those nodes are returned.
    """
    require_onnx("int8 quantization")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with prepared_for_quantization(src, dst, keep_fp32) as (bare, kept, excluded):
        quantize_dynamic(str(bare), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                         nodes_to_exclude=excluded, extra_options=quantizer_options())
    return kept


_OUTPUT_TYPES = {"logits": SequenceClassifierOutput, "last_hidden_state": BaseModelOutput}


class OnnxRuntimeModel(nn.Module):
    """An exported ONNX graph in ONNX Runtime, callable like the Hugging Face model it came from.

    ``model(input_ids=..., attention_mask=...)`` returns ``.logits`` or ``.last_hidden_state``
    as torch tensors, so evaluation and benchmark code written for torch models runs unchanged.
    Inputs the graph was not exported with are ignored; ``attention_mask`` and ``token_type_ids``
    default to ones and zeros when the graph has them and the caller does not pass them.

    :func:`surgery.runtimes.onnx.export_onnx` writes such a graph and checks it with this class; its
    docstring shows it in use.
    """

    def __init__(self, path: str | os.PathLike[str], *, config: Any, output: str = "last_hidden_state",
                 threads: int | None = None, task: str | None = None, pad_to_multiple_of: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.config = config
        self.output = output
        self.task = task
        #: batches are padded to a multiple of this where it pays (measured: surgery.runtimes.shared.alignment)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.session = make_session(self.path, threads=threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        # No weights live in torch; this empty parameter only tells device-aware callers "cpu".
        self.device_anchor = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **_: Any) -> Any:
        given, length = pad_batch({"input_ids": input_ids, "attention_mask": attention_mask,
                                   "token_type_ids": token_type_ids}, self.pad_to_multiple_of)
        (result,) = self.session.run([self.output], graph_feeds(given, self.input_names))
        tensor = trim(torch.from_numpy(result), length, per_token_output(self.output, self.task))
        if self.output == "logits" and self.task == "mlm":
            return MaskedLMOutput(logits=tensor)
        return _OUTPUT_TYPES[self.output](**{self.output: tensor})

    def file_bytes(self) -> int:
        """Size of the ONNX file (with external data, if any, next to it)."""
        extra = self.path.with_name(self.path.name + ".data")
        return self.path.stat().st_size + (extra.stat().st_size if extra.exists() else 0)


def BenchedOnnxModel(path: str | os.PathLike[str], source: nn.Module, *, output: str, task: str,
                     threads: int | None) -> BenchedRuntimeModel:
    """An ONNX graph in ONNX Runtime as a bench row of ``source`` (named like the class it used to be)."""
    served = OnnxRuntimeModel(path, config=source.config, output=output, threads=threads, task=task)
    return BenchedRuntimeModel(served, source, runtime="onnxruntime", artefact_bytes=served.file_bytes())
