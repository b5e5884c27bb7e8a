"""``expert-attention``: replace whole encoder layers by routed single-head experts (SHRP, §3.1).

An Expert Attention layer replaces a layer's attention **and** its FFN. Every pretrained head
becomes an expert with its own Q/K/V (``d -> d_head``), a router on the [CLS] state (or a masked
mean) picks one expert per *sequence*, the expert's head output goes through a small shared
Expander (``d_head -> d``, GELU, LayerNorm) and ``Y = LayerNorm(E + X)``.

Design notes:

* Expert weights are stacked (``qkv_weight[N, 3*d_head, d]``); a mixed batch gathers each
  sequence's expert and runs one ``bmm``. Because the stack is one parameter, it is always "used"
  in a step; only whole layers that are bypassed produce unused parameters (see ``shrp``).
* The forward value of the routed layer is exactly ``E_sel`` (no probability weighting). The
  router learns through a straight-through gate ``E * (1 + p - p.detach())`` by default.
* Family specifics (how the encoder calls a layer, masks, per-head position terms, the return
  value) come from the family's :class:`~surgery.anatomy.calling.CallingConvention`, never from
  module names here. The layer keeps only its plain functions: it holds no adapter and no model, so
  a converted layer and the model it sits in do not reference each other.
* A layer can carry a *bypass*: the original layer, run instead of the experts until the layer is
  activated (progressive conversion). The bypass is training state only: it never enters the state
  dict, so saving always writes the converted layer that the manifest rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from surgery.anatomy import AttentionParts, EncoderAdapter, adapter_for
from surgery.anatomy.calling import CallingConvention, LayerCall, Projection
from surgery.anatomy.parts import QKV
from surgery.anatomy.slicing import check_indices, head_rows
from surgery.core.errors import PlanError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy, StrategyConfig

RouterInput = Literal["cls", "mean"]
RouterGrad = Literal["straight-through", "switch", "none"]
ExpanderKind = Literal["linear", "mlp"]
ExpanderInit = Literal["random", "output"]
BALANCE_EPS = 1e-7


class Expander(nn.Module):
    """The shared Expander: ``LayerNorm(GELU(W h + b))`` (SHRP) or ``W2 GELU(W1 h)`` (first paper).

    Example:
        >>> Expander(8, 32, kind="linear")(torch.ones(2, 3, 8)).shape
        torch.Size([2, 3, 32])
    """

    def __init__(self, head_dim: int, hidden: int, *, kind: ExpanderKind = "linear", inner: int | None = None,
                 eps: float = 1e-12) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear":
            self.dense = nn.Linear(head_dim, hidden)
            self.norm: nn.Module = nn.LayerNorm(hidden, eps=eps)
            self.inner = None
        else:
            self.inner = nn.Linear(head_dim, inner or 4 * hidden)
            self.dense = nn.Linear(inner or 4 * hidden, hidden)
            self.norm = nn.Identity()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            return self.dense(F.gelu(self.inner(h)))
        return self.norm(F.gelu(self.dense(h)))


class ExpertAttentionLayer(nn.Module):
    """One Expert Attention layer: N single-head experts, a Top-k router and a shared Expander.

    With ``routed=False`` (after Top-1 pruning to one expert) there is no router: the layer is a
    static single-head layer. The forward takes the encoder's own call signature; the family's
    adapter translates it.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> import surgery
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
        >>> layer = model.encoder.layer[1]
        >>> layer.num_experts, model(**tiny_inputs(TinySpec("bert"))).last_hidden_state.shape
        (4, torch.Size([3, 7, 32]))
    """

    def __init__(
        self,
        convention: CallingConvention,
        *,
        hidden: int,
        num_experts: int,
        head_dim: int,
        routed: bool = True,
        router_input: RouterInput = "cls",
        router_grad: RouterGrad = "straight-through",
        top_k: int = 1,
        expander: ExpanderKind = "linear",
        expander_inner: int | None = None,
    ) -> None:
        super().__init__()
        # How the encoder calls the layer this one replaces, and what it expects back: the family's
        # plain functions (no adapter, no model), so the layer holds no reference to its model.
        self.parse_call: Callable[[tuple[Any, ...], dict[str, Any]], LayerCall] = convention.parse
        self.shape_result: Callable[[torch.Tensor, LayerCall], Any] = convention.result
        eps = float(getattr(convention.output_norm or convention.input_norm, "eps", 1e-12) or 1e-12)
        self.hidden, self.head_dim, self.scale = hidden, head_dim, convention.scale
        self.router_input, self.router_grad, self.top_k = router_input, router_grad, top_k
        self.qkv_weight = nn.Parameter(torch.empty(num_experts, 3 * head_dim, hidden))
        self.qkv_bias = nn.Parameter(torch.zeros(num_experts, 3 * head_dim))
        self.router = nn.Linear(hidden, num_experts) if routed else None
        self.expander = Expander(head_dim, hidden, kind=expander, inner=expander_inner, eps=eps)
        self.input_norm = nn.LayerNorm(hidden, eps=eps) if convention.input_norm is not None else None
        # Post-LN families (BERT ...): Y = LayerNorm(E + X), as in the paper. Pre-LN families keep
        # their form: the input is normed before the experts and Y = X + E.
        self.output_norm = nn.LayerNorm(hidden, eps=eps) if convention.output_norm is not None else None
        self.dropout = nn.Dropout(convention.dropout)
        # Which original head each expert came from (rebuilt by the plans, so not persisted); it
        # selects the per-head position term of families such as MPNet (after head pruning, the
        # kept heads' columns of the shared table).
        columns = convention.head_bias_columns
        self.register_buffer("head_index", torch.arange(num_experts) if columns is None else
                             torch.as_tensor(columns, dtype=torch.long), persistent=False)
        # Argmax choices per expert since conversion; saved with the model (usage-based pruning).
        self.register_buffer("usage", torch.zeros(num_experts, dtype=torch.long))
        # Experts the router may still pick (progressive expert dropping masks the others out while
        # training goes on). Training state only: a reload has every recorded expert allowed.
        self.register_buffer("allowed", torch.ones(num_experts, dtype=torch.bool), persistent=False)
        # Its count as a Python int: forward branches on it without reading a tensor, which keeps the
        # layer traceable by torch.export (ONNX export) and avoids a device sync per step.
        self.num_allowed = num_experts
        self.track_usage = True
        self.last_probs: torch.Tensor | None = None
        self.last_choice: torch.Tensor | None = None
        self.bypass: nn.Module | None = None
        self.active = True
        # Where the experts' heads and norms sit inside the layer this one replaced (submodule paths,
        # set by build_layer): re-initialising from a bypass reads them there, without an adapter.
        self.source: HeadSource | None = None
        for name, value in convention.attributes.items():  # what the encoder reads from its layers
            setattr(self, name, value)
        self._register_state_dict_hook(_drop_bypass_keys)

    # -- bookkeeping -------------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return int(self.qkv_weight.shape[0])

    @property
    def routed(self) -> bool:
        return self.router is not None

    def anatomy_summary(self) -> dict[str, Any]:
        """What ``surgery.inspect`` shows for this layer."""
        return {"kind": "expert-attention" if self.routed else "single-head", "heads": 1,
                "head_dim": self.head_dim, "ffn_width": None, "experts": self.num_experts,
                "top_k": self.top_k if self.routed else 1, "usage": self.usage.tolist()}

    def attach_bypass(self, original: nn.Module) -> None:
        """Run ``original`` instead of the experts until :meth:`activate` (progressive training)."""
        self.bypass = original
        self.active = False

    @torch.no_grad()
    def activate(self, reinit_from_bypass: bool = True) -> None:
        """Switch from the bypass to the experts, re-initialising them from the bypass's current heads."""
        if self.bypass is not None and reinit_from_bypass:
            if self.source is None:
                raise PlanError("activate: this layer does not know where its heads came from (it was not made by "
                                "build_layer); pass reinit_from_bypass=False")
            init_from_layer(self, self.source.found_in(self.bypass))
        self.active = True

    @torch.no_grad()
    def restrict_experts(self, allowed: list[int]) -> None:
        """Let the router pick only experts ``allowed`` from now on (the others keep their weights).

        Progressive expert dropping calls this while training continues; ``top1-prune`` later removes
        the masked experts physically, and since they can never be picked that changes no output.
        """
        if not allowed:
            raise PlanError("restrict_experts: keep at least one expert")
        check_indices(allowed, self.num_experts, "restrict_experts: experts")
        self.allowed.zero_()
        self.allowed[torch.as_tensor(allowed, dtype=torch.long, device=self.allowed.device)] = True
        self.num_allowed = int(self.allowed.sum())

    def release_bypass(self) -> None:
        """Drop the original layer for good (end of training): the layer is now exactly what a reload builds."""
        self.bypass = None
        self.active = True

    # -- forward -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.bypass is not None and not self.active:
            return self.bypass(*args, **kwargs)
        call = self.parse_call(args, kwargs)
        x = call.hidden
        inp = self.input_norm(x) if self.input_norm is not None else x
        if self.router is None:
            e = self.expander(self._expert(inp, None, call))
            self.last_probs = self.last_choice = None
        else:
            logits = self.router(self._pool(x, call))
            if self.num_allowed < self.num_experts:
                logits = logits.masked_fill(~self.allowed, float("-inf"))
            probs = logits.float().softmax(-1)
            self.last_probs = probs
            if self.top_k == 1:
                choice = logits.argmax(-1)
                e = self.expander(self._expert(inp, choice, call))
                p_sel = probs.gather(1, choice[:, None]).to(e.dtype)[:, :, None]
                if self.router_grad == "straight-through":
                    e = e * (1.0 + p_sel - p_sel.detach())
                elif self.router_grad == "switch":
                    e = e * p_sel
            else:
                top_p, top_i = probs.topk(min(self.top_k, self.num_allowed), dim=-1)
                weights = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)
                choice = top_i[:, 0]
                e = sum(weights[:, j, None, None] * self.expander(self._expert(inp, top_i[:, j], call))
                        for j in range(top_i.shape[1]))
            self.last_choice = choice.detach()
            if self.track_usage:
                self.usage.index_add_(0, choice.detach(), torch.ones_like(choice))
        out = self.dropout(e) + x
        if self.output_norm is not None:
            out = self.output_norm(out)
        return self.shape_result(out, call)

    def _pool(self, x: torch.Tensor, call: LayerCall) -> torch.Tensor:
        if self.router_input == "cls":
            return x[:, 0]
        keep = call.key_mask()
        if keep is None:
            return x.mean(1)
        w = keep.to(x.dtype)[:, :, None]
        return (x * w).sum(1) / w.sum(1).clamp_min(1.0)

    def _expert(self, x: torch.Tensor, choice: torch.Tensor | None, call: LayerCall) -> torch.Tensor:
        """Head output ``[B, S, d_head]`` of each sequence's expert (``choice=None``: the only expert)."""
        b = x.shape[0]
        if choice is None:
            qkv = F.linear(x, self.qkv_weight[0], self.qkv_bias[0])
            heads = self.head_index[:1].expand(b)
            weight, w_bias = self.qkv_weight[:1].expand(b, -1, -1), self.qkv_bias[:1].expand(b, -1)
        else:
            weight = self.qkv_weight.index_select(0, choice)  # [B, 3*dh, d]
            w_bias = self.qkv_bias.index_select(0, choice)
            qkv = torch.baddbmm(w_bias[:, None, :], x, weight.transpose(1, 2))
            heads = self.head_index.index_select(0, choice)
        q, k, v = (t.unsqueeze(1) for t in qkv.split(self.head_dim, dim=-1))  # [B, 1, S, dh]
        if call.rotary is not None:
            q, k = call.rotary(q, k)
        bias = call.attention_bias
        if call.head_bias is not None:
            hb = call.head_bias
            per_head = hb[torch.arange(b, device=x.device) if hb.shape[0] == b else 0, heads][:, None]
            bias = per_head if bias is None else bias + per_head
        if call.head_scores is not None:  # family-specific position scores from the expert's own projections
            extra_scores = call.head_scores(q, k, self._projection(weight, w_bias, 0),
                                            self._projection(weight, w_bias, 1))
            bias = extra_scores if bias is None else bias + extra_scores
        if bias is not None:
            bias = bias.to(q.dtype)
        p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, scale=self.scale)
        return out[:, 0]

    def _projection(self, weight: torch.Tensor, bias: torch.Tensor, part: int) -> Projection:
        """Each sequence's expert projection ``part`` (0 query, 1 key, 2 value) of its stacked ``[B, 3*dh, d]`` rows."""
        rows = slice(part * self.head_dim, (part + 1) * self.head_dim)
        return partial(project_rows, weight=weight[:, rows], bias=bias[:, rows])

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, head_dim={self.head_dim}, hidden={self.hidden}, "
                f"routed={self.routed}, router_input={self.router_input}, top_k={self.top_k}")


