"""The correctness oracles proven on the real vLLM CPU engine, with checkpoints derived from SmolLM2.

``nan``: one mid-depth layer's norm and down-projection filled with NaN (vLLM answers HTTP 400 "Out of
range float values are not JSON compliant" whenever logprobs are asked for). ``scrambled``: the decoder
layers in reverse order: finite, confident logprobs, and text like " piece, piece. piece in piece".
Both are derived in set-up from the converted model (idempotent, cached under the plugin's cache; no
weights in the repository). One inner pytest session runs the oracles on the healthy model and on both
derived ones, each served by a shared server of this test run (attached: the oracles' case is not booting).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import boots_line
from tests.e2e.shared import SharedServers

pytestmark = pytest.mark.slow

SHARED_SERVERS = ("healthy", "scrambled", "nan")  # the shared servers (tests/e2e/shared.py) this module attaches to

INNER_TESTS = """
import pytest

ORACLE_SERVERS = ("healthy", "scrambled", "nan")


@pytest.mark.llmserve_server(*ORACLE_SERVERS)
def test_no_nan(decode_check):
    decode_check.no_nan()


@pytest.mark.llmserve_server(*ORACLE_SERVERS)
def test_known_answers(decode_check):
    decode_check.known_answers()


@pytest.mark.llmserve_server(*ORACLE_SERVERS)
def test_coherent(decode_check):
    decode_check.coherent()


@pytest.mark.llmserve_server("healthy")
def test_batch_of_nine_matches_batch_one(llm_server, decode_check):
    # Reference: each prompt alone; candidate: all nine at once on the same server.
    decode_check.matches(llm_server, concurrent=True)
    print(decode_check.reports[-1].message(limit=20))


@pytest.mark.llmserve_server("healthy")
def test_matches_the_scrambled_reference(decode_check):
    decode_check.matches("scrambled", max_tokens=8)
"""


def outcomes_from_junit(path: Path) -> dict[str, tuple[str, str]]:
    """test name -> (passed | failed | skipped | error, failure text)."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        status, text = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = "failed" if tag == "failure" else tag
                text = (node.get("message") or "") + "\n" + (node.text or "")
                break
        found[case.get("name", "")] = (status, text)
    return found


def test_nan_and_scrambled_checkpoints_are_caught_by_the_right_oracle(
        pytester: pytest.Pytester, write_config: Callable[[str], Path], shared_servers: SharedServers) -> None:
    servers = {name: shared_servers.get(name) for name in ("healthy", "scrambled", "nan")}
    write_config('default_server = "healthy"\n' + "".join(server.toml() for server in servers.values()))
    pytester.makeini("[pytest]\n")  # the rootdir is this directory, whatever lies above it
    pytester.makepyfile(test_oracles=INNER_TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("test_oracles.py", "-p", "no:cacheprovider", "-rA",
                                           f"--junitxml={junit}", timeout=900)
    out = result.stdout.str()
    got = outcomes_from_junit(junit)
    summary = {name: status for name, (status, _) in got.items()}

    def failure(name: str) -> str:
        status, text = got[name]
        assert status == "failed", f"{name} {status}, expected failed\n{summary}\n{out[-6000:]}"
        return text

    # The healthy model passes every oracle, and the differential of batch 9 against batch 1.
    for name in ("test_no_nan[healthy]", "test_known_answers[healthy]", "test_coherent[healthy]",
                 "test_batch_of_nine_matches_batch_one[healthy]"):
        assert summary.get(name) == "passed", f"{name}: {got.get(name)}\n{summary}\n{out[-6000:]}"
    assert "differential[healthy vs reference healthy; 9 greedy prompts, 32 tokens, candidate all 9 at once] " \
           "passed on server healthy: 0 error(s)" in out

    # NaN planted in one layer: the NaN oracle fails with vLLM's 400, and says what users see without logprobs.
    message = failure("test_no_nan[nan]")
    assert "nan-check FAILED on server nan" in message
    assert "HTTP 400 whose body reports NaN/inf" in message
    assert "Out of range float values are not JSON compliant" in message
    assert "sent: prompt=[{'role': 'user', 'content': 'What is the capital of France? Answer in one word.'}]" \
           in message
    assert "without logprobs the same request answers HTTP 200, and 32 tokens were generated but the text has " \
           "only 0 character(s)" in message
    assert "/nan" in message or servers["nan"].url in message, message  # which server
    assert "log:" in message  # and its log
    for name in ("test_known_answers[nan]", "test_coherent[nan]"):
        assert "Out of range float values" in failure(name)  # every oracle sees the NaN, none hides it

    # Scrambled layers: finite and confident, so the NaN oracle passes; coherence and known answers fail,
    # showing the repeated tokens.
    assert summary.get("test_no_nan[scrambled]") == "passed", got.get("test_no_nan[scrambled]")
    message = failure("test_coherent[scrambled]")
    assert "long-decode FAILED on server scrambled" in message
    assert "[coherence] error in long-decode[story]" in message
    assert "' piece'" in message
    assert "vocabulary collapse" in message or "of the output" in message
    assert "offending tokens (#position token logprob [top alternatives]):" in message
    message = failure("test_known_answers[scrambled]")
    assert "expected one of ['paris'] (case-insensitive) in the answer, got ' piece" in message

    # The differential against a genuinely different reference fails at the first token, outside the top-k.
    message = failure("test_matches_the_scrambled_reference[healthy]")
    assert "differential[healthy vs reference scrambled" in message
    assert "healthy vs scrambled: diverge at position 0" in message
    assert "is not in scrambled's top-k" in message
    assert "offending tokens: scrambled's first, then healthy's" in message
    assert "reference: attached server scrambled at " + servers["scrambled"].url in message, message

    assert len(got) == 11, summary
    # Nothing booted: each server attached, its log read for the facts.
    assert boots_line(out) == "server boots: 0", out[-3000:]
    for name, server in servers.items():
        assert f"attached: {name} at {server.url}, not launched by this run" in out, out[-3000:]
