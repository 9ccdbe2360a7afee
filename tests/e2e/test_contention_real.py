"""Host contention, on the real vLLM CPU server: a CPU-bound process beside a round is seen and named.

This is *contention* (other processes taking the host's CPU), not *contamination* (other clients' requests
reaching the server: tests/e2e/test_isolation_real.py). One inner run, attached to the test run's shared
server (tests/e2e/shared.py; its processes are the server's, not contention):

* a quiet round, then a round with ``python -c "while True: pass"`` started beside it on every core: the quiet
  round's contention is below the bound, the busy one is above it and its reason names a burner's pid;
* a benchmark (``llm_bench.run()``) with the burners running throughout: every round is discarded as
  contended and the outcome is "confounded: host busy" naming a burner, never REGRESSED.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_llmserve.options import BenchDefaults
from tests.e2e.shared import SharedServers
from tests.e2e.test_faults import Workdir

SHARED_SERVERS = ("healthy",)  # the shared servers (tests/e2e/shared.py) this module attaches to

pytestmark = pytest.mark.slow

BOUND = BenchDefaults().contention_bound
WORKLOAD = """
[workloads.tiny]
num_prompts = 8
input_len = 32
output_len = 32
max_concurrency = 4
warmup = 1
"""

TESTS = """
    import json
    import os
    import pathlib
    import subprocess
    import sys
    import time

    import psutil
    import pytest

    from pytest_llmserve.options import BenchDefaults
    from pytest_llmserve.gates.bench import run_round
    from pytest_llmserve.load.prompts import build_prompts
    from pytest_llmserve.load.runner import judge_contention

    HERE = pathlib.Path(__file__).parent
    BOUND = BenchDefaults().contention_bound


    def start_burners():
        # One CPU-bound process per usable core, each in a session of its own. A single burner in the test
        # run's own session kept the host busy here in every run, but in CI (2026-12-03, 2 cores) its share fell
        # from 45 % of the machine to 19 % and then 3 % over the benchmark's three rounds, so the third round
        # counted as a sample (cause not found; the kernel groups a session's processes for CPU fairness
        # there). Here every core has a burner and no burner shares a session's share with the test run.
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                 for _ in range(len(os.sched_getaffinity(0)))]
        time.sleep(0.5)
        return procs, time.monotonic()


    def stop_burners(procs, started, name):
        # What the burners actually got of the machine while they ran: evidence for the outer test's message
        # if a round beside them was not contended.
        seconds = time.monotonic() - started
        cpu = sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs)
        for p in procs:
            p.kill()
            p.wait()
        (HERE / f"{name}-burners.json").write_text(json.dumps({
            "pids": [p.pid for p in procs], "cpu_s": cpu, "wall_s": seconds,
            "share": cpu / (seconds * len(os.sched_getaffinity(0)))}))


    @pytest.fixture
    def burners():
        procs, started = start_burners()
        yield procs
        stop_burners(procs, started, "bench")


    def test_rounds(llm_server, llmserve_config):
        wl = llmserve_config.workload("tiny")
        prompts = build_prompts(wl, tokenize=llm_server.client().tokenize)
        # What is measured here is each round's host contention. A round may also be invalid for measurement
        # artefacts of a starved client (seen in a fresh-clone run, 2026-12-03: beside the burner, 4 of 8
        # requests had every chunk in one read); that is recorded, not a failure of this test.
        artefacts = []
        run_round(llm_server, wl, prompts, "first round", artefacts.append)  # the server's own warm-up
        # A shared host may be busy with others' work: a few tries at a quiet round, each judged as the gate
        # judges a round (the outer test says so rather than passing when none was quiet).
        tries = []
        for k in range(5):
            quiet = run_round(llm_server, wl, prompts, f"quiet round, try {k + 1}", artefacts.append)
            quiet_reason = judge_contention(quiet, BOUND)
            if quiet_reason is None:
                break
            tries.append(quiet_reason)
        procs, started = start_burners()
        try:
            busy = run_round(llm_server, wl, prompts, "busy round", artefacts.append)
        finally:
            stop_burners(procs, started, "rounds")
        busy_reason = judge_contention(busy, BOUND)
        (HERE / "rounds.json").write_text(json.dumps({
            "burners": [p.pid for p in procs], "quiet": quiet.host_contention.to_dict(), "quiet_reason": quiet_reason,
            "quiet_tries": tries, "artefacts": artefacts,
            "busy": busy.host_contention.to_dict(), "busy_reason": busy_reason, "busy_valid": busy.valid,
            "quiet_throughput": quiet.metrics.get("output_throughput") or quiet.diagnostics.get("output_throughput"),
            "busy_throughput": busy.diagnostics.get("output_throughput")}))


    @pytest.mark.llmserve_benchmark(workload="tiny", warmup_rounds=0)
    def test_busy_benchmark(llm_bench, burners):
        llm_bench.run()