def project_rows(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Rows ``[R, d]`` through per-sequence projections ``weight [B, dh, d]``, ``bias [B, dh]``: ``[B, R, dh]``.

    Example:
        >>> project_rows(torch.ones(5, 3), torch.ones(2, 4, 3), torch.zeros(2, 4)).shape
        torch.Size([2, 5, 4])
    """
    return torch.einsum("rd,bhd->brh", rows, weight) + bias[:, None]


def _drop_bypass_keys(module: ExpertAttentionLayer, state: dict[str, Any], prefix: str, _meta: Any) -> None:
    for key in [k for k in state if k.startswith(prefix + "bypass.")]:
        del state[key]


@dataclass(frozen=True)
class SubmodulePath:
    """A submodule of a layer, named by its dotted path in it (``""``: the layer itself)."""

    path: str


@dataclass(frozen=True)
class HeadSource:
    """What experts are initialised from: a layer's attention parts and its input and closing norms.

    :meth:`within` turns it into paths inside the layer (an Expert Attention layer keeps that form, which
    holds no module), and :meth:`found_in` turns those back into the modules of a layer of the same shape.

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> original = model.encoder.layer[0]
        >>> source = HeadSource(adapter_for(model).attention_parts(original), output_norm=original.output.LayerNorm)
        >>> paths = source.within(original)
        >>> paths.output_norm, paths.found_in(original).attention.query is original.attention.self.query
        (SubmodulePath(path='output.LayerNorm'), True)
    """

    attention: AttentionParts
    input_norm: nn.Module | None = None
    output_norm: nn.Module | None = None

    def within(self, layer: nn.Module) -> HeadSource:
        """This source with every module replaced by its :class:`SubmodulePath` inside ``layer``."""
        names = {id(m): name for name, m in layer.named_modules()}

        def path(module: nn.Module) -> SubmodulePath:
            if id(module) not in names:
                raise PlanError(f"{type(module).__name__} is not inside {type(layer).__name__}; experts are "
                                "initialised from the layer they replace only")
            return SubmodulePath(names[id(module)])

        return _map_parts(self, nn.Module, path)

    def found_in(self, layer: nn.Module) -> HeadSource:
        """This source (in paths, from :meth:`within`) with the paths resolved to ``layer``'s submodules."""
        return _map_parts(self, SubmodulePath, lambda p: layer.get_submodule(p.path))


def _map_parts(value: Any, kind: type, swap: Callable[[Any], Any]) -> Any:
    """``value`` with every ``kind`` in it (through dataclass fields and tuples) replaced by ``swap(it)``."""
    if isinstance(value, kind):
        return swap(value)
    if isinstance(value, tuple):
        return tuple(_map_parts(v, kind, swap) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: _map_parts(getattr(value, f.name), kind, swap)
                                 for f in fields(value) if f.init})
    return value


