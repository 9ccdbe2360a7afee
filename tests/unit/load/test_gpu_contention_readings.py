"""The GPU side of host contention on recorded readings: the NVML per-process readings the H200 gave on 2026-12-06
(scripts/gpu/test_gpu_contention.py, call l1b: docs/gpu-runs/dsa-2026-12-06/gpu-contention.json) replayed through the
round's sampler. The server (SGLang, pid 4728 there) used 20-40 % of GPU 0's SM itself; a bf16 matmul loop (pid
4960) took 59-80 % beside it.

Each rule is shown catching its fault and passing the healthy case:

* a process on a GPU the server does not use never counts (the loop moved to GPU 5 of an 8-GPU host); before the
  scope, it confounded a benchmark on GPU 0;
* the server's own GPU processes never count, even when NVML numbers them in another pid namespace (the server's
  pid renumbered as a container's host would list it); before the scope, the server confounded its own quiet round;
* the loop on the server's GPU is contention, named by pid and GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.load.contention import HostContentionSampler, contention_reason
from pytest_llmserve.server.gpu import GpuInfo, GpuProcess, GpuSnapshot, ProcessUtilization, wait_memory_returned
from pytest_llmserve.server.gpu_scope import GpuScope, server_gpu_scope

RECORDED = Path(__file__).resolve().parents[3] / "docs" / "gpu-runs" / "dsa-2026-12-06" / "gpu-contention.json"
HOST_PID = 2_811_034  # what NVML lists for the server's scheduler when it runs in a container NVML cannot see into


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8"))
    return doc


def readings(doc: dict[str, Any], which: str, *, renumber: dict[int, int] | None = None,
             move: dict[int, int] | None = None) -> list[list[ProcessUtilization]]:
    """The recorded reads of one round; ``renumber`` maps pids (another namespace), ``move`` pid -> GPU index."""
    renumber, move = renumber or {}, move or {}
    return [[ProcessUtilization(move.get(r["pid"], r["gpu_index"]), renumber.get(r["pid"], r["pid"]), r["name"],
                                r["sm_util"], r["memory_mib"]) for r in read]
            for read in doc[which]["readings"]]


def replay(doc: dict[str, Any], reads: list[list[ProcessUtilization]], scope: GpuScope | None) -> Any:
    """The round's sampler over the recorded reads; the server's tree is the recorded scope's pids as this namespace
    numbers them (the CPU side sees nothing else)."""
    tree = set(doc["scope"]["server_pids"]) | {doc["server_pid"]}
    pending = list(reads)
    clock = [1000.0]
    sampler = HostContentionSampler(doc["server_pid"], None, process_table=list, excluded=lambda: tree, cores=16,
                                    clock=lambda: clock[0], wall=lambda: clock[0], gpu_reader=lambda: pending.pop(0),
                                    gpu_scope=scope)
    sampler.begin()
    while pending:
        clock[0] += 0.5
        sampler.sample()
    return sampler.result(now=clock[0])


def recorded_scope(doc: dict[str, Any]) -> GpuScope:
    return GpuScope(tuple(doc["scope"]["devices"]), frozenset(doc["scope"]["server_pids"]), doc["scope"]["how"])


def test_the_recorded_quiet_round_is_a_sample_and_the_matmul_beside_it_is_contention_named(
        recorded: dict[str, Any]) -> None:
    bound = recorded["bound"]
    quiet = replay(recorded, readings(recorded, "quiet"), recorded_scope(recorded))
    assert quiet.gpu_share == 0.0 and contention_reason(quiet, bound) is None
    busy = replay(recorded, readings(recorded, "busy"), recorded_scope(recorded))
    reason = contention_reason(busy, bound)
    assert busy.gpu_share > bound
    assert reason is not None and f"pid {recorded['matmul_pid']} python3 on GPU 0" in reason, reason
    # The same figure the H200 run judged (its sampler read the same NVML windows).
    assert busy.gpu_share == pytest.approx(recorded["busy"]["contention"]["gpu_share"], abs=1e-9)


def test_a_job_on_a_gpu_the_server_does_not_use_never_counts(recorded: dict[str, Any]) -> None:
    moved = readings(recorded, "busy", move={recorded["matmul_pid"]: 5})
    # Without the scope (the server's GPUs unknown: every GPU counts) the job on GPU 5 confounds GPU 0's benchmark.
    unscoped = replay(recorded, moved, None)
    assert contention_reason(unscoped, recorded["bound"]) is not None
    assert "every GPU" in unscoped.gpu_scope
    scoped = replay(recorded, moved, recorded_scope(recorded))
    assert scoped.gpu_share == 0.0 and contention_reason(scoped, recorded["bound"]) is None
    assert "GPU 0 (the server's)" in scoped.gpu_scope


def test_the_server_numbered_in_another_pid_namespace_does_not_count_against_itself(recorded: dict[str, Any]) -> None:
    server = recorded["scope"]["server_pids"][0]
    quiet = readings(recorded, "quiet", renumber={server: HOST_PID})
    # Before: the tree (our pids) does not contain NVML's number, so the server's own 27-29 % SM confounded its round.
    before = replay(recorded, quiet, None)
    assert contention_reason(before, recorded["bound"]) is not None and f"pid {HOST_PID}" in before.describe()
    # The scope found at readiness: NVML's pid appeared on the server's GPU during the boot and is not visible here.
    snap = GpuSnapshot((GpuInfo(0, "NVIDIA H200", "GPU-0", 143771, 2710, 141061),),
                       (GpuProcess(0, "GPU-0", HOST_PID, "sglang::scheduler", 1746),), "nvml")
    scope = server_gpu_scope([0], [], snap, [recorded["server_pid"], server], visible=lambda pid: False)
    assert scope.server_pids == {HOST_PID} and "NVML's pid namespace" in scope.how
    after = replay(recorded, quiet, scope)
    assert after.gpu_share == 0.0 and contention_reason(after, recorded["bound"]) is None
    # The loop beside it still counts.
    busy = replay(recorded, readings(recorded, "busy", renumber={server: HOST_PID}), scope)
    assert contention_reason(busy, recorded["bound"]) is not None


def test_server_gpu_scope_takes_only_what_appeared_on_its_gpus_during_the_boot() -> None:
    gpus = tuple(GpuInfo(i, "NVIDIA H100", f"GPU-{i}", 81559, 0, 81559) for i in range(8))
    old = GpuProcess(0, "GPU-0", 77, "trainer", 9000)  # there before the boot
    snap = GpuSnapshot(gpus, (
        GpuProcess(0, "GPU-0", 100, "python", 60000),   # the server, same namespace
        GpuProcess(0, "GPU-0", 900_001, "?", 500),       # a pid NVML lists that is not visible here: the server's
        old,
        GpuProcess(0, "GPU-0", 555, "jupyter", 300),     # visible here, outside the tree, started meanwhile
        GpuProcess(5, "GPU-5", 900_002, "?", 40000),     # on a GPU the server does not use
    ), "nvml")
    scope = server_gpu_scope([0], [old.pid], snap, [100, 101], visible=lambda pid: pid < 900_000)
    assert scope.devices == (0,)
    assert scope.server_pids == {100, 900_001}
    assert scope.counts(0, 555) and scope.counts(0, 77)
    assert not scope.counts(0, 100) and not scope.counts(0, 900_001) and not scope.counts(5, 900_002)


def test_teardown_waits_for_the_server_numbered_in_another_namespace() -> None:
    """A server whose GPU process NVML lists under a host pid: its memory still held after the kill is a leak,
    not 'someone else's process that started since' (which it was taken for before the scope)."""
    held = GpuSnapshot((GpuInfo(0, "NVIDIA H200", "GPU-0", 143771, 2710, 141061),),
                       (GpuProcess(0, "GPU-0", HOST_PID, "sglang::scheduler", 2700),), "nvml")
    kwargs: dict[str, Any] = {"timeout_s": 0.0, "sample": lambda: held, "sleep": lambda s: None}
    unscoped = wait_memory_returned({0: 10}, [0], server_pids={4676, 4728}, **kwargs)
    assert unscoped.ok  # the fault: the server's leftover taken for a newcomer
    scoped = wait_memory_returned({0: 10}, [0], server_pids={4676, 4728, HOST_PID}, **kwargs)
    assert not scoped.ok and f"pid {HOST_PID}" in scoped.message()
