"""Host contention, on the real vLLM CPU server: a CPU-bound process beside a round is seen and named.

This is *contention* (other processes taking the host's CPU), not *contamination* (other clients' requests
reaching the server: tests/e2e/test_isolation_real.py). One inner run, attached to the test run's shared
server (tests/e2e/shared.py; its processes are the server's, not contention):

* QUIET_ROUNDS quiet rounds (nothing of this test running beside them), each judged as the gate judges a round:
  at most MAX_FALSE_CONFOUNDED of them may be judged contended (the false-confounded rate, stated with its N), and a
  failure names the processes that took the host; then a round with ``python -c "while True: pass"`` started beside
  it on every core: it is above the bound and its reason names a burner's pid;
* a benchmark (``llm_bench.run()``) with the burners running throughout: every round is discarded as
  contended and the outcome is "confounded: host busy" naming a burner, never REGRESSED.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_llmserve.load.contention import BusyProcess, HostContention, contention_reason
from pytest_llmserve.options import BenchDefaults
from tests.e2e.shared import SharedServers
from tests.e2e.test_faults import Workdir

SHARED_SERVERS = ("healthy",)  # the shared servers (tests/e2e/shared.py) this module attaches to

pytestmark = [pytest.mark.slow, pytest.mark.bench]

BOUND = BenchDefaults().contention_bound
# The false-confounded rate is measured over this many quiet rounds. The test used to try up to 5 quiet rounds and
# stop at the first below the bound (one round on a quiet host); 5 every time costs 4 tiny rounds more there. The
# round beside the burners took 1.4 s on the 2-core host (docs/changelog.md, 2026-12-05: the fresh-clone rehearsal of
# 9ea51c2) and a quiet one takes no longer, so about 6 s more beside a file of about 80 s (docs/changelog.md: 79.9-85.2 s
# in the rehearsals since the shared servers boot in its set-up); on a busy host, what the old tries already cost.
QUIET_ROUNDS = 5
# A contended round is measured again (gates/rounds.py, clean_round; a benchmark is confounded after 3), so one false
# alarm in 5 costs a round; two or more mean the host's own background is above the bound a good part of the time,
# where benchmarks would be confounded often: that host fails here, its processes named.
MAX_FALSE_CONFOUNDED = 1
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
    from pytest_llmserve.gates.rounds import measure_round
    from pytest_llmserve.load.prompts import build_prompts
    from pytest_llmserve.load.runner import judge_contention

    HERE = pathlib.Path(__file__).parent


    def run_round(server, wl, prompts, what, invalid):
        # One round as the gate measures it (gates/rounds.measure_round); ``invalid`` gets an invalid round's reasons.
        result = measure_round(server, wl, prompts)
        if not result.valid:
            invalid(f"{what} is INVALID (not a number): " + " | ".join(result.invalid_reasons))
        return result
    BOUND = BenchDefaults().contention_bound
    QUIET_ROUNDS = int(os.environ["QUIET_ROUNDS"])


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
        # Every quiet round is kept and judged as the gate judges a round: the outer test counts the ones judged
        # contended with nothing of this test beside them (the false-confounded rate), none is retried.
        quiet = []
        for k in range(QUIET_ROUNDS):
            result = run_round(llm_server, wl, prompts, f"quiet round {k + 1}", artefacts.append)
            contention = result.host_contention
            quiet.append({"contention": contention.to_dict() if contention is not None else None,
                          "reason": judge_contention(result, BOUND),
                          "throughput": result.metrics.get("output_throughput")
                          or result.diagnostics.get("output_throughput")})
        procs, started = start_burners()
        try:
            busy = run_round(llm_server, wl, prompts, "busy round", artefacts.append)
        finally:
            stop_burners(procs, started, "rounds")
        busy_reason = judge_contention(busy, BOUND)
        (HERE / "rounds.json").write_text(json.dumps({
            "burners": [p.pid for p in procs], "quiet": quiet, "artefacts": artefacts,
            "busy": busy.host_contention.to_dict(), "busy_reason": busy_reason, "busy_valid": busy.valid,
            "busy_throughput": busy.diagnostics.get("output_throughput")}))


    @pytest.mark.llmserve_benchmark(workload="tiny", warmup_rounds=0)
    def test_busy_benchmark(llm_bench, burners):
        llm_bench.run()
"""