@torch.no_grad()
def init_from_layer(layer: ExpertAttentionLayer, source: HeadSource, heads: list[int] | None = None,
                    expander_init: ExpanderInit | None = None) -> None:
    """Copy the pretrained heads (Q/K/V rows and bias) and the norms of ``source`` into ``layer``."""
    attention = source.attention
    # Expert e starts as the original's current head e (head_index may instead hold shared-bias columns).
    heads = heads if heads is not None else list(range(layer.num_experts))
    hd = attention.head_dim
    for e, h in enumerate(heads):
        for j, part in enumerate(QKV):
            lin, rows = attention.rows_of_part(part, head_rows([h], hd))
            idx = torch.as_tensor(rows, device=lin.weight.device)
            layer.qkv_weight[e, j * hd:(j + 1) * hd].copy_(lin.weight.index_select(0, idx))
            if lin.bias is not None:
                layer.qkv_bias[e, j * hd:(j + 1) * hd].copy_(lin.bias.index_select(0, idx))
            else:
                layer.qkv_bias[e, j * hd:(j + 1) * hd].zero_()
    for mine, theirs in ((layer.output_norm, source.output_norm), (layer.input_norm, source.input_norm)):
        if mine is not None and theirs is not None:
            mine.weight.copy_(theirs.weight)
            if getattr(theirs, "bias", None) is not None:
                mine.bias.copy_(theirs.bias)
            else:
                mine.bias.zero_()
    if expander_init == "output" and layer.expander.inner is None:
        # The mean of the heads' slices of the output projection: each expert starts by writing what
        # an average head wrote into the residual stream.
        out = attention.output.weight.view(attention.output.out_features, attention.num_heads, hd)
        layer.expander.dense.weight.copy_(out.mean(1) * attention.num_heads ** 0.5)
        if attention.output.bias is not None:
            layer.expander.dense.bias.copy_(attention.output.bias)


