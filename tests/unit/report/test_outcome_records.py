"""The benchmark record is typed all the way down: every sub-record of a BenchOutcome is a dataclass whose JSON is
its fields (what results.json's layout documents, checked here against the types), read back equal, and the whole
record crosses a process (xdist) and comes back equal."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from typing import Any

import pytest

from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.report import json as results_json
from pytest_llmserve.report.outcome import (
    BenchOutcome,
    ContendedRound,
    DiscardedRound,
    Extension,
    ResolutionRecord,
    WarmUp,
)
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts import stats

RESOLUTION = stats.resolution(0.03, 0.04, n_baseline=5, n_current=8,
                              plan=stats.sequential_plan(stats.gate_looks(5, 3, 8), alpha=0.02), tolerance=0.10)
RECORDS: list[Any] = [
    WarmUp(metric="output_throughput", agreement=0.05, max_rounds=3, budget_s=300.0, rounds=2, values=[60.0, None],
           settled=False, difference=0.4, seconds=21.5, note="warm-up did not settle"),
    Extension(target=14, limit=30, budget_s=600.0, rounds_before=8, rounds_added=3, seconds=36.0,
              stopped="decided (pass) after 11 rounds", goal=14, plan_looks=12, note="extend_to_resolve: 3 rounds"),
    ResolutionRecord(figures=RESOLUTION, line="±10% needs about 14 current rounds", short="±10% needs ~14 rounds"),
    DiscardedRound(round="benchmark round 2 on cpu", reasons=("contaminated: 12 running requests",)),
    ContendedRound(round="benchmark round 3 on cpu", reason="confounded: host busy: 47%",
                   host_contention={"share": 0.47, "cores": 2}),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_each_sub_record_is_its_fields_as_plain_json_and_reads_back_equal(record: Any) -> None:
    data = record.to_dict()
    names = {f.name for f in fields(record.figures)} | {"line", "short"} if isinstance(record, ResolutionRecord) \
        else {f.name for f in fields(record)}
    assert set(data) == names
    assert json.loads(dumps(data)) == json.loads(json.dumps(data))  # plain: nothing the encoder had to change
    assert type(record).from_dict(json.loads(dumps(data))) == record


def _documented_keys(name: str, doc: str | None = results_json.__doc__) -> set[str]:
    """The keys results.json's layout (report/json.py's docstring) lists for the sub-record ``name``."""
    found = re.search(rf'"{name}": \[?\{{([^}}]*)\}}', doc or "")
    assert found, f"report/json.py documents no {name!r}"
    return set(re.findall(r'"([a-z_]+)"', found.group(1)))


@pytest.mark.parametrize(("name", "record"), [("warmup", WarmUp), ("extension", Extension),
                                              ("discarded_rounds", DiscardedRound),
                                              ("contended_rounds", ContendedRound)])
def test_the_documented_layout_is_the_types(name: str, record: type) -> None:
    assert _documented_keys(name) == {f.name for f in fields(record)}


def test_a_layout_that_parts_from_the_type_is_caught() -> None:
    # The check above fails when the layout and the type part: a layout naming a field gone, or missing one.
    names = {f.name for f in fields(WarmUp)}
    stale = '"warmup": {' + ", ".join(f'"{n}"' for n in sorted(names | {"gone"})) + "} | null"
    short = '"warmup": {' + ", ".join(f'"{n}"' for n in sorted(names - {"budget_s"})) + "} | null"
    assert _documented_keys("warmup", stale) != names and _documented_keys("warmup", short) != names
    assert _documented_keys("warmup", stale.replace(', "gone"', "")) == names


def test_the_whole_record_crosses_a_process_and_comes_back_equal() -> None:
    outcome = BenchOutcome(test_id="t.py::test_x[cpu]", server_id="cpu", workload="tiny", metric="output_throughput",
                           samples={"output_throughput": [100.0, float("nan"), 101.0]}, baseline_samples=[99.0, 100.0],
                           warmup=RECORDS[0], extension=RECORDS[1], resolution=RECORDS[2],
                           discarded_rounds=[RECORDS[3]], contended_rounds=[RECORDS[4]],
                           baseline_key=BenchKey("t.py::test_x", "cpu", "tiny"), rounds=3)
    again = BenchOutcome.from_json(outcome.to_json())
    assert json.loads(outcome.to_json())["samples"]["output_throughput"][1] is None  # strict JSON: NaN is null
    for name in ("warmup", "extension", "resolution", "discarded_rounds", "contended_rounds", "baseline_key",
                 "baseline_samples", "rounds"):
        assert getattr(again, name) == getattr(outcome, name), name
    assert again.samples["output_throughput"][0] == 100.0 and again.identity == outcome.identity
    # Identity is (node id, server, workload, the gate's run): two outcomes of one test differ by their outcome_id.
    twin = BenchOutcome(test_id=outcome.test_id, server_id="cpu", workload="tiny", metric="output_throughput")
    assert twin.identity[:3] == outcome.identity[:3] and twin.identity != outcome.identity
