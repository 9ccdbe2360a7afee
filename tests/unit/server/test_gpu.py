"""GPU inventory, preflight and memory-return checks: nvidia-smi CSV, a fake NVML, and no GPU at all."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import PreflightError
from pytest_llmserve.server import gpu

MiB = 1024 * 1024

# nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,driver_version,pci.bus_id
#   --format=csv,noheader,nounits   (values as a 2-GPU H200 machine of this workplace reports them)
SMI_GPUS = """\
0, GPU-1f2e3d4c-0000-1111-2222-333344445555, NVIDIA H200, 143771, 1, 143252, 580.159.04, 00000000:00:05.0
1, GPU-9a8b7c6d-0000-1111-2222-333344445555, NVIDIA H200, 143771, 1190, 142063, 580.159.04, 00000000:00:06.0
"""
SMI_APPS = """\
GPU-9a8b7c6d-0000-1111-2222-333344445555, 4242, /root/llmserve-build/cuda/bin/llama-server, 1188
GPU-9a8b7c6d-0000-1111-2222-333344445555, 4243, python3, [N/A]
"""
SMI_BANNER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
"""


def smi_runner(gpus: str = SMI_GPUS, apps: str = SMI_APPS, banner: str = SMI_BANNER) -> Any:
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> str | None:
        calls.append(list(argv))
        if any(a.startswith("--query-gpu=") for a in argv):
            return gpus
        if any(a.startswith("--query-compute-apps=") for a in argv):
            return apps
        return banner

    run.calls = calls  # type: ignore[attr-defined]
    return run


def no_smi(argv: Sequence[str]) -> str | None:
    return None