class ExpertAttentionConfig(StrategyConfig):
    """Settings of ``expert-attention``.

    Example:
        >>> ExpertAttentionConfig(layers=[4, 5]).router_grad
        'straight-through'
    """

    layers: list[int] | None = Field(default=None, description="layers to convert (default: all)")
    router_input: RouterInput = Field(default="cls", description="route on the [CLS] state or a masked mean")
    router_grad: RouterGrad = Field(default="straight-through", description="how the router gets task gradient")
    top_k: int = Field(default=1, ge=1, description="experts per sequence (k > 1: the top-k ablation)")
    expander: ExpanderKind = Field(default="linear", description="SHRP linear expander or the first paper's MLP")
    expander_inner: int | None = Field(default=None, ge=1, description="MLP expander width (default: the FFN's)")
    # "output" measured better than "random" in SHRP on MiniLM-L6 + Rotten Tomatoes (docs/results.md#shrp).
    expander_init: ExpanderInit = Field(default="output", description="from the heads' output-projection slices "
                                        "(mean), or random")
    # The Expander ends in a LayerNorm, so at γ=1 every token gets a unit-variance update, about three
    # times the whole residual update of a MiniLM-L6 layer (std 0.3 on inputs of std 0.6): it swamps the
    # layer input, and the converted model's embeddings start nearly orthogonal to the original's
    # (mean cosine 0.04 with 3 of 6 layers converted, 0.37 at γ=0.1; experiments/embeddings/results/embed.md).
    expander_gain: float = Field(default=1.0, ge=0.0, description="initial γ of the Expander's LayerNorm (the "
                                 "scale of what each token's update starts at; the paper's 1)")
    seed: int = Field(default=0, description="seed of the random expander/router initialisation")

    @field_validator("layers")
    @classmethod
    def _distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("layers must be distinct")
        return value


