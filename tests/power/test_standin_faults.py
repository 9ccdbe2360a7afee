"""The stand-in half of the fault catalogue, run as a mutation score in every ``pytest tests`` (CI included).

One inner pytest run (pytester) of the catalogue's checks (tests/power/inner_checks.py) on a healthy stand-in and one
stand-in per fault of ``catalogue.STANDIN_FAULTS`` (tests/standins/kernel_faults.py), each failure one no engine on
this machine produces on demand (the catalogue's ``why_stand_in``). ``no-graphs-captured`` is an SGLang server
attached by url: a healthy stand-in "launched elsewhere" whose log is SGLang 0.5.15's own, recorded on an H200 with
CUDA graphs disabled, while the configuration asks for graphs. Every server declares ``random_weights = true``: the
stand-ins' text is a pseudo-vocabulary, so known answers and long-decode coherence are not applicable (which is why
the catalogue names neither for a stand-in fault).

Scored with tests/power/score.py: every fault is caught by the checks its ``caught_by`` names, nothing else fails on
it but the checks :data:`ALSO_FAILING` names and explains, the healthy server fails nothing, and the findings show
that today's rules did the catching (the near-tie judged on both sides, the |Δlogprob| bound of a batch case).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.report.checks import CheckOutcome
from pytest_llmserve.verdicts.oracles import DEFAULT_DIFFERENTIAL_PROMPTS
from tests.power.catalogue import STANDIN_FAULTS
from tests.power.inner_checks import CHECKS, INNER_CHECKS
from tests.power.score import Scorecard, markdown, read_checks, score
from tests.standins.helpers import MARK_ENV, STANDINS, server_toml, standin_toml

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

NO_GRAPHS_LOG = Path(__file__).resolve().parents[1] / "data" / "logs" / "real_sglang_0.5.15_h200_no_cuda_graph.log"
ATTACHED = "no-graphs-captured"
LAUNCHED = tuple(f.name for f in STANDIN_FAULTS if f.name != ATTACHED)

#: Checks outside a fault's ``caught_by`` that fail on it as well, and why: the catalogue names the checks that must
#: catch a fault; these catch it too, by what the fault is, and the test pins them so that a check that starts (or
#: stops) failing on a fault is seen.
ALSO_FAILING: dict[str, frozenset[str]] = {
    # Every check asks for logprobs, and logprobs asked for but not returned is an error wherever it happens.
    "drops-logprobs": frozenset({"test_deterministic", "test_batch_of_4"}),
    # The checks send the same prompts more than once (NaN probes, the batch-1 reference, the batch, the
    # differential): each later answer is a rerun, flipped, and compared with an earlier or a healthy one.
    "rerun-flip": frozenset({"test_batch_of_4", "test_matches_healthy"}),
}


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


@pytest.fixture
def attached_server(token: str) -> Iterator[str]:
    """A healthy kernel_faults stand-in started outside the inner run, as a cluster manager would: its url."""
    proc = subprocess.Popen([sys.executable, str(STANDINS / "kernel_faults.py"), "--fault", "none", "--port", "0",
                             "--max-s", "300", token], stdout=subprocess.PIPE, env={**os.environ, MARK_ENV: token})
    try:
        assert proc.stdout is not None
        for _ in range(3):
            line = proc.stdout.readline().decode()
            if "listening on " in line:
                yield line.split("listening on ", 1)[1].strip()
                break
        else:
            raise AssertionError("the attached stand-in did not say where it listens")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def _config(token: str, url: str, log: Path) -> str:
    launched = [standin_toml(name, "kernel_faults.py", "--fault", "none" if name == "healthy" else name,
                             token=token, random_weights=True) for name in ("healthy", *LAUNCHED)]
    attached = server_toml(ATTACHED, engine="sglang", url=url, log=str(log), random_weights=True,
                           cuda_graph={"enabled": True, "batch_sizes": [1, 2, 4]})
    return "\n".join([*launched, attached])


def _scorecard(pytester: pytest.Pytester) -> tuple[Scorecard, dict[tuple[str, str], CheckOutcome]]:
    rows = read_checks(pytester.path / "llmserve-results" / "latest" / "results.json")
    return score(rows, STANDIN_FAULTS, ["healthy"]), {(r.server_id, r.check): r for r in rows}


def _errors(row: CheckOutcome, oracle: str) -> list[dict[str, Any]]:
    """The row's error findings of ``oracle``."""
    return [f for f in row.findings if f["oracle"] == oracle and f["severity"] == "error"]


