"""sentence-transformers interop: a ``SentenceTransformer`` that encodes with a surgered model.

Stock ``sentence_transformers.models.Transformer`` loads weights with ``AutoModel.from_pretrained``,
which cannot rebuild uneven heads, pruned FFNs or Expert Attention layers (it would warn about
missing keys and initialise them at random). :class:`SurgeryTransformer` is the stock module with
one change: its model comes from surgery's loader (manifest replay + strict weights), or is the
in-memory model passed to :func:`to_sentence_transformer`. Tokenization, batching, pooling and
normalisation are sentence-transformers' own.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from surgery.core.errors import ConfigError, ModelLoadError
from surgery.core.manifest import source_dir_of
from surgery.embedding.evaluate import EXTRA_HINT, encoder_of
from surgery.embedding.pooling import SentenceConfig, read_sentence_config
from surgery.persist.assets import resolve_model_path
from surgery.persist.model_io import from_pretrained
from surgery.runtimes.shared.names import SMOOTH_ALPHA

_PRELOADED = "surgery_model"  # the model_kwargs key that hands an in-memory model to the module


def _require_sentence_transformers() -> Any:
    try:
        import sentence_transformers
    except ImportError:
        raise ConfigError(f"sentence-transformers interop needs the package; install it with {EXTRA_HINT}") from None
    return sentence_transformers


def _modules() -> Any:
    """sentence-transformers' module classes (their home moved in version 6; ``models`` is the 5.x name)."""
    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


def _module_class() -> type:
    Transformer = _modules().Transformer

    class SurgeryTransformer(Transformer):
        """sentence-transformers' ``Transformer`` module whose model is loaded by surgery."""

        def _load_model(self, model_name_or_path: str, transformer_task: str, config: Any, backend: str,
                        is_peft_model: bool, **model_kwargs: Any) -> Any:
            preloaded = model_kwargs.pop(_PRELOADED, None)
            if preloaded is not None:
                return preloaded
            return encoder_of(from_pretrained(model_name_or_path))

    return SurgeryTransformer


def to_sentence_transformer(model_or_dir: nn.Module | str | os.PathLike[str], *,
                            tokenizer_dir: str | os.PathLike[str] | None = None,
                            sentence_config: SentenceConfig | None = None, device: str = "cpu") -> Any:
    """A ``SentenceTransformer`` that encodes with ``model_or_dir`` (a surgered model or its saved directory).

    The pooling and normalisation are read from the directory (``modules.json`` and
    ``1_Pooling/config.json``, or surgery's ``sentence_embedding.json``); for an in-memory model, from
    the directory it was loaded from, unless ``sentence_config`` is given. The tokenizer comes from
    the same directory, or ``tokenizer_dir``.

    Example:
        >>> import tempfile
        >>> from transformers import BertTokenizer
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> import surgery
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))  # uneven heads
        >>> d = surgery.save_pretrained(model, Path(tempfile.mkdtemp()) / "m", tokenizer=BertTokenizer(
        ...     vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])}))
        >>> st = to_sentence_transformer(d, sentence_config=SentenceConfig(modes=("mean",), normalize=True))
        >>> st.encode(["a a", "a"]).shape
        (2, 32)
    """
    _require_sentence_transformers()
    from sentence_transformers import SentenceTransformer

    Normalize, Pooling = _modules().Normalize, _modules().Pooling

    if isinstance(model_or_dir, nn.Module):
        model = model_or_dir
        source = source_dir_of(model)
        where = Path(tokenizer_dir or source or "")
        if not str(where) or not where.is_dir():
            raise ModelLoadError("to_sentence_transformer: the model was not loaded from a directory; pass "
                                 "tokenizer_dir= (a directory with its config and tokenizer) and sentence_config=")
    else:
        where = Path(tokenizer_dir) if tokenizer_dir else resolve_model_path(model_or_dir)
        model = from_pretrained(resolve_model_path(model_or_dir))
    config = sentence_config or read_sentence_config(where)
    if config is None and source_dir_of(model):
        config = read_sentence_config(source_dir_of(model))  # type: ignore[arg-type]
    if config is None:
        raise ModelLoadError(f"{where} holds no sentence-transformers pooling config (modules.json or "
                             "sentence_embedding.json); pass sentence_config=SentenceConfig(...)")
    encoder = encoder_of(model)
    first = _module_class()(str(where), model_kwargs={_PRELOADED: encoder},
                            max_seq_length=config.max_seq_length, do_lower_case=config.do_lower_case)
    modes = config.modes[0] if len(config.modes) == 1 else tuple(config.modes)
    modules: list[nn.Module] = [first, Pooling(encoder.config.hidden_size, pooling_mode=modes)]
    if config.normalize:
        modules.append(Normalize())
    return SentenceTransformer(modules=modules, device=device)


#: The subfolder where stock sentence-transformers' ONNX backend looks for ``model.onnx``.
ONNX_SUBFOLDER = "onnx"
#: The subfolder where its OpenVINO backend looks for ``openvino_model.xml``.
OPENVINO_SUBFOLDER = "openvino"


