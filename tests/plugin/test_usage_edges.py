"""Sharp edges of the command line and the configuration (issue 12, item 5), through pytester.

No server is booted: every case here is decided from configuration alone. Each usage error must name the
bad value, where it came from and what is allowed, without a traceback.
"""

from __future__ import annotations

import sys

import pytest

from pytest_llmserve.config import CACHE_ENV, cache_dir

# pytester points HOME at a temporary directory: the real cache, read before it does.
REAL_CACHE = str(cache_dir())

pytestmark = pytest.mark.filterwarnings("ignore")

EXTERNAL = '[servers.a]\nengine = "external"\nurl = "http://127.0.0.1:9"\n[servers.b]\nengine = "external"\nurl = "http://127.0.0.1:9"\n'


def _no_traceback(result: pytest.RunResult) -> None:
    out = result.stdout.str() + result.stderr.str()
    # A frame of a traceback names a file under site-packages; pytest's own warnings summary may too, so it is cut.
    out = out.split("warnings summary", 1)[0] + out.rsplit("Docs: https://docs.pytest.org", 1)[-1]
    assert "Traceback" not in out and "site-packages" not in out, out


def test_llmserve_run_passes_pytest_options_through(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve=EXTERNAL)
    result = pytester.run(sys.executable, "-m", "pytest_llmserve.cli.main", "run", "-q", "--collect-only",
                          "-k", "boots")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["llmserve-suite/test_llmserve_suite.py::test_boots_and_generates[[]a]",
                                 "llmserve-suite/test_llmserve_suite.py::test_boots_and_generates[[]b]",
                                 "2/* tests collected*"])
    # The old spelling, with a `--` before pytest's arguments, still works.
    again = pytester.run(sys.executable, "-m", "pytest_llmserve.cli.main", "run", "--", "-q", "--collect-only",
                         "-k", "boots")
    assert again.ret == 0 and "2/" in again.stdout.str()


@pytest.mark.parametrize("embedded_ready", [True, False])
def test_llmserve_run_with_broken_toml_says_file_line_and_column(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 embedded_ready: bool) -> None:
    # Set up, `llmserve run` hands over to pytest at once (the plugin reports the file); with an empty
    # cache it reads the configuration itself first, to decide whether to set up the embedded default.
    monkeypatch.setenv(CACHE_ENV, REAL_CACHE if embedded_ready else str(pytester.path / "empty-cache"))
    if embedded_ready:
        from pytest_llmserve.engines import embedded

        if not embedded.is_ready():
            pytest.skip("the embedded default is not set up here (`llmserve setup`)")
    pytester.makefile(".toml", llmserve='[servers.a\nengine = "vllm"\n')
    result = pytester.run(sys.executable, "-m", "pytest_llmserve.cli.main", "run", "-q")
    assert result.ret in (2, pytest.ExitCode.USAGE_ERROR)
    _no_traceback(result)
    result.stderr.fnmatch_lines(["*llmserve.toml: not valid TOML: Expected ']' at the end of a table declaration "
                                 "(at line 1, column 11)*"])


def test_bench_table_is_read_and_validated(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve=EXTERNAL + "[bench]\ntolerance = 0.12\nrounds = 5\n")
    pytester.makepyfile("def test_x(): pass")
    assert "tolerance 0.12, rounds 5..8" in pytester.runpytest().stdout.str()
    pytester.makefile(".toml", llmserve=EXTERNAL + "[bench]\ntolerance = -7\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _no_traceback(result)
    result.stderr.fnmatch_lines(["*llmserve.toml: [[]tool.llmserve.bench] tolerance = -7: must be > 0*"])
    pytester.makefile(".toml", llmserve=EXTERNAL + "[bench]\ntolerence = 0.1\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*[[]tool.llmserve.bench] unknown key 'tolerence' = 0.1 (known keys: alpha, "
                                 "between_run_sd, contention_bound, extend_budget_s, extend_to_resolve, max_rounds, "
                                 "metric, rounds, tolerance, warmup_agreement, warmup_rounds, workload)*"])


def test_tolerance_obeys_one_rule_on_the_command_line_and_in_a_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llmserve-tolerance=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmserve-tolerance = '2': must be a fraction below 1 (0.05 = 5%)*"])
    pytester.makefile(".toml", llmserve=EXTERNAL)
    pytester.makepyfile("""
        import pytest
        @pytest.mark.llmserve_benchmark(tolerance=2)
        def test_bench(llm_bench):
            pass
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_bench[[]a]: marker llmserve_benchmark tolerance = 2: "
                                 "must be a fraction below 1 (0.05 = 5%)*"])


@pytest.mark.parametrize(("marker", "expected"), [
    ('"missing"', "marker llmserve_server: unknown server 'missing' (configured servers: a, b or '*'; from *"),
    ('"a", servers=["b"]', "marker llmserve_server: unknown keyword argument(s) servers=[[]'b']: it takes no "
                           "keywords, only server names as positional arguments*(configured servers: a, b or '*'*"),
    ('["a", "b"]', "marker llmserve_server: [[]'a', 'b'] is not a server name: pass names as separate strings*"),
    ("", "marker llmserve_server: needs at least one server name (configured servers: a, b or '*'*"),
])
def test_bad_server_marker_is_a_usage_error_naming_test_and_known_servers(pytester: pytest.Pytester, marker: str,
                                                                          expected: str) -> None:
    pytester.makefile(".toml", llmserve=EXTERNAL)
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.llmserve_server({marker})
        def test_srv(llm_server):
            pass
        def test_plain():
            pass
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _no_traceback(result)
    result.stderr.fnmatch_lines([f"ERROR: pytest-llmserve: *::test_srv: {expected}"])


def test_suite_items_have_readable_node_ids(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve=EXTERNAL)
    result = pytester.runpytest("--llmserve-suite", "--collect-only", "-q", "--llmserve-server=a")
    lines = [line for line in result.stdout.str().splitlines() if "::" in line]
    assert lines and all(line.startswith(("llmserve-suite/test_llmserve_suite.py::",
                                          "llmserve-suite/test_llmserve_properties.py::")) for line in lines), lines
    assert "llmserve-suite/test_llmserve_suite.py::test_throughput[a]" in lines
    # The id selects what it names.
    result = pytester.runpytest("--llmserve-suite", "--collect-only", "-q", "--llmserve-server=a",
                                "--deselect", "llmserve-suite/test_llmserve_suite.py::test_throughput[a]")
    assert "test_throughput" not in result.stdout.str()