class FakeNVML:
    """The part of pynvml's API that gpu.py uses, with two GPUs and one process on GPU 1."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, fail_init: bool = False, used: Sequence[int] = (1, 1190)) -> None:
        self.fail_init = fail_init
        self.used = list(used)
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 13000

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:  # noqa: N802
        total = 143771 * MiB
        return SimpleNamespace(total=total, used=self.used[h] * MiB, free=total - self.used[h] * MiB)

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802
        return b"NVIDIA H200"  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return f"GPU-{h}"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:  # noqa: N802
        return SimpleNamespace(busId=f"00000000:00:0{5 + h}.0")

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        return (9, 0)  # Hopper, as the H200s here

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:  # noqa: N802
        if h == 1:
            return [SimpleNamespace(pid=4242, usedGpuMemory=1188 * MiB)]
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:  # noqa: N802
        if h == 1:  # the same process can be listed twice: counted once
            return [SimpleNamespace(pid=4242, usedGpuMemory=None)]
        return []

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:  # noqa: N802
        return b"/root/llmserve-build/cuda/bin/llama-server"


def spec(**kwargs: Any) -> ServerSpec:
    base: dict[str, Any] = {
        "name": "s",
        "engine": "llamacpp",
        "model": "/m.gguf",
        "gpu": True,
        "source": "llmserve.toml",
    }
    base.update(kwargs)
    return ServerSpec(**base)


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# --------------------------------------------------------------------------- parsing


def test_parse_smi_gpus_csv() -> None:
    gpus = gpu.parse_smi_gpus_csv(SMI_GPUS, cuda="13.0")
    assert [g.index for g in gpus] == [0, 1]
    first = gpus[0]
    assert first.name == "NVIDIA H200" and first.uuid.startswith("GPU-1f2e")  # type: ignore[union-attr]
    assert (first.memory_total_mib, first.memory_used_mib, first.memory_free_mib) == (143771, 1, 143252)
    assert first.driver == "580.159.04" and first.cuda == "13.0" and first.pci_bus_id == "00000000:00:05.0"
    assert gpus[1].free_fraction == pytest.approx(142063 / 143771)


def test_parse_smi_gpus_csv_skips_headers_errors_and_units() -> None:
    text = (
        "index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], driver_version\n"
        "No devices were found\n"
        "0, GPU-x, Tesla T4, 15360 MiB, 0 MiB, 14930 MiB, 535.1\n"
    )
    gpus = gpu.parse_smi_gpus_csv(text)
    assert len(gpus) == 1 and gpus[0].memory_total_mib == 15360 and gpus[0].pci_bus_id is None


def test_parse_smi_apps_csv() -> None:
    uuid1 = "GPU-9a8b7c6d-0000-1111-2222-333344445555"
    apps = gpu.parse_smi_apps_csv(SMI_APPS, {uuid1: 1})
    assert [(a.gpu_index, a.pid, a.used_memory_mib) for a in apps] == [(1, 4242, 1188), (1, 4243, None)]
    assert apps[0].name.endswith("llama-server")
    assert "memory not reported" in apps[1].describe()


def test_parse_smi_cuda_version() -> None:
    assert gpu.parse_smi_cuda_version(SMI_BANNER) == "13.0"
    assert gpu.parse_smi_cuda_version("no banner") is None


# --------------------------------------------------------------------------- backends


def test_snapshot_through_nvidia_smi() -> None:
    snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=smi_runner())
    assert snap.source == "nvidia-smi"
    assert [g.cuda for g in snap.gpus] == ["13.0", "13.0"]
    assert [p.pid for p in snap.processes] == [4242, 4243]
    assert snap.used_mib() == {0: 1, 1: 1190}


def test_snapshot_through_nvml_first() -> None:
    nvml = FakeNVML()
    runner = smi_runner()
    snap = gpu.snapshot(nvml=nvml, run=runner)
    assert snap.source == "nvml" and runner.calls == []
    assert [g.name for g in snap.gpus] == ["NVIDIA H200", "NVIDIA H200"]  # bytes decoded
    assert snap.gpus[0].cuda == "13.0" and snap.gpus[1].pci_bus_id == "00000000:00:06.0"
    assert [(p.gpu_index, p.pid, p.used_memory_mib) for p in snap.processes] == [(1, 4242, 1188)]
    assert nvml.shutdowns == 1


def test_nvml_that_cannot_list_processes_hands_over_to_nvidia_smi() -> None:
    class NoProcesses(FakeNVML):
        def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:  # noqa: N802
            raise self.NVMLError("Function Not Found")

    snap = gpu.snapshot(nvml=NoProcesses(), run=smi_runner())
    assert snap.source == "nvidia-smi" and [p.pid for p in snap.processes] == [4242, 4243]


def test_snapshot_prefers_nvidia_smi_when_asked() -> None:
    assert gpu.snapshot(nvml=FakeNVML(), run=smi_runner(), prefer="nvidia-smi").source == "nvidia-smi"


def test_no_gpu_gives_empty_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=no_smi)
    assert snap.source == "none" and snap.gpus == () and snap.processes == ()
    monkeypatch.setattr(gpu, "snapshot", lambda **kw: gpu.GpuSnapshot((), (), "none"))
    assert gpu.list_gpus() == [] and gpu.gpu_processes() == []
    summary = gpu.gpu_summary()
    assert summary["gpu_count"] == 0 and summary["gpu_name"] is None and summary["gpus"] == []
    assert gpu.preflight_gpus(spec(gpu=False)).ok
    back = gpu.wait_memory_returned({0: 10}, timeout_s=0.0)
    assert back.ok and back.used_mib == {} and "nothing to check" in back.message()


def test_no_pynvml_and_no_nvidia_smi_on_this_kind_of_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real backends where neither exists (CI): nothing raises."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpu.snapshot().source == "none"
    assert gpu.list_gpus() == []


def test_nvidia_smi_failure_is_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
        "exit 9\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu.snapshot().gpus == ()


def test_commands_are_filled_from_this_host() -> None:
    """A process this host can see gets its full command line (here: a real child process)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # exec'd: its command line is real
        apps = f"GPU-0, {child.pid}, python, 10\n"
        gpus = "0, GPU-0, Fake GPU, 1000, 10, 990, 1.0, 0:0\n"
        snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=smi_runner(gpus=gpus, apps=apps))
        assert snap.processes[0].command and "time.sleep(30)" in snap.processes[0].command
    finally:
        child.kill()
        child.wait()


# --------------------------------------------------------------------------- visibility and preflight


def test_visible_gpus_follows_cuda_visible_devices() -> None:
    gpus = gpu.parse_smi_gpus_csv(SMI_GPUS)
    assert [g.index for g in gpu.visible_gpus(gpus, {})] == [0, 1]
    assert [g.index for g in gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1"})] == [1]
    assert [g.index for g in gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,0"})] == [1, 0]
    assert [g.index for g in gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-9a8b"})] == [1]
    assert gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "-1"}) == []
    # An invalid entry ends the list, as CUDA does.
    assert [g.index for g in gpu.visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "0,7,1"})] == [0]


def _snap(apps: str = "") -> gpu.GpuSnapshot:
    return gpu.snapshot(nvml=FakeNVML(fail_init=True), run=smi_runner(apps=apps))


