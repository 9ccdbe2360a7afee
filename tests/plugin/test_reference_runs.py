"""A matrix's declared reference, through whole pytest runs (pytester): the reference combination records its
answers, the others replay the same prompts and are compared with them (one healthy near-tie passes, one
broken fails with the per-request table), and a later run replays the recording without the reference.
The servers are stand-ins (tests/standins/greedy_logprobs.py): no CPU engine breaks one configuration's
numerics on purpose. The same on the real vLLM CPU server: tests/e2e/test_servers.py (its matrix run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.standins.helpers import standin_toml

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

REFERENCE = "s[args=--skew none]"


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


def _config(token: str) -> str:
    return standin_toml("s", "greedy_logprobs.py", token=token) + """
[matrix.s]
args = [["--skew", "none"], ["--skew", "near-tie"], ["--skew", "broken"]]
reference = "args=--skew none"
"""


def _rows(pytester: pytest.Pytester) -> dict[str, dict[str, object]]:
    doc = json.loads((pytester.path / "llmserve-results" / "latest" / "results.json").read_text())
    return {row["server_id"]: row for row in doc["checks"]}


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadgroup"]], ids=["one-process", "xdist-loadgroup"])
def test_reference_recorded_then_replayed_against_each_combination(pytester: pytest.Pytester, token: str,
                                                                   workers: list[str]) -> None:
    pytester.makefile(".toml", llmserve=_config(token))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-suite", "-k", "matches_reference",
                                           "-rA", *workers, timeout=180)
    result.assert_outcomes(passed=2, failed=1)
    rows = _rows(pytester)
    assert {k: v["verdict"] for k, v in rows.items()} == {
        REFERENCE: "pass", "s[args=--skew near-tie]": "pass", "s[args=--skew broken]": "fail"}
    assert str(rows[REFERENCE]["detail"]).startswith(f"recorded: {REFERENCE} on command")
    healthy = str(rows["s[args=--skew near-tie]"]["detail"]).splitlines()
    assert healthy[0].startswith(f"s[args=--skew near-tie] vs {REFERENCE} on command, recorded ")
    assert "max |Δlogprob| (<= 0.25)" in healthy[1] and "near-tie gap (<= 0.5)" in healthy[1]
    assert len(healthy) == 2 + 9 and all("token 6:" in line and "0.020 @0" in line and "0.050" in line
                                         for line in healthy[2:])
    broken = rows["s[args=--skew broken]"]
    first = str(broken["first_finding"])
    assert first.startswith(f"s[args=--skew broken] disagrees with reference {REFERENCE}: worst request "
                            "differential[")
    assert "token 1:" in first and "near-tie gap: reference >= 2.000 (not in top-k)" in first
    assert "near-tie gap (<= 0.5)" in str(broken["detail"])
    result.stdout.fnmatch_lines(["*s[[]args=--skew broken[]] disagrees with reference*"])
    recorded = pytester.path / "llmserve-results" / "latest" / "reference-answers" / "s.json"
    saved = json.loads(recorded.read_text())
    assert saved["combination"] == REFERENCE and saved["max_tokens"] == 32 and len(saved["answers"]) == 9


def test_a_later_run_replays_the_recording_without_booting_the_reference(pytester: pytest.Pytester,
                                                                         token: str) -> None:
    pytester.makefile(".toml", llmserve=_config(token))
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-suite", "-k",
                                          "matches_reference and none", timeout=120)
    first.assert_outcomes(passed=1)
    earlier = (pytester.path / "llmserve-results" / "latest").resolve()
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-suite", "-k",
                                           "matches_reference and near", f"--llmserve-reference-answers={earlier}",
                                           timeout=120)
    replay.assert_outcomes(passed=1)
    now = (pytester.path / "llmserve-results" / "latest").resolve()
    assert now != earlier and not (now / "reference-answers").exists()  # replayed, nothing recorded anew
    assert "server boots: 1 (s[args=--skew near-tie])" in replay.stdout.str()
    # A recording of other weights is refused, naming the field.
    saved = json.loads((earlier / "reference-answers" / "s.json").read_text())
    other = Path(pytester.path / "other.json")
    other.write_text(json.dumps({**saved, "model": "/models/elsewhere"}))
    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-suite", "-k",
                                            "matches_reference and near", f"--llmserve-reference-answers={other}",
                                            timeout=120)
    refused.assert_outcomes(failed=1)
    refused.stdout.fnmatch_lines(["*were recorded for something else; refused: model: recorded '/models/elsewhere'*"])
