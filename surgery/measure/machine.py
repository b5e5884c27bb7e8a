"""Which machine a timing came from: the CPU, its int8-relevant instruction sets, libraries and threads.

int8 gains depend on the CPU: AVX2 alone multiplies int8 through 16-bit intermediates, AVX-512 VNNI and
AVX-VNNI have one-instruction int8 dot products, AMX has int8 tile multiplies. The same code measured
1.59x and 2.62x on two CPUs and nobody could tell which figure came from which, so every latency table
and every bench JSON carries a :class:`MachineInfo`, and a latency table's cache key carries its
:attr:`MachineInfo.fingerprint`.

On Linux the CPU is read from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM); on macOS
from ``sysctl``; elsewhere ``platform`` gives what it can and the flags stay empty.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

#: Instruction-set flags that decide how fast fp32 and int8 products run, as ``/proc/cpuinfo`` names them
#: (x86, then ARM); the fingerprint and the one-line summary use only these.
SPEED_FLAGS: tuple[str, ...] = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
    "avx_vnni_int8", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
    "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2", "sme",
)
#: The flags an int8 reader looks for first: the widest int8 dot-product path the CPU has.
INT8_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8",
                               "asimddp", "i8mm", "sve2", "sme")
# macOS names some of the same features under hw.optional; mapped to the Linux names.
_SYSCTL_FLAGS = {
    "hw.optional.avx2_0": "avx2", "hw.optional.avx512f": "avx512f", "hw.optional.avx512vnni": "avx512_vnni",
    "hw.optional.arm.FEAT_DotProd": "asimddp", "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16", "hw.optional.arm.FEAT_SME": "sme", "hw.optional.neon": "asimd",
}


class MachineInfo(BaseModel):
    """The CPU, its speed-relevant flags, the libraries and the thread counts of this process.

    Example:
        >>> info = MachineInfo(cpu_model="Example CPU", vendor="GenuineIntel", arch="x86_64", system="Linux",
        ...                    logical_cpus=8, usable_cpus=8, flags=["avx2", "avx512_vnni"], torch_threads=4)
        >>> info.int8_flags, info.summary()
        (['avx2', 'avx512_vnni'], 'Example CPU (x86_64, 8 CPUs; int8: avx2, avx512_vnni)')
        >>> len(info.fingerprint), info.fingerprint == info.model_copy(update={"torch_threads": 1}).fingerprint
        (12, True)
    """

    model_config = ConfigDict(frozen=True)

    cpu_model: str = Field(description="the CPU's model name (as the OS reports it; virtual machines may shorten it)")
    vendor: str = Field(default="", description="GenuineIntel, AuthenticAMD, an ARM implementer code ...")
    cpu_family: str = Field(default="", description="family/model/stepping numbers where the OS gives them")
    arch: str = Field(description="platform.machine(): x86_64, aarch64, arm64 ...")
    system: str = Field(description="platform.system(): Linux, Darwin, Windows")
    logical_cpus: int | None = Field(default=None, description="os.cpu_count()")
    usable_cpus: int | None = Field(default=None, description="CPUs this process may run on (affinity)")
    physical_cores: int | None = Field(default=None, description="distinct (package, core) pairs, where known")
    flags: list[str] = Field(default_factory=list, description="the SPEED_FLAGS this CPU has")
    torch_cpu_capability: str | None = Field(default=None, description="the kernel set torch dispatches to "
                                             "(torch.backends.cpu.get_cpu_capability)")
    hypervisor: bool = Field(default=False, description="running under a hypervisor (the flag says so)")
    torch_version: str | None = None
    onnxruntime_version: str | None = None
    transformers_version: str | None = None
    torch_threads: int | None = Field(default=None, description="torch's intra-op threads when read")
    source: str = Field(default="", description="where the CPU facts came from")

    @property
    def int8_flags(self) -> list[str]:
        """The flags of :data:`INT8_FLAGS` this CPU has, in that order."""
        return [f for f in INT8_FLAGS if f in self.flags]

    @property
    def fingerprint(self) -> str:
        """12 hex digits that change when the hardware does (CPU, flags, core count), not with threads or
        library versions: those enter cache keys on their own."""
        facts = "|".join([self.cpu_model, self.vendor, self.cpu_family, self.arch, self.system,
                          str(self.usable_cpus), ",".join(sorted(self.flags))])
        return hashlib.sha256(facts.encode()).hexdigest()[:12]

    @property
    def versions(self) -> dict[str, str]:
        """The library versions that a timing depends on (only those installed)."""
        named = {"torch": self.torch_version, "onnxruntime": self.onnxruntime_version,
                 "transformers": self.transformers_version}
        return {k: v for k, v in named.items() if v}

    def summary(self) -> str:
        """One line: the CPU model, architecture, CPU count and its int8-relevant flags."""
        cpus = self.usable_cpus or self.logical_cpus
        int8 = ", ".join(self.int8_flags) or "no int8 dot-product flags"
        return f"{self.cpu_model} ({self.arch}, {cpus if cpus is not None else '?'} CPUs; int8: {int8})"


def parse_cpuinfo(text: str) -> dict[str, str | int | list[str] | None]:
    """The facts of ``/proc/cpuinfo``'s text: model name, vendor, family numbers, speed flags, cores.

    Example:
        >>> facts = parse_cpuinfo("processor : 0\\nvendor_id : AuthenticAMD\\ncpu family : 25\\nmodel : 17\\n"
        ...                       "model name : AMD EPYC\\nflags : fpu avx2 avx512f avx512_vnni hypervisor\\n"
        ...                       "physical id : 0\\ncore id : 0\\n")
        >>> facts["cpu_model"], facts["cpu_family"], facts["flags"], facts["hypervisor"]
        ('AMD EPYC', '25/17', ['avx2', 'avx512f', 'avx512_vnni'], True)
    """
    blocks = [dict(_fields(block)) for block in text.strip().split("\n\n") if block.strip()]
    first = blocks[0] if blocks else {}
    # ARM kernels list "CPU implementer/part" per processor and sometimes no model name at all.
    name = first.get("model name") or first.get("Model") or first.get("Hardware") or first.get("cpu model") or ""
    if not name and first.get("CPU part"):
        name = f"ARM implementer {first.get('CPU implementer', '?')} part {first['CPU part']}"
    raw_flags = set((first.get("flags") or first.get("Features") or "").split())
    numbers = [first.get(k, "") for k in ("cpu family", "model", "stepping") if first.get(k, "").isdigit()]
    cores = {(b.get("physical id", "0"), b["core id"]) for b in blocks if "core id" in b}
    return {
        "cpu_model": " ".join(name.split()),
        "vendor": first.get("vendor_id") or first.get("CPU implementer") or "",
        "cpu_family": "/".join(numbers[:2]),
        "flags": [f for f in SPEED_FLAGS if f in raw_flags],
        "hypervisor": "hypervisor" in raw_flags,
        "physical_cores": len(cores) or None,
    }


def _fields(block: str) -> Iterable[tuple[str, str]]:
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


def _sysctl(names: Iterable[str]) -> dict[str, str]:
    """Values of macOS sysctl keys that exist (an unknown key is skipped, a missing sysctl gives nothing)."""
    found = {}
    for name in names:
        try:
            out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return found
        if out.returncode == 0 and out.stdout.strip():
            found[name] = out.stdout.strip()
    return found


def _cpu_facts() -> tuple[dict[str, str | int | list[str] | None], str]:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        try:
            return parse_cpuinfo(cpuinfo.read_text(errors="replace")), "/proc/cpuinfo"
        except OSError:
            pass
    if platform.system() == "Darwin":
        values = _sysctl(["machdep.cpu.brand_string", "machdep.cpu.vendor", "hw.physicalcpu", *_SYSCTL_FLAGS])
        flags = {flag for key, flag in _SYSCTL_FLAGS.items() if values.get(key) == "1"}
        cores = values.get("hw.physicalcpu", "")
        return {"cpu_model": values.get("machdep.cpu.brand_string", platform.processor()),
                "vendor": values.get("machdep.cpu.vendor", ""), "cpu_family": "",
                "flags": [f for f in SPEED_FLAGS if f in flags], "hypervisor": False,
                "physical_cores": int(cores) if cores.isdigit() else None}, "sysctl"
    return {"cpu_model": platform.processor() or platform.machine(), "vendor": "", "cpu_family": "",
            "flags": [], "hypervisor": False, "physical_cores": None}, "platform (no CPU flags on this system)"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _usable_cpus() -> int | None:
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return len(affinity(0))
        except OSError:
            pass
    return os.cpu_count()


@lru_cache(maxsize=1)
def _static_info() -> Mapping[str, object]:
    """What does not change while the process runs (read once: /proc/cpuinfo has a block per CPU)."""
    import torch

    facts, source = _cpu_facts()
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {**facts, "source": source, "arch": platform.machine(), "system": platform.system(),
            "logical_cpus": os.cpu_count(), "usable_cpus": _usable_cpus(),
            "torch_cpu_capability": capability() if callable(capability) else None,
            "torch_version": torch.__version__, "onnxruntime_version": _version("onnxruntime"),
            "transformers_version": _version("transformers")}


def machine_info() -> MachineInfo:
    """This machine: CPU model and flags, library versions and torch's current thread count.

    Example:
        >>> info = machine_info()
        >>> info.arch == platform.machine() and info.torch_threads >= 1 and len(info.fingerprint) == 12
        True
    """
    import torch

    return MachineInfo(**_static_info(), torch_threads=torch.get_num_threads())  # type: ignore[arg-type]
