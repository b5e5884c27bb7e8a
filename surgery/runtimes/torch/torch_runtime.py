"""The PyTorch runtimes: ``torch`` (the model as it is, fp32), ``torch-bf16`` and ``torch-fp16`` (a copy in that dtype).

bf16 is free speed on CPUs with bf16 instructions (avx512_bf16 or AMX: MiniLM-L6 ran 3.1x its fp32 at
cosine 0.99996 on an AVX-512 BF16 Zen 5) and slower without them, so ``torch-bf16`` is available only
where the CPU has them or a CUDA GPU has them (Ampere and later); ``torch-fp16`` needs CUDA (CPU fp16 kernels are slow).
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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from surgery.runtimes.shared.runtime import Runtime, RuntimeArtefact, artefact_files, bf16_missing

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch


def _hold_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(int(threads))


class TorchRuntime(Runtime):
    """PyTorch in the model's own dtype: the reference every other runtime is measured against."""

    name: ClassVar[str] = "torch"
    description: ClassVar[str] = "PyTorch, the model as it is (fp32)"
    as_is: ClassVar[bool] = True
    #: The ``torch`` dtype name of the converted copy (``"bfloat16"``); None keeps the model's own.
    dtype: ClassVar[str | None] = None

    def unavailable(self) -> str | None:
        return None

    def runs_on(self, device: str) -> bool:
        """PyTorch runs wherever the model is."""
        return True

    def convert(self, model: nn.Module, task: str = "auto") -> nn.Module:
        """The ``task`` target of ``model`` as this runtime runs it (a copy when the dtype changes)."""
        import copy

        import torch

        from surgery.runtimes.shared.graph_export import export_target
        from surgery.runtimes.torch.half_precision import Float32Outputs

        target, _, _ = export_target(model, task)
        if self.dtype is None:
            return target.eval()
        return Float32Outputs(copy.deepcopy(target).to(getattr(torch, self.dtype)).eval())

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        import torch

        from surgery.persist.model_io import save_pretrained
        from surgery.runtimes.shared.parity import agreement_of, reference_batch
        from surgery.runtimes.torch.half_precision import Float32Outputs

        _hold_threads(threads)
        ref = reference_batch(model, task)
        converted = self.convert(ref.module, "auto")
        with torch.no_grad():
            got = getattr(converted(**ref.inputs), ref.output).float()
        weights = converted.model if isinstance(converted, Float32Outputs) else converted
        out = save_pretrained(weights, out_dir)
        files = artefact_files(out)
        dtype = str(next(weights.parameters()).dtype).removeprefix("torch.")
        return RuntimeArtefact(self.name, out, files, ref.task, ref.output,
                               agreement_of(ref.expected, got, ref.inputs["attention_mask"]), {"dtype": dtype})

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        from surgery.persist.model_io import from_pretrained
        from surgery.runtimes.torch.half_precision import Float32Outputs

        _hold_threads(threads)
        model = from_pretrained(out_dir).eval()
        return model if self.dtype is None else Float32Outputs(model)

    def serving_code(self, directory: str) -> list[str]:
        return ["import surgery, transformers", f'model = surgery.from_pretrained("{directory}")',
                f'outputs = model(**transformers.AutoTokenizer.from_pretrained("{directory}")(texts, padding=True, '
                'return_tensors="pt"))']

    def prepare(self, model: nn.Module, work_dir: Path, *, task: str = "auto",
                calibration: Sequence[Batch] | None = None, threads: int | None = None) -> nn.Module:
        """A converted copy in memory; nothing is written (``work_dir`` is unused)."""
        _hold_threads(threads)
        return self.convert(model, task)


class TorchBf16Runtime(TorchRuntime):
    """PyTorch bf16: a bf16 copy of the model (CPUs with avx512_bf16 or AMX, or CUDA GPUs from Ampere on)."""

    name: ClassVar[str] = "torch-bf16"
    description: ClassVar[str] = "PyTorch, a bf16 copy (CPU with avx512_bf16 or AMX, or CUDA from Ampere on)"
    precision: ClassVar[str] = "bf16"
    as_is: ClassVar[bool] = False
    dtype: ClassVar[str | None] = "bfloat16"

    def unavailable(self) -> str | None:
        reason = bf16_missing()
        return None if reason is None else f"{reason}; bf16 would run slower than fp32 here: use --runtime torch"


class TorchFp16Runtime(TorchRuntime):
    """PyTorch fp16: an fp16 copy of the model (CUDA only)."""

    name: ClassVar[str] = "torch-fp16"
    description: ClassVar[str] = "PyTorch, an fp16 copy (CUDA only)"
    precision: ClassVar[str] = "fp16"
    devices: ClassVar[tuple[str, ...]] = ("cuda",)
    as_is: ClassVar[bool] = False
    dtype: ClassVar[str | None] = "float16"

    def unavailable(self) -> str | None:
        import torch

        if torch.cuda.is_available():
            return None
        return "fp16 needs a CUDA device (CPU fp16 kernels are slower than fp32); use --runtime torch or torch-bf16"
