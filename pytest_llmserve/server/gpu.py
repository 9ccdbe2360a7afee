"""GPUs seen from the host: what is there, who holds memory, and whether a server gave it back.

Read through NVML (``pynvml``, the ``nvidia-ml-py`` distribution; imported lazily) and, when NVML is
missing or fails, through ``nvidia-smi``'s CSV queries. Without a GPU every function returns an empty
answer (``[]``, ``{}``, ``None``) and raises nothing, so callers need no "is there a GPU?" branch.

Used around a server's life:

* before boot, :func:`preflight_gpus` refuses a boot that cannot succeed or would measure the wrong
  thing: fewer GPUs than ``tp``, too little free memory, or a stale process still holding a GPU
  (named with pid, command and memory, and how to clear it);
* after teardown, :func:`wait_memory_returned` waits until each GPU's used memory is back near what
  it was before boot, and names the processes still holding memory when it is not.

Memory is in MiB throughout (what nvidia-smi prints and what people read).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, SupportsInt, TypedDict, TypeVar, Unpack

import psutil

from pytest_llmserve.errors import PreflightError

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec

__all__ = [
    "GpuInfo",
    "GpuProcess",
    "GpuSnapshot",
    "MemoryReturn",
    "ProcessUtilization",
    "PreflightResult",
    "gpu_check",
    "gpu_processes",
    "gpu_summary",
    "list_gpus",
    "no_gpu_reason",
    "parse_smi_apps_csv",
    "parse_smi_cuda_version",
    "parse_smi_gpus_csv",
    "parse_smi_power_limits",
    "preflight_gpus",
    "process_utilization",
    "snapshot",
    "visible_gpus",
    "wait_memory_returned",
]

SMI_TIMEOUT_S = 20.0
#: A GPU is "free enough" to boot on when at least this fraction of its memory is free.
DEFAULT_MIN_FREE_FRACTION = 0.9
#: Memory that may stay in use after teardown without counting as a leak (driver/context noise).
DEFAULT_RETURN_TOLERANCE_MIB = 256

#: gpu_summary's keys that are part of a host's identity (baseline contexts' "hardware").
GPU_IDENTITY_FIELDS = ("gpu_name", "gpu_count", "driver", "cuda", "gpu_memory_mib", "gpu_compute_capability",
                       "gpu_power_limit_w", "gpu_interconnect")

#: A value the GPUs of a host may share: a memory size or power limit (MiB, W), a compute capability.
_Shared = TypeVar("_Shared", int, str)

_GPU_FIELDS = "index,uuid,name,memory.total,memory.used,memory.free,driver_version,pci.bus_id"
_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as the driver reports it now."""

    index: int
    name: str
    uuid: str | None
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    driver: str | None = None
    cuda: str | None = None  # the driver's CUDA version, e.g. "13.0"
    pci_bus_id: str | None = None
    compute_capability: str | None = None  # e.g. "9.0" (Hopper); None where the driver does not say
    power_limit_w: int | None = None  # the enforced power limit (an admin may lower it: slower, same name)
    nvlink: bool | None = None  # an NVLink link is active (NVML); None where unknown (nvidia-smi)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name})"

    @property
    def free_fraction(self) -> float:
        return self.memory_free_mib / self.memory_total_mib if self.memory_total_mib else 0.0

    def describe(self) -> str:
        return (
            f"GPU {self.index} ({self.name}): {self.memory_used_mib} MiB used, {self.memory_free_mib} "
            f"of {self.memory_total_mib} MiB free"
        )


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    gpu_index: int | None
    gpu_uuid: str | None
    pid: int
    name: str
    used_memory_mib: int | None  # None: the driver does not say (e.g. in some containers)
    command: str | None = None  # full command line when this host can see the process

    def describe(self) -> str:
        mem = f"{self.used_memory_mib} MiB" if self.used_memory_mib is not None else "memory not reported"
        what = self.command or self.name or "?"
        where = f"GPU {self.gpu_index}" if self.gpu_index is not None else (self.gpu_uuid or "GPU ?")
        return f"pid {self.pid} on {where} ({mem}): {what}"


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """What one process used of one GPU lately (NVML's per-process accounting): the mean SM utilisation of the
    driver's samples since the read's window began (a fraction of the GPU) and the memory it holds."""

    gpu_index: int
    pid: int
    name: str
    sm_util: float
    memory_mib: int | None


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """GPUs and the processes on them at one moment, and which tool said so."""

    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...]
    source: str  # "nvml", "nvidia-smi" or "none"

    def used_mib(self) -> dict[int, int]:
        return {g.index: g.memory_used_mib for g in self.gpus}