class ExpertAttentionStrategy(Strategy):
    """Convert encoder layers to Expert Attention (one expert per pretrained head).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> import surgery
        >>> model = tiny_model(TinySpec("bert", layers=2))
        >>> report = surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
        >>> surgery.inspect(model).layers[0].kind
        'expert-attention'
    """

    name = "expert-attention"
    trained_after = True  # fresh experts: the pipeline that converts trains them next
    config_class = ExpertAttentionConfig
    config: ExpertAttentionConfig

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        adapter = adapter_for(model)
        layers = self.config.layers if self.config.layers is not None else list(range(adapter.num_layers))
        check_indices(layers, adapter.num_layers, f"{self.name}: layers")
        experts = {}
        for i in layers:
            attention = adapter.layer(i).attention
            if attention is None or adapter.layer(i).ffn is None:
                raise PlanError(f"{self.name}: layer {i} is not a standard layer any more; convert each layer once")
            experts[str(i)] = attention.num_heads
        return {"layers": list(layers), "experts": experts, "head_dim": adapter.head_dim()}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        adapter = adapter_for(model)
        layers = [int(i) for i in plan["layers"]]
        check_indices(layers, adapter.num_layers, f"{self.name}: plan layers")
        changes = []
        gen = torch.Generator().manual_seed(self.config.seed)
        for i in layers:
            parts = adapter.layer(i)
            if parts.attention is None or parts.ffn is None:
                raise PlanError(f"{self.name}: layer {i} is not a standard layer; it was converted already")
            new = build_layer(adapter, parts.module, self.config, int(plan["experts"][str(i)]), gen)
            before = sum(p.numel() for p in parts.module.parameters())
            adapter.layers()[i] = new
            changes.append(LayerChange(layer=i, component="layer", before=before,
                                       after=sum(p.numel() for p in new.parameters()),
                                       note=f"expert attention, {new.num_experts} experts"))
        return changes


