"""``soft-prompt``: prepend trainable soft tokens to an encoder's input embeddings (Lester et al. 2021).

The prompt is a recorded structural step: :meth:`SoftPromptStrategy.apply` creates a
:class:`SoftPrompt` module inside the model's base encoder and installs two hooks on the base
encoder, so a saved model rebuilds the module on reload and its weights come from the safetensors
file. The hooks work for every family, because they only use ``get_input_embeddings()`` and
the standard ``inputs_embeds`` path:

* before the forward: token ids become embeddings; the ``length`` prompt vectors are inserted at
  position ``insert_at`` (default 1: right after ``[CLS]``/``<s>``, so every pooling head that reads
  token 0 still reads it); ``attention_mask`` gets ones, ``token_type_ids`` zeros and explicit
  ``position_ids`` the prompt's own positions (text positions shift by ``length``, exactly as when
  the family numbers positions itself);
* after the forward: the prompt positions are cut out of ``last_hidden_state`` (and
  ``hidden_states``), so outputs, MLM logits and labels stay aligned with the caller's tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from surgery.core.errors import ConfigError, PlanError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy, StrategyConfig

PROMPT_ATTR = "surgery_prompt"
_HOOKED = "_surgery_prompt_hooked"


class SoftPrompt(nn.Module):
    """``length`` trainable vectors of the input-embedding width, inserted at ``insert_at``.

    Example:
        >>> SoftPrompt(20, 384).weight.shape
        torch.Size([20, 384])
    """

    def __init__(self, length: int, dim: int, insert_at: int = 1) -> None:
        super().__init__()
        self.length, self.dim, self.insert_at = int(length), int(dim), int(insert_at)
        self.weight = nn.Parameter(torch.zeros(self.length, self.dim))

    def extra_repr(self) -> str:
        return f"length={self.length}, dim={self.dim}, insert_at={self.insert_at}"

    def expand_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A ``[B, T]`` token mask widened with ones at the prompt's positions."""
        k = min(self.insert_at, mask.shape[1])
        ones = mask.new_ones(mask.shape[0], self.length)
        return torch.cat([mask[:, :k], ones, mask[:, k:]], dim=1)


def base_of(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model)


def prompt_of(model: nn.Module) -> SoftPrompt | None:
    """The soft prompt installed on ``model`` (or its base encoder), if any."""
    return getattr(base_of(model), PROMPT_ATTR, None)


def _insert(x: torch.Tensor, k: int, filler: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:, :k], filler.to(x.dtype), x[:, k:]], dim=1)


def _pre_hook(base: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
    prompt: SoftPrompt | None = getattr(base, PROMPT_ATTR, None)
    if prompt is None:
        return None
    kwargs = dict(kwargs)
    input_ids = kwargs.pop("input_ids", None)
    if args:  # the first positional argument of every HF encoder forward is input_ids
        input_ids, args = args[0], args[1:]
    embeds = kwargs.pop("inputs_embeds", None)
    if embeds is None:
        if input_ids is None:
            raise PlanError("soft prompt: the forward got neither input_ids nor inputs_embeds")
        embeds = base.get_input_embeddings()(input_ids)
    b, t = embeds.shape[:2]
    n, k = prompt.length, min(prompt.insert_at, t)
    kwargs["inputs_embeds"] = _insert(embeds, k, prompt.weight.to(embeds.dtype).unsqueeze(0).expand(b, n, -1))
    mask = kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones(b, t, dtype=torch.long, device=embeds.device)
    kwargs["attention_mask"] = _insert(mask, k, mask.new_ones(b, n))
    if kwargs.get("token_type_ids") is not None:
        tt = kwargs["token_type_ids"]
        kwargs["token_type_ids"] = _insert(tt, k, tt.new_zeros(b, n))
    if kwargs.get("position_ids") is not None:
        pos = kwargs["position_ids"]
        own = (torch.arange(n, device=pos.device) + pos[:, k - 1:k] + 1) if k else torch.arange(n, device=pos.device)
        kwargs["position_ids"] = torch.cat([pos[:, :k], own.expand(pos.shape[0], n), pos[:, k:] + n], dim=1)
    return args, kwargs


def _strip(x: Any, k: int, n: int) -> Any:
    if isinstance(x, torch.Tensor) and x.dim() == 3:
        return torch.cat([x[:, :k], x[:, k + n:]], dim=1)
    return x


def _post_hook(base: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any], output: Any):
    prompt: SoftPrompt | None = getattr(base, PROMPT_ATTR, None)
    if prompt is None:
        return None
    n, k = prompt.length, prompt.insert_at
    if isinstance(output, tuple):
        return (_strip(output[0], k, n), *output[1:])
    if getattr(output, "last_hidden_state", None) is not None:
        output["last_hidden_state"] = _strip(output.last_hidden_state, k, n)
    if getattr(output, "hidden_states", None) is not None:
        output["hidden_states"] = tuple(_strip(h, k, n) for h in output.hidden_states)
    return output


