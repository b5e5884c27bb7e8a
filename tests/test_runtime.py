"""Unplug and play: experts swap in smaller layers and restore the full model bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from surgery.anatomy import adapter_for
from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
from surgery.strategies.doe.zero_recovery_prune import group_width
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs


def random_expert(model, name: str, groups: tuple[str, ...], seed: int) -> TaskExpert:
    gen = torch.Generator().manual_seed(seed)
    adapter = adapter_for(model)
    remove = {}
    for layer in range(adapter.num_layers):
        remove[layer] = {}
        for g in groups:
            n = group_width(adapter, layer, g)
            remove[layer][g] = sorted(torch.randperm(n, generator=gen)[: n // 2].tolist())
    dim = model.get_input_embeddings().weight.shape[1]
    head = {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()
            if not n.startswith(model.base_model_prefix + ".")}
    return TaskExpert(name, remove, prompt=torch.randn(4, dim, generator=gen), head=head)


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data(), groups=st.sampled_from([("neurons",), ("qk", "v", "o", "neurons")]))
def test_use_then_restore_is_bit_identical(family, data, groups) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("seq-cls",)))
    model, x = tiny_model(spec), tiny_inputs(spec)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = main_output(model, x)
    runtime = UnplugRuntime(model, [random_expert(model, "a", groups, spec.seed)])
    with runtime.use("a"):
        inside = main_output(model, x)
        widths = [adapter_for(model).layer(i).ffn.width for i in range(spec.layers)]
    assert widths == [spec.ffn - spec.ffn // 2] * spec.layers  # physically smaller inside
    assert inside.shape == ref.shape and not torch.equal(inside, ref)
    with pytest.raises(RuntimeError), runtime.use("a"):
        raise RuntimeError("body failed")
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)
    assert torch.equal(main_output(model, x), ref)


def test_save_and_reload_runtime(tmp_path) -> None:
    spec = TinySpec("bert", task="seq-cls")
    model, x = tiny_model(spec), tiny_inputs(spec)
    runtime = UnplugRuntime(model, [random_expert(model, "sst2", ("neurons",), 1),
                                    random_expert(model, "plot", ("qk", "v", "o", "neurons"), 2)])
    outs = {}
    for name in runtime.experts:
        with runtime.use(name):
            outs[name] = main_output(model, x)
    runtime.save(tmp_path / "rt")
    assert sorted(p.name for p in (tmp_path / "rt" / "experts").iterdir()) == [
        "plot.json", "plot.safetensors", "sst2.json", "sst2.safetensors"]
    loaded = UnplugRuntime.load(tmp_path / "rt")
    for name, out in outs.items():
        with loaded.use(name) as m:
            assert torch.allclose(main_output(m, x), out, atol=1e-6)
    latency = loaded.switch_latency("sst2", repeats=3)
    assert latency["plug_ms"] > 0 and latency["restore_ms"] >= 0


def test_runtime_save_is_atomic(tmp_path, monkeypatch) -> None:
    """The experts are written inside the model's atomic save: a failure leaves nothing behind."""
    import surgery.strategies.doe.unplug as unplug

    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec)
    runtime = UnplugRuntime(model, [random_expert(model, "sst2", ("neurons",), 1)])

    def broken(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(unplug, "save_file", broken)
    with pytest.raises(OSError):
        runtime.save(tmp_path / "rt")
    assert not (tmp_path / "rt").exists() and list(tmp_path.iterdir()) == []
