"""Writing a surgered model as a plain Hugging Face directory that loads without surgery.

A surgery save (:func:`surgery.save_pretrained`) keeps the original config and replays the recorded
plans on reload, which can rebuild any structure (uneven heads and widths, replaced layers). Stock
servers (``AutoModel.from_pretrained``, sentence-transformers' torch backend, text-embeddings-inference)
read only ``config.json``, so they can serve a surgered model only when its structure is one the
family's stock config can state: every layer keeps all its heads and the same FFN width, and
removed layers are simply fewer layers. :func:`save_stock` writes such a model as a stock directory:

* ``config.json``: the FFN width config (``intermediate_size``, or what the family's adapter names)
  set to the one kept width, ``num_hidden_layers`` to the kept layer count, and a per-layer
  ``layer_types`` list (ModernBERT's local/global pattern) cut to the kept layers;
* ``model.safetensors``: the weights. ``layer-drop`` deletes layers from the encoder's ``ModuleList``,
  so the kept layers' keys are already numbered 0..k-1; that they are exactly the stock model's keys
  and shapes is checked against the class built from the new config (on the ``meta`` device) before
  anything is written;
* the tokenizer, and sentence-transformers' module files when the source directory defines sentence
  embeddings, so ``SentenceTransformer(dir)`` loads it with its default torch backend;
* no ``surgery.json``: nothing in the directory needs surgery.

A layer whose FFN lost every neuron is written as one zero neuron (:mod:`surgery.anatomy.empty_ffn`:
exactly the same outputs), since ``intermediate_size: 0`` is a config that surgery itself refuses to
read.

What a stock config cannot say is refused in one line (:class:`~surgery.core.errors.StockFormatError`)
before anything is written; :func:`stock_structure_problem` gives the reason without raising.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from surgery.anatomy import adapter_for
from surgery.anatomy.empty_ffn import fill_empty_ffns_
from surgery.core.errors import ConfigError, StockFormatError
from surgery.core.manifest import source_dir_of, steps_of
from surgery.persist.atomic import atomic_directory
from surgery.persist.config_values import without_remote_code
from surgery.persist.model_io import WEIGHTS_NAME, output_directory, weights_dtype

__all__ = ["save_stock", "stock_config", "stock_fixed_layers", "stock_structure_problem"]

#: The transformers-wide config attribute that lists one entry per layer (ModernBERT's attention pattern).
LAYER_TYPES = "layer_types"


def _kept_origin(model: nn.Module, kept: int) -> list[int] | None:
    """Original indices of the kept layers, from the recorded ``layer-drop`` steps (None if they do not add up)."""
    from surgery.training.distill import default_layer_map

    try:
        mapping = default_layer_map(kept, int(model.config.num_hidden_layers), steps_of(model))
    except ConfigError:
        return None
    return [mapping[i] for i in range(kept)]


def stock_config(model: nn.Module) -> PretrainedConfig:
    """The stock config that states ``model``'s kept layers and FFN width (its structure is not checked here).

    Example:
        >>> import surgery
        >>> from surgery.strategies import FFNPruningStrategy, LayerDropStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("distilbert", layers=3, ffn=20))
        >>> _ = surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
        >>> _ = surgery.convert(model, LayerDropStrategy(layers=[1]))
        >>> config = stock_config(model)
        >>> config.num_hidden_layers, config.hidden_dim, model.config.num_hidden_layers
        (2, 10, 3)
    """
    adapter = adapter_for(model)
    config = without_remote_code(copy.deepcopy(model.config))  # auto_map names files that are not copied
    kept = adapter.num_layers
    origin = _kept_origin(model, kept)
    per_layer = getattr(config, LAYER_TYPES, None)
    if origin is not None and isinstance(per_layer, list) and len(per_layer) == config.num_hidden_layers:
        setattr(config, LAYER_TYPES, [per_layer[i] for i in origin])
    config.num_hidden_layers = kept
    widths = {adapter.layer(i).ffn.width for i in range(kept) if adapter.layer(i).ffn is not None}
    if len(widths) == 1:
        setattr(config, adapter.ffn_width_config, widths.pop())
    config.architectures = [type(model).__name__]
    dtype = weights_dtype(model)
    if dtype is not None:  # a model cast after loading: its config's dtype would be stale
        config.dtype = getattr(torch, dtype)
    return config


def _layer_problem(model: nn.Module) -> str | None:
    """Why the layers themselves (replaced modules, pruned heads, uneven FFN widths) are not stock."""
    adapter = adapter_for(model)
    configured = adapter.num_heads_config()
    widths: dict[int, list[int]] = {}
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        if parts.attention is None or parts.ffn is None:
            return (f"layer {i} is a {type(parts.module).__name__}, a module a strategy put there; a stock "
                    f"{model.config.model_type} config cannot describe it")
        if parts.attention.num_heads != configured:
            return (f"attention heads were pruned (layer {i} keeps {parts.attention.num_heads} of {configured}); "
                    "a stock config has one head count for every layer and transformers v5 has no pruned_heads")
        widths.setdefault(parts.ffn.width, []).append(i)
    if len(widths) > 1:
        shown = ", ".join(f"{w} in layers {layers}" for w, layers in sorted(widths.items()))
        return (f"FFN widths differ across layers ({shown}); a stock config has one {adapter.ffn_width_config}; "
                "prune every layer to the same width (ffn-prune with scope=layer)")
    return None


def _stock_skeleton(model: nn.Module, config: PretrainedConfig) -> nn.Module:
    """``model``'s class built from ``config`` on the ``meta`` device: the structure a stock load makes."""
    with torch.device("meta"):
        return type(model)._from_config(config)  # type: ignore[attr-defined]


