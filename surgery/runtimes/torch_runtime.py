"""The PyTorch runtimes: ``torch`` (the model as it is, fp32), ``torch-bf16`` and ``torch-fp16`` (a copy in that dtype).

bf16 is free speed on CPUs with bf16 instructions (avx512_bf16 or AMX: MiniLM-L6 ran 3.1x its fp32 at
cosine 0.99996 on an AVX-512 BF16 Zen 5) and slower without them, so ``torch-bf16`` is available only
where the CPU has them or a CUDA device is present; ``torch-fp16`` needs CUDA (CPU fp16 kernels are slow).
Their artefact is ``surgery.save_pretrained`` of the converted copy (safetensors in that dtype).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from surgery.testing import TinySpec, tiny_model
    >>> art = TorchRuntime().write_artefact(tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()) / "t")
    >>> art.files, art.parity["max_abs_diff"]
    (('config.json', 'model.safetensors', 'surgery.json'), 0.0)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from surgery.runtimes.base import Batch, Runtime, RuntimeArtefact
from surgery.runtimes.parity import agreement_of, reference_batch


def _hold_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(int(threads))


class Float32Outputs(nn.Module):
    """A half-precision model whose floating outputs come back as fp32, so callers compare like with like.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> half = Float32Outputs(tiny_model(spec).to(torch.bfloat16))
        >>> half(**tiny_inputs(spec)).last_hidden_state.dtype, half.config.model_type
        (torch.float32, 'bert')
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, **inputs: Any) -> Any:
        out = self.model(**inputs)
        for key, value in out.items():
            if torch.is_tensor(value) and value.is_floating_point():
                out[key] = value.float()
        return out


class TorchRuntime(Runtime):
    """PyTorch in the model's own dtype: the reference every other runtime is measured against."""

    name: ClassVar[str] = "torch"
    description: ClassVar[str] = "PyTorch, the model as it is (fp32)"
    #: The dtype of the converted copy; None keeps the model's own.
    dtype: ClassVar[torch.dtype | None] = None

    def unavailable(self) -> str | None:
        return None

    def convert(self, model: nn.Module, task: str = "auto") -> nn.Module:
        """The ``task`` target of ``model`` as this runtime runs it (a copy when the dtype changes)."""
        from surgery.deploy.export import export_target

        target, _, _ = export_target(model, task)
        if self.dtype is None:
            return target.eval()
        return Float32Outputs(copy.deepcopy(target).to(self.dtype).eval())

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        from surgery.persist.model_io import save_pretrained

        _hold_threads(threads)
        ref = reference_batch(model, task)
        converted = self.convert(ref.module, "auto")
        with torch.no_grad():
            got = getattr(converted(**ref.inputs), ref.output).float()
        weights = converted.model if isinstance(converted, Float32Outputs) else converted
        out = save_pretrained(weights, out_dir)
        files = tuple(sorted(p.name for p in out.iterdir()))
        dtype = str(next(weights.parameters()).dtype).removeprefix("torch.")
        return RuntimeArtefact(self.name, out, files, ref.task, ref.output,
                               agreement_of(ref.expected, got, ref.inputs["attention_mask"]), {"dtype": dtype})

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        from surgery.persist.model_io import from_pretrained

        _hold_threads(threads)
        model = from_pretrained(out_dir).eval()
        return model if self.dtype is None else Float32Outputs(model)

    def prepare(self, model: nn.Module, work_dir: Path, *, task: str = "auto",
                calibration: Sequence[Batch] | None = None, threads: int | None = None) -> nn.Module:
        """A converted copy in memory; nothing is written (``work_dir`` is unused)."""
        _hold_threads(threads)
        return self.convert(model, task)


class TorchBf16Runtime(TorchRuntime):
    """PyTorch bf16: a bf16 copy of the model (CPUs with avx512_bf16 or AMX, or CUDA)."""

    name: ClassVar[str] = "torch-bf16"
    description: ClassVar[str] = "PyTorch, a bf16 copy (CPU with avx512_bf16 or AMX, or CUDA)"
    dtype: ClassVar[torch.dtype | None] = torch.bfloat16
    #: CPU flags (``/proc/cpuinfo`` names) with native bf16 products; any one suffices.
    cpu_flags: ClassVar[tuple[str, ...]] = ("avx512_bf16", "amx_bf16")

    def unavailable(self) -> str | None:
        if torch.cuda.is_available():
            return None
        from surgery.measure.machine import machine_info

        info = machine_info()
        if any(flag in info.flags for flag in self.cpu_flags):
            return None
        return (f"this CPU ({info.cpu_model}) has no native bf16 products ({' or '.join(self.cpu_flags)} missing) "
                "and no CUDA device is present; bf16 would run slower than fp32 here: use --runtime torch")


class TorchFp16Runtime(TorchRuntime):
    """PyTorch fp16: an fp16 copy of the model (CUDA only)."""

    name: ClassVar[str] = "torch-fp16"
    description: ClassVar[str] = "PyTorch, an fp16 copy (CUDA only)"
    dtype: ClassVar[torch.dtype | None] = torch.float16

    def unavailable(self) -> str | None:
        if torch.cuda.is_available():
            return None
        return "fp16 needs a CUDA device (CPU fp16 kernels are slower than fp32); use --runtime torch or torch-bf16"
