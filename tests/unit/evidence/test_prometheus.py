"""The one Prometheus text parser: quoted labels with braces, bad lines skipped, counters summed."""

from __future__ import annotations

from pytest_llmserve.evidence.prometheus import counter_total, metric_line, parse


def test_a_brace_inside_a_quoted_label_does_not_end_the_labels() -> None:
    samples = parse('sglang:cuda_graph_passes_total{mode="decode}x",tp_rank="0"} 7\n')
    assert samples["sglang:cuda_graph_passes_total"] == [({"mode": "decode}x", "tp_rank": "0"}, 7.0)]


def test_a_bad_line_is_skipped_and_the_rest_still_parsed() -> None:
    text = "# TYPE good counter\ngood_total 3\nthis is not a sample\nother_total{a=\"1\"} 2\nother_total{a=\"2\"} 5\n"
    samples = parse(text)
    assert counter_total(samples, "good") == 3.0
    assert counter_total(samples, "other_total") == 7.0
    assert counter_total(samples, "missing") is None


def test_metric_line_quotes_labels_sorted() -> None:
    assert metric_line("x", {"b": "2", "a": "1"}, 3.0) == 'x{a="1",b="2"} 3'
    assert metric_line("x", {}, 0.5) == "x 0.5"
