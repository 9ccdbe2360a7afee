"""Host contention: the sampler over a stood-in process table, the bound, and the gate's handling of a busy host."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_llmserve.load.contention import (
    HostContention,
    HostContentionSampler,
    Settling,
    contention_reason,
    wait_until_quiet,
)
from pytest_llmserve.server.procs import listener_pid

SERVER, ENGINE_WORKER, ME, BURNER, LATE, GONE = 100, 101, 200, 300, 400, 500


class Table:
    """A process table whose CPU times the test moves between samples (psutil's ``info`` dicts)."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.created: dict[int, float] = {}

    def add(self, pid: int, name: str, cpu: float, created: float = 0.0) -> None:
        self.cpu[pid], self.names[pid], self.created[pid] = cpu, name, created

    def __call__(self) -> list[Any]:
        return [SimpleNamespace(info={"pid": pid, "name": self.names[pid],
                                      "cpu_times": SimpleNamespace(user=cpu * 0.75, system=cpu * 0.25),
                                      "create_time": self.created[pid]})
                for pid, cpu in self.cpu.items()]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sampler(table: Table, clock: Clock, *, cores: int = 2, gpu: Any = None) -> HostContentionSampler:
    return HostContentionSampler(SERVER, None, process_table=table, excluded=lambda: {SERVER, ENGINE_WORKER, ME},
                                 cores=cores, clock=clock, wall=clock, gpu_reader=gpu)


def test_others_cpu_is_a_share_of_the_machine_and_the_server_and_the_client_do_not_count() -> None:
    table, clock = Table(), Clock()
    for pid, name in ((SERVER, "vllm"), (ENGINE_WORKER, "VLLM::EngineCore"), (ME, "pytest"), (BURNER, "python"),
                      (7, "sshd")):
        table.add(pid, name, 50.0)
    s = sampler(table, clock)
    s.begin()  # the round's start (no sampling thread in a unit test: samples by hand)
    clock.now += 10.0
    table.cpu[SERVER] += 12.0  # the server and the client are what is measured, never contention
    table.cpu[ENGINE_WORKER] += 6.0
    table.cpu[ME] += 2.0
    table.cpu[BURNER] += 9.0  # a CPU-bound neighbour took most of a core of two
    table.cpu[7] += 0.2
    s.sample()
    busy = s.result(now=clock.now)
    assert busy.share == pytest.approx(9.2 / 20.0)
    assert [(p.pid, p.name) for p in busy.top] == [(BURNER, "python"), (7, "sshd")]
    assert busy.top[0].share == pytest.approx(9.0 / 20.0) and busy.top[0].cpu_s == pytest.approx(9.0)
    assert busy.cores == 2 and busy.samples == 2 and busy.gpu_share is None
    assert [name for name, _share, _count in busy.by_command] == ["python", "sshd"]
    assert [share for _name, share, _count in busy.by_command] == pytest.approx([0.45, 0.01])
    assert [count for _name, _share, count in busy.by_command] == [1, 1]
    assert busy.describe().startswith("host contention 46.0% of the machine (2 cores, 10.0 s): pid 300 python (45.0%)")


def test_a_process_born_during_the_round_counts_from_its_start_and_a_pid_reused_is_another_process() -> None:
    table, clock = Table(), Clock()
    table.add(BURNER, "python", 30.0, created=5.0)
    s = sampler(table, clock)
    s.begin()
    clock.now += 4.0
    table.add(LATE, "cc1", 1.5, created=clock.now - 1.0)  # born after the first read: all its CPU is the round's
    table.add(BURNER, "python", 0.5, created=clock.now - 0.5)  # the pid reused by a new process
    s.sample()
    busy = s.result(now=clock.now)
    assert {p.pid: p.cpu_s for p in busy.top} == {LATE: 1.5, BURNER: 0.5}
    assert [(name, n) for name, _, n in busy.by_command] == [("cc1", 1), ("python", 1)]
    assert busy.share == pytest.approx(2.0 / 8.0)


def test_a_quiet_round_is_no_reason_and_a_busy_one_names_its_processes() -> None:
    quiet = HostContention(share=0.012, seconds=10.0, cores=2, samples=11)
    assert contention_reason(quiet, 0.10) is None
    busy = HostContention(share=0.47, seconds=10.0, cores=2, samples=11, top=[
        _busy(BURNER, "python", 0.45), _busy(7, "sshd", 0.02)], by_command=[("python", 0.45, 1), ("sshd", 0.02, 1)])
    assert contention_reason(busy, 0.10) == (
        "confounded: host busy: other processes took 47.0% of the machine's 2 cores during the round (bound 10%): "
        "pid 300 python (45.0%), pid 7 sshd (2.0%); by command: python 45.0% (1 process), sshd 2.0% (1 process)")
    assert contention_reason(busy, 0.5) is None  # the bound is the setting's
    unjudged = HostContention(share=0.9, seconds=10.0, cores=2, samples=11, judged=False)
    assert contention_reason(unjudged, 0.10) is None  # the server itself may be among the "others"
    assert contention_reason(None, 0.10) is None


def _busy(pid: int, name: str, share: float) -> Any:
    from pytest_llmserve.load.contention import BusyProcess

    return BusyProcess(pid, name, share * 20.0, share)


def test_gpu_processes_of_others_are_contention_too() -> None:
    from pytest_llmserve.server.gpu import ProcessUtilization

    table, clock = Table(), Clock()
    reads = [[ProcessUtilization(0, SERVER, "python", 0.9, 60_000), ProcessUtilization(0, 4242, "trainer", 0.6, 9000)],
             [ProcessUtilization(0, SERVER, "python", 0.9, 60_000), ProcessUtilization(0, 4242, "trainer", 0.4, 9500)]]
    s = sampler(table, clock, gpu=lambda: reads.pop(0))
    s.begin()
    clock.now += 2.0
    s.sample()
    busy = s.result(now=clock.now)
    assert busy.gpu_share == pytest.approx(0.5)
    assert [(p.pid, p.memory_mib) for p in busy.gpu_top] == [(4242, 9500)]
    reason = contention_reason(busy, 0.10)
    assert reason is not None and "50.0% of a GPU's SM" in reason and "pid 4242 trainer on GPU 0" in reason


def test_no_gpu_accounting_is_not_idle_gpus() -> None:
    table, clock = Table(), Clock()
    s = sampler(table, clock, gpu=lambda: None)
    s.begin()
    assert s.result(now=clock.now + 1).gpu_share is None


def test_an_attached_server_elsewhere_counts_everything_but_the_load_generator() -> None:
    s = HostContentionSampler(None, "http://gpu-box.example:8000", process_table=Table(), cores=2)
    assert s.judged and "load generator" in s.excluded and "every other process counts" in s.excluded


def test_a_local_server_whose_process_is_unknown_is_recorded_but_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_llmserve.load.contention as contention

    monkeypatch.setattr(contention, "listener_pid", lambda port: None)
    s = HostContentionSampler(None, "http://127.0.0.1:8123", process_table=Table(), cores=2)
    assert not s.judged and "not judged" in s.excluded
    monkeypatch.setattr(contention, "listener_pid", lambda port: SERVER if port == 8123 else None)
    found = HostContentionSampler(None, "http://127.0.0.1:8123", process_table=Table(), cores=2)
    assert found.judged and found.server_pid == SERVER and f"pid {SERVER}" in found.excluded


def test_the_real_sampler_runs_and_sees_a_process_table() -> None:
    s = HostContentionSampler(os.getpid(), hz=50.0).start()
    busy = s.stop()
    assert busy.samples >= 2 and busy.cores >= 1 and busy.share >= 0.0
    assert all(p.pid != os.getpid() for p in busy.top)


def test_listener_pid_of_a_free_port_is_none() -> None:
    from pytest_llmserve.server.procs import free_port

    assert listener_pid(free_port()) is None


def test_a_subprocess_of_the_test_is_contention_and_the_load_generator_is_not() -> None:
    import subprocess
    import sys
    import time

    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        s = HostContentionSampler(None, "http://remote.invalid:1", hz=20.0).start()
        time.sleep(1.0)
        busy = s.stop()
    finally:
        burner.kill()
        burner.wait()
    named = {p.pid: p for p in busy.top}
    assert burner.pid in named and named[burner.pid].cpu_s > 0, busy.describe()
    assert os.getpid() not in named


# ---------------------------------------------------------------------------- waiting for a process tree to go quiet

class _Busy:
    """A process tree's CPU-seconds on a stand-in clock: busy (one core) until ``quiet_at``, idle after."""

    def __init__(self, quiet_at: float) -> None:
        self.now = 0.0
        self.quiet_at = quiet_at

    def cpu_s(self, _pid: int) -> float:
        return min(self.now, self.quiet_at)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_until_quiet_waits_while_the_tree_is_busy_and_returns_when_it_is_quiet() -> None:
    busy = _Busy(quiet_at=1.0)
    settling = wait_until_quiet(42, bound=0.05, cores=2, cpu_s=busy.cpu_s, clock=lambda: busy.now, sleep=busy.sleep)
    assert settling.settled and settling.share == 0.0
    assert settling.seconds == pytest.approx(1.25)  # four busy windows of 0.25 s, then the quiet one


def test_wait_until_quiet_gives_up_at_its_cap_and_says_how_busy_the_tree_still_was() -> None:
    busy = _Busy(quiet_at=float("inf"))
    settling = wait_until_quiet(42, bound=0.05, cap_s=1.0, cores=2, cpu_s=busy.cpu_s, clock=lambda: busy.now,
                                sleep=busy.sleep)
    assert not settling.settled
    assert settling.seconds == pytest.approx(1.0)
    assert settling.share == pytest.approx(0.5)  # one core of two


def test_wait_until_quiet_has_nothing_to_wait_for_without_a_process() -> None:
    assert wait_until_quiet(None, bound=0.05) == Settling(0.0, True, 0.0)


def test_wait_until_quiet_on_a_real_sleeping_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # The interpreter's start-up is CPU: the first windows may be busy, the cap is far beyond it.
        settling = wait_until_quiet(child.pid, bound=0.05, window_s=0.1, cap_s=5.0)
        assert settling.settled, settling
    finally:
        child.kill()
        child.wait()
