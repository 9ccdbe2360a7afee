"""Settings resolution (ini < environment < command line) and the benchmark spec (< marker), without pytest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.settings import OPTIONS, BenchSpec, Settings, Sources, bench_spec, resolve_settings


def _default() -> ServerSpec:
    return ServerSpec(name="default", engine="vllm", model="/m")


def _resolve(tmp_path: Path, cli: dict[str, Any] | None = None, ini: dict[str, Any] | None = None,
             env: dict[str, str] | None = None) -> Settings:
    return resolve_settings(tmp_path, Sources(cli=cli or {}, ini=ini or {}, env=env or {}), _default)


def test_later_sources_win_and_each_is_named_in_errors(tmp_path: Path) -> None:
    ini = {"tolerance": 0.2, "rounds": 4}
    assert _resolve(tmp_path, ini=ini).bench.tolerance == 0.2
    assert _resolve(tmp_path, ini=ini, env={"PYTEST_LLMSERVE_TOLERANCE": "0.1"}).bench.tolerance == 0.1
    both = _resolve(tmp_path, cli={"tolerance": "0.07"}, ini=ini, env={"PYTEST_LLMSERVE_TOLERANCE": "0.1"})
    assert (both.bench.tolerance, both.bench.rounds, both.bench.max_rounds) == (0.07, 4, 8)
    with pytest.raises(ConfigError, match=r"\$PYTEST_LLMSERVE_ROUNDS = '0': must be a positive integer"):
        _resolve(tmp_path, env={"PYTEST_LLMSERVE_ROUNDS": "0"})
    with pytest.raises(ConfigError, match="ini llmserve_max_rounds = 0: must be a positive integer"):
        _resolve(tmp_path, ini={"max_rounds": 0})


def test_command_line_server_wins_over_ini(tmp_path: Path) -> None:
    (tmp_path / "llmserve.toml").write_text('[servers.a]\nmodel = "/a"\n[servers.b]\nmodel = "/b"\n')
    assert _resolve(tmp_path, cli={"servers": "b"}, ini={"servers": "a"}).servers == ("b",)
    with pytest.raises(ConfigError, match="--llmserve-server = 'ghost': no server named 'ghost'"):
        _resolve(tmp_path, cli={"servers": "ghost"})


def test_configured_only_by_a_file_or_an_llmserve_setting(tmp_path: Path) -> None:
    assert not _resolve(tmp_path, env={"PYTEST_LLMSERVE_CACHE": "/c", "PYTEST_LLMSERVE_EVENT_LOOP": "asyncio"}).configured
    assert _resolve(tmp_path, env={"PYTEST_LLMSERVE_METRIC": "p99_ttft_ms"}).configured
    assert _resolve(tmp_path, ini={"save_baseline": False}).configured
    (tmp_path / "pyproject.toml").write_text('[tool.llmserve.servers.a]\nmodel = "/a"\n')
    assert _resolve(tmp_path).configured


def test_flags_from_every_source(tmp_path: Path) -> None:
    assert _resolve(tmp_path, cli={"save_baseline": True}).save_baseline
    assert _resolve(tmp_path, env={"PYTEST_LLMSERVE_KILL_STALE": "yes"}).kill_stale
    assert _resolve(tmp_path, ini={"suite": True}).suite
    with pytest.raises(ConfigError, match=r"\$PYTEST_LLMSERVE_ALLOW_CONFOUNDED = 'maybe': must be true or false"):
        _resolve(tmp_path, env={"PYTEST_LLMSERVE_ALLOW_CONFOUNDED": "maybe"})


def test_allow_host_change_is_off_unless_asked_and_the_command_line_wins_over_the_ini(tmp_path: Path) -> None:
    assert not _resolve(tmp_path).allow_host_change
    assert _resolve(tmp_path, ini={"allow_host_change": True}).allow_host_change
    assert _resolve(tmp_path, cli={"allow_host_change": True}, ini={"allow_host_change": False}).allow_host_change
    assert not _resolve(tmp_path, env={"PYTEST_LLMSERVE_ALLOW_HOST_CHANGE": "no"},
                        ini={"allow_host_change": True}).allow_host_change
    with pytest.raises(ConfigError, match="ini llmserve_allow_host_change = 'sometimes': must be true or false"):
        _resolve(tmp_path, ini={"allow_host_change": "sometimes"})
    option = next(o for o in OPTIONS if o.name == "allow_host_change")
    assert (option.flag, option.ini, option.env) == ("--llmserve-allow-host-change", "llmserve_allow_host_change",
                                                     "PYTEST_LLMSERVE_ALLOW_HOST_CHANGE")


def test_option_spellings() -> None:
    names = {o.name: (o.flag, o.ini, o.env) for o in OPTIONS}
    assert names["servers"] == ("--llmserve-server", "llmserve_servers", "PYTEST_LLMSERVE_SERVERS")
    assert names["max_rounds"] == ("--llmserve-max-rounds", "llmserve_max_rounds", "PYTEST_LLMSERVE_MAX_ROUNDS")


def test_bench_spec_applies_the_marker_over_the_settings(tmp_path: Path) -> None:
    settings = _resolve(tmp_path, cli={"rounds": "4"})
    assert bench_spec(settings) == BenchSpec(workload="smoke", metric="output_throughput", tolerance=0.10, rounds=4,
                                             max_rounds=8, alpha=0.02, between_run_sd=None)
    spec = bench_spec(settings, ("saturated",), {"rounds": 10, "variable": "cuda_graph", "higher_is_better": False},
                      where="t.py::test_b: marker llmserve_benchmark")
    assert (spec.workload, spec.rounds, spec.max_rounds, spec.variable, spec.higher_is_better) == (
        "saturated", 10, 10, "cuda_graph", False)


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    ((), {"tolerance": 2}, "W tolerance = 2: must be a fraction below 1"),
    ((), {"rounds": 0}, "W rounds = 0: must be a positive integer"),
    ((), {"between_run_sd": -0.01}, "W between_run_sd = -0.01: must be a fraction in [0, 1) (0.03 = 3%)"),
    ((), {"between_run_sd": "wide"}, "W between_run_sd = 'wide': must be a fraction in [0, 1)"),
    ((), {"rounds_": 3}, "W: unknown argument rounds_=3 (known: "),
    ((), {"metric": "tokens"}, "W metric = 'tokens': unknown metric"),
    ((), {"workload": "nope"}, "unknown workload 'nope' in W"),
    (("a", "b"), {}, "W: takes at most one positional argument (the workload), got ('a', 'b')"),
])
def test_bad_marker_arguments_name_the_place_and_value(tmp_path: Path, args: tuple[Any, ...],
                                                        kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        bench_spec(_resolve(tmp_path), args, kwargs, where="W")
    assert expected in str(info.value)


def test_bench_table_sits_between_ini_and_environment(tmp_path: Path) -> None:
    (tmp_path / "llmserve.toml").write_text('[servers.a]\nmodel = "/a"\n'
                                            '[bench]\ntolerance = 0.12\nrounds = 5\nworkload = "saturated"\n')
    ini = {"tolerance": 0.2, "rounds": 4, "max_rounds": 9}
    table = _resolve(tmp_path, ini=ini).bench
    assert (table.tolerance, table.rounds, table.max_rounds, table.workload) == (0.12, 5, 9, "saturated")
    env = _resolve(tmp_path, ini=ini, env={"PYTEST_LLMSERVE_TOLERANCE": "0.1"}).bench
    assert (env.tolerance, env.rounds) == (0.1, 5)
    cli = _resolve(tmp_path, cli={"tolerance": "0.07", "rounds": "6"}, ini=ini,
                   env={"PYTEST_LLMSERVE_TOLERANCE": "0.1"}).bench
    assert (cli.tolerance, cli.rounds) == (0.07, 6)
    # ... and the marker over all of them.
    spec = bench_spec(_resolve(tmp_path, ini=ini), (), {"tolerance": 0.3}, where="W")
    assert (spec.tolerance, spec.rounds, spec.workload) == (0.3, 5, "saturated")


@pytest.mark.parametrize(("bench", "expected"), [
    ("tolerance = -7", "[tool.llmserve.bench] tolerance = -7: must be > 0"),
    ("tolerance = 2", "[tool.llmserve.bench] tolerance = 2: must be a fraction below 1 (0.05 = 5%)"),
    ("alpha = 1.5", "[tool.llmserve.bench] alpha = 1.5: must be a fraction below 1"),
    ("between_run_sd = 1.5", "[tool.llmserve.bench] between_run_sd = 1.5: must be a fraction in [0, 1)"),
    ("rounds = 0", "[tool.llmserve.bench] rounds = 0: must be a positive integer"),
    ('metric = "speed"', "[tool.llmserve.bench] metric = 'speed': unknown metric (known: output_throughput, "),
    ('workload = "nope"', "unknown workload 'nope' in "),
    ("save_baseline = true", "[tool.llmserve.bench] unknown key 'save_baseline' = True (known keys: alpha, "),
    ("rounds = 5\nmax_rounds = 3", "[tool.llmserve.bench] max_rounds = 3 is below "),
])
def test_bad_bench_table_values_name_the_file_and_key(tmp_path: Path, bench: str, expected: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[tool.llmserve.servers.a]\nmodel = "/a"\n[tool.llmserve.bench]\n{bench}\n')
    with pytest.raises(ConfigError) as info:
        _resolve(tmp_path)
    assert str(tmp_path / "pyproject.toml") in str(info.value)
    assert expected in str(info.value)


def test_one_rule_for_tolerance_and_metric_whatever_the_source(tmp_path: Path) -> None:
    for kwargs, where in (({"cli": {"tolerance": "2"}}, "--llmserve-tolerance = '2'"),
                          ({"env": {"PYTEST_LLMSERVE_TOLERANCE": "1"}}, "$PYTEST_LLMSERVE_TOLERANCE = '1'"),
                          ({"ini": {"tolerance": 1.5}}, "ini llmserve_tolerance = 1.5")):
        with pytest.raises(ConfigError, match=rf"^{re.escape(where)}: must be a fraction below 1 \(0.05 = 5%\)$"):
            _resolve(tmp_path, **kwargs)
    with pytest.raises(ConfigError, match=r"--llmserve-metric = 'speed': unknown metric \(known: output_throughput"):
        _resolve(tmp_path, cli={"metric": "speed"})


def test_between_run_sd_from_every_source_and_zero_allowed(tmp_path: Path) -> None:
    # None by default (the measured prior); 0 says runs of this server do not differ (a tolerance or alpha of 0 is
    # refused, a spread of 0 is a statement).
    assert _resolve(tmp_path).bench.between_run_sd is None
    assert _resolve(tmp_path, ini={"between_run_sd": 0.02}).bench.between_run_sd == 0.02
    assert _resolve(tmp_path, cli={"between_run_sd": "0"}).bench.between_run_sd == 0.0
    assert _resolve(tmp_path, env={"PYTEST_LLMSERVE_BETWEEN_RUN_SD": "0.04"}).bench.between_run_sd == 0.04
    assert bench_spec(_resolve(tmp_path), (), {"between_run_sd": 0.01}, where="W").between_run_sd == 0.01
    with pytest.raises(ConfigError, match=r"^--llmserve-between-run-sd = 'nan': must be a fraction in \[0, 1\)"):
        _resolve(tmp_path, cli={"between_run_sd": "nan"})


def test_max_rounds_below_rounds_names_both_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--llmserve-max-rounds = 3 is below ini llmserve_rounds = 5: "
                                          r"max_rounds must be >= rounds$"):
        _resolve(tmp_path, cli={"max_rounds": "3"}, ini={"rounds": 5})


def test_config_option_with_broken_toml_names_the_file_and_position(tmp_path: Path) -> None:
    broken = tmp_path / "other.toml"
    broken.write_text('[servers.a]\nmodel = "/a\n')
    with pytest.raises(ConfigError, match=r"--llmserve-config = '.*other.toml': not valid TOML: .*\(at line 2"):
        _resolve(tmp_path, cli={"config": str(broken)})


def test_probe_concurrency_from_every_source_and_a_bad_value_named(tmp_path: Path) -> None:
    assert _resolve(tmp_path).probe_concurrency is None  # the server's batch capacity decides
    assert _resolve(tmp_path, ini={"probe_concurrency": 4}).probe_concurrency == 4
    assert _resolve(tmp_path, ini={"probe_concurrency": 4},
                    env={"PYTEST_LLMSERVE_PROBE_CONCURRENCY": "2"}).probe_concurrency == 2
    assert _resolve(tmp_path, cli={"probe_concurrency": "1"},
                    env={"PYTEST_LLMSERVE_PROBE_CONCURRENCY": "2"}).probe_concurrency == 1
    with pytest.raises(ConfigError, match="--llmserve-probe-concurrency = '0': must be a positive integer"):
        _resolve(tmp_path, cli={"probe_concurrency": "0"})
    with pytest.raises(ConfigError, match=r"\$PYTEST_LLMSERVE_PROBE_CONCURRENCY = 'many': must be a positive"):
        _resolve(tmp_path, env={"PYTEST_LLMSERVE_PROBE_CONCURRENCY": "many"})
