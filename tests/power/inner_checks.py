"""The checks the fault catalogue runs on every server, as an inner pytest file (its text is ``INNER_CHECKS``).

Each test calls one of the plugin's checks as the built-in suite does (pytest_llmserve/suite/test_llmserve_suite.py),
on every configured server; ``test_matches_healthy`` compares each server with the one named ``healthy``, booted or
attached beside it (``decode_check.matches``), by the differential rule. The catalogue (tests/power/catalogue.py)
names, per fault, which of these tests must fail.
"""

from __future__ import annotations

INNER_CHECKS = '''
import pytest

from pytest_llmserve.verdicts.batch_sizes import BatchCase

pytestmark = pytest.mark.llmserve_server("*")


def test_no_nan(decode_check):
    decode_check.no_nan()


def test_known_answers(decode_check):
    decode_check.known_answers()


def test_long_decode(decode_check):
    decode_check.coherent()


def test_deterministic(decode_check):
    decode_check.deterministic()


def test_batch_of_4(decode_check):
    decode_check.batch_case(BatchCase(4, "no-graph"))


def test_graph_coverage(decode_check):
    decode_check.cuda_graph_sizes_covered()


def test_matches_healthy(decode_check):
    decode_check.matches("healthy")
'''

#: The inner tests, by name, in the order they run.
CHECKS = ("test_no_nan", "test_known_answers", "test_long_decode", "test_deterministic", "test_batch_of_4",
          "test_graph_coverage", "test_matches_healthy")
