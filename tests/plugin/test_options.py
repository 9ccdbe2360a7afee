"""Options, ini keys, markers and usage errors, through pytester (no server is booted here)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore")


def test_markers_are_registered_with_signatures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    for line in ("@pytest.mark.llmserve_server(*names)*",
                 "@pytest.mark.llmserve_benchmark(workload=None, *, metric=None, tolerance=None, rounds=None*",
                 "@pytest.mark.llmserve_correctness*"):
        result.stdout.fnmatch_lines([line])
    # gpu, a common name, only in a configured run: elsewhere a project's own gpu marker is left alone.
    assert "@pytest.mark.gpu" not in result.stdout.str()
    pytester.makefile(".toml", llmserve='[servers.a]\nengine = "external"\nurl = "http://127.0.0.1:9"\n')
    pytester.runpytest("--markers").stdout.fnmatch_lines(["@pytest.mark.gpu: an llmserve test that needs a GPU*"])


def test_options_in_one_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*LLM inference server fixtures*", "*--llmserve-suite*", "*--llmserve-url=*",
                                 "*--llmserve-save-baseline*", "*llmserve_save_baseline (bool)*",
                                 "*llmserve_tolerance (float)*", "*llmserve_rounds (int)*",
                                 "*llmserve_warmup_rounds (int)*", "*llmserve_warmup_agreement (float)*",
                                 "*llmserve_contention_bound (float)*"])


def test_bad_config_key_is_a_usage_error_naming_key_value_and_file(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve='[servers.a]\nmodel = "/m"\nstartup_timeout_s = "soon"\n')
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*llmserve.toml: [[]tool.llmserve.servers.a] startup_timeout_s = 'soon': "
                                 "must be a number of seconds > 0*"])


def test_bad_tolerance_on_command_line_names_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llmserve-tolerance=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmserve-tolerance = 'lots': must be a number*"])


def test_warm_up_options_reach_the_header_and_a_bad_one_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nllmserve_warmup_rounds = 5\n")
    pytester.makepyfile("def test_x(): pass")
    assert "after up to 5 warm-up (agreeing within 2%)" in pytester.runpytest(
        "--llmserve-warmup-agreement=0.02").stdout.str()
    result = pytester.runpytest("--llmserve-warmup-rounds=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmserve-warmup-rounds = '-1': must be a whole number >= 0*"])


def test_precedence_ini_then_env_then_cli(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nllmserve_tolerance = 0.2\nllmserve_rounds = 4\n")
    pytester.makepyfile("def test_x(): pass")
    assert "tolerance 0.2, rounds 4..8" in pytester.runpytest().stdout.str()
    monkeypatch.setenv("PYTEST_LLMSERVE_TOLERANCE", "0.1")
    assert "tolerance 0.1, rounds 4..8" in pytester.runpytest().stdout.str()
    assert "tolerance 0.07, rounds 4..8" in pytester.runpytest("--llmserve-tolerance=0.07").stdout.str()


def test_bad_marker_argument_names_the_test(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve='[servers.a]\nengine = "external"\nurl = "http://127.0.0.1:9"\n')
    pytester.makepyfile("""
        import pytest
        @pytest.mark.llmserve_benchmark(workload="nope")
        def test_bench(llm_bench):
            pass
        @pytest.mark.llmserve_server("missing")
        def test_srv(llm_server):
            pass
    """)
    result = pytester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_bad_marker_argument_names_the_test.py::test_srv: marker llmserve_server: "
                                 "unknown server 'missing'*",
                                 "*unknown workload 'nope' in test_bad_marker_argument_names_the_test.py::test_bench[[]a]: marker llmserve_benchmark*"])


def test_unknown_server_on_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llmserve-server=ghost")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmserve-server = 'ghost': no server named 'ghost'*"])


def test_matrix_parametrizes_with_readable_ids_in_config_order(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", llmserve="""
        [servers.m]
        engine = "vllm"
        model = "/m"
        [matrix.m]
        eager = [true, false]
        max_batch_size = [1, 8]
    """)
    pytester.makepyfile("""
        import pytest
        @pytest.mark.llmserve_server("m")
        def test_a(llm_server): pass
        @pytest.mark.llmserve_server("m")
        def test_b(llm_server): pass
    """)
    result = pytester.runpytest("--collect-only", "-q")
    # Grouped by configuration, so each combination boots once.
    result.stdout.fnmatch_lines([
        "*test_a[[]m[[]eager=on,max_batch_size=1]]",
        "*test_b[[]m[[]eager=on,max_batch_size=1]]",
        "*test_a[[]m[[]eager=on,max_batch_size=8]]",
        "*test_b[[]m[[]eager=on,max_batch_size=8]]",
        "*test_a[[]m[[]eager=off,max_batch_size=1]]",
        "*test_b[[]m[[]eager=off,max_batch_size=1]]",
        "*test_a[[]m[[]eager=off,max_batch_size=8]]",
        "*test_b[[]m[[]eager=off,max_batch_size=8]]",
    ])


def test_suite_option_collects_the_builtin_suite_only(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests")
    pytester.makepyfile(**{"tests/test_own": "def test_mine(): pass"})
    result = pytester.runpytest("--llmserve-suite", "--collect-only", "-q")
    out = result.stdout.str()
    assert "test_mine" not in out
    assert "::test_boots_and_generates[default]" in out
    assert "::test_throughput[default]" in out
    assert "test_batch_size[default-bs=" in out
    # Every file of the suite directory, the property tests included.
    assert "::test_api_invariants[default]" in out
    assert "::test_seeded_sampling_is_repeatable[default]" in out
    assert out.index("::test_boots_and_generates[default]") < out.index("::test_api_invariants[default]")


def test_suite_files_are_collected_whatever_python_files_says(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npython_files = check_*.py\n")
    result = pytester.runpytest("--llmserve-suite", "--collect-only", "-q")
    out = result.stdout.str()
    assert "::test_boots_and_generates[default]" in out
    assert "::test_api_invariants[default]" in out



def test_every_option_has_a_typed_ini_key_with_the_same_help(pytester: pytest.Pytester) -> None:
    from pytest_llmserve.settings import OPTIONS

    parser = pytester.parseconfig()._parser
    group = parser.getgroup("llmserve")
    option_help = {name: arg.attrs()["help"] for arg in group.options for name in arg.names()}
    ini_types = {"flag": "bool", "string": "string", "int": "int", "float": "float"}
    for option in OPTIONS:
        help_text, ini_type, default = parser._inidict[option.ini]
        assert (help_text, ini_type, default) == (option.help, ini_types[option.kind], None), option
        assert option_help[option.flag] == option.help
    assert "default 8" in option_help["--llmserve-max-rounds"]  # BenchDefaults.max_rounds, not a copy of it
