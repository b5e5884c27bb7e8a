"""Properties of the ``expert-attention`` strategy on tiny models of every family."""

from __future__ import annotations

import copy
import gc
import math
import types
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import surgery
from surgery.anatomy import EncoderAdapter, adapter_for
from surgery.core.errors import PlanError
from surgery.strategies import ExpertAttentionStrategy, HeadPruningStrategy
from surgery.strategies.shrp.expert_attention import (
    ExpertAttentionLayer,
    balance_loss,
    expert_layers,
    symmetric_kl_to_uniform,
)
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs


def _convert(spec: TinySpec, **settings: object) -> torch.nn.Module:
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(**settings))
    return model


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_forward_backward_and_router_gradient(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model = _convert(spec, layers=[spec.layers - 1])
    inputs = tiny_inputs(spec)
    model.train()
    out = main_output(model, inputs)
    assert out.shape[0] == 3 and torch.isfinite(out).all()
    (out.float().pow(2).mean() + balance_loss(model)).backward()
    (_, layer), = expert_layers(model)
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0
    assert layer.qkv_weight.grad is not None


def _assert_experts_reproduce_heads(spec: TinySpec, model: torch.nn.Module, heads: int) -> None:
    adapter = adapter_for(model)
    original = adapter.layers()[1]
    seen: dict[str, object] = {}
    original.register_forward_pre_hook(lambda m, a, k: seen.update(args=a, kwargs=dict(k)), with_kwargs=True)
    out_proj = adapter.layer(1).attention.output
    out_proj.register_forward_pre_hook(lambda m, a: seen.update(context=a[0].detach()))
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        model(**inputs)
    gen = torch.Generator().manual_seed(0)
    from surgery.strategies.shrp.expert_attention import ExpertAttentionConfig, build_layer

    layer = build_layer(adapter, original, ExpertAttentionConfig(), heads, gen).eval()
    call = layer.parse_call(seen["args"], seen["kwargs"])
    x = layer.input_norm(call.hidden) if layer.input_norm is not None else call.hidden
    real = inputs["attention_mask"].bool()
    for head in range(heads):
        with torch.no_grad():
            mine = layer._expert(x, torch.full((3,), head), call)
        theirs = seen["context"][..., head * spec.head_dim:(head + 1) * spec.head_dim]
        torch.testing.assert_close(mine[real], theirs[real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_reproduces_its_pretrained_head(family: str) -> None:
    """Each expert's attention output equals its original head's (position terms included)."""
    spec = TinySpec(family, layers=2)
    _assert_experts_reproduce_heads(spec, tiny_model(spec), spec.heads)


def test_experts_of_a_head_pruned_mpnet_layer_read_their_own_bias_columns() -> None:
    """After head pruning, MPNet experts must use the kept heads' columns of the shared relative bias."""
    spec = TinySpec("mpnet", layers=2)
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads={1: [0, 2]}))
    _assert_experts_reproduce_heads(spec, model, spec.heads - 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_parameter_count_matches_formula(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("base",)))
    model = _convert(spec, layers=[0])
    layer = adapter_for(model).layers()[0]
    d, n, dh = spec.hidden, spec.heads, spec.head_dim
    norms = 2 * d * ((layer.input_norm is not None) + (layer.output_norm is not None))
    expected = n * 4 * dh * d - n * dh * d + n * 3 * dh + (d * n + n) + (dh * d + d + 2 * d) + norms
    assert sum(p.numel() for p in layer.parameters()) == expected


def test_mixed_batch_matches_per_sample_routing() -> None:
    spec = TinySpec("bert", layers=1)
    model = _convert(spec, layers=[0])
    layer = model.encoder.layer[0]
    inputs = tiny_inputs(spec, batch=4)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.bias.copy_(torch.tensor([0.0, 1.0, 0.0, 0.0]))  # everything to expert 1 ...
        layer.router.weight[2, 5] = 50.0  # ... unless the [CLS] feature 5 is large
        batch = main_output(model, inputs)
        singles = torch.cat([main_output(model, {k: v[i:i + 1] for k, v in inputs.items()}) for i in range(4)])
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(batch[real], singles[real], atol=1e-5, rtol=1e-4)


def test_balance_loss_matches_hand_computation() -> None:
    p = torch.tensor([0.7, 0.2, 0.1, 0.0])
    u, eps = 0.25, 1e-7
    kl_pu = sum((pi + eps) * math.log((pi + eps) / (u + eps)) for pi in p.tolist())
    kl_up = sum((u + eps) * math.log((u + eps) / (pi + eps)) for pi in p.tolist())
    assert float(symmetric_kl_to_uniform(p)) == pytest.approx(0.5 * kl_pu + 0.5 * kl_up, rel=1e-5)
    # F.kl_div(input=log q, target=t) is KL(t || q): check the direction the docs warn about.
    q = torch.tensor([0.25] * 4)
    assert float(F.kl_div(q.log(), p + eps, reduction="sum")) == pytest.approx(kl_pu, rel=1e-4)
    assert float(symmetric_kl_to_uniform(torch.full((4,), 0.25))) == 0.0


def test_balance_loss_is_zero_for_a_uniform_router() -> None:
    spec = TinySpec("bert")
    model = _convert(spec)
    for _, layer in expert_layers(model):
        with torch.no_grad():
            layer.router.weight.zero_()
            layer.router.bias.zero_()
    model(**tiny_inputs(spec))
    assert float(balance_loss(model)) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("options", [{"router_grad": "switch"}, {"router_grad": "none"}, {"top_k": 2},
                                     {"router_input": "mean", "expander": "mlp"}, {"expander_init": "random"}])
def test_options_run_and_reload(options: dict[str, object], tmp_path: object) -> None:
    spec = TinySpec("roberta", task="seq-cls")
    model = _convert(spec, **options)
    inputs = tiny_inputs(spec)
    model.train()
    main_output(model, inputs).sum().backward()
    model.eval()
    out = surgery.save_pretrained(model, tmp_path / "m")
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(model, inputs))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_save_reload_same_outputs(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    import tempfile
    from pathlib import Path

    model = _convert(spec, layers=list(range(spec.layers)))
    inputs = tiny_inputs(spec)
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = surgery.from_pretrained(surgery.save_pretrained(model, Path(tmp) / "m"))
        torch.testing.assert_close(main_output(reloaded, inputs), main_output(model, inputs))
        assert [m.usage.tolist() for _, m in expert_layers(reloaded)] == [m.usage.tolist() for _, m in
                                                                          expert_layers(model)]


def test_bypass_runs_the_original_and_is_never_saved(tmp_path: object) -> None:
    spec = TinySpec("bert", layers=2)
    model = tiny_model(spec)
    inputs = tiny_inputs(spec)
    reference = main_output(model, inputs)
    original = model.encoder.layer[1]
    surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
    layer: ExpertAttentionLayer = model.encoder.layer[1]
    layer.attach_bypass(original)
    torch.testing.assert_close(main_output(model, inputs), reference)
    assert not any(k.startswith("encoder.layer.1.bypass") for k in model.state_dict())
    out = surgery.save_pretrained(model, tmp_path / "m")
    layer.activate()
    layer.release_bypass()
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(model, inputs))


