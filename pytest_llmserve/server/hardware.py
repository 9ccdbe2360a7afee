"""This host's identity, the ``hardware`` of a baseline context (:data:`HOST_FIELDS`): the CPU from
``/proc/cpuinfo`` (vendor, family, model, stepping and the instruction sets engines dispatch on; cores), NUMA
nodes and memory, and the GPUs through the one GPU probe (:mod:`pytest_llmserve.server.gpu`: model, count,
memory, driver and CUDA version, compute capability, power limit, interconnect). Probed once per process
(:func:`hardware_context`).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from pytest_llmserve.server import gpu

CPUINFO = Path("/proc/cpuinfo")


# The instruction-set extensions inference engines dispatch their kernels on (vLLM's CPU backend picks
# AVX-512/BF16/VNNI/AMX paths and runs far slower without them; llama.cpp and oneDNN likewise): two hosts
# with one CPU name but another set of these are different hosts. Only these are stored, sorted, so that a
# flag of no consequence (a microcode or hypervisor detail) does not tell two identical hosts apart.
DISPATCH_FLAGS = frozenset({
    "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512_fp16",
    "amx_bf16", "amx_tile", "amx_int8", "amx_fp16",
    "asimd", "sve", "sve2", "bf16", "i8mm",  # aarch64 ("Features" line)
})
MEMINFO = Path("/proc/meminfo")
NODES = Path("/sys/devices/system/node")


class CpuIdentity(TypedDict):
    """The CPU part of a host's identity (:func:`parse_cpuinfo`); None where ``/proc/cpuinfo`` does not say."""

    cpu_model: str | None
    cpu_vendor: str | None
    cpu_family: str | None
    cpu_model_id: str | None
    cpu_stepping: str | None
    cpu_flags: list[str]  # the DISPATCH_FLAGS it has, sorted
    cpu_cores: int | None  # physical cores


def parse_cpuinfo(text: str) -> CpuIdentity:
    """The CPU's identity from a ``/proc/cpuinfo`` text: name, vendor, family, model and stepping (of the
    first processor; aarch64 spells them ``CPU implementer``/``CPU architecture``/``CPU part``/``CPU variant``),
    the :data:`DISPATCH_FLAGS` it has (sorted) and its physical cores (distinct ``physical id``/``core id``
    pairs; None where the text does not say). Absent fields are None."""
    first: dict[str, str] = {}
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    current: dict[str, str] = {}

    def end_processor() -> None:
        if "core id" in current:
            cores.add((current.get("physical id", "0"), current["core id"]))
        current.clear()

    for line in text.splitlines():
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep:
            continue
        if name == "processor" and current:
            end_processor()
        current[name] = value
        first.setdefault(name, value)
        if name in ("flags", "Features"):
            flags.update(value.split())
    end_processor()

    def field(*names: str) -> str | None:
        return next((first[n] for n in names if first.get(n)), None)

    return {
        "cpu_model": field("model name", "Model", "Hardware", "cpu model"),
        "cpu_vendor": field("vendor_id", "CPU implementer"),
        "cpu_family": field("cpu family", "CPU architecture"),
        "cpu_model_id": field("model", "CPU part"),
        "cpu_stepping": field("stepping", "CPU variant"),
        "cpu_flags": sorted(flags & DISPATCH_FLAGS),
        "cpu_cores": len(cores) or None,
    }


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_count() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _numa_nodes(nodes: Path) -> int | None:
    """NUMA nodes under ``/sys/devices/system/node`` (``node0``, ``node1``...); None where it is not there."""
    try:
        found = [p for p in nodes.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError:
        return None
    return len(found) or None


def _memory_gib(meminfo: Path) -> int | None:
    """``MemTotal`` rounded to whole GiB: the kernel's reservations move it by a few MiB between boots and
    kernels, and a host must compare with itself."""
    for line in _read_text(meminfo).splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal" and value.split() and value.split()[0].isdigit():
            return round(int(value.split()[0]) / (1024 * 1024))
    return None


#: The keys of :func:`probe_hardware`, in stored order (the first six are those of baselines recorded before
#: the host's identity was: cpu_model, cpu_count and the GPU's name, count, driver and CUDA version).
HOST_FIELDS = ("cpu_model", "cpu_count", "gpu_name", "gpu_count", "driver", "cuda",
               "cpu_vendor", "cpu_family", "cpu_model_id", "cpu_stepping", "cpu_flags", "cpu_cores",
               "numa_nodes", "memory_gib",
               "gpu_memory_mib", "gpu_compute_capability", "gpu_power_limit_w", "gpu_interconnect")


def probe_hardware(*, gpus: gpu.GpuSnapshot | None = None, cpuinfo: Path = CPUINFO, meminfo: Path = MEMINFO,
                   nodes: Path = NODES) -> dict[str, Any]:
    """The host's identity, the ``hardware`` of a baseline context (:data:`HOST_FIELDS`, in that order).

    CPU: name, vendor, family, model, stepping and the :data:`DISPATCH_FLAGS` it has (:func:`parse_cpuinfo`),
    logical cores this process may use (affinity) and physical cores; NUMA nodes; total memory in GiB.
    GPU (:func:`pytest_llmserve.server.gpu.gpu_summary`; None/0 without one): name, count, driver and CUDA
    version, memory per GPU (MiB), compute capability, power limit (W) and interconnect (``nvlink``/``pcie``).
    ``gpus`` defaults to a fresh :func:`pytest_llmserve.server.gpu.snapshot` (NVML, else nvidia-smi).
    """
    cpu = parse_cpuinfo(_read_text(cpuinfo))
    summary = gpu.gpu_summary(gpus)
    found = {
        **cpu,
        "cpu_model": cpu["cpu_model"] or platform.processor() or None,
        "cpu_count": _cpu_count(),
        "numa_nodes": _numa_nodes(nodes),
        "memory_gib": _memory_gib(meminfo),
        **{name: summary[name] for name in gpu.GPU_IDENTITY_FIELDS},
    }
    return {name: found[name] for name in HOST_FIELDS}


# Cached for the life of the process: a host's hardware does not change while it runs, and the GPU
# query can cost nvidia-smi subprocesses on every benchmark. The value is read-only (a mapping proxy over
# immutable values), so no caller can change what the next one gets; tests call probe_hardware instead.
@functools.cache
def _host_hardware() -> Mapping[str, Any]:
    return MappingProxyType(probe_hardware())


def hardware_context() -> dict[str, Any]:
    """This host's :func:`probe_hardware`, probed once per process; a fresh dict on every call."""
    return dict(_host_hardware())