"""


@dataclass
class Story:
    out: str
    rounds: dict[str, Any]
    burners: dict[str, dict[str, Any]]  # "rounds" and "bench": pids, CPU seconds and share the burners got


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, shared_servers: SharedServers) -> Iterator[Story]:
    wd = Workdir(tmp_path_factory.mktemp("contention"))
    wd.write("llmserve.toml", shared_servers.get("healthy").toml("default") + WORKLOAD)
    wd.write("test_busy.py", TESTS)
    try:
        run = wd.run("C", "-rA", timeout_s=900)
        assert (wd.path / "rounds.json").exists(), run.out
        rounds = json.loads((wd.path / "rounds.json").read_text())
        quiet, busy = rounds["quiet"], rounds["busy"]
        print(f"MEASURE quiet round: host contention {quiet['share']:.1%} ({quiet['seconds']:.1f} s, "
              f"{quiet['cores']} cores, top {quiet['top']}), output {rounds['quiet_throughput']:.1f} tok/s; "
              f"contended tries before it: {rounds['quiet_tries']}")
        print(f"MEASURE busy round: host contention {busy['share']:.1%} ({busy['seconds']:.1f} s, top "
              f"{busy['top']}), output {rounds['busy_throughput']:.1f} tok/s; reason: {rounds['busy_reason']}")
        print(f"MEASURE rounds invalid for measurement artefacts: {rounds['artefacts']}")
        burners = {name: json.loads((wd.path / f"{name}-burners.json").read_text())
                   for name in ("rounds", "bench") if (wd.path / f"{name}-burners.json").exists()}
        for name, got in burners.items():
            print(f"MEASURE burners beside the {name}: {got['share']:.1%} of the machine "
                  f"({got['cpu_s']:.1f} CPU-s over {got['wall_s']:.1f} s)")
        yield Story(run.out, rounds, burners)
        assert not wd.leftovers()
    finally:
        wd.cleanup()


def test_a_cpu_bound_process_beside_a_round_is_contention_named_by_pid(story: Story) -> None:
    busy, burners = story.rounds["busy"], story.rounds["burners"]
    assert busy["share"] > BOUND, (busy, story.burners.get("rounds"))
    # A burner named among the top processes (first on a quiet host; on a shared one others' may take as much).
    # The busiest of the burners: the kernel need not share the cores evenly between them in a 1.4 s round
    # (seen in a fresh-clone run, 2 cores, 2026-12-05: 11.2 % and 2.5 %).
    named = {p["pid"]: p for p in busy["top"]}
    ours = sorted((pid for pid in burners if pid in named), key=lambda pid: named[pid]["share"], reverse=True)
    assert ours and named[ours[0]]["share"] > 0.5 * BOUND, busy
    assert not story.rounds["busy_valid"]
    reason = story.rounds["busy_reason"]
    assert reason.startswith("confounded: host busy: ") and f"pid {ours[0]} python" in reason, reason
    assert "PASSED test_busy.py::test_rounds[default]" in story.out, story.out


def test_a_benchmark_on_a_busy_host_is_confounded_never_regressed(story: Story) -> None:
    # No verdict either way: skipped with the reason (a busy machine neither blocks a merge nor passes as a figure).
    skipped = [line for line in story.out.splitlines()
               if line.startswith("SKIPPED") and "test_busy_benchmark[default]" in line]
    assert skipped and "confounded: host busy: 3 rounds discarded" in skipped[0], (story.burners.get("bench"),
                                                                                  story.out)
    assert "FAILED test_busy.py::test_busy_benchmark" not in story.out, story.out
    assert any(f"pid {pid} python" in story.out for pid in story.burners["bench"]["pids"]), story.out
    assert "REGRESSED" not in story.out


def test_a_quiet_round_is_below_the_bound(story: Story) -> None:
    quiet = story.rounds["quiet"]
    if story.rounds["quiet_reason"] is not None:
        # Not a pass: this shared host stayed busy with others' work through every try (named in the reasons).
        pytest.skip(f"no quiet round on this host in 5 tries: {story.rounds['quiet_tries'][-1]}")
    assert quiet["share"] < BOUND, quiet
    assert all(p["pid"] not in story.rounds["burners"] for p in quiet["top"])
