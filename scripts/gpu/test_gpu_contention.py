"""The GPU side of host contention on the lent GPU (issue 34, item 5), run by scripts/gpu/dsa_suite.sh (call l3)
against the `dsa-contention` server of scripts/gpu/dsa_gpu.toml.in.

* The server's GPU scope, found when it is ready (pytest_llmserve.server.gpu_scope.server_gpu_scope): its GPUs and its
  processes as NVML lists them; the server never counts against itself, even where NVML numbers processes in
  another pid namespace than this one.
* A quiet round (after the server's own first round): the other processes' SM share on the server's GPU stays
  under the bound and the round is a sample.
* A round beside a bf16 matmul loop in another process on the same GPU: above the bound, the reason names the
  loop (by pid where NVML numbers it as we do, always by GPU and SM share).
* A benchmark with the loop running throughout: every round contended, the outcome "confounded: host busy" (the
  test skipped with that reason, as the gate does), never a verdict on the server.

Every NVML reading the rounds took is written to $LLMSERVE_CONTENTION_OUT/gpu-contention.json: the recorded readings
the CPU-side tests replay (tests/unit/load/test_gpu_contention_readings.py). The matmul's interpreter comes from
$LLMSERVE_TORCH_PYTHON (with torch importable there).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.gates.rounds import measure_round
from pytest_llmserve.load import runner
from pytest_llmserve.load.prompts import build_prompts
from pytest_llmserve.load.runner import judge_contention
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.server.gpu import ProcessUtilization, process_utilization

BOUND = BenchDefaults().contention_bound


def run_round(server: Any, wl: Any, prompts: Any, what: str, invalid: Any) -> Any:
    """One round as the gate measures it (gates/rounds.measure_round); ``invalid`` gets an invalid round's reasons."""
    result = measure_round(server, wl, prompts)
    if not result.valid:
        invalid(f"{what} is INVALID (not a number): " + " | ".join(result.invalid_reasons))
    return result
OUT = Path(os.environ.get("LLMSERVE_CONTENTION_OUT", "."))
# A loop of 8192 x 8192 bf16 matmuls: on a Hopper GPU it keeps the SMs busy nearly all the time.
MATMUL = ("import torch\n"
          "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
          "while True:\n"
          "    a = (a @ a).clamp_(-1, 1)\n"
          "    torch.cuda.synchronize()\n")


def start_matmul() -> subprocess.Popen[bytes]:
    """The loop in a session of its own; returns once NVML lists a process using the GPU beside the server (at most
    90 s: torch's first CUDA context takes a while)."""
    before = {r.pid for r in process_utilization() or []}
    proc = subprocess.Popen([os.environ.get("LLMSERVE_TORCH_PYTHON", "python3"), "-c", MATMUL],
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the matmul loop ended at once (exit {proc.returncode})")
        now = process_utilization(window_s=1.0) or []
        if any(r.pid not in before and r.sm_util > 0.5 for r in now):
            return proc
        time.sleep(1.0)
    proc.kill()
    raise AssertionError("the matmul loop never showed on the GPU in 90 s")


@pytest.fixture
def readings(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, Any]] | None]:
    """Every per-process GPU reading the rounds' contention samplers take, kept for the record."""
    taken: list[list[dict[str, Any]] | None] = []

    def reader() -> list[ProcessUtilization] | None:
        got = process_utilization()
        taken.append([asdict(r) for r in got] if got is not None else None)
        return got

    monkeypatch.setattr(runner, "process_utilization", reader)
    return taken


@pytest.fixture
def matmul() -> Iterator[subprocess.Popen[bytes]]:
    proc = start_matmul()
    yield proc
    proc.kill()
    proc.wait()


def contention_of(result: Any) -> dict[str, Any] | None:
    busy = result.host_contention
    return busy.to_dict() if busy is not None else None


@pytest.mark.gpu
def test_gpu_contention_quiet_round_then_a_matmul_beside_it(llm_server: Any, llmserve_config: Any,
                                                            readings: list[Any]) -> None:
    scope = llm_server.gpu_scope
    assert scope is not None and scope.devices and scope.server_pids, scope
    wl = llmserve_config.workload("decode-c1")
    prompts = build_prompts(wl, tokenize=llm_server.client().tokenize)
    artefacts: list[str] = []
    run_round(llm_server, wl, prompts, "first round", artefacts.append)
    first = len(readings)
    quiet = run_round(llm_server, wl, prompts, "quiet round", artefacts.append)
    quiet_reason = judge_contention(quiet, BOUND)
    quiet_readings = readings[first:]
    proc = start_matmul()
    try:
        start = len(readings)
        busy = run_round(llm_server, wl, prompts, "round beside the matmul", artefacts.append)
        busy_readings = readings[start:]
    finally:
        proc.kill()
        proc.wait()
    busy_reason = judge_contention(busy, BOUND)
    record = {"scope": {"devices": list(scope.devices), "server_pids": sorted(scope.server_pids), "how": scope.how},
              "server_pid": llm_server.server_pid, "matmul_pid": proc.pid, "bound": BOUND,
              "quiet": {"contention": contention_of(quiet), "reason": quiet_reason, "readings": quiet_readings},
              "busy": {"contention": contention_of(busy), "reason": busy_reason, "readings": busy_readings},
              "artefacts": artefacts}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu-contention.json").write_text(json.dumps(record, indent=1))
    print(f"MEASURE scope: {scope.describe()}")
    print(f"MEASURE quiet round: {quiet.host_contention.describe()}; reason {quiet_reason}")
    print(f"MEASURE round beside the matmul (pid {proc.pid}): {busy.host_contention.describe()}; reason {busy_reason}")
    assert quiet.host_contention.gpu_share is not None, "no per-process GPU accounting on this host"
    assert quiet.host_contention.gpu_share <= BOUND and quiet_reason is None, quiet.host_contention.describe()
    assert busy.host_contention.gpu_share is not None and busy.host_contention.gpu_share > BOUND, \
        busy.host_contention.describe()
    assert busy_reason is not None and busy_reason.startswith("confounded: host busy: "), busy_reason
    assert f"on GPU {scope.devices[0]}" in busy_reason, busy_reason
    # Named by pid where NVML numbers processes as this namespace does (the server's pids were then its tree's).
    if scope.server_pids & set(_tree(llm_server.server_pid)):
        assert f"pid {proc.pid} " in busy_reason, busy_reason


def _tree(pid: int | None) -> list[int]:
    from pytest_llmserve.server.procs import tree_of

    return [p.pid for p in tree_of(pid)] if pid is not None else []


@pytest.mark.gpu
@pytest.mark.llmserve_benchmark(workload="decode-c1", warmup_rounds=0)
def test_gpu_contention_a_benchmark_beside_a_matmul_is_confounded(llm_bench: Any,
                                                                  matmul: subprocess.Popen[bytes]) -> None:
    with pytest.raises(pytest.skip.Exception) as skipped:
        llm_bench.run()
    message = str(skipped.value)
    print(f"MEASURE benchmark beside the matmul (pid {matmul.pid}): {message}")
    assert "confounded: host busy" in message and "of a GPU's SM" in message, message
