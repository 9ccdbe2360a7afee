"""A refused comparison shows every differing key in the terminal table and the Markdown (issue 12, item 5)."""

from __future__ import annotations

from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.text import format_markdown, format_table
from pytest_llmserve.verdicts.comparability import comparability


def test_every_differing_key_of_a_refusal_is_shown() -> None:
    keys = [f"VLLM_SETTING_{i:02d}" for i in range(15)]
    old = {"engine": "vllm", "engine_env": {k: "1" for k in keys}, "server_args": {"args": ["--x"] * 30}}
    new = {"engine": "vllm", "engine_env": {k: "2" for k in keys}, "server_args": {"args": ["--y"] * 30}}
    comp = comparability(old, new)
    item = BenchOutcome(test_id="t.py::test_throughput[a]", server_id="a", workload="tiny",
                        metric="output_throughput", higher_is_better=True, tolerance=0.05, note=comp.message,
                        comparability=comp)
    assert item.status == "refused"
    for text in (format_table([item]), format_markdown([item])):
        for key in keys:
            assert f'engine_env.{key}: "1" -> "2"' in text
        assert "server_args.args: " + str(["--x"] * 30).replace("'", '"') in text  # a long value in full