@dataclass
class PreflightResult:
    """What the GPU preflight looked at (kept for the report even when it passes)."""

    gpus: list[GpuInfo]
    devices: list[int]  # the GPUs this server will use
    processes: list[GpuProcess]
    baseline_used_mib: dict[int, int]
    problems: list[str] = field(default_factory=list)
    baseline_pids: list[int] = field(default_factory=list)  # every GPU process seen, for the teardown check

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "devices": list(self.devices),
            "processes": [asdict(p) for p in self.processes],
            "baseline_used_mib": {str(k): v for k, v in self.baseline_used_mib.items()},
            "problems": list(self.problems),
            "baseline_pids": list(self.baseline_pids),
        }


@dataclass
class MemoryReturn:
    """Whether every GPU's memory came back after a teardown."""

    ok: bool
    baseline_used_mib: dict[int, int]
    used_mib: dict[int, int]
    waited_s: float
    leftover_processes: list[GpuProcess] = field(default_factory=list)
    tolerance_mib: int = DEFAULT_RETURN_TOLERANCE_MIB

    def message(self) -> str:
        if not self.used_mib:
            return "no GPU visible: nothing to check"
        parts = [
            f"GPU {i}: {self.used_mib.get(i, '?')} MiB used "
            f"(before boot {self.baseline_used_mib.get(i, '?')})"
            for i in sorted(self.used_mib)
        ]
        head = (
            "GPU memory returned"
            if self.ok
            else f"GPU memory NOT returned within {self.waited_s:.0f} s (tolerance {self.tolerance_mib} MiB)"
        )
        text = head + ": " + "; ".join(parts)
        if self.leftover_processes:
            text += "\nstill holding GPU memory:\n" + "\n".join(
                "  " + p.describe() for p in self.leftover_processes
            )
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "baseline_used_mib": {str(k): v for k, v in self.baseline_used_mib.items()},
            "used_mib": {str(k): v for k, v in self.used_mib.items()},
            "waited_s": round(self.waited_s, 2),
            "leftover_processes": [asdict(p) for p in self.leftover_processes],
            "tolerance_mib": self.tolerance_mib,
        }


# --------------------------------------------------------------------------- nvidia-smi parsing


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    value = text.strip()
    match = re.fullmatch(r"(-?\d+)(?:\s*MiB)?", value)
    return int(match.group(1)) if match else None


def _rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in row]
        for row in csv.reader(io.StringIO(text))
        if row and any(c.strip() for c in row)
    ]