def _key_problem(model: nn.Module, stock: nn.Module) -> str | None:
    """The first difference between ``model``'s and the stock model's weights and module types, if any."""
    mine, theirs = model.state_dict(), stock.state_dict()
    missing, extra = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
    if missing or extra:
        which = f"the stock model needs {missing[0]}, which the surgered one lacks" if missing else \
            f"the surgered model has {extra[0]}, which the stock model has no place for"
        return f"{which}; a stock config cannot rebuild this structure"
    for key, tensor in mine.items():
        if tuple(tensor.shape) != tuple(theirs[key].shape):
            return (f"{key} has shape {list(tensor.shape)} but a stock model built from the new config has "
                    f"{list(theirs[key].shape)}")
    modules = dict(model.named_modules())
    for name, module in stock.named_modules():
        if name in modules and type(modules[name]) is not type(module):
            return (f"module {name or type(model).__name__} is a {type(modules[name]).__name__} but a stock model "
                    f"has a {type(module).__name__} there")
    return None


def stock_structure_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be written as a stock Hugging Face directory; None if it can.

    Every layer must keep all its heads (a stock config has one head count and transformers v5 no
    ``pruned_heads``) and its original modules, and all layers one FFN width; removed layers are
    fine. Last, the class built from :func:`stock_config` must have exactly ``model``'s weight names,
    shapes and module types.

    Example:
        >>> import surgery
        >>> from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
        >>> stock_structure_problem(model) is None
        True
        >>> _ = surgery.convert(model, HeadPruningStrategy(heads={1: [0]}))
        >>> stock_structure_problem(model)  # doctest: +ELLIPSIS
        'attention heads were pruned (layer 1 keeps 3 of 4); a stock config has one head count ...'
    """
    if not isinstance(model, PreTrainedModel):
        raise ConfigError(f"save_stock needs a transformers model (a PreTrainedModel), got {type(model).__name__}")
    problem = _layer_problem(model)
    if problem is not None:
        return problem
    kept = adapter_for(model).num_layers
    if kept != model.config.num_hidden_layers and _kept_origin(model, kept) is None:
        return (f"the model has {kept} layers but its config {model.config.num_hidden_layers}, and its recorded steps "
                "do not say which layers were removed")
    return _key_problem(model, _stock_skeleton(model, stock_config(model)))


def _layer_signature(layer: nn.Module) -> tuple[tuple[str, str], ...]:
    """What a stock model builds at a layer's position: its submodules' names and types."""
    return tuple((name, type(module).__name__) for name, module in layer.named_modules())


def stock_fixed_layers(model: nn.Module) -> list[int]:
    """The layers a stock search may not remove: removing them would leave a layer where a stock model builds
    another kind.

    Removing layer ``i`` moves every later layer one place down, and a stock config rebuilds each
    place the way the family builds it there. Where every layer is built alike that is any layer;
    ModernBERT builds its first layer without an attention norm (``Identity``), so its layer 0 cannot
    go: layer 1 would land where a stock model has no norm, and the save would fail after the whole job.
    A layer may go only if every layer from it on is built like it.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> stock_fixed_layers(tiny_model(TinySpec("modernbert", layers=3)))
        [0]
        >>> stock_fixed_layers(tiny_model(TinySpec("bert", layers=3)))
        []
    """
    layers = adapter_for(model).layers()
    signatures = [_layer_signature(layer) for layer in layers]
    return [i for i in range(len(signatures)) if any(later != signatures[i] for later in signatures[i + 1:])]


def _served(model: nn.Module) -> nn.Module:
    """``model``, or a copy of it whose FFNs of width 0 are one zero neuron (the same outputs, a readable config)."""
    if not isinstance(model, PreTrainedModel):
        return model  # refused with its reason by stock_structure_problem
    adapter = adapter_for(model)
    if all((parts := adapter.layer(i)).ffn is None or parts.ffn.width != 0 for i in range(adapter.num_layers)):
        return model
    served = copy.deepcopy(model)  # the caller's model keeps its plans and shapes
    fill_empty_ffns_(served)
    return served


def _sentence_files(model: nn.Module, sentence_config: Any) -> Any:
    """The sentence-embedding config to write: the one given, else the source directory's (None if neither)."""
    from surgery.embedding.pooling import read_sentence_config

    source = source_dir_of(model)
    if sentence_config is not None or not source or not Path(source).is_dir():
        return sentence_config
    return read_sentence_config(source)


