"""DecodeCheck records each oracle's verdict with its full evidence, and fails with a concise message
(every finding in full from ``verbose >= 2``, pytest's ``-vv``)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.gates.decode import DecodeCheck
from pytest_llmserve.verdicts.oracles import DEFAULT_NAN_PROMPTS
from tests.unit.gates.test_decode import Failed, FakeHandle
from tests.unit.gates.test_oracle_runs import FakeServer

NAN_EVERYWHERE = tuple(p.text for p in DEFAULT_NAN_PROMPTS)


class LoggedHandle(FakeHandle):
    """A FakeHandle with a server log (that reports NaN once the check has begun) and no facts."""

    log_reads = 0
    nan_in_log = False

    def log_text(self) -> str:
        self.log_reads += 1
        return "" if self.log_reads == 1 or not self.nan_in_log else "Detected errors during sampling! NaN in the logits.\n"

    def facts(self) -> None:
        return None


class Skipped(Exception):
    pass


def finish(check: DecodeCheck) -> None:
    """What the plugin does when a test's body returns: the checks kept without a verdict skip the test."""
    kept = check.finish()
    if kept:
        raise Skipped(kept)


def checker(server: FakeServer, verbose: int = 0) -> tuple[DecodeCheck, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    handle = LoggedHandle(ServerSpec(name="nan"), server)
    handle.nan_in_log = bool(server.nan_prompts)
    check = DecodeCheck(handle, verbose=verbose, records=records)
    return check, records


def test_a_passing_oracle_is_recorded_as_a_pass() -> None:
    check, records = checker(FakeServer())
    check.no_nan().deterministic()
    assert [(r["check"], r["verdict"]) for r in records] == [("nan-check", "pass"), ("determinism", "pass")]


def test_a_failure_is_concise_and_its_record_holds_everything() -> None:
    server = FakeServer(nan_prompts=NAN_EVERYWHERE, corrupted_after=3.0)
    check, records = checker(server)
    with pytest.raises(Failed) as failed:
        check.no_nan()
    message = str(failed.value)
    (record,) = records
    assert record["verdict"] == "fail" and record["check"] == "nan-check"
    assert record["first_finding"].startswith("[nan] nan-check[")
    assert "HTTP 400 whose body reports NaN/inf" in record["first_finding"]
    report = check.reports[-1]
    assert len(record["findings"]) == len(report.findings)  # every finding, structured
    assert record["findings"][0]["request"].startswith("sent: ")
    full = record["detail"]
    assert full.startswith("nan-check FAILED on server nan") and "more finding(s)" not in full
    # The message shows the first three distinct findings and counts the rest; the full text is longer.
    assert message.startswith("nan-check FAILED on server nan")
    assert sum(1 for line in message.splitlines() if line.startswith("[")) == 3
    assert "more finding(s) (all of them, in full: -vv, or this check's row in results.json)" in message
    assert "first tokens (token:logprob)" not in message  # the offending tokens stand for them
    assert len(message.splitlines()) < len(full.splitlines())
    assert max(len(line) for line in message.splitlines()) <= 340
    assert "server nan at http://fake (log: /logs/nan.log)" in message  # where to look, always

    verbose, verbose_records = checker(FakeServer(nan_prompts=NAN_EVERYWHERE, corrupted_after=3.0), verbose=2)
    with pytest.raises(Failed) as everything:
        verbose.no_nan()
    assert str(everything.value) == verbose_records[0]["detail"]  # -vv: the full evidence in the failure


def test_skips_say_whether_the_evidence_is_missing_or_the_check_does_not_apply() -> None:
    check, records = checker(FakeServer())
    check.cuda_graph_sizes_covered()  # kept, not raised: the chain goes on
    assert records[-1]["verdict"] == "skipped" and records[-1]["check"] == "cuda-graph coverage"
    check.skip("the server does not report its attention backend", unverifiable=True)
    assert records[-1]["verdict"] == "unverifiable"
    assert records[-1]["first_finding"] == "the server does not report its attention backend"
    # finish() reports them once the chain is done: the unverifiable one first, the other named after it.
    with pytest.raises(Skipped) as raised:
        finish(check)
    lines = str(raised.value).splitlines()
    assert lines[0] == "the server does not report its attention backend"
    assert lines[1].startswith("  also skipped: nan: CUDA graphs are off")
    finish(check)  # nothing kept any more: nothing raised


def test_a_skip_in_a_chain_never_hides_the_checks_after_it() -> None:
    # Graphs off: the coverage check cannot apply, and the NaN check after it still runs and still fails.
    check, records = checker(FakeServer(nan_prompts=NAN_EVERYWHERE))
    with pytest.raises(Failed, match="nan-check FAILED"):
        check.cuda_graph_sizes_covered().no_nan()
    assert [(r["check"], r["verdict"]) for r in records] == [("cuda-graph coverage", "skipped"), ("nan-check", "fail")]
    # The same chain on a healthy server: both ran; the skip is reported when the test's body is done.
    check, records = checker(FakeServer())
    check.cuda_graph_sizes_covered().no_nan()
    assert [(r["check"], r["verdict"]) for r in records] == [("cuda-graph coverage", "skipped"), ("nan-check", "pass")]
    with pytest.raises(Skipped, match="CUDA graphs are off"):
        finish(check)
