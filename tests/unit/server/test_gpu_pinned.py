"""Characterization of the GPU preflight and the teardown's memory check (issue 36): the devices chosen, the
processes named and every problem's wording, and what the memory check measures, allows and reports, pinned
before ``preflight_gpus`` and ``wait_memory_returned`` were split into their steps."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.server.gpu import GpuInfo, GpuProcess, GpuSnapshot, preflight_gpus, wait_memory_returned

G0 = GpuInfo(0, "H100", "GPU-aaa", 80000, 500, 79500)
G1 = GpuInfo(1, "H100", "GPU-bbb", 80000, 30000, 50000)
G2 = GpuInfo(2, "H100", "GPU-ccc", 80000, 0, 80000)
OURS = GpuProcess(1, "GPU-bbb", 10, "python", 29000, "python -m vllm")
UNSEEN = GpuProcess(None, "GPU-aaa", 11, "x", None, None)  # known by its GPU's UUID only, its command not visible
OTHER = GpuProcess(2, "GPU-ccc", 12, "y", 100, "y --z")
SNAP = GpuSnapshot((G0, G1, G2), (OURS, UNSEEN, OTHER), "nvml")

KILL_10 = ("stale GPU process: pid 10 on GPU 1 (29000 MiB): python -m vllm; stop it (`kill 10`, then `kill -9 10` if "
           "it stays) or `llmserve kill-stale` if it is ours")
KILL_11 = ("stale GPU process: pid 11 on GPU-aaa (memory not reported): x; pid 11 is not visible from this host "
           "(another container or VM?): stop it where it runs, or pick other GPUs with CUDA_VISIBLE_DEVICES in the "
           "server's env")
KILL_12 = ("stale GPU process: pid 12 on GPU 2 (100 MiB): y --z; stop it (`kill 12`, then `kill -9 12` if it stays) "
           "or `llmserve kill-stale` if it is ours")


def spec(**kwargs: Any) -> ServerSpec:
    return ServerSpec(**{"name": "s", "model": "/m", "gpu": True, "source": "f.toml", **kwargs})


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize(("server", "options", "devices", "holders", "problems"), [
    (spec(tp=2), {}, [0, 1], [10, 11], [
        "GPU 1 (H100): 30000 MiB used, 50000 of 80000 MiB free: less than the 72000 MiB free needed to boot s on a "
        "clean GPU", KILL_10, KILL_11]),
    (spec(tp=2), {"ignore_pids": [10]}, [0, 1], [11], [KILL_11]),
    (spec(tp=2), {"ignore_pids": [10, 11], "min_free_mib": 79600, "min_free_fraction": 0.5}, [0, 1], [], [
        "GPU 0 (H100): 500 MiB used, 79500 of 80000 MiB free: less than the 79600 MiB free needed to boot s on a "
        "clean GPU",
        "GPU 1 (H100): 30000 MiB used, 50000 of 80000 MiB free: less than the 79600 MiB free needed to boot s on a "
        "clean GPU (29000 MiB held by this run's other servers counted as free)"]),
    (spec(tp=4, env=(("CUDA_VISIBLE_DEVICES", "2,0"),)), {}, [2, 0], [11, 12], [
        "server s needs 4 GPU(s) (tp = 4 in f.toml) but only 2 visible (3 on the machine, "
        "CUDA_VISIBLE_DEVICES='2,0')", KILL_11, KILL_12]),
    (spec(tp=0, env=(("CUDA_VISIBLE_DEVICES", "2"),)), {}, [2], [12], [KILL_12]),
])
def test_preflight_devices_holders_and_problems(server: ServerSpec, options: dict[str, Any], devices: list[int],
                                                holders: list[int], problems: list[str]) -> None:
    result = preflight_gpus(server, snap=SNAP, **options)
    assert (result.devices, [p.pid for p in result.processes], result.problems) == (devices, holders, problems)
    assert result.baseline_used_mib == {0: 500, 1: 30000, 2: 0} and result.baseline_pids == [10, 11, 12]
    assert result.gpus == [G0, G1, G2]


def test_preflight_without_a_gpu_and_of_a_cpu_server() -> None:
    result = preflight_gpus(spec(), snap=GpuSnapshot((), (), "none"))
    assert result.to_dict() == {"gpus": [], "devices": [], "processes": [], "baseline_used_mib": {}, "problems": [
        "server s needs a GPU (gpu = true in f.toml) but no GPU is visible (neither NVML nor nvidia-smi answered)"],
        "baseline_pids": []}
    assert preflight_gpus(spec(gpu=False), snap=SNAP).to_dict() == {
        "gpus": [], "devices": [], "processes": [], "baseline_used_mib": {}, "problems": [], "baseline_pids": []}


def _used(*used: int, procs: tuple[GpuProcess, ...] = ()) -> GpuSnapshot:
    gpus = tuple(GpuInfo(i, "H100", f"GPU-{i}", 80000, u, 80000 - u) for i, u in enumerate(used))
    return GpuSnapshot(gpus, procs, "nvml")


def test_memory_polled_until_back_within_the_tolerance() -> None:
    snaps = iter([_used(5000, 7000), _used(700, 7000), _used(356, 7000)])
    ticks = iter([0.0, 1.0, 2.0, 3.0])
    sleeps: list[float] = []
    back = wait_memory_returned({0: 100, 1: 1}, devices=[0], timeout_s=30, sample=lambda: next(snaps),
                                sleep=sleeps.append, clock=lambda: next(ticks), poll_s=0.25)
    assert back.to_dict() == {"ok": True, "baseline_used_mib": {"0": 100}, "used_mib": {"0": 356}, "waited_s": 3.0,
                              "leftover_processes": [], "tolerance_mib": 256}
    assert sleeps == [0.25, 0.25]
    assert back.message() == "GPU memory returned: GPU 0: 356 MiB used (before boot 100)"


def test_memory_not_back_names_every_process_on_the_devices() -> None:
    procs = (GpuProcess(0, "GPU-0", 7, "a", 900, "a --b"), GpuProcess(1, "GPU-1", 8, "c", 5, None),
             GpuProcess(3, "GPU-3", 9, "d", 1, None))
    ticks = iter([0.0, 5.0, 12.0])
    back = wait_memory_returned({0: 1, 1: 1}, timeout_s=10, tolerance_mib=100, sample=lambda: _used(1000, 50,
                                procs=procs), sleep=lambda s: None, clock=lambda: next(ticks))
    assert back.to_dict() == {
        "ok": False, "baseline_used_mib": {"0": 1, "1": 1}, "used_mib": {"0": 1000, "1": 50}, "waited_s": 12.0,
        "leftover_processes": [
            {"gpu_index": 0, "gpu_uuid": "GPU-0", "pid": 7, "name": "a", "used_memory_mib": 900, "command": "a --b"},
            {"gpu_index": 1, "gpu_uuid": "GPU-1", "pid": 8, "name": "c", "used_memory_mib": 5, "command": None}],
        "tolerance_mib": 100}
    assert back.message() == (
        "GPU memory NOT returned within 12 s (tolerance 100 MiB): GPU 0: 1000 MiB used (before boot 1); GPU 1: 50 MiB "
        "used (before boot 1)\nstill holding GPU memory:\n  pid 7 on GPU 0 (900 MiB): a --b\n  pid 8 on GPU 1 (5 MiB): c")


@pytest.mark.parametrize(("server_pids", "baseline_pids", "ok"), [
    (None, (), False),  # without the server's processes every byte above the baseline counts
    ([4], (), True),  # 5 started since the baseline: its memory is allowed
    ([4], [5], False),  # 5 was there before: its memory is part of the baseline, not an allowance
    ([5], (), False),  # the server's own process still holds memory
    ([4], [6], True),  # 6, whose memory is not reported, neither allows nor blocks
])
def test_memory_of_other_processes_and_of_the_server(server_pids: list[int] | None, baseline_pids: Any,
                                                     ok: bool) -> None:
    procs = (GpuProcess(0, "GPU-0", 5, "b", 2000, None), GpuProcess(0, "GPU-0", 6, "c", None, None),
             GpuProcess(7, "GPU-7", 4, "z", 10, None))
    back = wait_memory_returned({0: 1}, timeout_s=0, sample=lambda: _used(2001, procs=procs),
                                server_pids=server_pids, baseline_pids=baseline_pids, clock=lambda: 0.0)
    assert back.ok is ok
    assert back.leftover_processes == ([] if ok else [procs[0], procs[1]])


def test_no_gpu_is_returned_at_once() -> None:
    back = wait_memory_returned({0: 5}, timeout_s=30, sample=lambda: GpuSnapshot((), (), "none"), clock=lambda: 0.0)
    assert back.to_dict() == {"ok": True, "baseline_used_mib": {"0": 5}, "used_mib": {}, "waited_s": 0.0,
                              "leftover_processes": [], "tolerance_mib": 256}
    assert back.message() == "no GPU visible: nothing to check"
