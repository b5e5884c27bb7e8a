"""What a runtime is: one name, whether it runs here, the artefact it writes and the model as it runs.

A :class:`Runtime` turns a surgery model (PyTorch, any structure surgery made) into the model as a
user would serve it: the same weights in PyTorch bf16, an ONNX graph in ONNX Runtime, an OpenVINO IR,
int8 where the runtime quantizes. ``surgery export --runtime``, ``surgery bench --runtime`` and
``surgery compress --runtime`` all go through this one interface, by the same names, and a third
party adds a runtime (TensorRT, CTranslate2 ...) by registering a subclass under the entry-point
group ``surgery.runtimes`` (:mod:`surgery.runtimes.runtime_registry`), as the built-ins are.

Every runtime holds itself to ``threads`` (torch's intra-op threads, ONNX Runtime's
``intra_op_num_threads``, OpenVINO's ``INFERENCE_NUM_THREADS`` with pinning off), so timings taken
side by side compare runtimes, not core counts.

A runtime answers every question about itself, so no caller tests its name: the numbers it computes in
(:attr:`Runtime.precision`), the devices it runs on, whether it runs the model object itself
(:attr:`Runtime.as_is`), the folder its artefact takes in an output directory (:attr:`Runtime.folder`),
what a cached timing in it depends on (:meth:`Runtime.cache_key`), whether it calibrates
(:attr:`Runtime.needs_calibration`), the export settings it reads, its artefact's own record
(:meth:`Runtime.read_info`) and its artefact's accuracy on labelled data (:meth:`Runtime.accuracy`).
A third-party runtime inherits every answer and overrides what differs. The class attributes are read
without importing torch (the CLI validates flags with them before heavy imports).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from surgery.runtimes import get_runtime
    >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
    >>> spec = TinySpec("bert")
    >>> runtime = get_runtime("torch")
    >>> runtime.unavailable() is None, runtime.needs_calibration, runtime.precision, runtime.as_is
    (True, False, 'fp32', True)
    >>> served = runtime.prepare(tiny_model(spec), Path(tempfile.mkdtemp()))
    >>> tuple(served(**tiny_inputs(spec)).last_hidden_state.shape)
    (3, 7, 32)
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks); the methods import it
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch  # a tokenized batch: input_ids, attention_mask (, token_type_ids)

from surgery.persist.atomic import OUTPUT_MANIFEST

__all__ = ["BF16_CPU_FLAGS", "Runtime", "RuntimeArtefact", "artefact_files", "artefact_of", "bf16_cpu_missing",
           "bf16_missing", "cuda_bf16", "fp32_copy", "missing_packages"]

#: The numbers a runtime may compute in (:attr:`Runtime.precision`).
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
#: CPU flags (``/proc/cpuinfo`` names) with native bf16 products; any one suffices.
BF16_CPU_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")


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
    #: The numbers it computes in: ``fp32`` (the same function as PyTorch fp32, parity-checked), ``bf16``,
    #: ``fp16`` or ``int8`` (:data:`PRECISIONS`). ``--runtime auto`` searches only the fastest fp32 runtime.
    precision: ClassVar[str] = "fp32"
    #: The torch device types it runs on (a model elsewhere is refused before anything is timed).
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: True where the runtime runs the model object itself, unchanged (PyTorch in the model's dtype): nothing
    #: is written, and the unchanged model's figures there are the original's own.
    as_is: ClassVar[bool] = False
    #: The import names it needs; a missing one makes it unavailable with a
    #: :class:`~surgery.runtimes.onnx.onnx_session.MissingDependencyError` naming :attr:`extra`.
    packages: ClassVar[tuple[str, ...]] = ()
    #: The distributions whose versions change its kernels or its artefact (a cached timing is keyed on them);
    #: the distribution that ships the runtime's class is always added (:meth:`cache_key`).
    versioned: ClassVar[tuple[str, ...]] = ()
    #: The version of the artefact format it writes (a cached timing is keyed on it); None: not versioned.
    graph_format: ClassVar[int | None] = None
    #: The folder its artefact takes inside a ``compress`` output (empty: the runtime's name).
    artefact_folder: ClassVar[str] = ""
    #: The ``backend`` stock sentence-transformers loads its artefact with (``onnx``, ``openvino``); None where
    #: it has none (``export --format sentence-transformers`` is then refused).
    sentence_backend: ClassVar[str | None] = None
    #: The runtime-specific export settings it reads (:class:`~surgery.runtimes.export_config.ExportConfig`
    #: field names: ``opset``, ``int8_mode`` ...); any other one given is refused in one line.
    export_settings: ClassVar[frozenset[str]] = frozenset()
    #: True where its int8 artefact can leave op groups in float (a precision map, recorded on the model and replayed
    #: by every export) and :meth:`with_float_groups` writes such a copy of an artefact: compress's precision pass
    #: (:mod:`surgery.compress.precision`) searches maps on it.
    float_fallback: ClassVar[bool] = False
    #: True where its served model can pad each batch to a block multiple that was measured to run faster
    #: (:mod:`surgery.runtimes.shared.alignment`) and :meth:`align` records that multiple in an artefact.
    aligns: ClassVar[bool] = False

    @classmethod
    def padding_refused(cls) -> str | None:
        """Why this runtime cannot serve batches padded to a block (None where it can: :attr:`aligns`).

        Example:
            >>> from surgery.runtimes import runtime_class
            >>> runtime_class("onnxruntime").padding_refused() is None
            True
            >>> runtime_class("torch").padding_refused()[:52]
            "pad_to_multiple_of: runtime 'torch' serves batches a"
        """
        if cls.aligns:
            return None
        return (f"pad_to_multiple_of: runtime {cls.name!r} serves batches as given; padding belongs to the graph "
                "runtimes (onnxruntime, openvino and their int8/bf16 kinds)")

    def align(self, out_dir: Path, multiple: int | None, why: str | None = None) -> None:
        """Record that the artefact in ``out_dir`` is served padded to a multiple of ``multiple`` (only where
        :attr:`aligns`), and ``why`` (how the multiple was chosen)."""
        raise NotImplementedError(self.padding_refused())

    @property
    def int8(self) -> bool:
        """Whether its artefact is quantized to int8."""
        return self.precision == "int8"

    @property
    def folder(self) -> str:
        """The folder its artefact takes inside a ``compress`` output (``onnx``, ``openvino``, else its name)."""
        return self.artefact_folder or self.name

    def runs_on(self, device: str) -> bool:
        """Whether it runs a model that sits on ``device`` (a torch device type: ``cpu``, ``cuda`` ...)."""
        return device in self.devices

    def missing(self) -> str | None:
        """The one-line reason it cannot run here for want of a package (:attr:`packages`), else None."""
        hint = f"pip install 'encoder-surgery[{self.extra}]'" if self.extra else "install it"
        return missing_packages(self.packages, hint) if self.packages else None

    def cache_key(self) -> dict[str, Any]:
        """What a timing measured in this runtime depends on beyond the machine: its class, artefact format and
        the versions of :attr:`versioned` and of the distribution that ships it (a third party's too).

        Example:
            >>> from surgery.runtimes import get_runtime
            >>> key = get_runtime("torch").cache_key()
            >>> key["name"], key["class"], "encoder-surgery" in key["versions"]
            ('torch', 'surgery.runtimes.torch.torch_runtime:TorchRuntime', True)
        """
        cls = type(self)
        owner = _distribution_of(cls.__module__)
        names = dict.fromkeys([*self.versioned, *([owner] if owner else [])])
        return {"name": self.name, "class": f"{cls.__module__}:{cls.__qualname__}", "graph_format": self.graph_format,
                "versions": {dist: _version(dist) for dist in names}}

    def read_info(self, out_dir: Path) -> dict[str, Any]:
        """The record its artefact in ``out_dir`` keeps of itself (the export report), as JSON data; ``{}`` when
        the runtime keeps none. Refused in one line when the record is missing or damaged."""
        return {}

    def accuracy(self, out_dir: Path, batches: Iterable[Mapping[str, torch.Tensor]], *, config: PretrainedConfig,
                 threads: int | None = None) -> float | None:
        """Accuracy of its artefact in ``out_dir`` (loaded as it serves) on labelled ``batches``; None where the
        artefact is not a single-label sequence classifier."""
        from surgery.runtimes.shared.benched_model import accuracy_of

        return accuracy_of(self.load(out_dir, config=config, threads=threads), batches)

    def smooth_alpha(self, config: Any) -> float | None:
        """The SmoothQuant strength its int8 export uses for ``config`` (an ExportConfig): the one given, else its
        own default; None where it does not smooth."""
        return config.smooth_alpha

    def artefact_options(self, config: Any, *, tokenizer: Any = None) -> dict[str, Any]:
        """The keyword arguments of :meth:`write_artefact` that ``config`` (an
        :class:`~surgery.runtimes.export_config.ExportConfig`) sets for this runtime: its own export settings.

        This default passes ``opset`` (the one setting the interface names); a runtime that reads more (the
        parity batch, its int8 settings, ``tokenizer`` for the parity batch's texts) returns them.
        """
        return {"opset": config.opset}

    def export(self, model: nn.Module, out_dir: Path, config: Any, *, tokenizer: Any = None,
               calibration: Sequence[Batch] | None = None, data: Iterable[Mapping[str, torch.Tensor]] | None = None
               ) -> Any:
        """``surgery export``'s graph format, as ``config`` (an :class:`~surgery.runtimes.export_config.ExportConfig`)
        says: :meth:`write_folder` with this runtime's :meth:`artefact_options`. Returns :meth:`export_report`."""
        return self.write_folder(model, out_dir, task=config.task, tokenizer=tokenizer, calibration=calibration,
                                 data=data, threads=config.threads, overwrite=config.overwrite,
                                 max_length=config.max_length, pad_to_multiple_of=config.pad_to_multiple_of,
                                 **self.artefact_options(config, tokenizer=tokenizer))

    def write_folder(self, model: nn.Module, out_dir: str | os.PathLike[str], *, task: str = "auto",
                     tokenizer: Any = None, calibration: Sequence[Batch] | None = None,
                     data: Iterable[Mapping[str, torch.Tensor]] | None = None, threads: int | None = None,
                     overwrite: bool = False, max_length: int | None = None,
                     pad_to_multiple_of: int | str | None = None, **options: Any) -> Any:
        """The deployable folder, for every runtime: :meth:`write_artefact` (with ``options``), the serving tokenizer
        beside it and, with labelled ``data``, the accuracy of PyTorch fp32 and of the artefact as served
        (:meth:`accuracy`, kept by :meth:`record_accuracy`), written atomically into ``out_dir`` (an existing one is
        replaced only with ``overwrite``, and only when surgery wrote it whole).

        ``tokenizer`` is saved truncating at ``max_length`` (default: the source's ``max_seq_length``, else the
        tokenizer's or the model's limit; :mod:`surgery.runtimes.shared.tokenizer`). ``pad_to_multiple_of`` (a graph
        runtime: a multiple, or ``"auto"`` to measure it at the shape of ``calibration`` or ``data``) records the
        block the served model pads each batch to (:func:`surgery.runtimes.shared.alignment.align_artefact`), before
        the accuracy is read, so that ``data`` is judged as the artefact is served. Returns :meth:`export_report`
        of the :class:`RuntimeArtefact` (``info["accuracy_torch"]`` and ``info["accuracy"]`` with ``data``).

        Example:
            >>> import tempfile
            >>> from surgery.runtimes import get_runtime
            >>> from surgery.testing import TinySpec, tiny_model
            >>> out = Path(tempfile.mkdtemp()) / "t"
            >>> art = get_runtime("torch").write_folder(tiny_model(TinySpec("bert")), out)
            >>> art.directory == out.resolve(), (out / "model.safetensors").is_file()
            (True, True)
        """
        from dataclasses import replace

        from surgery.core.errors import ConfigError
        from surgery.core.manifest import source_dir_of
        from surgery.persist.model_io import atomic_directory
        from surgery.runtimes.shared.benched_model import accuracy_of
        from surgery.runtimes.shared.tokenizer import save_serving_tokenizer, serving_max_length, source_max_seq_length

        out = Path(out_dir).expanduser()
        with atomic_directory(out, overwrite=overwrite) as tmp:
            artefact = self.write_artefact(model, tmp / "artefact", task=task, calibration=calibration,
                                           threads=threads, **options)
            for item in artefact.directory.iterdir():
                item.rename(tmp / item.name)
            artefact.directory.rmdir()
            info = dict(artefact.info)
            batches = list(data) if data is not None else None
            if pad_to_multiple_of is not None:
                from surgery.runtimes.shared.alignment import align_artefact

                align_artefact(self, tmp, model, pad_to_multiple_of, batches=list(calibration or []) or batches,
                               threads=threads)
            if batches is not None:
                on_torch = accuracy_of(fp32_copy(model), batches)
                served = self.accuracy(tmp, batches, config=model.config, threads=threads)
                if served is None or on_torch is None:
                    raise ConfigError(f"export: accuracy on data needs a sequence classifier; this export is "
                                      f"{artefact.task!r} (drop --data)")
                info = self.record_accuracy(tmp, info, accuracy_torch=on_torch, accuracy=served)
            if tokenizer is not None:
                limit = max_length or source_max_seq_length(source_dir_of(model))
                save_serving_tokenizer(tokenizer, tmp, serving_max_length(model.config, tokenizer, limit))
            files = tuple(sorted(p.name for p in tmp.iterdir()))
        return self.export_report(replace(artefact, directory=out.resolve(), files=files, info=info))

    def record_accuracy(self, out_dir: Path, info: dict[str, Any], *, accuracy_torch: float, accuracy: float
                        ) -> dict[str, Any]:
        """Keep the accuracy on data of PyTorch fp32 and of the artefact in ``out_dir``: this default adds
        ``accuracy_torch`` and ``accuracy`` to ``info``; a runtime with its own record writes them there. Returns
        the artefact's info."""
        return {**info, "accuracy_torch": accuracy_torch, "accuracy": accuracy}

    def export_report(self, artefact: RuntimeArtefact) -> Any:
        """What :meth:`write_folder` returns for the folder it wrote: this default returns ``artefact``; a runtime
        with its own report (the ONNX export report ...) returns that."""
        return artefact

    def with_float_groups(self, served_dir: Path, model: nn.Module, groups: Sequence[str], out_dir: Path) -> Path:
        """A copy of its int8 artefact in ``served_dir`` (of ``model``) with ``groups``' products back in float,
        written into ``out_dir`` (new) for :meth:`load`: how compress's precision pass measures a fallback's gain and
        cost without quantizing again. Where :attr:`float_fallback` is False it is refused in one line."""
        from surgery.core.errors import ConfigError

        raise ConfigError(f"runtime {self.name!r} keeps no op groups in float (its float_fallback is False)")

    def int8_refit(self, model: nn.Module, teacher: nn.Module, batches: Sequence[Batch], *,
                   calibration: Sequence[Batch], threads: int | None = None) -> list[str] | None:
        """Refit ``model``'s cut projections in place against the inputs its int8 artefact feeds them (``teacher``'s
        outputs as targets, ``calibration`` quantizing as the artefact will); the projections solved. This default
        refits nothing and returns None (a runtime with such a refit overrides it)."""
        return None

    def serving_code(self, directory: str) -> list[str]:
        """Python lines that serve its artefact in ``directory`` (``texts`` a list of strings): what a generated
        README shows. This default goes through the runtime itself; the built-ins show their own library's loader.

        Example:
            >>> from surgery.runtimes import get_runtime
            >>> get_runtime("torch").serving_code("out")[1]
            'model = surgery.from_pretrained("out")'
        """
        return ["from pathlib import Path", "from transformers import AutoConfig, AutoTokenizer",
                "from surgery.runtimes import get_runtime",
                f'model = get_runtime("{self.name}").load(Path("{directory}"), config=AutoConfig.from_pretrained('
                f'"{directory}"))', f'outputs = model(**AutoTokenizer.from_pretrained("{directory}")(texts, '
                'padding=True, return_tensors="pt"))']

    def check_settings(self, given: Iterable[str]) -> None:
        """Refuse, in one line, export settings (``ExportConfig`` field names) this runtime does not read."""
        from surgery.core.errors import ConfigError

        wrong = sorted(set(given) - self.export_settings)
        if wrong:
            raise ConfigError(f"{wrong[0]} is not a setting of runtime {self.name!r}; drop it")

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


def bf16_cpu_missing() -> str | None:
    """None where this CPU has native bf16 products (:data:`BF16_CPU_FLAGS`), else one line naming the CPU.

    Example:
        >>> reason = bf16_cpu_missing()
        >>> reason is None or "avx512_bf16" in reason
        True
    """
    from surgery.measure.machine import machine_info

    info = machine_info()
    if any(flag in info.flags for flag in BF16_CPU_FLAGS):
        return None
    return f"this CPU ({info.cpu_model}) has no native bf16 products ({' or '.join(BF16_CPU_FLAGS)} missing)"


def cuda_bf16() -> bool:
    """Whether torch sees a CUDA GPU with native bf16 products (compute capability 8.0 and up).

    Not ``torch.cuda.is_bf16_supported()``'s default, which counts a GPU that emulates bf16 (before Ampere, slower
    there, and refused by the HF Trainer's bf16 check).

    Example:
        >>> isinstance(cuda_bf16(), bool)
        True
    """
    import torch

    return torch.cuda.is_available() and bool(torch.cuda.is_bf16_supported(including_emulation=False))


def bf16_missing() -> str | None:
    """None where PyTorch multiplies bf16 natively here (a CUDA device with bf16 products, compute capability 8.0
    and up, or :func:`bf16_cpu_missing` is None), else one line saying why not: the test behind the ``torch-bf16``
    runtime (training asks about the device it trains on: ``training_tier.bf16_training``).

    Example:
        >>> reason = bf16_missing()
        >>> reason is None or "CUDA" in reason
        True
    """
    if cuda_bf16():
        return None
    reason = bf16_cpu_missing()
    return None if reason is None else f"{reason} and no CUDA device with native bf16 is present"


def _distribution_of(module: str) -> str | None:
    """The installed distribution that ships the top-level package of ``module``; None when none does."""
    from importlib import metadata

    found = metadata.packages_distributions().get(module.partition(".")[0], [])
    return found[0] if found else None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


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
    :class:`~surgery.runtimes.shared.graph_export.Agreement`) as its parity figures."""
    out = Path(out_dir).expanduser().resolve()
    parity = {"max_abs_diff": float(found.max_abs_diff), "mean_cosine": float(found.mean_cosine or 0.0),
              "min_cosine": float(found.min_cosine)}
    return RuntimeArtefact(runtime, out, artefact_files(out), task, output, parity, info)


def artefact_files(directory: Path) -> tuple[str, ...]:
    """The names of an artefact's files, sorted: what the runtime loads (surgery's own manifest left out).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "model.onnx").write_bytes(b""), (d / OUTPUT_MANIFEST).write_text("{}")
        >>> artefact_files(d)
        ('model.onnx',)
    """
    return tuple(sorted(p.name for p in directory.iterdir() if p.name != OUTPUT_MANIFEST))


def fp32_copy(model: nn.Module) -> nn.Module:
    """A detached fp32 copy of ``model`` in eval mode (what every artefact is made from).

    Example:
        >>> import torch
        >>> m = torch.nn.Linear(2, 2).to(torch.bfloat16)
        >>> fp32_copy(m).weight.dtype, m.weight.dtype
        (torch.float32, torch.bfloat16)
    """
    return copy.deepcopy(model).float().eval()