def false_confounded(rounds: dict[str, Any]) -> list[str]:
    """The reasons of the quiet rounds judged contended (each names the processes that took the host)."""
    return [q["reason"] for q in rounds["quiet"] if q["reason"] is not None]


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
        run = wd.run("C", "-rA", timeout_s=900, env={"QUIET_ROUNDS": str(QUIET_ROUNDS)})
        assert (wd.path / "rounds.json").exists(), run.out
        rounds = json.loads((wd.path / "rounds.json").read_text())
        busy = rounds["busy"]
        for k, quiet in enumerate(rounds["quiet"], 1):
            got = quiet["contention"]
            figure = (f"host contention {got['share']:.1%} ({got['seconds']:.1f} s, {got['cores']} cores, "
                      f"top {got['top']})" if got else "host contention not sampled")
            output = f"{quiet['throughput']:.1f} tok/s" if quiet["throughput"] is not None else "no figure"
            print(f"MEASURE quiet round {k}/{len(rounds['quiet'])}: {figure}, output {output}; "
                  f"{quiet['reason'] or 'a sample (below the bound)'}")
        print(f"MEASURE false-confounded quiet rounds: {len(false_confounded(rounds))} of {len(rounds['quiet'])} "
              f"(bound {BOUND:.0%} of the machine; at most {MAX_FALSE_CONFOUNDED} of {QUIET_ROUNDS} allowed)")
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


def quiet_rounds_problem(rounds: dict[str, Any]) -> str | None:
    """Why the quiet rounds break the false-confounded bound (at most MAX_FALSE_CONFOUNDED of QUIET_ROUNDS judged
    contended), in a message naming the processes that took the host; None when they keep it."""
    quiet = rounds["quiet"]
    if len(quiet) != QUIET_ROUNDS:
        return f"{len(quiet)} quiet rounds measured, not {QUIET_ROUNDS}: {quiet}"
    # A round whose contention was not sampled or not judged could never count as contended.
    unjudged = [k for k, q in enumerate(quiet, 1) if q["contention"] is None or not q["contention"]["judged"]]
    if unjudged:
        return f"quiet round(s) {unjudged} without a judged contention figure: {quiet}"
    busy = false_confounded(rounds)
    if len(busy) > MAX_FALSE_CONFOUNDED:
        return (f"{len(busy)} of {QUIET_ROUNDS} quiet rounds judged contended (above {BOUND:.0%} of the machine) with "
                f"nothing of this test beside them; at most {MAX_FALSE_CONFOUNDED} of {QUIET_ROUNDS} allowed. This "
                "host's own background is above the bound too often for a benchmark to measure on it:\n"
                + "\n".join(busy))
    return None


def test_quiet_rounds_are_rarely_judged_contended(story: Story) -> None:
    """With nothing of this test beside them, at most MAX_FALSE_CONFOUNDED of QUIET_ROUNDS rounds may be judged
    contended. A host busy with others' work fails here, naming their processes (each reason names the top ones):
    a busy host is not a pass, and a benchmark there would be confounded as often."""
    problem = quiet_rounds_problem(story.rounds)
    assert problem is None, problem


# The check above on rounds made with the package's own contention record and reason (no server): a host busy in 2
# of 5 rounds fails it naming the process, one false alarm in 5 passes, an unjudged round fails.
def made_quiet_rounds(contended: int, *, judged: bool = True) -> dict[str, Any]:
    background = BusyProcess(pid=812, name="sshd", cpu_s=0.01, share=0.004)
    neighbour = BusyProcess(pid=4242, name="cc1plus", cpu_s=0.8, share=0.29)
    quiet = []
    for k in range(QUIET_ROUNDS):
        busy = k < contended
        figure = HostContention(share=0.31 if busy else 0.012, seconds=1.4, cores=2, samples=2,
                                top=[neighbour, background] if busy else [background], judged=judged)
        quiet.append({"contention": figure.to_dict(), "reason": contention_reason(figure, BOUND), "throughput": 90.0})
    return {"quiet": quiet}


def test_the_quiet_rounds_check_fails_a_host_busy_in_two_rounds_naming_the_process() -> None:
    problem = quiet_rounds_problem(made_quiet_rounds(2))
    assert problem is not None
    assert problem.startswith(f"2 of {QUIET_ROUNDS} quiet rounds judged contended (above 10% of the machine)"), problem
    assert f"at most 1 of {QUIET_ROUNDS} allowed" in problem and "pid 4242 cc1plus (29.0%)" in problem, problem


def test_the_quiet_rounds_check_passes_one_false_alarm_and_a_quiet_host() -> None:
    assert quiet_rounds_problem(made_quiet_rounds(1)) is None
    assert quiet_rounds_problem(made_quiet_rounds(0)) is None


def test_the_quiet_rounds_check_fails_rounds_whose_contention_was_not_judged() -> None:
    problem = quiet_rounds_problem(made_quiet_rounds(0, judged=False))
    assert problem is not None and problem.startswith("quiet round(s) [1, 2, 3, 4, 5] without a judged"), problem