def test_preflight_passes_on_clean_gpus() -> None:
    result = gpu.preflight_gpus(spec(tp=2), snap=_snap())
    assert result.ok, result.problems
    assert result.devices == [0, 1] and result.baseline_used_mib == {0: 1, 1: 1190}
    assert result.to_dict()["devices"] == [0, 1] and result.baseline_pids == []


def test_preflight_names_a_stale_process_with_pid_command_and_memory() -> None:
    result = gpu.preflight_gpus(spec(tp=2), snap=_snap(SMI_APPS))
    assert not result.ok
    text = "\n".join(result.problems)
    assert "stale GPU process: pid 4242 on GPU 1 (1188 MiB)" in text
    assert "llama-server" in text
    assert "kill" in text or "CUDA_VISIBLE_DEVICES" in text  # how to clear it


def test_preflight_ignores_other_gpus_and_ignored_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    one = spec(env=(("CUDA_VISIBLE_DEVICES", "0"),))
    assert gpu.preflight_gpus(one, snap=_snap(SMI_APPS)).ok  # the process sits on GPU 1
    ours = gpu.preflight_gpus(spec(tp=2), snap=_snap(SMI_APPS), ignore_pids=[4242, 4243])
    assert ours.ok and ours.baseline_pids == [4242, 4243]  # known, for the teardown check


def test_preflight_refuses_too_few_gpus() -> None:
    result = gpu.preflight_gpus(spec(tp=4), snap=_snap())
    assert any("needs 4 GPU(s) (tp = 4 in llmserve.toml) but only 2 visible" in p for p in result.problems)
    masked = gpu.preflight_gpus(spec(tp=2, env=(("CUDA_VISIBLE_DEVICES", "1"),)), snap=_snap())
    assert any("CUDA_VISIBLE_DEVICES='1'" in p for p in masked.problems)


def test_preflight_refuses_a_gpu_with_too_little_free_memory() -> None:
    busy = gpu.snapshot(nvml=FakeNVML(used=(100_000, 1)), run=no_smi)
    result = gpu.preflight_gpus(spec(), snap=busy, min_free_fraction=0.9)
    assert not result.ok and "less than the 129393 MiB free needed" in result.problems[0]
    assert gpu.preflight_gpus(spec(), snap=busy, min_free_fraction=0.2).ok


def test_preflight_without_a_gpu() -> None:
    none = gpu.GpuSnapshot((), (), "none")
    assert gpu.preflight_gpus(spec(gpu=False), snap=none).ok  # a CPU server needs nothing
    result = gpu.preflight_gpus(spec(), snap=none)
    assert not result.ok and "no GPU is visible" in result.problems[0]


def test_gpu_check_raises_one_preflight_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stale = _snap(SMI_APPS)
    monkeypatch.setattr(gpu, "snapshot", lambda **kw: stale)
    with pytest.raises(PreflightError, match=r"GPU preflight for s failed:\n  stale GPU process: pid 4242"):
        gpu.gpu_check(spec(tp=2))
    assert gpu.gpu_check(spec(gpu=False)).ok  # nothing to check
    assert gpu.gpu_check(spec(tp=2), ignore_pids=[4242, 4243]).devices == [0, 1]  # the A/B's other side


# --------------------------------------------------------------------------- teardown


def test_wait_memory_returned_polls_until_back() -> None:
    used = iter([(5000, 1), (3000, 1), (300, 1)])
    clock = iter(range(100))

    def sample() -> gpu.GpuSnapshot:
        return gpu.snapshot(nvml=FakeNVML(used=next(used)), run=no_smi)

    sleeps: list[float] = []
    back = gpu.wait_memory_returned(
        {0: 100, 1: 1}, timeout_s=30, sample=sample, sleep=sleeps.append, clock=lambda: float(next(clock))
    )
    assert back.ok and back.used_mib == {0: 300, 1: 1} and len(sleeps) == 2
    assert "GPU memory returned" in back.message()


def test_wait_memory_returned_times_out_and_names_the_holder() -> None:
    def sample() -> gpu.GpuSnapshot:
        return gpu.snapshot(nvml=FakeNVML(used=(1, 9000)), run=no_smi)

    ticks = iter([0.0, 0.0, 10.0, 31.0, 31.0])
    back = gpu.wait_memory_returned(
        {0: 1, 1: 1}, timeout_s=30, sample=sample, sleep=lambda s: None, clock=lambda: next(ticks)
    )
    assert not back.ok
    assert back.used_mib == {0: 1, 1: 9000}
    assert [p.pid for p in back.leftover_processes] == [4242]
    text = back.message()
    assert "NOT returned within 31 s" in text and "GPU 1: 9000 MiB used (before boot 1)" in text
    assert "pid 4242 on GPU 1" in text
    assert back.to_dict()["ok"] is False


