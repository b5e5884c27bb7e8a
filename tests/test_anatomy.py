"""The anatomy adapters: uniform view of all eight families, bare and task models, and family quirks.

Covers what the property tests cannot see from outside: DeBERTa-v2's position projections in
every configuration, MPNet's per-layer slice of the shared relative bias across several pruning
steps, ModernBERT's fused qkv and GeGLU layout, head bookkeeping attributes, and the error for an
unsupported model.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch import nn

import surgery
from surgery.anatomy import adapter_for
from surgery.anatomy.mpnet import BIAS_HEADS, slice_position_bias
from surgery.anatomy.slicing import head_rows
from surgery.core.registry import ENCODER_GROUP, adapters
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import FAMILIES, VOCAB, TinySpec, main_output, tiny_inputs, tiny_model

ADAPTER_OF = {
    "bert": "BertAdapter", "roberta": "BertAdapter", "xlm-roberta": "BertAdapter", "electra": "BertAdapter",
    "distilbert": "DistilBertAdapter", "mpnet": "MPNetAdapter", "deberta-v2": "DebertaV2Adapter",
    "modernbert": "ModernBertAdapter",
}
SPEC = {"heads": 4, "head_dim": 4, "layers": 3, "ffn": 10}


def masked_copy(model: nn.Module, heads: dict[int, list[int]]) -> nn.Module:
    """A copy of ``model`` with the given heads zeroed at the output projection's input."""
    reference = copy.deepcopy(model)
    adapter = adapter_for(reference)
    with torch.no_grad():
        for layer, units in heads.items():
            output, columns = adapter.head_output_columns(layer, units)
            output.weight[:, columns] = 0
    return reference


def assert_masking_equivalent(model: nn.Module, spec: TinySpec, heads: dict[int, list[int]]) -> None:
    reference = masked_copy(model, heads)
    surgery.convert(model, HeadPruningStrategy(heads=heads))
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        assert torch.allclose(main_output(model, inputs), main_output(reference, inputs), atol=1e-5, rtol=0)


def test_every_family_is_registered_through_entry_points() -> None:
    table = adapters()
    assert {t: cls.__name__ for t, cls in table.items() if t in ADAPTER_OF} == ADAPTER_OF


@pytest.mark.parametrize("task", ["base", "seq-cls", "mlm"])
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_view_of_bare_and_task_models(family: str, task: str) -> None:
    spec = TinySpec(family, task=task, **SPEC)
    model = tiny_model(spec)
    adapter = adapter_for(model)
    assert type(adapter).__name__ == ADAPTER_OF[family]
    assert adapter.base is model.base_model and type(adapter.base).__name__.endswith("Model")
    assert adapter.num_layers == spec.layers and adapter.hidden_size == spec.hidden
    assert adapter.head_dim() == spec.head_dim and adapter.num_heads_config() == spec.heads
    for i in range(spec.layers):
        parts = adapter.layer(i)
        assert parts.index == i and parts.module is adapter.layers()[i]
        att, ffn = parts.attention, parts.ffn
        assert (att.num_heads, att.head_dim, ffn.width, ffn.gated) == (4, 4, 10, family == "modernbert")
        assert all(isinstance(p, nn.Linear) for p in att.projections) and isinstance(att.output, nn.Linear)
        assert sum(p.out_features for p in att.projections) == 3 * spec.hidden
        assert att.output.in_features == spec.hidden and ffn.down.in_features == 10
        assert set(parts.norms) == {"attention", "ffn"}
        assert all(m in set(parts.module.modules()) for m in (*att.projections, att.output, ffn.up, ffn.down))
    anatomy = surgery.inspect(model)
    assert (anatomy.model_type, anatomy.model_class) == (model.config.model_type, type(model).__name__)
    assert [(la.heads, la.head_dim, la.ffn_width) for la in anatomy.layers] == [(4, 4, 10)] * spec.layers
    assert anatomy.params.total > anatomy.params.without_embeddings > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_head_bookkeeping_follows_pruning(family: str) -> None:
    spec = TinySpec(family, **SPEC)
    model = tiny_model(spec)
    adapter = adapter_for(model)
    assert_masking_equivalent(model, spec, {0: [1, 2], 2: [3]})
    for layer, heads in ((0, 2), (1, 4), (2, 3)):
        module = adapter.layer(layer).attention.module
        assert adapter.layer(layer).attention.num_heads == heads
        for attr in ("num_attention_heads", "n_heads"):
            if hasattr(module, attr):
                assert getattr(module, attr) == heads
        if hasattr(module, "all_head_size"):
            assert module.all_head_size == heads * spec.head_dim
    with pytest.raises(surgery.PlanError, match=r"layer 3 does not exist; this model has layers 0\.\.2"):
        adapter.layer(3)


