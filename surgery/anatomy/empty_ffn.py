"""Empty FFNs as one-neuron zero blocks, for runtimes that cannot run a zero-sized product.

A layer whose FFN lost every neuron computes ``down.bias`` alone (the product over zero neurons is
zero). PyTorch and ONNX Runtime run that as it is; OpenVINO's CPU plugin returns an empty tensor for
a zero-sized matrix product, so such a layer cannot be served there. One neuron whose ``down`` column
is zero computes exactly the same thing (``act(x @ 0 + 0) * 0 == 0``), at the cost of one neuron, and
every runtime runs it.
"""

from __future__ import annotations

import torch
from torch import nn


def _zero_linear_(linear: nn.Linear, *, inputs: int | None = None, outputs: int | None = None) -> None:
    """Give ``linear`` zero weights of the new shape in place, keeping its bias (zero-extended if it grows)."""
    out_features = outputs if outputs is not None else linear.out_features
    in_features = inputs if inputs is not None else linear.in_features
    like = linear.weight
    linear.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=like.dtype, device=like.device),
                                 requires_grad=like.requires_grad)
    if linear.bias is not None and linear.bias.shape[0] != out_features:
        linear.bias = nn.Parameter(torch.zeros(out_features, dtype=like.dtype, device=like.device),
                                   requires_grad=linear.bias.requires_grad)
    linear.in_features, linear.out_features = in_features, out_features


def fill_empty_ffns_(model: nn.Module) -> list[int]:
    """Turn every FFN of width 0 into one zero neuron, in place; return the layers changed.

    The outputs are unchanged exactly; the model's plans are not (call it on a copy made for export).

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> model = tiny_model(spec).eval()
        >>> adapter_for(model).keep_neurons(1, [])
        >>> inputs = tiny_inputs(spec, batch=2, seq=5)
        >>> before = model(**inputs).last_hidden_state
        >>> fill_empty_ffns_(model), adapter_for(model).layer(1).ffn.width
        ([1], 1)
        >>> bool(torch.equal(before, model(**inputs).last_hidden_state))
        True
    """
    from surgery.anatomy import adapter_for

    adapter = adapter_for(model)
    changed = []
    for index in range(adapter.num_layers):
        ffn = adapter.layer(index).ffn
        if ffn is None or ffn.width != 0:
            continue
        _zero_linear_(ffn.up, outputs=ffn.halves)  # one row per half: GeGLU's input and gate
        _zero_linear_(ffn.down, inputs=1)  # bias kept: the layer's whole FFN output
        changed.append(index)
    return changed
