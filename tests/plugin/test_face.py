"""The pytest face: one plugin object (pytest_llmserve.face.LLMServeFace) registered by the entry module once the run
uses llmserve, the fixtures declared by the entry module (no server is booted here)."""

from __future__ import annotations

import re

import pytest

from tests.standins.helpers import server_toml

pytestmark = pytest.mark.filterwarnings("ignore")

FACE_PROBE = """
import sys

import pytest


def _face(config):
    return config.pluginmanager.get_plugin("llmserve-face") is not None


def test_plain(request):
    print("PLAIN", _face(request.config), "pytest_llmserve.face" in sys.modules)


@pytest.mark.llmserve_correctness
def test_marked(request):
    print("MARKED", _face(request.config))
"""


def _printed(result: pytest.RunResult, tag: str) -> str:
    match = re.search(rf"{tag} ((?:True|False)(?: True| False)?)", result.stdout.str())
    assert match, result.stdout.str()
    return match.group(1)


def test_the_face_is_registered_once_the_run_uses_llmserve(pytester: pytest.Pytester) -> None:
    """Unconfigured, a plain test sees no face and none of its modules; an llmserve item (a marker is enough)
    registers it during collection."""
    pytester.makepyfile(test_probe=FACE_PROBE)
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "test_probe.py::test_plain")
    plain.assert_outcomes(passed=1)
    assert _printed(plain, "PLAIN") == "False False"
    both = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    both.assert_outcomes(passed=2)
    assert _printed(both, "PLAIN") == "True True" and _printed(both, "MARKED") == "True"


def test_a_configured_run_has_its_face_from_configuration_even_without_xdist(pytester: pytest.Pytester) -> None:
    """Configured, the face is registered at configuration; its pytest-xdist hooks are optional, so a run with
    pytest-xdist disabled (which then knows no such hooks) still collects."""
    pytester.makefile(".toml", llmserve=server_toml("a", engine="external", url="http://127.0.0.1:9"))
    pytester.makepyfile(test_probe=FACE_PROBE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-s",
                                           "test_probe.py::test_plain")
    result.assert_outcomes(passed=1)
    assert _printed(result, "PLAIN") == "True True"


def test_fixtures_reached_through_a_projects_own_fixture_are_parametrized_in_an_unconfigured_run(
        pytester: pytest.Pytester) -> None:
    """The reason the fixtures are declared by the entry module: pytest computes a test's fixture closure as it
    collects it, so fixtures that appeared only once collection met an llmserve test would be missing from the
    first closures (here: no ``llm_server`` parametrization for the first test, which reaches ``decode_check``
    through the project's fixture). Unconfigured, the one configuration is the embedded default."""
    pytester.makeconftest("""
        import pytest

        @pytest.fixture
        def checked(decode_check):
            return decode_check
    """)
    pytester.makepyfile(test_x="""
        def test_through_the_projects_fixture(checked):
            pass

        def test_direct(llm_server):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert [line for line in result.outlines if line.startswith("test_x.py::")] == [
        "test_x.py::test_through_the_projects_fixture[default]", "test_x.py::test_direct[default]"]


def test_the_fixtures_are_listed_in_a_project_that_does_not_use_llmserve(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    out = result.stdout.str()
    for name in ("llmserve_config", "llm_server", "decode_check", "llm_client", "llm_openai", "llm_async_openai",
                 "llm_bench", "llm_ab"):
        assert f"{name} -- " in out or f"{name} [" in out or f"\n{name}\n" in out, (name, out)
    result.stdout.fnmatch_lines(["*The running server for this test's configuration.*"])


def test_a_failed_check_is_reported_once_without_a_traceback(pytester: pytest.Pytester) -> None:
    """A check that failed (CheckFailed) fails its test with its message, once: not chained to the exception it
    replaced ("During handling of the above exception ..."), which doubled every failure's text in junit."""
    pytester.makepyfile(test_failing="""
import pytest

from pytest_llmserve.gates.decode import CheckFailed


@pytest.mark.llmserve_correctness
def test_check():
    raise CheckFailed("nan-check FAILED on server a: the one message")
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    start = out.index(" FAILURES ")
    failure = out[start:out.index("= llmserve =", start)]  # the test's own section (the summaries' lines vary by width)
    assert failure.count("nan-check FAILED on server a: the one message") == 1, out
    assert "During handling" not in out and "Traceback" not in out, out
    junit = (pytester.path / "junit.xml").read_text(encoding="utf-8")
    # the first-finding property, the failure's message attribute and its text: each once
    assert junit.count("the one message") == 3, junit