def install_prompt(model: nn.Module, prompt: SoftPrompt) -> SoftPrompt:
    """Put ``prompt`` into ``model``'s base encoder (replacing any prompt there) and hook it up.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = install_prompt(model, SoftPrompt(5, 32))
        >>> model(**tiny_inputs(TinySpec("bert"))).last_hidden_state.shape
        torch.Size([3, 7, 32])
    """
    base = base_of(model)
    if hasattr(base, PROMPT_ATTR):
        delattr(base, PROMPT_ATTR)
    setattr(base, PROMPT_ATTR, prompt)
    # The hooks are module-level functions (deepcopy-safe) installed once; without a prompt they do nothing.
    if not getattr(base, _HOOKED, False):
        base.register_forward_pre_hook(_pre_hook, with_kwargs=True)
        base.register_forward_hook(_post_hook, with_kwargs=True)
        object.__setattr__(base, _HOOKED, True)
    return prompt


class SoftPromptConfig(StrategyConfig):
    """Settings of ``soft-prompt``.

    Example:
        >>> SoftPromptConfig().length
        20
    """

    length: int = Field(default=20, ge=1, description="number of soft tokens")
    insert_at: int = Field(default=1, ge=0, description="position of the first soft token (1 = after [CLS])")
    seed: int = Field(default=0, description="seed of the initialisation (copies of random vocabulary embeddings)")


class SoftPromptStrategy(Strategy):
    """Add a soft prompt to an encoder (initialised from random vocabulary embeddings, seeded).

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("distilbert"))
        >>> _ = surgery.convert(model, SoftPromptStrategy(length=4))
        >>> prompt_of(model).weight.shape
        torch.Size([4, 32])
    """

    name = "soft-prompt"
    trained_after = True  # new prompt tokens: prompt tuning follows
    config_class = SoftPromptConfig
    config: SoftPromptConfig

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        emb = base_of(model).get_input_embeddings()
        if emb is None:
            raise ConfigError("soft-prompt: the model has no input embeddings (get_input_embeddings() is None)")
        return {"length": self.config.length, "dim": int(emb.weight.shape[1]), "insert_at": self.config.insert_at}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        emb = base_of(model).get_input_embeddings()
        dim = int(plan["dim"])
        if dim != emb.weight.shape[1]:
            raise PlanError(f"soft-prompt: plan dim {dim} does not match the input embeddings ({emb.weight.shape[1]})")
        prompt = SoftPrompt(int(plan["length"]), dim, int(plan.get("insert_at", 1)))
        gen = torch.Generator().manual_seed(self.config.seed)
        rows = torch.randint(0, emb.weight.shape[0], (prompt.length,), generator=gen)
        with torch.no_grad():
            prompt.weight.copy_(emb.weight.detach()[rows].to(prompt.weight.dtype))
        prompt.to(device=emb.weight.device, dtype=emb.weight.dtype)
        install_prompt(model, prompt)
        return [LayerChange(layer=-1, component="soft-prompt", before=0, after=prompt.length,
                            note=f"{prompt.length} soft tokens at position {prompt.insert_at}")]
