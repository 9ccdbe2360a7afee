"""The package's progress lines reach a handler only while it is shown (the terminal under pytest, stderr under the
``llmserve`` command), whatever the root logger's level."""

from __future__ import annotations

import logging

import pytest

from pytest_llmserve.bench_face import progress_to
from pytest_llmserve.cli.bisect import progress_on_stderr
from pytest_llmserve.gates.rounds import log as gates_log
from pytest_llmserve.progress import PACKAGE_LOGGER, shown_by


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_gates_progress_is_shown_while_the_block_runs_and_not_after() -> None:
    handler = _Lines()
    level = logging.getLogger(PACKAGE_LOGGER).level
    gates_log.info("before: %s", "not shown")
    with shown_by(handler):
        gates_log.info("round %d on %s", 1, "cpu")
    gates_log.info("after: not shown")
    assert handler.lines == ["round 1 on cpu"]
    assert logging.getLogger(PACKAGE_LOGGER).level == level  # the logger is left as it was


def test_the_pytest_face_and_the_command_show_the_same_lines(capsys: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    with progress_to(said.append):
        gates_log.info("warm-up round 1 of workload %s (not counted)", "tiny")
    assert said == ["warm-up round 1 of workload tiny (not counted)"]
    with progress_on_stderr():
        gates_log.info("step B1 vs B0: pass")
    assert "[llmserve] step B1 vs B0: pass" in capsys.readouterr().err
