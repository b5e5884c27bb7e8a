"""The removal engine and the row maps it cuts by, on all eight families (hypothesis over tiny models).

* the row maps of ``AttentionParts``/``FFNParts`` agree with the offsets the code derived by hand
  before they existed (fused ``[q | k | v]`` rows, GeGLU's two halves, per-head position rows);
* committing a removal map reversibly and restoring it gives back the very same module and
  parameter objects, a bit-identical state dict and bit-identical outputs, and while it is in
  place the model computes exactly what the permanently pruned model computes;
* ``ffn-prune`` with attribution importance and ``zero-recovery-prune`` with module set ``ffn`` are
  one cut: the same neurons go and the outputs are identical, and both plan formats replay;
* malformed removal maps are refused before anything is cut.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import surgery
from surgery.anatomy import adapter_for
from surgery.anatomy.removal import GROUPS, MODULE_GROUPS, Undo, commit_reversibly, layer_cuts, restore, units_of
from surgery.anatomy.slicing import head_rows
from surgery.core.registry import get_method, method_catalog
from surgery.strategies import (
    FFNPruningStrategy,
    ZeroRecoveryPruningConfig,
    ZeroRecoveryPruningStrategy,
)
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs
from tests.helpers import one_family_fast


def old_head_rows(attention, heads: list[int]) -> list[tuple[nn.Linear, list[int]]]:
    """The rows ``keep_heads`` cut before the row maps existed, written out as it did."""
    rows = head_rows(heads, attention.head_dim)
    if attention.qkv is not None:
        width = attention.num_heads * attention.head_dim
        return [(attention.qkv, [part * width + r for part in range(3) for r in rows]),
                *((lin, rows) for lin in attention.per_head_rows)]
    return [(lin, rows) for lin in attention.projections]


def old_part(attention, part: str) -> tuple[nn.Linear, int]:
    """The Linear and row offset of q, k or v as ``module_prune._proj`` derived them."""
    if attention.qkv is not None:
        return attention.qkv, {"q": 0, "k": 1, "v": 2}[part] * attention.num_heads * attention.head_dim
    return {"q": attention.query, "k": attention.key, "v": attention.value}[part], 0


def random_removal(model: nn.Module, seed: int, groups: tuple[str, ...] = MODULE_GROUPS) -> dict[int, dict]:
    """About half of every group's units of every layer, drawn with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    adapter = adapter_for(model)
    removal = {}
    for layer in range(adapter.num_layers):
        parts = adapter.layer(layer)
        removal[layer] = {}
        for group in groups:
            n = units_of(parts, group)
            removal[layer][group] = sorted(torch.randperm(n, generator=gen)[: n // 2].tolist())
    return removal


def position_rows_spec(family: str) -> dict:
    """Overrides giving DeBERTa-v2 separate per-head position projections (``per_head_rows``)."""
    return {"share_att_key": False} if family == "deberta-v2" else {}


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_row_maps_agree_with_the_old_offsets(family, data) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model = tiny_model(spec, **position_rows_spec(family))
    adapter = adapter_for(model)
    for layer in range(spec.layers):
        att, ffn = adapter.layer(layer).attention, adapter.layer(layer).ffn
        heads = sorted(data.draw(st.sets(st.integers(0, spec.heads - 1))))
        new = att.rows_of_heads(heads)
        old = old_head_rows(att, heads)
        assert [lin for lin, _ in new] == [lin for lin, _ in old]
        assert [rows for _, rows in new] == [rows for _, rows in old]
        assert att.columns_of_heads(heads) == head_rows(heads, spec.head_dim)
        dims = sorted(data.draw(st.sets(st.integers(0, att.width - 1))))
        for part in ("q", "k", "v"):
            linear, offset = old_part(att, part)
            assert att.projection_of(part) == (linear, offset)
            assert att.rows_of_part(part, dims) == (linear, [offset + d for d in dims])
        neurons = sorted(data.draw(st.sets(st.integers(0, ffn.width - 1))))
        old_rows = neurons + [ffn.width + j for j in neurons] if ffn.gated else neurons
        assert ffn.rows_of_neurons(neurons) == old_rows
        assert ffn.halves * ffn.width == ffn.up.out_features


@pytest.mark.parametrize("family", FAMILIES)
def test_row_maps_cover_every_row_once(family) -> None:
    spec = TinySpec(family, heads=3, head_dim=4, ffn=9)
    adapter = adapter_for(tiny_model(spec, **position_rows_spec(family)))
    att, ffn = adapter.layer(0).attention, adapter.layer(0).ffn
    for linear in att.projections:
        rows = [r for h in range(spec.heads) for lin, rs in att.rows_of_heads([h]) if lin is linear for r in rs]
        assert sorted(rows) == list(range(linear.out_features))
    assert sorted(j for n in range(ffn.width) for j in ffn.rows_of_neurons([n])) == list(range(ffn.up.out_features))
    # Cutting only v dims of a fused projection keeps all of its q and k rows.
    for linear, rows in att.rows_of_parts({"v": [1]}):
        _, v_offset = att.projection_of("v")
        assert rows == [r for r in range(v_offset) if linear is att.qkv] + [v_offset + 1]


@pytest.mark.parametrize("family", one_family_fast())
@given(data=st.data(), groups=st.sampled_from([("neurons",), ("qk", "v"), ("o",), MODULE_GROUPS]))
def test_reversible_commit_then_restore_is_exact_and_equals_the_permanent_cut(family, data, groups) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model, x = tiny_model(spec), tiny_inputs(spec)
    removal = random_removal(model, spec.seed, groups)
    originals = dict(model.named_modules())
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = main_output(model, x)

    pruned = copy.deepcopy(model)
    pruned_adapter = adapter_for(pruned)
    for layer, groups_of_layer in removal.items():
        pruned_adapter.remove_units(layer, groups_of_layer)

    adapter, undo = adapter_for(model), []
    with torch.no_grad():
        for layer, groups_of_layer in removal.items():
            parts = adapter.layer(layer)
            commit_reversibly(parts.module, layer_cuts(parts, groups_of_layer), undo)
        assert undo  # something was swapped in
        assert torch.equal(main_output(model, x), main_output(pruned, x))
        restore(undo)
        assert torch.equal(main_output(model, x), ref)
    assert dict(model.named_modules()) == originals  # the very same objects, by identity
    assert all(p is params[n] for n, p in model.named_parameters())
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)


def test_restore_deletes_what_was_absent() -> None:
    owner = nn.Module()
    undo: Undo = [(owner, "extra", None)]
    owner.extra = nn.Linear(2, 2)
    restore(undo)
    assert not hasattr(owner, "extra")


@pytest.mark.parametrize("family", one_family_fast())
@given(data=st.data(), ratio=st.floats(0.05, 0.95), min_keep=st.integers(0, 2))
def test_ffn_prune_attribution_and_zero_recovery_ffn_are_one_cut(family, data, ratio, min_keep) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("seq-cls",)))
    x = tiny_inputs(spec)
    batch = {**x, "labels": torch.tensor([0, 1, 2])}
    a, b = tiny_model(spec), tiny_model(spec)
    ffn = surgery.convert(a, FFNPruningStrategy(ratio=ratio, importance="attribution", max_batches=1,
                                                min_keep=min_keep), data=[batch])
    zr = surgery.convert(b, ZeroRecoveryPruningStrategy(module_set="ffn", ratio=ratio, min_keep=min_keep),
                         data=[batch])
    as_ffn = {layer: groups["neurons"] for layer, groups in zr.plan["remove"].items() if groups["neurons"]}
    assert as_ffn == ffn.plan["neurons"]
    assert torch.equal(main_output(a, x), main_output(b, x))
    # Either plan format replays onto a fresh model to the same result (saved models record both).
    c, d = tiny_model(spec), tiny_model(spec)
    get_method("ffn-prune")(neurons={0: []}).apply(c, ffn.plan)
    get_method("zero-recovery-prune")(module_set="ffn", ratio=0.0).apply(d, zr.plan)
    assert torch.equal(main_output(c, x), main_output(a, x)) and torch.equal(main_output(d, x), main_output(a, x))


