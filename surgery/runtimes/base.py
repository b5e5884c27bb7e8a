"""What a runtime is: one name, whether it runs here, the artefact it writes and the model as it runs.

A :class:`Runtime` turns a surgery model (PyTorch, any structure surgery made) into the model as a
user would serve it: the same weights in PyTorch bf16, an ONNX graph in ONNX Runtime, an OpenVINO IR,
int8 where the runtime quantizes. ``surgery export --runtime``, ``surgery bench --runtime`` and
``surgery compress --runtime`` all go through this one interface, by the same names, and a third
party adds a runtime (TensorRT, CTranslate2 ...) by registering a subclass under the entry-point
group ``surgery.runtimes`` (:mod:`surgery.runtimes.registry`), as the built-ins are.

Every runtime holds itself to ``threads`` (torch's intra-op threads, ONNX Runtime's
``intra_op_num_threads``, OpenVINO's ``INFERENCE_NUM_THREADS`` with pinning off), so timings taken
side by side compare runtimes, not core counts.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from surgery.runtimes import get_runtime
    >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
    >>> spec = TinySpec("bert")
    >>> runtime = get_runtime("torch")
    >>> runtime.unavailable() is None, runtime.needs_calibration, runtime.extra
    (True, False, None)
    >>> served = runtime.prepare(tiny_model(spec), Path(tempfile.mkdtemp()))
    >>> tuple(served(**tiny_inputs(spec)).last_hidden_state.shape)
    (3, 7, 32)
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

__all__ = ["Batch", "Runtime", "RuntimeArtefact", "artefact_of", "fp32_copy", "missing_packages"]

#: A tokenized batch: ``input_ids``, ``attention_mask`` and, where the family has them, ``token_type_ids``.
Batch = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class RuntimeArtefact:
    """What :meth:`Runtime.write_artefact` wrote: the files, the task, and how closely it agrees with PyTorch fp32.

    ``parity`` holds ``max_abs_diff`` and ``mean_cosine`` (per example, real tokens only) of the
    artefact as it runs against the fp32 PyTorch model on the same padded batch: a check for fp32
    runtimes, the recorded drift for int8 and bf16 ones. ``info`` is the runtime's own report
    (the ONNX export report, the NNCF settings ...), JSON-serializable.

    Example:
        >>> art = RuntimeArtefact("torch", Path("out"), ("model.safetensors",), "base", "last_hidden_state",
        ...                       {"max_abs_diff": 0.0, "mean_cosine": 1.0})
        >>> art.path("model.safetensors").as_posix(), art.info
        ('out/model.safetensors', {})
    """

    runtime: str
    directory: Path
    files: tuple[str, ...]
    task: str
    output: str
    parity: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        """One written file's path."""
        return self.directory / name


class Runtime(ABC):
    """A way to run a model: a registered name, its availability here, its artefact, its loaded form.

    Subclasses set the class attributes and implement :meth:`unavailable`, :meth:`write_artefact`
    and :meth:`load`; :meth:`prepare` (artefact, then load) suits runtimes that serve from files,
    and the PyTorch runtimes override it to return a converted copy without writing anything.
    """

    #: The registered name (``torch``, ``torch-bf16``, ``onnxruntime``, ``onnxruntime-int8``, ``openvino`` ...).
    name: ClassVar[str]
    #: True for runtimes that calibrate activations on the user's texts (the int8 ones).
    needs_calibration: ClassVar[bool] = False
    #: The pip extra of encoder-surgery that provides it (``"onnx"``, ``"openvino"``); None for torch.
    extra: ClassVar[str | None] = None
    #: One line for ``--help`` and error messages.
    description: ClassVar[str] = ""

    @abstractmethod
    def unavailable(self) -> str | None:
        """None when this runtime runs on this machine; else ONE line saying why and the fix.

        A missing package names the extra (``pip install 'encoder-surgery[openvino]'``); a missing CPU
        feature names the flag (``torch-bf16`` needs avx512_bf16 or AMX, or a CUDA device).
        """

    @abstractmethod
    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        """Write the deployable artefact of ``model`` into ``out_dir`` (new or empty) and check it.

        The ONNX graph, the OpenVINO IR, or torch safetensors in the runtime's dtype, never the
        tokenizer (the export command adds it). fp32 runtimes fail with a one-line error when the
        artefact differs from PyTorch beyond tolerance; int8 and bf16 ones record the drift in
        :attr:`RuntimeArtefact.parity`. ``calibration`` (tokenized batches of the user's texts) is
        required where :attr:`needs_calibration` is True; ``opset`` concerns ONNX only.
        """

    @abstractmethod
    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        """The artefact in ``out_dir`` as it runs: an ``nn.Module`` whose ``forward(**inputs)`` returns
        the source's Hugging Face output type (``BaseModelOutput``, ``SequenceClassifierOutput``,
        ``MaskedLMOutput``), with ``.config`` set to ``config``."""

    def prepare(self, model: nn.Module, work_dir: Path, *, task: str = "auto",
                calibration: Sequence[Batch] | None = None, threads: int | None = None) -> nn.Module:
        """``model`` as this runtime runs it: :meth:`write_artefact` into ``work_dir``, then :meth:`load`."""
        artefact = self.write_artefact(model, work_dir, task=task, calibration=calibration, threads=threads)
        return self.load(artefact.directory, config=model.config, threads=threads)

    def check_calibration(self, calibration: Sequence[Batch] | bool | None) -> None:
        """Refuse, in one line, a missing ``calibration`` (the batches, or whether they were given) where required."""
        from surgery.core.errors import ConfigError

        if self.needs_calibration and not calibration:
            raise ConfigError(f"runtime {self.name!r} calibrates int8 activations on your texts: pass --calibration "
                              "FILE (a few hundred representative texts)")

    def __repr__(self) -> str:
        return f"<runtime {self.name}>"


def missing_packages(packages: Sequence[str], hint: str) -> str | None:
    """The one-line reason a runtime is unavailable when any of ``packages`` cannot be imported, else None.

    Example:
        >>> missing_packages(["json"], "pip install x") is None, missing_packages(["no_such_pkg"], "pip install x")
        (True, 'needs no_such_pkg (not installed): pip install x')
    """
    import importlib.util

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    return f"needs {', '.join(missing)} (not installed): {hint}" if missing else None


def artefact_of(runtime: str, out_dir: Path, *, task: str, output: str, found: Any, info: dict[str, Any]
                ) -> RuntimeArtefact:
    """A :class:`RuntimeArtefact` for the files in ``out_dir``, with ``found`` (an export report's
    :class:`~surgery.deploy.export.Agreement`) as its parity figures."""
    out = Path(out_dir).expanduser().resolve()
    parity = {"max_abs_diff": float(found.max_abs_diff), "mean_cosine": float(found.mean_cosine or 0.0),
              "min_cosine": float(found.min_cosine)}
    return RuntimeArtefact(runtime, out, tuple(sorted(p.name for p in out.iterdir())), task, output, parity, info)


def fp32_copy(model: nn.Module) -> nn.Module:
    """A detached fp32 copy of ``model`` in eval mode (what every artefact is made from).

    Example:
        >>> m = torch.nn.Linear(2, 2).to(torch.bfloat16)
        >>> fp32_copy(m).weight.dtype, m.weight.dtype
        (torch.float32, torch.bfloat16)
    """
    return copy.deepcopy(model).float().eval()