def export_sentence_transformers(model: nn.Module, out_dir: str | os.PathLike[str], *, tokenizer: Any,
                                 sentence_config: SentenceConfig | None = None, int8: bool = False,
                                 per_channel: bool = True, int8_fp32: tuple[str, ...] | list[str] = (),
                                 calibration: Any = None, smooth_alpha: float = SMOOTH_ALPHA,
                                 threads: int | None = None, fuse_attention: bool = True,
                                 int8_mode: str = "dynamic", overwrite: bool = False, backend: str = "onnx",
                                 precision: str = "f32") -> Any:
    """Write a directory that stock ``SentenceTransformer(out_dir, backend="onnx")`` loads and encodes with.

    The directory holds the encoder's graph in ``onnx/model.onnx`` (exported and parity-checked by
    :func:`surgery.runtimes.onnx.export_onnx`, optionally int8, with ``int8_fp32`` parts kept in fp32), its
    ``config.json`` and tokenizer, and
    sentence-transformers' own ``modules.json``, ``1_Pooling/config.json`` and
    ``sentence_bert_config.json``. The graph holds every weight, so the surgered structure (uneven
    heads, pruned FFNs, converted or dropped layers) needs nothing from surgery at load time: stock
    sentence-transformers with its ONNX extra (``optimum-onnx`` and ``onnxruntime``) encodes with it,
    and ``scripts/check_st_onnx_interop.sh`` checks that in a virtual environment without surgery.
    The directory holds no torch weights, so the default torch backend fails to load it instead of
    rebuilding the original shapes: load it with ``backend="onnx"``.

    ``fuse_attention`` and ``int8_mode`` pass to the export (``--no-fuse-attention``, ``--int8-mode``).
    ``backend="openvino"`` writes the OpenVINO IR to ``openvino/openvino_model.xml`` instead
    (:func:`surgery.runtimes.openvino.openvino_export.export_openvino`; ``int8`` is NNCF's, calibrated on
    ``calibration``, which it then requires; ``precision="bf16"`` records and checks the IR for bf16), for
    ``SentenceTransformer(out_dir, backend="openvino")``.
    The pooling comes from ``sentence_config``, else from the directory the model was loaded from.
    Returns the :class:`~surgery.runtimes.onnx.ExportReport` of the graph (also written as
    ``onnx/surgery-onnx.json``). The directory is written atomically.

    Example:
        >>> import tempfile
        >>> from transformers import BertTokenizer
        >>> from surgery.testing import TinySpec, tiny_model
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])})
        >>> out = Path(tempfile.mkdtemp()) / "st"
        >>> report = export_sentence_transformers(tiny_model(TinySpec("bert")), out, tokenizer=tok,
        ...                                       sentence_config=SentenceConfig(normalize=True))
        >>> sorted(p.name for p in out.iterdir())[:5], report.output
        (['.surgery-manifest.json', '1_Pooling', 'config.json', 'modules.json', 'onnx'], 'last_hidden_state')
        >>> unfused = export_sentence_transformers(tiny_model(TinySpec("bert")), out.with_name("plain"), tokenizer=tok,
        ...                                        sentence_config=SentenceConfig(), fuse_attention=False)
        >>> report.fused_attention.layers, unfused.fused_attention
        ([0, 1], None)
    """
    from surgery.embedding.pooling import write_sentence_transformers_files
    from surgery.persist.model_io import atomic_directory
    from surgery.runtimes.onnx.onnx_export import export_onnx
    from surgery.runtimes.shared.tokenizer import save_serving_tokenizer, serving_max_length

    config = sentence_config
    source = source_dir_of(model)
    if config is None and source and Path(source).is_dir():
        config = read_sentence_config(source)
    if config is None:
        raise ConfigError("export --format sentence-transformers needs a sentence-embedding model: its directory "
                          "has no modules.json or sentence_embedding.json (pass sentence_config= in Python)")
    encoder = encoder_of(model)
    if backend not in (ONNX_SUBFOLDER, OPENVINO_SUBFOLDER):  # the backends are named as their folders are
        raise ConfigError(f"export --format sentence-transformers: backend {backend!r} is not onnx or openvino")
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        if backend == OPENVINO_SUBFOLDER:  # openvino/openvino_model.xml, where backend="openvino" looks
            from surgery.runtimes.openvino.openvino_export import export_openvino

            report = export_openvino(encoder, tmp / OPENVINO_SUBFOLDER, tokenizer=tokenizer, save_tokenizer=False,
                                     write_config=False, task="base", int8=int8, calibration=calibration,
                                     smooth_quant_alpha=smooth_alpha, threads=threads, precision=precision)
        else:
            report = export_onnx(encoder, tmp / ONNX_SUBFOLDER, tokenizer=tokenizer, save_tokenizer=False,
                                 task="base", int8=int8, per_channel=per_channel, int8_fp32=int8_fp32,
                                 calibration=calibration, smooth_alpha=smooth_alpha, threads=threads,
                                 fuse_attention=fuse_attention, int8_mode=int8_mode)
        # At the top, where sentence-transformers' Transformer module reads it; truncating where it does, and
        # sentence_bert_config.json says the same length.
        limit = serving_max_length(encoder.config, tokenizer, config.max_seq_length)
        save_serving_tokenizer(tokenizer, tmp, limit)
        encoder.config.to_json_file(str(tmp / "config.json"))
        write_sentence_transformers_files(replace(config, max_seq_length=limit), tmp, encoder.config.hidden_size,
                                          source=source)
    return report