def parse_smi_gpus_csv(text: str, cuda: str | None = None) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,
    driver_version,pci.bus_id --format=csv,noheader,nounits`` (a header row is skipped too)."""
    out: list[GpuInfo] = []
    for row in _rows(text):
        if len(row) < 6 or not row[0].isdigit():
            continue  # header or an error line ("No devices were found")
        total, used, free = (_int_or_none(v) for v in row[3:6])
        out.append(
            GpuInfo(
                index=int(row[0]),
                uuid=row[1] or None,
                name=row[2],
                memory_total_mib=total or 0,
                memory_used_mib=used or 0,
                memory_free_mib=free if free is not None else max(0, (total or 0) - (used or 0)),
                driver=row[6] if len(row) > 6 and row[6] else None,
                cuda=cuda,
                pci_bus_id=row[7] if len(row) > 7 and row[7] else None,
            )
        )
    return out


def parse_smi_apps_csv(text: str, uuid_to_index: Mapping[str, int] | None = None) -> list[GpuProcess]:
    """Rows of ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits``. ``used_memory`` may read ``[N/A]`` (then None)."""
    index = dict(uuid_to_index or {})
    out: list[GpuProcess] = []
    for row in _rows(text):
        if len(row) < 3 or not row[1].isdigit():
            continue
        uuid = row[0] or None
        out.append(
            GpuProcess(
                gpu_index=index.get(uuid) if uuid else None,
                gpu_uuid=uuid,
                pid=int(row[1]),
                name=row[2],
                used_memory_mib=_int_or_none(row[3]) if len(row) > 3 else None,
            )
        )
    return out


def parse_smi_compute_caps(text: str) -> dict[int, str]:
    """Rows of ``nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader`` (``0, 9.0``) by GPU index."""
    return {int(row[0]): row[1] for row in _rows(text)
            if len(row) > 1 and row[0].isdigit() and re.fullmatch(r"\d+\.\d+", row[1])}


def parse_smi_power_limits(text: str) -> dict[int, int]:
    """Rows of ``nvidia-smi --query-gpu=index,power.limit --format=csv,noheader,nounits`` (``0, 700.00``) in W."""
    out: dict[int, int] = {}
    for row in _rows(text):
        if len(row) > 1 and row[0].isdigit() and re.fullmatch(r"\d+(?:\.\d+)?", row[1]):
            out[int(row[0])] = round(float(row[1]))
    return out


def parse_smi_cuda_version(banner: str) -> str | None:
    """``CUDA Version: 13.0`` from the plain ``nvidia-smi`` banner."""
    match = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- backends


Runner = Callable[[Sequence[str]], str | None]


def _run_smi(argv: Sequence[str]) -> str | None:
    """stdout of nvidia-smi, or None when it is missing or fails (no GPU, no driver)."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mib(value: SupportsInt) -> int:
    return int(value) // (1024 * 1024)


def _nvml_started(nvml: Any = None) -> Any:
    """``nvml`` (default: pynvml) after ``nvmlInit``, or None when pynvml is missing or NVML cannot start; the
    caller shuts it down (``nvmlShutdown``) when done."""
    if nvml is None:
        try:  # optional: nvidia-ml-py is installed where a GPU is, not on a CPU host
            import pynvml as nvml  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded / ...: no GPU here
        return None
    return nvml


