"""The Prometheus text format, parsed in one place (every ``/metrics`` reader of the plugin uses this).

prometheus_client's own parser does the work: it handles escapes and ``}`` inside quoted label values,
which a hand-written regex got wrong. It rejects a whole page for one bad line, so a page it refuses
is parsed line by line and the lines it cannot read are skipped: a server's odd line must not hide
the counters the gate needs.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MetricSamples", "counter_total", "metric_line", "parse"]

#: name -> [(labels, value)], one entry per sample line of the page.
MetricSamples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> MetricSamples:
    """Prometheus text exposition -> {sample name: [(labels, value)]}."""
    # lazy: prometheus_client's parser takes ~67 ms to import (-X importtime)
    from prometheus_client.parser import text_string_to_metric_families

    out: MetricSamples = {}

    def add(chunk: str) -> None:
        for family in text_string_to_metric_families(chunk):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))

    try:
        add(text)
    except ValueError:
        out.clear()
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    add(line + "\n")
                except ValueError:
                    continue
    return out


def counter_total(page: str | MetricSamples, counter: str) -> float | None:
    """Sum over label sets of ``counter`` (``_total`` may be left off); None when the page lacks it."""
    samples = parse(page) if isinstance(page, str) else page
    names = [counter] if counter.endswith("_total") else [counter + "_total", counter]
    for name in names:
        if name in samples:
            return sum(value for _, value in samples[name])
    return None


def metric_line(name: str, labels: Mapping[str, str], value: float) -> str:
    """One sample as a Prometheus line: the evidence quoted in reports."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}"