def build_layer(adapter: EncoderAdapter, original: nn.Module, config: ExpertAttentionConfig, num_experts: int,
                gen: torch.Generator) -> ExpertAttentionLayer:
    """An Expert Attention layer for ``original``, initialised from its heads (``gen`` seeds the new parts)."""
    attention = adapter.attention_parts(original)
    if attention is None:
        raise PlanError(f"{type(original).__name__} has no standard attention to initialise experts from")
    convention = adapter.calling_convention(original)
    ffn = adapter.ffn_parts(original)
    ref = attention.output.weight
    layer = ExpertAttentionLayer(
        convention, hidden=adapter.hidden_size, num_experts=num_experts, head_dim=attention.head_dim,
        router_input=config.router_input, router_grad=config.router_grad, top_k=config.top_k,
        expander=config.expander, expander_inner=config.expander_inner or (ffn.width if ffn is not None else None),
    ).to(device=ref.device, dtype=ref.dtype)
    std = float(getattr(adapter.config, "initializer_range", 0.02))
    with torch.no_grad():
        for lin in [m for m in layer.modules() if isinstance(m, nn.Linear)]:
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
            if lin.bias is not None:
                lin.bias.zero_()
    layer.train(original.training)  # a new module starts in training mode; follow the model's mode
    source = HeadSource(attention, input_norm=convention.input_norm, output_norm=convention.output_norm)
    layer.source = source.within(original)
    init_from_layer(layer, source, heads=list(range(num_experts)), expander_init=config.expander_init)
    if layer.expander.inner is None:  # the linear Expander's closing LayerNorm sets the update's scale
        with torch.no_grad():
            layer.expander.norm.weight.fill_(config.expander_gain)
    return layer


def expert_layers(model: nn.Module) -> Iterator[tuple[int, ExpertAttentionLayer]]:
    """``(index, layer)`` of every Expert Attention layer of ``model`` (in encoder order)."""
    adapter = adapter_for(model)
    for i, layer in enumerate(adapter.layers()):
        if isinstance(layer, ExpertAttentionLayer):
            yield i, layer


def balance_loss(model: nn.Module, eps: float = BALANCE_EPS) -> torch.Tensor | None:
    """SHRP's load-balance loss of the last forward pass, averaged over routed, active layers.

    Per layer ``L = ½ KL(p̄ ‖ u) + ½ KL(u ‖ p̄)`` with ``p̄`` the batch mean of the router softmax,
    ``u`` uniform and ``eps`` added to both. ``None`` if no routed layer ran.

    Example:
        >>> balance_loss(nn.Linear(2, 2)) is None
        True
    """
    losses = [symmetric_kl_to_uniform(p.mean(0), eps) for p in _router_probs(model)]
    return torch.stack(losses).mean() if losses else None


def _router_probs(model: nn.Module) -> list[torch.Tensor]:
    """The router softmax ``[B, N]`` of every routed, active layer in the last forward pass."""
    return [m.last_probs for m in model.modules()
            if isinstance(m, ExpertAttentionLayer) and m.active and m.last_probs is not None]


def concentration_loss(model: nn.Module, eps: float = BALANCE_EPS) -> torch.Tensor | None:
    """Entropy of the batch-mean router distribution, averaged over routed, active layers.

    ``H(p̄) = -Σ_i p̄_i log(p̄_i + eps)``: adding it to the loss (stage 2 of ``shrp``) pushes each
    layer to send the whole batch to one expert, so that Top-1 pruning keeps the path every input
    takes. It is the opposite pressure to :func:`balance_loss`. ``None`` if no routed layer ran.

    Example:
        >>> concentration_loss(nn.Linear(2, 2)) is None
        True
    """
    losses = [entropy(p.mean(0), eps) for p in _router_probs(model)]
    return torch.stack(losses).mean() if losses else None


def entropy(p: torch.Tensor, eps: float = BALANCE_EPS) -> torch.Tensor:
    """``-Σ p log(p + eps)`` of a distribution ``p`` (natural log).

    Example:
        >>> round(float(entropy(torch.full((4,), 0.25))), 4)  # log 4
        1.3863
    """
    return -(p * (p + eps).log()).sum()


def symmetric_kl_to_uniform(p: torch.Tensor, eps: float = BALANCE_EPS) -> torch.Tensor:
    """``½ KL(p ‖ u) + ½ KL(u ‖ p)`` for a distribution ``p`` over N experts (``eps`` added to both).

    ``F.kl_div(input=log q, target=t)`` computes ``KL(t ‖ q)``.

    Example:
        >>> float(symmetric_kl_to_uniform(torch.full((4,), 0.25)))
        0.0
    """
    u = torch.full_like(p, 1.0 / p.numel())
    kl_p_u = F.kl_div((u + eps).log(), p + eps, reduction="sum")
    kl_u_p = F.kl_div((p + eps).log(), u + eps, reduction="sum")
    return 0.5 * kl_p_u + 0.5 * kl_u_p