# -- DeBERTa-v2 ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "position_rows"),
    [
        ({}, 0),  # as v3 checkpoints: shared key/query position projections, c2p|p2c, buckets
        ({"share_att_key": False}, 2),
        ({"share_att_key": False, "pos_att_type": ["c2p"]}, 1),
        ({"share_att_key": False, "pos_att_type": ["p2c"], "position_buckets": -1}, 1),
        ({"relative_attention": False, "pos_att_type": None}, 0),
    ],
)
def test_deberta_position_projections_are_cut_per_head(overrides: dict, position_rows: int) -> None:
    spec = TinySpec("deberta-v2", task="seq-cls", **SPEC)
    model = tiny_model(spec, **overrides)
    adapter = adapter_for(model)
    parts = adapter.layer(0).attention
    assert len(parts.per_head_rows) == position_rows
    before = surgery.count_params(model).total
    heads = {0: [0, 2], 1: [3], 2: [0, 1, 2]}
    assert_masking_equivalent(model, spec, heads)
    d, hd = spec.hidden, spec.head_dim
    per_head = (3 + position_rows) * (d * hd + hd) + hd * d
    assert before - surgery.count_params(model).total == 6 * per_head
    for proj in adapter.layer(2).attention.per_head_rows:
        assert proj.weight.shape == (hd, d)


# -- MPNet ---------------------------------------------------------------------------------
def test_mpnet_bias_columns_compose_over_steps_and_survive_copies() -> None:
    spec = TinySpec("mpnet", task="seq-cls", **SPEC)
    model = tiny_model(spec)
    reference = masked_copy(model, {0: [0, 2], 1: [1, 2, 3]})
    surgery.convert(model, HeadPruningStrategy(heads={0: [0], 1: [1]}))  # layer 0 keeps 1,2,3; layer 1 keeps 0,2,3
    surgery.convert(model, HeadPruningStrategy(heads={0: [1], 1: [1, 2]}))  # current 1 = original 2; 2 = original 3
    adapter = adapter_for(model)
    modules = [adapter.layer(i).attention.module for i in range(3)]
    assert [getattr(m, BIAS_HEADS, None) is not None for m in modules] == [True, True, False]
    assert modules[0].bias_heads.tolist() == [1, 3] and modules[1].bias_heads.tolist() == [0]
    assert [list(m._forward_pre_hooks.values()).count(slice_position_bias) for m in modules] == [1, 1, 0]
    assert not any(BIAS_HEADS in key for key in model.state_dict())  # rebuilt by replay, never saved
    # The shared table keeps one column per original head; every layer still reads it.
    assert model.mpnet.encoder.relative_attention_bias.weight.shape == (32, spec.heads)
    inputs = tiny_inputs(spec)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        expected = main_output(reference, inputs)
        assert torch.allclose(main_output(model, inputs), expected, atol=1e-5, rtol=0)
        assert torch.equal(main_output(clone, inputs), main_output(model, inputs))


def test_mpnet_hook_reads_position_bias_by_keyword_too() -> None:
    spec = TinySpec("mpnet", **SPEC)
    model = tiny_model(spec)
    adapter_for(model).keep_heads(0, [3])
    attention = model.encoder.layer[0].attention.attn
    hidden = torch.randn(2, 5, spec.hidden)
    bias = torch.randn(2, spec.heads, 5, 5)
    with torch.no_grad():
        positional = attention(hidden, None, bias)[0]
        keyword = attention(hidden, attention_mask=None, position_bias=bias)[0]
    assert torch.equal(positional, keyword)


# -- ModernBERT ------------------------------------------------------------------------------
def test_modernbert_fused_qkv_and_geglu_layout() -> None:
    spec = TinySpec("modernbert", task="mlm", **SPEC)
    model = tiny_model(spec)
    adapter = adapter_for(model)
    assert isinstance(adapter.layer(0).norms["attention"], nn.Identity)
    assert isinstance(adapter.layer(1).norms["attention"], nn.LayerNorm)
    wqkv = adapter.layer(1).attention.qkv.weight.detach().clone()
    wi = adapter.layer(1).ffn.up.weight.detach().clone()
    adapter.keep_heads(1, [0, 3])
    adapter.keep_neurons(1, [2, 7])
    width = spec.hidden
    expected_rows = [part * width + r for part in range(3) for r in head_rows([0, 3], spec.head_dim)]
    assert torch.equal(adapter.layer(1).attention.qkv.weight, wqkv[expected_rows])
    assert torch.equal(adapter.layer(1).ffn.up.weight, wi[[2, 7, 12, 17]])  # input half j, gate half j + 10
    assert adapter.layer(1).attention.num_heads == 2 and adapter.layer(1).ffn.width == 2
    with torch.no_grad():
        assert main_output(model, tiny_inputs(spec)).shape == (3, 7, VOCAB)