def save_stock(model: nn.Module, out_dir: str | os.PathLike[str], *, overwrite: bool = False,
               tokenizer: Any = None, sentence_config: Any = None,
               extra: Callable[[Path], None] | None = None) -> Path:
    """Write ``model`` as a plain Hugging Face directory that ``AutoModel.from_pretrained`` loads without surgery.

    Args:
        model: a transformers model whose structure a stock config can express (see
            :func:`stock_structure_problem`); otherwise :class:`~surgery.core.errors.StockFormatError` is
            raised and nothing is written.
        out_dir: a new (or empty) directory; never the directory the model was loaded from.
        overwrite: replace a non-empty ``out_dir`` (atomically).
        tokenizer: saved alongside; default: the tokenizer of the directory the model was loaded
            from, if it has one.
        sentence_config: a :class:`~surgery.embedding.SentenceConfig` to write sentence-transformers'
            module files for; default: the source directory's, if it defines sentence embeddings.
        extra: writes further files (reports) into the directory before it is renamed into place,
            so they land with the weights or not at all, as with ``save_pretrained``.

    Example:
        >>> import tempfile
        >>> import surgery
        >>> from surgery.strategies import FFNPruningStrategy, LayerDropStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("roberta", layers=3))
        >>> _ = surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
        >>> _ = surgery.convert(model, LayerDropStrategy(layers=[2]))
        >>> out = save_stock(model, Path(tempfile.mkdtemp()) / "stock")
        >>> sorted(p.name for p in out.iterdir())
        ['.surgery-manifest.json', 'config.json', 'model.safetensors']
        >>> from transformers import AutoModel
        >>> AutoModel.from_pretrained(out).config.num_hidden_layers
        2
    """
    model = _served(model)
    problem = stock_structure_problem(model)
    if problem is not None:
        raise StockFormatError(f"save_stock: cannot write a stock Hugging Face directory: {problem}; save it with "
                               "surgery.save_pretrained (replayed on load), or export it to ONNX")
    out = output_directory(model, out_dir)
    source = source_dir_of(model)
    if tokenizer is None and source and Path(source).is_dir():
        from surgery.persist.tokenizer_files import read_tokenizer

        tokenizer = read_tokenizer(source)
    sentence = _sentence_files(model, sentence_config)
    config = stock_config(model)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        config.save_pretrained(tmp)
        # The weight names are the stock model's (checked above): the ModuleList already renumbers kept layers.
        save_model(model, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if sentence is not None:
            from surgery.embedding.pooling import write_sentence_transformers_files

            write_sentence_transformers_files(sentence, tmp, adapter_for(model).hidden_size, source=source)
        if extra is not None:
            extra(tmp)
    return out