def _reachable(root: object) -> Iterator[object]:
    """Every object ``root`` references, directly or through others: instance state, containers, partials,
    closures and bound methods, but not classes, modules or a function's globals (shared by everything)."""
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.CodeType)):
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, types.FunctionType):
            stack += [cell.cell_contents for cell in obj.__closure__ or ()]
            stack += [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
        else:
            stack += gc.get_referents(obj)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_converted_layer_holds_no_reference_to_its_model_or_an_adapter(family: str) -> None:
    """The layer keeps the family's plain call functions, not the adapter (which holds the root model)."""
    spec = TinySpec(family, layers=2, task="seq-cls")
    model = tiny_model(spec)
    originals = {1: adapter_for(model).layers()[1]}
    surgery.convert(model, ExpertAttentionStrategy(layers=[0, 1]))
    from surgery.strategies.shrp import prepare_progressive

    prepare_progressive(model, originals)  # a bypassed layer holds its original layer, and only that
    with torch.no_grad():
        model(**tiny_inputs(spec))
    for _, layer in expert_layers(model):
        found = list(_reachable(layer))
        assert not any(obj is model or obj is model.base_model for obj in found)
        assert not any(isinstance(obj, EncoderAdapter) for obj in found)
        copy.deepcopy(layer)  # so copying one layer copies that layer, not the model around it
    (_, bypassed), = [(i, m) for i, m in expert_layers(model) if m.bypass is not None]
    bypassed.activate()  # re-initialises from the bypass without an adapter
    bypassed.release_bypass()


def test_converting_twice_is_refused() -> None:
    model = _convert(TinySpec("bert"), layers=[0])
    with pytest.raises(PlanError, match="layer 0"):
        surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