def _top(token_at: dict[str, Any]) -> set[str]:
    """The tokens a finding's evidence lists at one position (the top-5 the server sent there)."""
    return {str(token) for token, _ in token_at["top"]}


def test_every_standin_fault_is_caught_by_its_checks_and_the_healthy_server_by_none(
        pytester: pytest.Pytester, token: str, attached_server: str, tmp_path: Path) -> None:
    log = tmp_path / "shared" / "sglang.log"
    log.parent.mkdir()
    shutil.copy(NO_GRAPHS_LOG, log)
    pytester.makefile(".toml", llmserve=_config(token, attached_server, log))
    pytester.makepyfile(test_inner=INNER_CHECKS)
    start = time.monotonic()
    # One probe at a time: batch-only-nan and batch-drift must see only the batch case's requests overlap.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-probe-concurrency=1", "-rA",
                                           timeout=240)
    elapsed = time.monotonic() - start
    card, rows = _scorecard(pytester)
    table = markdown(card)
    (pytester.path / "standin-faults.md").write_text(table)
    print(f"\n{table}\nMEASURE stand-in fault catalogue: inner run {elapsed:.1f} s "
          f"({len(STANDIN_FAULTS)} faults, {len(CHECKS)} checks each)")
    out = result.stdout.str()

    servers = {server for server, _ in rows}
    assert servers == {"healthy", *LAUNCHED, ATTACHED}, out
    for f in card.faults:
        shown = "; ".join(f"{r.render()} ({r.first_finding})" for r in f.expected)
        assert f.caught, f"{f.fault.name} not caught: {shown}\n{table}"
        also = {r.check for r in f.also_failed}
        assert also == ALSO_FAILING.get(f.fault.name, frozenset()), \
            f"{f.fault.name}: other checks failed: {also}; caught by {shown}\n{table}"
    (healthy,) = card.healthy
    assert {r.check for r in healthy.results} == set(CHECKS), table
    assert not healthy.false_alarms, f"false alarms on the healthy server:\n{table}"
    assert card.score == 1.0, table

    # first-token-flip: every answer diverges at position 1 inside vLLM's rule (each side's token in the other's
    # top-5: check_logprobs_close passes it), and fails on the near-tie judged on both sides: the healthy side puts
    # the flipped token, its own 5th choice, 4 nats below its choice.
    flips = _errors(rows[("first-token-flip", "test_matches_healthy")], "differential")
    assert len(flips) == len(DEFAULT_DIFFERENTIAL_PROMPTS), flips  # each prompt's answer flips
    for finding in flips:
        message, (reference, candidate) = finding["message"], finding["tokens"]
        assert "diverge at position 1, not a near-tie" in message and "healthy puts first-token-flip's " in message \
            and "4.000 nats below its own choice" in message, message
        assert reference["position"] == candidate["position"] == 1, finding
        assert candidate["token"] in _top(reference) and reference["token"] in _top(candidate), finding
        assert candidate["token"] == reference["top"][-1][0], finding  # the reference's 5th choice
    # batch-drift: the same tokens, caught by the batch case's |Δlogprob| bound.
    drift = [f["message"] for f in _errors(rows[("batch-drift", "test_batch_of_4")], "differential")]
    assert any("|Δlogprob| 0.500 of the token both chose exceeds the tolerance 0.25" in m for m in drift), drift
    # batch-only-nan: NaN only in the batch; the NaN probes, sent one at a time, are clean.
    assert rows[("batch-only-nan", "test_no_nan")].verdict == "pass"
    nan = _errors(rows[("batch-only-nan", "test_batch_of_4")], "nan")
    assert nan and all(str(f["probe"]).startswith("bs=4-no-graph request ") for f in nan), nan
    # no-graphs-captured: graphs requested, none captured by SGLang's own account (before, the configured sizes ran
    # as batch cases and passed).
    graphs = str(rows[(ATTACHED, "test_graph_coverage")].first_finding)
    assert "CUDA graphs were requested for batch sizes [1, 2, 4] but the server reports that it captured none" \
        in graphs, graphs
    # drops-logprobs: the NaN check says what is missing, not that it found nothing.
    drops = [f["message"] for f in _errors(rows[("drops-logprobs", "test_no_nan")], "transport")]
    assert any("logprobs were requested but none came back" in m for m in drops), drops
