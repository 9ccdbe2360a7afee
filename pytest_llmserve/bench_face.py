"""The benchmark gates' pytest face: what the ``llm_bench`` and ``llm_ab`` fixtures hand a test.

The gates (:class:`~pytest_llmserve.gates.bench.BenchGate`, :class:`~pytest_llmserve.gates.ab.ABRunner`) return a
:class:`~pytest_llmserve.report.outcome.BenchOutcome` whose ``ending`` says what it means for the test; they never
call pytest. Here, and only here, an outcome is recorded for the reports and made a failure, a skip or a warning.
While a gate runs, its progress (the ``pytest_llmserve.gates`` logger) is also written to the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from pytest_llmserve.gates.ab import ABRunner
from pytest_llmserve.gates.bench import BenchGate
from pytest_llmserve.progress import shown_by
from pytest_llmserve.report.outcome import BenchOutcome


class BenchFace:
    """``llm_bench``: ``run()`` measures with the gate, records the outcome, and fails, skips or warns the test."""

    def __init__(self, gate: BenchGate, *, record: Callable[[BenchOutcome], None], say: Callable[[str], None]) -> None:
        self.gate = gate
        self._record = record
        self._say = say

    def run(self, workload: str | None = None) -> BenchOutcome:
        with progress_to(self._say):
            outcome = self.gate.run(workload)
        return end_test(outcome, self._record)


class ABFace:
    """``llm_ab``: ``run(a=..., b=...)`` benchmarks the two configurations, records, and fails a regression."""

    def __init__(self, runner: ABRunner, *, record: Callable[[BenchOutcome], None], say: Callable[[str], None]) -> None:
        self.runner = runner
        self._record = record
        self._say = say

    def run(self, a: str, b: str, **options: Any) -> BenchOutcome:
        with progress_to(self._say):
            outcome = self.runner.run(a, b, **options)
        return end_test(outcome, self._record)


def end_test(outcome: BenchOutcome, record: Callable[[BenchOutcome], None]) -> BenchOutcome:
    """Record ``outcome``, then end the test as its ``ending`` says (a warning leaves it passing)."""
    record(outcome)
    ending = outcome.ending
    if ending is None:
        return outcome
    if ending.action == "fail":
        pytest.fail(ending.message, pytrace=False)
    if ending.action == "skip":
        pytest.skip(ending.message)
    warnings.warn((ending.warning or UserWarning)(ending.message), stacklevel=3)  # at the test's call of run()
    return outcome


class _ToTerminal(logging.Handler):
    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())


def progress_to(say: Callable[[str], None]) -> contextlib.AbstractContextManager[None]:
    """The gates' progress lines to ``say`` (the terminal) while the block runs; they reach pytest's own logging
    (live log, captured log) as well, at INFO."""
    return shown_by(_ToTerminal(say))
