"""Unplug and play (DoE §3.1): one full model, several task experts, swapped in per request.

A :class:`TaskExpert` is what a task needs on top of the full model: the units it removes per
layer (module-set groups as in ``zero-recovery-prune``), its soft prompt, and in classifier mode
its head. ``with runtime.use("sst2"):`` commits the expert's removal map reversibly, through the
same removal engine as permanent pruning (:mod:`surgery.anatomy.removal`: sliced copies of the FFN
Linears, zero-recovered copies of attention projections), installs the prompt and head, and on
exit puts the *original module and parameter objects* back, even if the body raised: the state
dict and outputs after a use are bit-identical to before.

Saved form: the full model once (:func:`surgery.save_pretrained`) plus ``experts/<task>.safetensors``
(prompt, head tensors, removed indices) and ``experts/<task>.json`` per task.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from surgery.anatomy import adapter_for
from surgery.anatomy.removal import MODULE_GROUPS, Undo, commit_reversibly, layer_cuts, restore
from surgery.anatomy.slicing import check_indices, owner_of
from surgery.core.errors import ConfigError, ModelLoadError
from surgery.persist.model_io import from_pretrained, save_pretrained
from surgery.strategies.doe.prompt_tuning import head_state
from surgery.strategies.doe.soft_prompt import PROMPT_ATTR, SoftPrompt, base_of, install_prompt
from surgery.strategies.doe.zero_recovery_prune import group_width

EXPERTS_DIR = "experts"


@dataclass
class TaskExpert:
    """One task's expert: removed units per layer and group, soft prompt, head tensors, metadata.

    Example:
        >>> e = TaskExpert("t", remove={0: {"neurons": [1, 2]}}, prompt=torch.zeros(2, 4))
        >>> e.pruned_units
        2
    """

    name: str
    remove: dict[int, dict[str, list[int]]]
    prompt: torch.Tensor | None = None
    prompt_insert_at: int = 1
    head: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def pruned_units(self) -> int:
        return sum(len(v) for groups in self.remove.values() for v in groups.values())

    @classmethod
    def from_model(cls, name: str, model: nn.Module, remove: Mapping[Any, Mapping[str, list[int]]],
                   *, with_head: bool, meta: dict[str, Any] | None = None) -> TaskExpert:
        """Take the prompt (and head) from a tuned ``model`` and the removal map from its DoE run."""
        prompt = getattr(base_of(model), PROMPT_ATTR, None)
        return cls(
            name=name,
            remove={int(k): {g: sorted(int(i) for i in v) for g, v in m.items()} for k, m in remove.items()},
            prompt=prompt.weight.detach().clone() if prompt is not None else None,
            prompt_insert_at=prompt.insert_at if prompt is not None else 1,
            head=head_state(model) if with_head else {},
            meta=dict(meta or {}),
        )


class UnplugRuntime:
    """Serve several task experts from one full model.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> model = tiny_model(TinySpec("bert"))
        >>> runtime = UnplugRuntime(model, [TaskExpert("a", {0: {"neurons": list(range(30))}})])
        >>> with runtime.use("a"):
        ...     model.encoder.layer[0].intermediate.dense.out_features
        7
        >>> model.encoder.layer[0].intermediate.dense.out_features
        37
    """

    def __init__(self, model: nn.Module, experts: list[TaskExpert] | None = None) -> None:
        self.model = model
        self.experts: dict[str, TaskExpert] = {}
        self.active: str | None = None
        for expert in experts or []:
            self.add(expert)

    def add(self, expert: TaskExpert) -> None:
        """Register an expert (checked against the model's layers and widths)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", expert.name):
            raise ConfigError(f"task name {expert.name!r} must use letters, digits, '.', '_' or '-'")
        adapter = adapter_for(self.model)
        for layer, groups in expert.remove.items():
            check_indices([layer], adapter.num_layers, f"expert {expert.name}: layers")
            for group, units in groups.items():
                if group not in MODULE_GROUPS:
                    raise ConfigError(f"expert {expert.name}: group {group!r} of layer {layer} cannot be unplugged; "
                                      f"use {', '.join(MODULE_GROUPS)}")
                check_indices(units, group_width(adapter, layer, group), f"expert {expert.name}: {group} of {layer}")
        self.experts[expert.name] = expert

    # -- switching -------------------------------------------------------------------------
    def _plug(self, expert: TaskExpert) -> Undo:
        """Swap the expert in; return undo records (owner, attribute, original object)."""
        undo: Undo = []
        adapter = adapter_for(self.model)
        try:
            for layer, groups in sorted(expert.remove.items()):
                parts = adapter.layer(layer)
                commit_reversibly(parts.module, layer_cuts(parts, groups, f"expert {expert.name}"), undo)
            base = base_of(self.model)
            if expert.prompt is not None:
                old_prompt = getattr(base, PROMPT_ATTR, None)
                prompt = SoftPrompt(expert.prompt.shape[0], expert.prompt.shape[1], expert.prompt_insert_at)
                prompt.to(device=expert.prompt.device, dtype=expert.prompt.dtype)
                with torch.no_grad():
                    prompt.weight.copy_(expert.prompt)
                install_prompt(self.model, prompt)
                undo.append((base, PROMPT_ATTR, old_prompt))
            for name, tensor in expert.head.items():
                owner, attr = owner_of(self.model, name)
                old = getattr(owner, attr)
                setattr(owner, attr, nn.Parameter(tensor.to(old.device, old.dtype), requires_grad=False))
                undo.append((owner, attr, old))
        except Exception:
            restore(undo)
            raise
        return undo

    @contextmanager
    def use(self, name: str) -> Iterator[nn.Module]:
        """Run the body with task ``name``'s expert plugged in; restore the full model on exit."""
        if name not in self.experts:
            raise ConfigError(f"no task expert {name!r}; known: {sorted(self.experts)}")
        if self.active is not None:
            raise ConfigError(f"task {self.active!r} is already plugged in; leave its 'use' block first")
        undo = self._plug(self.experts[name])
        self.active = name
        try:
            yield self.model
        finally:
            restore(undo)
            self.active = None

    def switch_latency(self, name: str, repeats: int = 20) -> dict[str, float]:
        """Median milliseconds to plug task ``name`` in and to restore the full model."""
        plug, unplug = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            undo = self._plug(self.experts[name])
            t1 = time.perf_counter()
            restore(undo)
            t2 = time.perf_counter()
            plug.append(t1 - t0)
            unplug.append(t2 - t1)
        return {"plug_ms": 1000 * sorted(plug)[len(plug) // 2], "restore_ms": 1000 * sorted(unplug)[len(unplug) // 2]}

    # -- persistence ---------------------------------------------------------------------------
    def save(self, out_dir: str | Path, *, tokenizer: Any = None, overwrite: bool = False) -> Path:
        """Save the full model once and one small safetensors + JSON file per task."""
        if self.active is not None:
            raise ConfigError("save the runtime outside a 'use' block (the full model must be in place)")

        def write_experts(tmp: Path) -> None:
            folder = tmp / EXPERTS_DIR
            folder.mkdir()
            for name, e in self.experts.items():
                tensors = {f"head.{k}": v.contiguous() for k, v in e.head.items()}
                if e.prompt is not None:
                    tensors["prompt"] = e.prompt.contiguous()
                for layer, groups in e.remove.items():
                    for group, units in groups.items():
                        tensors[f"remove.{layer}.{group}"] = torch.as_tensor(units, dtype=torch.int64)
                save_file(tensors, str(folder / f"{name}.safetensors"))
                (folder / f"{name}.json").write_text(json.dumps(
                    {"name": name, "prompt_insert_at": e.prompt_insert_at, "meta": e.meta}, indent=2) + "\n")

        # The experts are written inside the model's atomic save: a runtime directory is whole or absent.
        return save_pretrained(self.model, out_dir, tokenizer=tokenizer, overwrite=overwrite, extra=write_experts)

    @classmethod
    def load(cls, path: str | Path, model_class: str | type[nn.Module] | None = None) -> UnplugRuntime:
        """Reload a runtime saved by :meth:`save`."""
        path = Path(path)
        model = from_pretrained(path, model_class=model_class)
        folder = path / EXPERTS_DIR
        if not folder.is_dir():
            raise ModelLoadError(f"{folder} is missing; {path} was not saved by UnplugRuntime.save")
        experts = []
        for meta_file in sorted(folder.glob("*.json")):
            info = json.loads(meta_file.read_text())
            tensors = load_file(str(meta_file.with_suffix(".safetensors")))
            remove: dict[int, dict[str, list[int]]] = {}
            for key, value in tensors.items():
                if key.startswith("remove."):
                    _, layer, group = key.split(".", 2)
                    remove.setdefault(int(layer), {})[group] = value.tolist()
            experts.append(TaskExpert(
                name=info["name"], remove=remove, prompt=tensors.get("prompt"),
                prompt_insert_at=int(info.get("prompt_insert_at", 1)),
                head={k[len("head."):]: v for k, v in tensors.items() if k.startswith("head.")},
                meta=info.get("meta", {})))
        return cls(model, experts)