def test_wait_memory_returned_only_checks_given_devices() -> None:
    def sample() -> gpu.GpuSnapshot:
        return gpu.snapshot(nvml=FakeNVML(used=(1, 9000)), run=no_smi)

    back = gpu.wait_memory_returned({0: 1, 1: 1}, devices=[0], timeout_s=0, sample=sample)
    assert back.ok and back.used_mib == {0: 1}


def test_memory_of_a_server_started_later_is_not_a_leak_of_this_one() -> None:
    """A/B: B booted while A ran; A's teardown must not fail because B now holds GPU 1."""
    later = "GPU-9a8b7c6d-0000-1111-2222-333344445555, 5000, llama-server, 1188\n"
    snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=smi_runner(apps=later))
    back = gpu.wait_memory_returned(
        {0: 1, 1: 1}, timeout_s=0, sample=lambda: snap, server_pids=[4242], baseline_pids=[]
    )
    assert back.ok, back.message()
    # Without the process list, the same memory reads as not returned.
    assert not gpu.wait_memory_returned({0: 1, 1: 1}, timeout_s=0, sample=lambda: snap).ok


def test_a_server_process_still_on_the_gpu_is_a_leak() -> None:
    snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=smi_runner())
    back = gpu.wait_memory_returned({0: 1, 1: 5000}, timeout_s=0, sample=lambda: snap, server_pids=[4242])
    assert not back.ok and [p.pid for p in back.leftover_processes] == [4242, 4243]
    # A process that was there before the boot counts against the baseline, not as an allowance.
    stale = gpu.wait_memory_returned(
        {0: 1, 1: 1}, timeout_s=0, sample=lambda: snap, server_pids=[1], baseline_pids=[4242, 4243]
    )
    assert not stale.ok


def test_gpu_summary_matches_hardware_context_keys() -> None:
    summary = gpu.gpu_summary(_snap())
    assert {"gpu_name", "gpu_count", "driver", "cuda"} <= set(summary)
    assert summary["gpu_name"] == "NVIDIA H200" and summary["gpu_count"] == 2
    assert summary["driver"] == "580.159.04" and summary["cuda"] == "13.0"
    assert summary["gpus"][1]["memory_total_mib"] == 143771 and summary["gpu_source"] == "nvidia-smi"


def test_module_imports_without_pynvml() -> None:
    code = "import sys; sys.modules['pynvml'] = None; import pytest_llmserve.server.gpu as g; print(g.list_gpus(run=None))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": "/nonexistent"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


# --------------------------------------------------------------------------- compute capability


def test_compute_capability_from_nvml_and_from_its_own_nvidia_smi_query() -> None:
    """What an engine's kernels are built for (the SGLang adapter refuses trtllm's SM100-only DSA kernels on 9.0)."""
    snap = gpu.snapshot(nvml=FakeNVML(), run=no_smi)
    assert [g.compute_capability for g in snap.gpus] == ["9.0", "9.0"]
    assert snap.gpus[0].label == "GPU 0 (NVIDIA H200)"

    def run(argv: Sequence[str]) -> str | None:
        if "--query-gpu=index,compute_cap" in argv:
            return "0, 9.0\n1, 9.0\n"
        answer: str | None = smi_runner()(argv)
        return answer

    assert [g.compute_capability for g in gpu.snapshot(nvml=FakeNVML(fail_init=True), run=run).gpus] == ["9.0", "9.0"]

    def old_driver(argv: Sequence[str]) -> str | None:  # a driver that does not know the field: GPUs still seen
        answer: str | None = None if "--query-gpu=index,compute_cap" in argv else smi_runner()(argv)
        return answer

    snap = gpu.snapshot(nvml=FakeNVML(fail_init=True), run=old_driver)
    assert len(snap.gpus) == 2 and {g.compute_capability for g in snap.gpus} == {None}


# --------------------------------------------------------------------------- the GPUs' part of a host's identity


class NVLinkNVML(FakeNVML):
    """Two H200 of an SXM board as NVML reads them: a 700 W enforced limit, links 0-17 of which NVML answers."""

    class NVMLError_NotSupported(Exception):  # noqa: N801 - pynvml's name, which the probe reads
        pass

    def __init__(self, *, nvlink: bool, power_mw: int = 700000) -> None:
        super().__init__()
        self.nvlink = nvlink
        self.power_mw = power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:  # noqa: N802
        return self.power_mw

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:  # noqa: N802
        if not self.nvlink:
            raise self.NVMLError_NotSupported("Not Supported")  # a PCIe card
        return 1 if link < 18 else 0


