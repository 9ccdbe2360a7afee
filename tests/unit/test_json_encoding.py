"""The package's JSON, one encoder and one NaN policy: a non-finite float is null, the text is always strict JSON;
where the non-finite value is the datum its owner keeps it as a string. Each writer of a file is checked with a
planted NaN and infinity, so one that stops going through the encoder fails here."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.json_encoding import dumps, float_or_nan, keep_nonfinite, to_plain
from pytest_llmserve.report.benchmark_json import write_pytest_benchmark_json
from pytest_llmserve.report.builds import Measured, results_document, write_build_reports
from pytest_llmserve.report.json import read_results_json, write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.store import reference_answers
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from pytest_llmserve.verdicts.stats import Summary
from tests.unit.contexts import HW

NAN, INF = math.nan, math.inf


def strict_loads(text: str) -> Any:
    """What a strict reader (jq, JavaScript's JSON.parse) accepts: no NaN, Infinity or -Infinity token."""
    def refuse(token: str) -> Any:
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@dataclass
class _Round:
    figures: tuple[float, ...]
    path: Path


def test_nan_and_infinity_in_a_nested_record_become_null_and_everything_else_is_kept() -> None:
    record = {"rounds": [_Round((1.5, NAN, -INF), Path("/tmp/x")), {"cv": INF, "n": 3}],
              "ok": True, 7: None, "tags": {"b", "a"}}
    want = {"rounds": [{"figures": [1.5, None, None], "path": "/tmp/x"}, {"cv": None, "n": 3}],
            "ok": True, "7": None, "tags": ["a", "b"]}
    assert to_plain(record) == want
    assert strict_loads(dumps(record)) == want
    assert strict_loads(dumps(record, indent=2, sort_keys=True)) == want


def test_a_value_whose_non_finiteness_is_the_datum_is_kept_as_a_string_that_float_reads_back() -> None:
    for value in (NAN, INF, -INF):
        kept = keep_nonfinite(value)
        assert isinstance(kept, str) and strict_loads(dumps({"v": kept})) == {"v": kept}
        back = float(kept)
        assert math.isnan(back) if math.isnan(value) else back == value
    assert keep_nonfinite(-0.5) == -0.5 and keep_nonfinite(None) is None
    # A workload's request_rate = inf is such a setting: "inf", as the configuration file writes it.
    assert strict_loads(dumps(Workload("w").to_dict()))["request_rate"] == "inf"
    assert strict_loads(dumps(Workload("w", request_rate=2.0).to_dict()))["request_rate"] == 2.0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_writing_strict_json_never_raises_and_reads_back_as_the_policy_says(value: Any) -> None:
    text = dumps(value)  # never ValueError("Out of range float values are not JSON compliant")
    assert strict_loads(text) == to_plain(value)


# --------------------------------------------------------------------------- every file writer, a NaN planted


def _outcome() -> BenchOutcome:
    # An undefined figure (one round's NaN, an infinite CV) beside the gated metric's finite samples.
    return BenchOutcome(test_id="tests/test_perf.py::test_t", server_id="srv", workload="smoke",
                        metric="output_throughput",
                        samples={"output_throughput": [100.0, 101.0], "median_ttft_ms": [NAN, 20.0]},
                        request_latencies_s={"e2e": [0.5, INF]})


def _results_json(tmp: Path) -> Path:
    return write_results_json(tmp / "results.json", [_outcome()], run_id="r1")


def _pytest_benchmark_json(tmp: Path) -> Path:
    commit = {"id": "abc", "dirty": False, "project": "p", "branch": "main", "time": "2026-01-01T00:00:00+00:00"}
    return write_pytest_benchmark_json(tmp / "bench.json", [_outcome()], hardware=HW, commit=commit)


def _builds_results_json(tmp: Path) -> Path:
    measured = Measured(envs=[], specs=[])
    data = results_document(command="compare", error=None, metric="output_throughput", tolerance=0.05, alpha=0.05,
                            workload=Workload("smoke"), base_server="srv", load={"start": [NAN], "end": [INF]},
                            builds=[], measured=measured, steps=[], labels=[], result=None)
    write_build_reports(tmp, data, measured=measured, steps=[], say=lambda _: None)
    return tmp / "results.json"


def _baseline(tmp: Path) -> Path:
    store = BaselineStore(tmp / "baselines")
    doc = store.save(BenchKey("t", "s", "w"), {"engine": "vllm", "workload": Workload("w").to_dict()},
                     {"output_throughput": [100.0, 101.0]}, metric="output_throughput", higher_is_better=True,
                     info={"cv": NAN, "ceiling": INF})
    assert doc.path is not None
    return doc.path


def _reference_answers(tmp: Path) -> Path:
    answer = Completion(request={"prompt": "p"}, status=200, text=" x",
                        tokens=[TokenLogprob(" x", NAN, {" x": NAN, " y": -INF})])
    answers = reference_answers.ReferenceAnswers(
        server="s", combination="s", model="m", model_sha256=None, engine="vllm", engine_version=None,
        max_tokens=1, logprobs=2, prompts=(), answers=(answer,))
    path = reference_answers.answers_file(tmp, ServerSpec(name="s").name)
    reference_answers.record(path, answers)
    return path


@pytest.mark.parametrize("write", [_results_json, _pytest_benchmark_json, _builds_results_json, _baseline,
                                   _reference_answers], ids=lambda f: f.__name__.strip("_"))
def test_every_file_the_package_writes_is_strict_json_with_a_nan_and_an_infinity_planted(
        tmp_path: Path, write: Callable[[Path], Path]) -> None:
    text = write(tmp_path).read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    strict_loads(text)


def test_a_results_file_with_an_undefined_summary_reads_back_with_nan_figures(tmp_path: Path) -> None:
    # Summary.undefined() (no samples) is all NaN: written null, read back NaN (this file was unreadable when
    # written null and read with float()).
    outcome = BenchOutcome(test_id="t", server_id="s", workload="w", metric="output_throughput",
                           samples={"output_throughput": [100.0, 101.0]},
                           metrics={"median_ttft_ms": Summary.undefined()})
    path = write_results_json(tmp_path / "results.json", [outcome])
    assert strict_loads(path.read_text())["benchmarks"][0]["metrics"]["median_ttft_ms"]["mean"] is None
    _, (back,) = read_results_json(path)
    figures = back.metrics["median_ttft_ms"]
    assert figures.n == 0 and math.isnan(figures.mean) and math.isnan(figures.cv)
    assert float_or_nan(None) != float_or_nan(None) and float_or_nan("-inf") == -INF and float_or_nan(2) == 2.0


def test_the_policys_two_exceptions_survive_in_the_files() -> None:
    # The evidence of a recorded answer: which non-finite logprob it was, read back as that float.
    token = reference_answers.completion_to_dict(
        Completion(request={}, status=200, tokens=[TokenLogprob(" x", NAN, {" y": -INF})]))["tokens"][0]
    assert (token["logprob"], token["top"]) == ("nan", {" y": "-inf"})
    back = reference_answers.completion_from_dict({"status": 200, "tokens": [token]}).tokens[0]
    assert math.isnan(back.logprob or 0.0) and back.top == {" y": -INF}
