"""The benchmark gate's pure parts: refusals before any boot, the command that records a baseline, the
correctness-failure registry, how well a baseline knows its median, figures, run directories and plot names."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmserve.config import LLMServeConfig, ServerSpec, Workload, config_from_table
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.bench import (
    BenchGate,
    figure_line,
    median_half_width,
)
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.gates.failed_checks import correctness_failures, record_correctness_failure
from pytest_llmserve.gates.preflight import accept_command, preflight_refusal, refusal_before_boot, save_command
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.plots import axis_label, comparison_plot_name
from pytest_llmserve.report.session import latest_run_dir, new_run_dir, point_latest
from pytest_llmserve.settings import BenchSpec, Settings, Sources, resolve_settings
from pytest_llmserve.store.baselines import BaselineStore, BenchKey

TOML = {"servers": {"cpu": {"engine": "vllm", "model": "/models/m", "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}},
        "workloads": {"tiny": {"num_prompts": 8, "input_len": 32, "output_len": 32}}}
# The synthetic rounds of one stand-in do not differ between runs: the spread between runs (a prior with a one-run
# baseline) is tests/unit/verdicts/test_between_runs.py's subject, not this file's.
GATE = BenchSpec(workload="tiny", metric="output_throughput", tolerance=0.10, rounds=3, max_rounds=8, alpha=0.05,
                 between_run_sd=0.0)
KEY_TEST = "test_perf.py::test_throughput"


def configured(env: str = "2") -> tuple[LLMServeConfig, ServerSpec, Workload]:
    table = json.loads(json.dumps(TOML))
    table["servers"]["cpu"]["env"]["VLLM_CPU_KVCACHE_SPACE"] = env
    cfg = config_from_table(table, "llmserve.toml")
    return cfg, cfg.expanded("cpu")[0], cfg.workload("tiny", where="test")


def stored(tmp_path: Path, *, state: dict[str, object] | None = None, **hardware: object) -> Path:
    """A baseline of the ``cpu`` server recorded as a real run records it (engine version 0.32.0; ``state``: the
    server's state read after its boot, gates/context.server_state)."""
    _, spec, wl = configured()
    context = build_context(spec, wl, engine_version="0.32.0",
                            extra={"server_state": state} if state is not None else None)
    context["hardware"].update(hardware)
    store = BaselineStore(tmp_path / "baselines")
    key = BenchKey(KEY_TEST, spec.id, wl.name)
    store.save(key, context, {"output_throughput": [100.0, 101.0, 99.0, 100.5, 100.2]},
               metric="output_throughput", higher_is_better=True)
    return store.path_for(key)


def preflight(tmp_path: Path, *, env: str = "2", save: bool = False) -> BenchOutcome | None:
    cfg, spec, _ = configured(env)
    return preflight_refusal(spec=spec, cfg=cfg, options=GATE, store_dir=tmp_path / "baselines", key_test=KEY_TEST,
                             test_id="tests/test_perf.py::test_throughput[cpu]", save=save, allow_confounded=False,
                             results_dir=tmp_path / "llmserve-results")


def test_nothing_to_refuse_without_a_baseline_or_with_the_same_context(tmp_path: Path) -> None:
    assert preflight(tmp_path) is None
    stored(tmp_path)
    assert preflight(tmp_path) is None
    assert preflight(tmp_path, save=True) is None  # appending to the same context is fine


def test_a_second_run_appends_to_a_baseline_that_holds_the_servers_state(tmp_path: Path) -> None:
    """README's loop of --llmserve-save-baseline runs: the stored file holds the server's state (read after its boot),
    the check before the next boot cannot know it yet, so it is no reason to refuse (seen on the H100, 2026-12-07:
    'server_state.state: "fresh" -> (absent)' refused every run after the first); the append after the boot compares
    the state, and a run after traffic is not appended to fresh ones."""
    from pytest_llmserve.errors import BaselineError
    from pytest_llmserve.gates.context import server_state

    path = stored(tmp_path, state=server_state(12, 30.0))
    assert preflight(tmp_path, save=True) is None
    _, spec, wl = configured()
    store = BaselineStore(tmp_path / "baselines")
    key = BenchKey(KEY_TEST, spec.id, wl.name)

    def context(state: dict[str, object]) -> dict[str, object]:
        return build_context(spec, wl, engine_version="0.32.0", extra={"server_state": state})

    samples = {"output_throughput": [100.0, 99.0, 101.0, 100.0, 100.4]}
    store.save(key, context(server_state(40, 80.0)), samples, metric="output_throughput", higher_is_better=True)
    assert len(store.load(key).records) == 2  # type: ignore[union-attr]
    before = path.read_bytes()
    with pytest.raises(BaselineError, match='server_state.state: "fresh" -> "after traffic"'):
        store.save(key, context(server_state(52_000, 400.0)), samples, metric="output_throughput",
                   higher_is_better=True)
    assert path.read_bytes() == before


def test_a_baseline_recorded_before_the_servers_state_was_kept_takes_a_run_that_has_it(tmp_path: Path) -> None:
    from pytest_llmserve.gates.context import server_state

    stored(tmp_path)  # no server_state: recorded before issue 35
    _, spec, wl = configured()
    store = BaselineStore(tmp_path / "baselines")
    key = BenchKey(KEY_TEST, spec.id, wl.name)
    store.save(key, build_context(spec, wl, engine_version="0.32.0", extra={"server_state": server_state(12, 30.0)}),
               {"output_throughput": [100.0, 99.0, 101.0, 100.0, 100.4]}, metric="output_throughput",
               higher_is_better=True)
    assert len(store.load(key).records) == 2  # type: ignore[union-attr]


def test_a_changed_server_environment_is_refused_before_any_boot(tmp_path: Path) -> None:
    stored(tmp_path)
    refusal = preflight(tmp_path, env="1")
    assert refusal is not None and refusal.status == "refused"
    message = str(refusal.note)
    assert "comparison refused" in message and "server_args.env.VLLM_CPU_KVCACHE_SPACE" in message
    assert "no server was started" in message


def test_another_machine_is_not_refused_before_the_boot_it_measures_instead(tmp_path: Path) -> None:
    stored(tmp_path, cpu_model="Some Other CPU", cpu_count=96)
    assert preflight(tmp_path) is None  # the run measures and reports "no baseline for this environment"


@pytest.mark.parametrize("save", [False, True])
def test_an_unreadable_baseline_is_refused_before_measuring_and_left_byte_identical(tmp_path: Path,
                                                                                    save: bool) -> None:
    path = stored(tmp_path)
    truncated = path.read_bytes()[:200]
    path.write_bytes(truncated)
    refusal = preflight(tmp_path, save=save)
    assert refusal is not None and refusal.status == "error"
    assert "refused before any boot" in str(refusal.note) and "not valid JSON" in str(refusal.note)
    assert path.read_bytes() == truncated


def test_a_save_onto_another_context_is_refused_naming_the_command_that_records_this_one(tmp_path: Path) -> None:
    path = stored(tmp_path, cpu_model="Some Other CPU")
    before = path.read_bytes()
    refusal = preflight(tmp_path, save=True)
    assert refusal is not None
    message = str(refusal.note)
    assert "hardware.cpu_model" in message and "Nothing was measured" in message
    assert "llmserve baselines accept --replace" in message and "latest/results.json" in message
    assert path.read_bytes() == before


def test_accept_command_names_this_run_and_this_benchmark(tmp_path: Path) -> None:
    command = shlex.split(accept_command(tmp_path / "res", tmp_path / "bl", "t.py::test_x[cpu[eager=on]]"))
    assert command == ["llmserve", "baselines", "accept", "--replace", str(tmp_path / "res/latest/results.json"),
                       "--dir", str(tmp_path / "bl"), "-k", "t.py::test_x[cpu[eager=on]]"]


def test_save_command_keeps_this_runs_llmserve_options_and_selects_this_benchmark() -> None:
    invocation = ["--llmserve-suite", "--llmserve-server", "cpu,gpu", "-k", "something", "-x",
                  "--llmserve-tolerance=0.1", "--llmserve-baseline-dir", "bl", "--llmserve-save-baseline", "tests"]
    suite = save_command(invocation, nodeid="ignored", test_name="test_throughput", server_name="cpu", suite=True)
    assert shlex.split(suite) == ["pytest", "--llmserve-suite", "--llmserve-tolerance=0.1", "--llmserve-baseline-dir",
                                  "bl", "--llmserve-save-baseline", "--llmserve-server=cpu", "-k", "test_throughput"]
    own = save_command([], nodeid="tests/test_perf.py::test_throughput[cpu[eager=on]]", test_name="test_throughput",
                       server_name="cpu", suite=False)
    assert shlex.split(own) == ["pytest", "--llmserve-save-baseline",
                                "tests/test_perf.py::test_throughput[cpu[eager=on]]"]


def test_correctness_failures_are_per_server_and_shared_through_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert correctness_failures(run_dir, "nan") == []
    record_correctness_failure(run_dir, "nan", "test_x.py::test_no_nan[nan]", "nan-check FAILED on server nan\n...")
    record_correctness_failure(run_dir, "healthy[x=1]", "test_x.py::test_coherent[healthy[x=1]]", "long-decode")
    with open(run_dir / "correctness-failures.jsonl", "a") as fh:
        fh.write("not json\n")  # a torn line (a process killed mid-write) is skipped, not fatal
    got = correctness_failures(run_dir, "nan")
    assert got == [{"server": "nan", "test": "test_x.py::test_no_nan[nan]",
                    "summary": "nan-check FAILED on server nan\n..."}]
    assert [f["test"] for f in correctness_failures(run_dir, "healthy[x=1]")] == [
        "test_x.py::test_coherent[healthy[x=1]]"]


def test_median_half_width_tells_a_quiet_record_from_a_noisy_one() -> None:
    quiet = [124.0, 123.5, 124.4, 123.9, 124.2]
    noisy = [124.0, 81.7, 120.2, 126.5, 98.0]  # the loaded machine: one round at 81.7
    assert median_half_width(quiet) < 0.01
    assert median_half_width(noisy) > 0.05
    assert median_half_width(noisy) == median_half_width(list(noisy))  # seeded: the same every time
    assert median_half_width([5.0]) == 0.0


def test_figure_line_has_median_spread_and_unit() -> None:
    assert figure_line("output_throughput", [100.0, 110.0, 105.0]) == (
        "output_throughput: median 105.00 tok/s over 3 rounds (100.00..110.00, CV 4.8%)")
    assert figure_line("p99_ttft_ms", [12.0]) == "p99_ttft_ms: median 12.00 ms over 1 round (12.00..12.00, CV 0.0%)"
    assert figure_line("output_throughput", []) == "output_throughput: no valid round"


def test_inconclusive_policy_is_a_setting_with_its_source_in_errors(tmp_path: Path) -> None:
    def resolve(cli: dict[str, object] | None = None, env: dict[str, str] | None = None) -> str:
        sources = Sources(cli=cli or {}, ini={}, env=env or {})
        return resolve_settings(tmp_path, sources, lambda: ServerSpec(name="d", engine="vllm", model="/m")).inconclusive

    assert resolve() == "warn"
    assert resolve(env={"PYTEST_LLMSERVE_INCONCLUSIVE": "fail"}) == "fail"
    assert resolve(cli={"inconclusive": "WARN"}, env={"PYTEST_LLMSERVE_INCONCLUSIVE": "fail"}) == "warn"
    with pytest.raises(ConfigError, match=r"--llmserve-inconclusive = 'ignore': must be one of warn, fail"):
        resolve(cli={"inconclusive": "ignore"})


def test_each_run_keeps_its_reports_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    first, second = new_run_dir(tmp_path), new_run_dir(tmp_path)
    assert first != second and first.parent == second.parent == tmp_path / "runs"
    (first / "results.json").write_text("first")
    assert point_latest(tmp_path, first) == tmp_path / "latest"
    assert point_latest(tmp_path, second) == tmp_path / "latest"
    assert os.readlink(tmp_path / "latest") == os.path.join("runs", second.name)  # relative: the tree can move
    assert latest_run_dir(tmp_path) == second.resolve()
    assert (first / "results.json").read_text() == "first"


def test_latest_falls_back_to_a_text_pointer_where_symlinks_fail(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Some file systems (and Windows without the privilege) refuse symlinks; that cannot be made on demand here.
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("symlinks not supported")

    run = new_run_dir(tmp_path)
    monkeypatch.setattr(os, "symlink", refuse)
    assert point_latest(tmp_path, run) == tmp_path / "latest.txt"
    assert latest_run_dir(tmp_path) == run.resolve()


def test_comparison_plots_are_named_by_what_they_compare_with_units() -> None:
    base = BenchOutcome(test_id="tests/test_perf.py::test_throughput[cpu]", server_id="cpu", workload="tiny",
                        metric="output_throughput", samples={"output_throughput": [1.0, 2.0]},
                        baseline_samples=[1.0, 2.0])
    assert comparison_plot_name(base).startswith("baseline-vs-current-test_throughput-cpu-")
    ab = replace(base, baseline_key=BenchKey("t.py::test_ab", "cpu[eager=on]|cpu[eager=off]", "tiny"))
    assert comparison_plot_name(ab).startswith("cpu_eager=on-vs-cpu_eager=off-test_ab-")
    assert axis_label("output_throughput") == "output_throughput (tok/s)"
    assert axis_label("p99_ttft_ms") == "p99_ttft_ms (ms)"


def run_settings(tmp_path: Path, *, save: bool = False) -> Settings:
    """The run's settings as the plugin resolves them, over the ``cpu`` configuration of ``TOML``."""
    cfg, _, _ = configured()
    return Settings(rootdir=tmp_path, cfg=cfg, servers=None, url=None, save_baseline=save,
                    baseline_dir=tmp_path / "baselines", results_dir=tmp_path / "llmserve-results",
                    bench=BenchDefaults(), kill_stale=False, allow_confounded=False, allow_host_change=False,
                    bench_json=None, suite=False, inconclusive="warn", probe_concurrency=None,
                    reference_answers=None, configured=True)


def test_a_test_s_setup_refusal_is_the_record_and_its_note_or_a_message_alone(tmp_path: Path) -> None:
    test_id = "tests/test_perf.py::test_throughput[cpu]"
    _, spec, _ = configured()
    settings = run_settings(tmp_path)
    assert refusal_before_boot(spec, settings, GATE, key_test=KEY_TEST, test_id=test_id) == (None, "")
    # A baseline of another server environment: refused from the configuration, the note is the failure.
    stored(tmp_path)
    _, changed, _ = configured(env="4")
    refusal, message = refusal_before_boot(changed, settings, GATE, key_test=KEY_TEST, test_id=test_id)
    assert refusal is not None and refusal.before_boot and message == refusal.note
    assert "VLLM_CPU_KVCACHE_SPACE" in message and "no server was started" in message
    # A workload the configuration does not declare: the test's message names it, and there is no record.
    refusal, message = refusal_before_boot(spec, settings, replace(GATE, workload="huge"), key_test=KEY_TEST,
                                           test_id=test_id)
    assert refusal is None and message.startswith(f"{test_id}: ") and "huge" in message


def test_the_gate_of_a_run_takes_the_run_s_settings_and_reads_its_correctness_failures(tmp_path: Path) -> None:
    settings = run_settings(tmp_path, save=True)
    run_dir = tmp_path / "run"
    gate = BenchGate.for_run(settings, server=object(), options=GATE, test_id="t.py::test_x[cpu]",  # type: ignore[arg-type]
                             key_test="t.py::test_x", run_dir=run_dir,
                             record_command="pytest --llmserve-save-baseline t.py::test_x")
    assert (gate.store_dir, gate.results_dir, gate.run_settings.save) == (settings.baseline_dir,
                                                                         settings.results_dir, True)
    assert (gate.key_test, gate.inconclusive) == ("t.py::test_x", "warn")
    assert gate.correctness_failed("cpu") == []
    record_correctness_failure(run_dir, "cpu", "t.py::test_nan[cpu]", "NaN in the logits")
    assert [f["test"] for f in gate.correctness_failed("cpu")] == ["t.py::test_nan[cpu]"]