def test_the_gpus_identity_power_limit_and_interconnect_from_nvml() -> None:
    summary = gpu.gpu_summary(gpu.snapshot(nvml=NVLinkNVML(nvlink=True), run=no_smi))
    assert {name: summary[name] for name in gpu.GPU_IDENTITY_FIELDS} == {
        "gpu_name": "NVIDIA H200", "gpu_count": 2, "driver": "580.159.04", "cuda": "13.0", "gpu_memory_mib": 143771,
        "gpu_compute_capability": "9.0", "gpu_power_limit_w": 700, "gpu_interconnect": "nvlink"}
    pcie = gpu.gpu_summary(gpu.snapshot(nvml=NVLinkNVML(nvlink=False, power_mw=600000), run=no_smi))
    assert (pcie["gpu_interconnect"], pcie["gpu_power_limit_w"]) == ("pcie", 600)
    # An NVML without these calls (the older stand-in): unknown, not "pcie".
    old = gpu.gpu_summary(gpu.snapshot(nvml=FakeNVML(), run=no_smi))
    assert (old["gpu_interconnect"], old["gpu_power_limit_w"]) == (None, None)


def test_the_power_limit_through_its_own_nvidia_smi_query_and_the_interconnect_unknown_there() -> None:
    assert gpu.parse_smi_power_limits("0, 700.00\n1, 699.60\n2, [N/A]\n") == {0: 700, 1: 700}

    def run(argv: Sequence[str]) -> str | None:
        if "--query-gpu=index,power.limit" in argv:
            return "0, 700.00\n1, 700.00\n"
        answer: str | None = smi_runner()(argv)
        return answer

    summary = gpu.gpu_summary(gpu.snapshot(nvml=FakeNVML(fail_init=True), run=run))
    assert (summary["gpu_power_limit_w"], summary["gpu_interconnect"], summary["gpu_memory_mib"]) == (700, None, 143771)


def test_gpus_that_differ_are_stored_as_their_sorted_values() -> None:
    snap = gpu.snapshot(nvml=FakeNVML(), run=no_smi)
    mixed = gpu.GpuSnapshot((snap.gpus[0], replace(snap.gpus[1], memory_total_mib=81559, power_limit_w=400)),
                            snap.processes, snap.source)
    summary = gpu.gpu_summary(mixed)
    assert summary["gpu_memory_mib"] == [81559, 143771] and summary["gpu_power_limit_w"] == [400, None]


# --------------------------------------------------------------------------- per-process utilisation (contention)


class AccountingNVML(FakeNVML):
    """FakeNVML with NVML's per-process utilisation samples: the llama-server on GPU 1 and a process that holds
    no memory but ran kernels on GPU 0; GPU 1 had no other sampled process in the window."""

    def __init__(self) -> None:
        super().__init__()
        self.since: list[int] = []

    def nvmlDeviceGetProcessUtilization(self, h: int, since_us: int) -> list[Any]:  # noqa: N802
        self.since.append(since_us)
        if h == 0:
            return [SimpleNamespace(pid=777, smUtil=40, memUtil=5, timeStamp=1),
                    SimpleNamespace(pid=777, smUtil=60, memUtil=5, timeStamp=2)]
        return [SimpleNamespace(pid=4242, smUtil=90, memUtil=30, timeStamp=1)]


def test_process_utilization_reads_each_process_s_sm_share_and_memory() -> None:
    nvml = AccountingNVML()
    readings = gpu.process_utilization(nvml=nvml, window_s=1.0)
    assert readings == [gpu.ProcessUtilization(0, 777, "llama-server", 0.5, None),
                        gpu.ProcessUtilization(1, 4242, "llama-server", 0.9, 1188)]
    assert len(nvml.since) == 2 and nvml.shutdowns == 1


def test_process_utilization_of_idle_gpus_is_empty_and_without_nvml_is_none() -> None:
    class Idle(FakeNVML):
        def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:  # noqa: N802
            return []

        def nvmlDeviceGetProcessUtilization(self, h: int, since_us: int) -> list[Any]:  # noqa: N802
            raise self.NVMLError("Not Found")  # what NVML says when no process ran in the window

    assert gpu.process_utilization(nvml=Idle()) == []
    assert gpu.process_utilization(nvml=FakeNVML(fail_init=True)) is None