def test_report_counts_each_family_unit_cost_by_hand() -> None:
    # hidden 16, head_dim 4, ffn 10: numbers written out, independent of any helper.
    expected = {
        "bert": (268, 33), "roberta": (268, 33), "xlm-roberta": (268, 33), "electra": (268, 33),
        "distilbert": (268, 33), "mpnet": (268, 33), "deberta-v2": (268, 33),
        "modernbert": (256, 48),  # no biases; Wi has two rows per neuron
    }
    for family, (head, neuron) in expected.items():
        model = tiny_model(TinySpec(family, **SPEC))
        heads = surgery.convert(model, HeadPruningStrategy(heads={1: [2]}))
        neurons = surgery.convert(model, FFNPruningStrategy(neurons={2: [0, 9]}))
        assert heads.params_before.total - heads.params_after.total == head, family
        assert neurons.params_before.total - neurons.params_after.total == 2 * neuron, family


# -- unsupported models ----------------------------------------------------------------------
def test_unknown_model_names_supported_types_and_entry_point_group() -> None:
    config = transformers.GPT2Config(vocab_size=99, n_embd=16, n_layer=1, n_head=2, n_positions=16)
    model = transformers.GPT2Model(config)
    for call in (adapter_for, surgery.inspect, lambda m: surgery.convert(m, HeadPruningStrategy(heads={0: [0]}))):
        with pytest.raises(surgery.UnsupportedModelError) as info:
            call(model)
        message = str(info.value)
        assert "'gpt2'" in message and ENCODER_GROUP in message and "\n" not in message
        assert all(family in message for family in FAMILIES)
    with pytest.raises(surgery.UnsupportedModelError, match="not a Hugging Face transformers model"):
        adapter_for(nn.Linear(2, 2))


# -- torch-pruning's dependency graph as an independent oracle ------------------------------
def coupled(model: nn.Module, spec: TinySpec, root: nn.Linear, outputs: bool, idxs: list[int]) -> dict:
    """What torch-pruning's traced dependency graph couples to removing ``idxs`` of ``root``."""
    import torch_pruning as tp

    graph = tp.DependencyGraph().build_dependency(model, example_inputs=dict(tiny_inputs(spec)))
    fn = tp.prune_linear_out_channels if outputs else tp.prune_linear_in_channels
    found = {}
    for dep, indices in graph.get_pruning_group(root, fn, idxs=idxs):
        if isinstance(dep.target.module, nn.Linear):
            kind = "out" if dep.handler.__name__ == "prune_out_channels" else "in"
            found[(id(dep.target.module), kind)] = sorted(int(i) for i in indices)
    return found


@pytest.mark.parametrize(
    ("family", "overrides"),
    [(f, {}) for f in FAMILIES if f not in ("mpnet", "modernbert")] + [("deberta-v2", {"share_att_key": False})],
)
def test_head_coupling_agrees_with_torch_pruning(family: str, overrides: dict) -> None:
    # MPNet and ModernBERT are left out on purpose: the traced graph couples MPNet's heads across
    # all layers through the shared bias, and cuts only the q rows of ModernBERT's fused Wqkv.
    spec = TinySpec(family, heads=4, head_dim=4, layers=2, ffn=6)
    model = tiny_model(spec, **overrides)
    att = adapter_for(model).layer(1).attention
    rows = head_rows([2], spec.head_dim)
    expected = {(id(p), "out"): rows for p in att.projections} | {(id(att.output), "in"): rows}
    assert coupled(model, spec, att.query, True, rows) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_neuron_coupling_agrees_with_torch_pruning(family: str) -> None:
    spec = TinySpec(family, heads=2, head_dim=4, layers=1, ffn=6)
    model = tiny_model(spec)
    ffn = adapter_for(model).layer(0).ffn
    up_rows = [4, 4 + ffn.width] if ffn.gated else [4]
    assert coupled(model, spec, ffn.down, False, [4]) == {(id(ffn.up), "out"): up_rows, (id(ffn.down), "in"): [4]}