def _snapshot_nvml(nvml: Any = None) -> GpuSnapshot | None:
    """Everything through NVML, or None when pynvml is missing or NVML cannot start."""
    nvml = _nvml_started(nvml)
    if nvml is None:
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda: str | None = None
        with contextlib.suppress(Exception):
            cuda_int = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}"
        gpus: list[GpuInfo] = []
        procs: list[GpuProcess] = []
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            uuid: str | None = None
            with contextlib.suppress(Exception):
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            bus: str | None = None
            with contextlib.suppress(Exception):
                bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            capability: str | None = None
            with contextlib.suppress(Exception):
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability = f"{int(major)}.{int(minor)}"
            power: int | None = None
            with contextlib.suppress(Exception):
                power = round(int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000)  # mW
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=uuid,
                    memory_total_mib=_mib(mem.total),
                    memory_used_mib=_mib(mem.used),
                    memory_free_mib=_mib(mem.free),
                    driver=driver,
                    cuda=cuda,
                    pci_bus_id=bus,
                    compute_capability=capability,
                    power_limit_w=power,
                    nvlink=_nvlink_active(nvml, handle),
                )
            )
            # Compute processes are the ones that matter; if NVML cannot list them (a pynvml/driver
            # mismatch does that), let nvidia-smi answer rather than report a GPU with no processes.
            running: list[Any] = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            with contextlib.suppress(Exception):
                running.extend(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
            seen: set[int] = set()
            for proc in running:
                pid = int(proc.pid)
                if pid in seen:
                    continue
                seen.add(pid)
                used = getattr(proc, "usedGpuMemory", None)
                name = ""
                with contextlib.suppress(Exception):
                    name = _text(nvml.nvmlSystemGetProcessName(pid))
                procs.append(
                    GpuProcess(
                        gpu_index=i,
                        gpu_uuid=uuid,
                        pid=pid,
                        name=name,
                        used_memory_mib=_mib(used) if isinstance(used, int) else None,
                    )
                )
        return GpuSnapshot(tuple(gpus), tuple(procs), "nvml")
    except Exception:  # noqa: BLE001 - a half-working NVML: let nvidia-smi answer instead
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvlink_active(nvml: Any, handle: object) -> bool | None:
    """Whether any of the GPU's NVLink links is active; False when NVML answers for its links and none is
    (a PCIe-only GPU answers "not supported"); None when NVML cannot say."""
    links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    answered = False
    for link in range(links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported / InvalidArgument past the last link
            if type(exc).__name__ == "NVMLError_NotSupported":
                answered = True  # this GPU (or link) has no NVLink
            continue
        answered = True
        if int(state) == 1:  # NVML_FEATURE_ENABLED
            return True
    return False if answered else None


def process_utilization(*, nvml: Any = None, window_s: float = 1.0) -> list[ProcessUtilization] | None:
    """Every compute process on every GPU with its SM utilisation over the last ``window_s`` seconds
    (``nvmlDeviceGetProcessUtilization``) and its memory (``nvmlDeviceGetComputeRunningProcesses``); a process
    with utilisation samples but no memory listed is included too. None where NVML cannot answer (no GPU, no
    pynvml): a host without per-process GPU accounting, which is not the same as idle GPUs (``[]``).
    ``nvml`` (a pynvml-like module) is injectable for tests."""
    nvml = _nvml_started(nvml)
    if nvml is None:
        return None
    try:
        out: list[ProcessUtilization] = []
        since_us = int((time.time() - window_s) * 1_000_000)
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory: dict[int, int | None] = {}
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(proc, "usedGpuMemory", None)
                memory[int(proc.pid)] = _mib(used) if isinstance(used, int) else None
            util: dict[int, list[float]] = {}
            # NVML raises NVMLError_NotFound when no process ran on the GPU in the window: none used it.
            with contextlib.suppress(Exception):
                for sample in nvml.nvmlDeviceGetProcessUtilization(handle, since_us):
                    util.setdefault(int(sample.pid), []).append(float(sample.smUtil) / 100.0)
            for pid in sorted(set(memory) | set(util)):
                name = ""
                with contextlib.suppress(Exception):
                    name = os.path.basename(_text(nvml.nvmlSystemGetProcessName(pid)))
                values = util.get(pid, [])
                out.append(ProcessUtilization(i, pid, name, sum(values) / len(values) if values else 0.0,
                                              memory.get(pid)))
        return out
    except Exception:  # noqa: BLE001 - a half-working NVML gives no accounting rather than a wrong one
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _snapshot_smi(run: Runner = _run_smi) -> GpuSnapshot | None:
    gpus_text = run(["nvidia-smi", f"--query-gpu={_GPU_FIELDS}", "--format=csv,noheader,nounits"])
    if gpus_text is None:
        return None
    banner = run(["nvidia-smi"]) or ""
    gpus = parse_smi_gpus_csv(gpus_text, cuda=parse_smi_cuda_version(banner))
    if not gpus:
        return None
    # A query of its own: a driver that does not know the field fails the whole query, and the GPUs must still be seen.
    capabilities = parse_smi_compute_caps(run(["nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader"])
                                          or "")
    power = parse_smi_power_limits(run(["nvidia-smi", "--query-gpu=index,power.limit", "--format=csv,noheader,nounits"])
                                   or "")
    gpus = [replace(g, compute_capability=capabilities.get(g.index), power_limit_w=power.get(g.index)) for g in gpus]
    apps_text = (
        run(["nvidia-smi", f"--query-compute-apps={_APP_FIELDS}", "--format=csv,noheader,nounits"]) or ""
    )
    procs = parse_smi_apps_csv(apps_text, {g.uuid: g.index for g in gpus if g.uuid})
    return GpuSnapshot(tuple(gpus), tuple(procs), "nvidia-smi")


def _with_commands(snap: GpuSnapshot) -> GpuSnapshot:
    """Fill each process's command line from /proc when this host can see it (not in every container)."""
    procs = []
    for p in snap.processes:
        command = p.command
        name = p.name
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(p.pid)
            command = " ".join(proc.cmdline())[:300] or None
            name = name or proc.name()
        procs.append(GpuProcess(p.gpu_index, p.gpu_uuid, p.pid, name, p.used_memory_mib, command))
    return GpuSnapshot(snap.gpus, tuple(procs), snap.source)


class SnapshotOptions(TypedDict, total=False):
    """:func:`snapshot`'s options, which :func:`list_gpus`, :func:`gpu_processes` and :func:`no_gpu_reason` pass on."""

    nvml: Any  # a pynvml-like module (pynvml is untyped; tests hand in stand-ins for the part gpu.py calls)
    run: Runner | None
    prefer: str


def snapshot(*, nvml: Any = None, run: Runner | None = None, prefer: str = "nvml") -> GpuSnapshot:
    """GPUs and their processes now; an empty snapshot (source ``none``) without a GPU.

    ``nvml`` (a pynvml-like module) and ``run`` (an nvidia-smi runner returning stdout or None)
    are injectable for tests; ``prefer="nvidia-smi"`` asks nvidia-smi first.
    """
    runner = run or _run_smi
    order: list[Callable[[], GpuSnapshot | None]] = [
        lambda: _snapshot_nvml(nvml),
        lambda: _snapshot_smi(runner),
    ]
    if prefer == "nvidia-smi":
        order.reverse()
    for backend in order:
        snap = backend()
        if snap is not None and snap.gpus:
            return _with_commands(snap)
    return GpuSnapshot((), (), "none")


def list_gpus(**kwargs: Unpack[SnapshotOptions]) -> list[GpuInfo]:
    """Every GPU the driver sees (not only the visible ones); ``[]`` without a GPU."""
    return list(snapshot(**kwargs).gpus)


def gpu_processes(**kwargs: Unpack[SnapshotOptions]) -> list[GpuProcess]:
    """Processes holding GPU memory now; ``[]`` without a GPU."""
    return list(snapshot(**kwargs).processes)


def visible_gpus(gpus: Sequence[GpuInfo], env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs a process started with ``env`` may use (``CUDA_VISIBLE_DEVICES``: indices or UUIDs).

    Unset means all; an empty value or ``-1`` means none. An entry that matches nothing ends the
    list, as CUDA does.
    """
    environ = os.environ if env is None else env
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(gpus)
    out: list[GpuInfo] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            break
        match: GpuInfo | None = None
        if re.fullmatch(r"\d+", entry):
            match = next((g for g in gpus if g.index == int(entry)), None)
        else:
            match = next((g for g in gpus if g.uuid and (g.uuid == entry or g.uuid.startswith(entry))), None)
        if match is None or match in out:
            break
        out.append(match)
    return out


def no_gpu_reason(env: Mapping[str, str] | None = None, **kwargs: Unpack[SnapshotOptions]) -> str | None:
    """None when this process may use a GPU, else why not (the reason ``gpu`` tests are skipped).

    An empty or ``-1`` ``CUDA_VISIBLE_DEVICES`` answers without asking the driver.
    """
    environ = os.environ if env is None else env
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None and raw.strip() in ("", "-1"):
        return f"no GPU visible (CUDA_VISIBLE_DEVICES={raw!r})"
    gpus = list_gpus(**kwargs)
    if not gpus:
        return "no GPU visible (neither NVML nor nvidia-smi answered)"
    if not visible_gpus(gpus, environ):
        return f"no GPU visible (CUDA_VISIBLE_DEVICES={raw!r} names none of the {len(gpus)} GPUs)"
    return None


def _one(values: Iterable[_Shared | None]) -> _Shared | list[_Shared | None] | None:
    """The value all GPUs share, else their distinct values sorted, None last (a mixed host says so)."""
    distinct = set(values)
    if len(distinct) == 1:
        return distinct.pop()
    return sorted(v for v in distinct if v is not None) + ([None] if None in distinct else [])


def _interconnect(gpus: Sequence[GpuInfo]) -> str | None:
    """``nvlink`` when any GPU has an active NVLink link, ``pcie`` when NVML said none has, else None."""
    if any(g.nvlink for g in gpus):
        return "nvlink"
    return "pcie" if gpus and all(g.nvlink is False for g in gpus) else None


def gpu_summary(snap: GpuSnapshot | None = None) -> dict[str, Any]:
    """The GPUs' identity (:data:`GPU_IDENTITY_FIELDS`) and per-GPU memory, for baseline keys and reports.

    The identity keys are the GPU part of :func:`pytest_llmserve.server.hardware.hardware_context`:
    name, count, driver, CUDA version, memory (MiB), compute capability, power limit (W) and interconnect;
    a value the GPUs do not share is the sorted list of theirs.
    """
    snap = snap if snap is not None else snapshot()
    if not snap.gpus:
        return {
            "gpu_name": None,
            "gpu_count": 0,
            "driver": None,
            "cuda": None,
            "gpu_memory_mib": None,
            "gpu_compute_capability": None,
            "gpu_power_limit_w": None,
            "gpu_interconnect": None,
            "gpus": [],
            "gpu_source": snap.source,
        }
    names = sorted({g.name for g in snap.gpus})
    return {
        "gpu_name": " + ".join(names),
        "gpu_count": len(snap.gpus),
        "driver": snap.gpus[0].driver,
        "cuda": snap.gpus[0].cuda,
        "gpu_memory_mib": _one(g.memory_total_mib for g in snap.gpus),
        "gpu_compute_capability": _one(g.compute_capability for g in snap.gpus),
        "gpu_power_limit_w": _one(g.power_limit_w for g in snap.gpus),
        "gpu_interconnect": _interconnect(snap.gpus),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_total_mib": g.memory_total_mib,
                "pci_bus_id": g.pci_bus_id,
            }
            for g in snap.gpus
        ],
        "gpu_source": snap.source,
    }


# --------------------------------------------------------------------------- preflight and teardown


def _clear_hint(p: GpuProcess) -> str:
    if p.command is None:
        return (
            f"pid {p.pid} is not visible from this host (another container or VM?): stop it where it "
            "runs, or pick other GPUs with CUDA_VISIBLE_DEVICES in the server's env"
        )
    return (
        f"stop it (`kill {p.pid}`, then `kill -9 {p.pid}` if it stays) or `llmserve kill-stale` if it is ours"
    )


def preflight_gpus(
    spec: ServerSpec,
    *,
    snap: GpuSnapshot | None = None,
    min_free_fraction: float = DEFAULT_MIN_FREE_FRACTION,
    min_free_mib: int | None = None,
    ignore_pids: Iterable[int] = (),
) -> PreflightResult:
    """Check the GPUs before booting ``spec`` (only when ``spec.gpu`` is true; else an empty result).

    Problems (``result.problems``; :func:`gpu_check` raises them as one :class:`PreflightError`):
    fewer visible GPUs than ``tp``; a GPU the server will use with less than ``min_free_fraction`` of
    its memory free (or less than ``min_free_mib``); any process holding memory on those GPUs, named
    with pid, command and memory, since a stale server would also skew every measurement.
    ``ignore_pids``: processes that may be there (the process trees of this run's own live servers,
    e.g. the other side of an A/B).
    """
    if not spec.gpu:
        return PreflightResult([], [], [], {})
    snap = snap if snap is not None else snapshot()
    gpus = list(snap.gpus)
    result = PreflightResult(
        gpus,
        [],
        [],
        {g.index: g.memory_used_mib for g in gpus},
        baseline_pids=sorted({p.pid for p in snap.processes}),
    )
    if not gpus:
        result.problems.append(
            f"server {spec.id} needs a GPU (gpu = true in {spec.source}) but no GPU is "
            "visible (neither NVML nor nvidia-smi answered)"
        )
        return result
    env = {**os.environ, **spec.env_dict}
    visible = visible_gpus(gpus, env)
    want = max(1, spec.tp)
    if len(visible) < want:
        result.problems.append(_too_few_gpus(spec, want, visible, gpus, env.get("CUDA_VISIBLE_DEVICES")))
    used = visible[:want]
    result.devices = [g.index for g in used]
    ignored = set(ignore_pids)
    need = _need_free_mib(min_free_fraction, min_free_mib)
    result.problems += [problem for gpu in used
                        if (problem := _too_little_free(spec, gpu, need(gpu), _held_by(snap.processes, ignored, gpu)))]
    result.processes = _holders(snap.processes, ignored, used)
    result.problems += [f"stale GPU process: {p.describe()}; {_clear_hint(p)}" for p in result.processes]
    return result


def _too_few_gpus(spec: ServerSpec, want: int, visible: Sequence[GpuInfo], gpus: Sequence[GpuInfo],
                  cvd: str | None) -> str:
    return (f"server {spec.id} needs {want} GPU(s) (tp = {spec.tp} in {spec.source}) but only {len(visible)} "
            f"visible ({len(gpus)} on the machine" + (f", CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "")
            + ")")


def _on(process: GpuProcess, gpu: GpuInfo) -> bool:
    """Whether ``process`` runs on ``gpu`` (by index, or by UUID where the driver gave no index)."""
    return process.gpu_index == gpu.index or (process.gpu_index is None and process.gpu_uuid == gpu.uuid)


def _held_by(processes: Iterable[GpuProcess], pids: set[int], gpu: GpuInfo) -> int:
    """MiB that the processes ``pids`` hold on ``gpu``."""
    return sum(p.used_memory_mib or 0 for p in processes if p.pid in pids and _on(p, gpu))


def _need_free_mib(min_free_fraction: float, min_free_mib: int | None) -> Callable[[GpuInfo], int]:
    return lambda gpu: max(min_free_mib or 0, int(gpu.memory_total_mib * min_free_fraction))


def _too_little_free(spec: ServerSpec, gpu: GpuInfo, need_mib: int, ours: int) -> str | None:
    """This run's own servers (an A/B keeps two up) are not what makes a GPU unclean: their memory is counted as
    free for the check, the rest must be."""
    if gpu.memory_free_mib + ours >= need_mib:
        return None
    return (f"{gpu.describe()}: less than the {need_mib} MiB free needed to boot {spec.id} on a clean GPU"
            + (f" ({ours} MiB held by this run's other servers counted as free)" if ours else ""))


def _holders(processes: Iterable[GpuProcess], ignored: set[int], used: Sequence[GpuInfo]) -> list[GpuProcess]:
    """The processes (but ``ignored``) on the GPUs the server will use."""
    devices = {g.index for g in used}
    uuids = {g.uuid for g in used}
    return [p for p in processes if p.pid not in ignored
            and (p.gpu_index in devices or (p.gpu_index is None and p.gpu_uuid in uuids))]


def gpu_check(spec: ServerSpec, *, ignore_pids: Iterable[int] = ()) -> PreflightResult:
    """``server.preflight(..., gpu_check=gpu_check)``: raise :class:`PreflightError` naming every problem;
    else return the result (its baseline is what :func:`wait_memory_returned` compares with)."""
    result = preflight_gpus(spec, ignore_pids=ignore_pids)
    if not result.ok:
        raise PreflightError(f"GPU preflight for {spec.id} failed:\n  " + "\n  ".join(result.problems))
    return result


def wait_memory_returned(
    baseline_used: Mapping[int, int],
    devices: Iterable[int] | None = None,
    timeout_s: float = 30.0,
    *,
    tolerance_mib: int = DEFAULT_RETURN_TOLERANCE_MIB,
    server_pids: Iterable[int] | None = None,
    baseline_pids: Iterable[int] = (),
    poll_s: float = 0.5,
    sample: Callable[[], GpuSnapshot] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> MemoryReturn:
    """Poll until every device's used memory is at most its ``baseline_used`` + ``tolerance_mib``.

    ``devices`` defaults to the keys of ``baseline_used``. With ``server_pids`` (the torn-down
    server's process tree) none of them may still hold GPU memory, and memory held by processes that
    started after the baseline (``baseline_pids`` were there before) is not counted against the
    server: an A/B keeps two servers up, and the second one's boot must not fail the first one's
    teardown. Without a GPU it returns ``ok=True`` with nothing measured. When memory does not come
    back in ``timeout_s``, the processes still holding those GPUs are listed.
    """
    take = sample or snapshot
    wanted = sorted(set(devices) if devices is not None else set(baseline_used))
    mine = set(server_pids) if server_pids is not None else None
    before = set(baseline_pids)
    start = clock()
    while True:
        snap = take()
        if not snap.gpus:
            return MemoryReturn(True, dict(baseline_used), {}, clock() - start, tolerance_mib=tolerance_mib)
        used = {g.index: g.memory_used_mib for g in snap.gpus if g.index in wanted}
        back = _returned(snap, used, {i: baseline_used.get(i, 0) + tolerance_mib for i in wanted}, mine, before)
        waited = clock() - start
        if back or waited >= timeout_s:
            leftover = [] if back else [p for p in snap.processes if p.gpu_index in wanted]
            return MemoryReturn(
                back, {i: baseline_used.get(i, 0) for i in wanted}, used, waited, leftover, tolerance_mib
            )
        sleep(poll_s)


def _returned(snap: GpuSnapshot, used: Mapping[int, int], allowance: dict[int, int], server_pids: set[int] | None,
              before: set[int]) -> bool:
    """Whether no process of the server is left on the checked GPUs (the keys of ``allowance``) and each GPU's
    used memory is within its allowance."""
    held_by_server = _held_by_server(snap.processes, allowance, server_pids, before)
    return not held_by_server and all(used.get(i, 0) <= limit for i, limit in allowance.items())


def _held_by_server(processes: Iterable[GpuProcess], allowance: dict[int, int], server_pids: set[int] | None,
                    before: set[int]) -> list[GpuProcess]:
    """The torn-down server's processes still on the checked GPUs; memory of processes started since the baseline
    (someone else's: the other side of an A/B) is added to its GPU's ``allowance``. Without ``server_pids`` nothing
    is known of whose memory is whose: every byte counts."""
    if server_pids is None:
        return []
    held: list[GpuProcess] = []
    for p in processes:
        if p.gpu_index not in allowance:
            continue
        if p.pid in server_pids:
            held.append(p)
        elif p.pid not in before and p.used_memory_mib is not None:
            allowance[p.gpu_index] += p.used_memory_mib  # someone else's, started since
    return held