def test_zero_recovery_prune_is_registered_under_its_name() -> None:
    assert get_method("zero-recovery-prune") is ZeroRecoveryPruningStrategy
    assert ZeroRecoveryPruningStrategy.name == "zero-recovery-prune"
    # Read without importing the module.
    assert method_catalog()["zero-recovery-prune"].summary.startswith("Prune a module set with zero-recovery")
    with pytest.raises(surgery.ConfigError, match="exactly one of 'remove' \\(explicit units\\) or 'ratio'"):
        ZeroRecoveryPruningStrategy(remove={0: {"neurons": [1]}}, ratio=0.5)
    assert ZeroRecoveryPruningConfig(ratio=0.5).module_set == "ffn"


@pytest.mark.parametrize(
    ("removal", "message"),
    [
        ({"neuron": [1]}, r"unit groups \['neuron'\] are unknown"),
        ({"heads": [0], "qk": [1]}, "'heads' and 'qk'/'v' cut the same rows"),
        ({"heads": [0, 1, 2, 3]}, "removing all 4 heads is not supported"),
        ({"o": [32]}, r"o of layer 0: indices \[32\] are out of range"),
    ],
)
def test_malformed_removal_maps_are_refused_before_any_cut(removal, message) -> None:
    spec = TinySpec("bert")
    model, x = tiny_model(spec), tiny_inputs(spec)
    ref = main_output(model, x)
    with pytest.raises(surgery.PlanError, match=message):
        adapter_for(model).remove_units(0, {"neurons": [0, 1], **removal})
    assert adapter_for(model).layer(0).ffn.width == spec.ffn and torch.equal(main_output(model, x), ref)


def test_a_zero_recovered_projection_is_not_cut_again() -> None:
    model = tiny_model(TinySpec("modernbert"))
    adapter = adapter_for(model)
    adapter.remove_units(0, {"v": [0]})
    with pytest.raises(surgery.PlanError, match="already zero-recovered"):
        adapter.remove_units(0, {"qk": [1]})
    assert set(GROUPS) == {"heads", *MODULE_GROUPS}
