"""What the plugin relies on in pytest and pytest-xdist beyond their documented API, pinned: each test here fails
when the installed version changes it (pyproject allows pytest >= 8.4 and pytest-xdist >= 3.5; written against
pytest 9.2 and pytest-xdist 3.8). The scheduler protocol's members are pinned in tests/unit/server/test_hosts.py."""

from __future__ import annotations

import json

import pytest

from pytest_llmserve.report_hooks import ROW_ATTR

pytestmark = pytest.mark.filterwarnings("ignore")


def test_a_report_attribute_survives_the_serialization_xdist_sends_reports_through(pytestconfig: pytest.Config) -> None:
    """report_hooks.py carries a check's row as a report attribute (``ROW_ATTR``), and pytest-xdist sends a worker's
    reports home through pytest's public ``pytest_report_to_serializable`` / ``pytest_report_from_serializable``
    hooks. That an attribute set on a ``pytest.TestReport`` makes that round trip is pytest's behaviour (its
    reports serialize their ``__dict__``), not a documented promise."""
    row = {"test_id": "t.py::test_x", "verdict": "pass"}
    report = pytest.TestReport("t.py::test_x", ("t.py", 0, "test_x"), {}, "passed", None, "call")
    setattr(report, ROW_ATTR, row)
    data = pytestconfig.hook.pytest_report_to_serializable(config=pytestconfig, report=report)
    back = pytestconfig.hook.pytest_report_from_serializable(config=pytestconfig, data=json.loads(json.dumps(data)))
    assert isinstance(back, pytest.TestReport) and getattr(back, ROW_ATTR) == row


XDIST_CONFTEST = """
import pytest

from pytest_llmserve.xdist_hooks import tx_specs


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        print("OPTIONS", config.option.tx, len(tx_specs(config)), config.option.dist, config.option.maxworkerrestart)


def pytest_configure_node(node):
    node.workerinput["pin"] = "to the worker"


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["pin"] = session.config.workerinput["pin"] + " and back"


def pytest_testnodedown(node, error):
    print("HOME", node.workeroutput.get("pin"), node.gateway.id, type(node.gateway.spec).__name__)


def pytest_runtest_logreport(report):
    if report.when == "call" and hasattr(report, "node"):
        print("NODE", report.node.gateway.id)
"""


def test_what_a_controller_and_its_workers_exchange(pytester: pytest.Pytester) -> None:
    """``-n N`` is N ``popen`` specs in ``--tx`` by configuration (xdist_hooks.tx_specs reads them); the option
    names the plugin reads and sets (``tx``, ``dist``, ``maxworkerrestart``); ``workerinput`` (documented)
    reaches the worker and ``workeroutput`` (not documented) comes back to ``pytest_testnodedown``; a worker's
    report carries its ``node`` (documented in pytest-xdist's hook specifications)."""
    pytest.importorskip("xdist")
    pytester.makeconftest(XDIST_CONFTEST)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-n", "1")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "OPTIONS ['popen'] 1 load None" in out, out
    assert "HOME to the worker and back gw0 XSpec" in out, out
    assert "NODE gw0" in out, out
