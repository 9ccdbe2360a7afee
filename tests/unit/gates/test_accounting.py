"""Suite accounting: wall time split between boots, requests, the tests' own time and the plugin."""

from __future__ import annotations

import json
import threading

import pytest

from pytest_llmserve.gates.accounting import Accounting, format_report, report


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def test_split_sums_to_wall_and_plugin_is_the_rest() -> None:
    clock = FakeClock()
    acc = Accounting(clock)
    clock.advance(1.0)  # plugin: collection, config
    with acc.boot("default"):
        clock.advance(30.0)
        with acc.requests():  # readiness probe inside the boot: counts as boot
            clock.advance(2.0)
    clock.advance(0.5)  # plugin: prompt building
    with acc.requests():
        clock.advance(10.0)
    with acc.test_idle():
        clock.advance(3.0)
    clock.advance(1.5)  # plugin: verdict, report
    with acc.teardown():
        clock.advance(2.0)
    acc.stop()
    clock.advance(99.0)  # after stop: not counted
    rep = acc.report()
    assert rep["wall_s"] == pytest.approx(50.0)
    assert rep["teardown_s"] == pytest.approx(2.0)
    assert rep["boot_s"] == pytest.approx(32.0)
    assert rep["request_s"] == pytest.approx(10.0)
    assert rep["idle_s"] == pytest.approx(3.0)
    assert rep["plugin_s"] == pytest.approx(3.0)
    assert rep["plugin_fraction"] == pytest.approx(3.0 / 50.0)
    parts = ("boot_s", "teardown_s", "request_s", "idle_s", "plugin_s")
    assert sum(rep[k] for k in parts) == pytest.approx(rep["wall_s"])
    assert rep["boots"] == 1
    assert rep["boot_keys"] == ["default"]
    assert rep["rebooted"] == []
    assert "plugin 3.0 s (6.0%)" in format_report(rep)


def test_overlapping_requests_count_once_and_reboots_are_reported() -> None:
    acc = Accounting(start=False)
    acc.add("request", 10.0, 20.0)
    acc.add("request", 15.0, 25.0)  # a second thread, overlapping
    acc.add("boot", 0.0, 5.0, key="a")
    acc.add("boot", 30.0, 32.0, key="a")
    acc.add("idle", 24.0, 28.0)  # partly under a request
    rep = report({"start": 0.0, "end": 40.0, "intervals": acc.snapshot()["intervals"]})
    assert rep["request_s"] == pytest.approx(15.0)
    assert rep["boot_s"] == pytest.approx(7.0)
    assert rep["idle_s"] == pytest.approx(3.0)
    assert rep["plugin_s"] == pytest.approx(15.0)
    assert rep["boots"] == 2
    assert rep["rebooted"] == ["a"]
    assert "booted more than once: a" in format_report(rep)
    with pytest.raises(ValueError, match="category"):
        acc.add("nap", 0.0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="before it starts"):
        acc.add("boot", 2.0, 1.0)


def test_thread_safe_under_concurrent_marking() -> None:
    acc = Accounting()
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for _ in range(200):
            with acc.requests():
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acc.stop()
    snap = acc.snapshot()
    assert len(snap["intervals"]) == 1600
    rep = report(snap)
    assert 0.0 <= rep["request_s"] <= rep["wall_s"]
    parts = ("boot_s", "teardown_s", "request_s", "idle_s", "plugin_s")
    assert sum(rep[k] for k in parts) == pytest.approx(rep["wall_s"])


def test_open_interval_counts_until_now_and_snapshots_merge_across_processes() -> None:
    clock = FakeClock()
    acc = Accounting(clock)
    with acc.boot("x"):
        clock.advance(4.0)
        assert acc.report()["boot_s"] == pytest.approx(4.0)  # still booting: counted up to now
    worker = {"start": acc.now() - 2.0, "end": acc.now() + 6.0,
              "intervals": [["request", acc.now(), acc.now() + 5.0, None]]}
    merged = Accounting.merge([acc.snapshot(), json.loads(json.dumps(worker))])
    rep = report(merged)
    assert rep["wall_s"] == pytest.approx(10.0)
    assert rep["boot_s"] == pytest.approx(4.0)
    assert rep["request_s"] == pytest.approx(5.0)
    assert report(Accounting.merge([]))["wall_s"] == 0.0


def test_test_body_idle_with_plugin_calls_carved_out() -> None:
    clock = FakeClock()
    acc = Accounting(clock)
    with acc.test_idle():  # the whole call phase of a user test
        clock.advance(2.0)  # the test's own code
        with acc.plugin():  # llm_bench.run(): prompt building, verdict...
            clock.advance(1.0)
            with acc.requests():  # ...and its requests
                clock.advance(5.0)
            clock.advance(0.5)
        clock.advance(1.5)  # the test's own code again
    acc.stop()
    rep = acc.report()
    assert rep["wall_s"] == pytest.approx(10.0)
    assert rep["idle_s"] == pytest.approx(3.5)
    assert rep["request_s"] == pytest.approx(5.0)
    assert rep["plugin_s"] == pytest.approx(1.5)


def test_request_time_split_by_kind_shares_concurrent_slices_by_requests_in_flight() -> None:
    acc = Accounting(start=False)
    acc.add("boot", 0.0, 10.0, "default")
    acc.add("request", 10.0, 20.0, "probes")  # 10..20: 1 probe and 3 property requests in flight
    for _ in range(3):
        acc.add("request", 10.0, 20.0, "properties")
    acc.add("request", 20.0, 30.0, "batch")
    acc.add("request", 30.0, 40.0, "benchmark")
    acc.add("request", 40.0, 42.0)  # no kind: a user's request
    acc.add("request", 5.0, 10.0, "probes")  # inside the boot: boot time, no request kind
    rep = report({"start": 0.0, "end": 50.0, "intervals": acc.snapshot()["intervals"]})
    assert rep["request_s"] == pytest.approx(32.0)
    assert rep["request_kinds"] == pytest.approx({"probes": 2.5, "batch": 10.0, "properties": 7.5,
                                                  "benchmark": 10.0, "other": 2.0})
    assert list(rep["request_kinds"]) == ["probes", "batch", "properties", "benchmark", "other"]
    assert sum(rep["request_kinds"].values()) == pytest.approx(rep["request_s"])
    line = format_report(rep)
    assert ("requests 32.0 s (64%: correctness probes 2.5 s, batch cases 10.0 s, properties 7.5 s, "
            "benchmark rounds 10.0 s, other requests 2.0 s)") in line


def test_merged_workers_line_names_each_kind_once() -> None:
    # Two xdist workers: one prefetched the independent probes, the other ran the batch cases; the
    # controller merges their snapshots (as xdist_hooks does) into one line.
    worker_a, worker_b = Accounting(start=False), Accounting(start=False)
    worker_a.add("boot", 0.0, 40.0, "default")
    worker_a.add("request", 40.0, 60.0, "probes")
    worker_a.add("request", 40.0, 60.0, "properties")
    worker_b.add("request", 50.0, 80.0, "batch")
    worker_b.add("request", 80.0, 100.0, "benchmark")
    snaps = [{**w.snapshot(), "start": 0.0, "end": 100.0} for w in (worker_a, worker_b)]
    rep = report(Accounting.merge(json.loads(json.dumps(snaps))))  # it crosses processes as JSON
    assert rep["request_s"] == pytest.approx(60.0)
    # 40..50: one probe and one property request in flight, half each; 50..60: and one batch, a third each.
    assert rep["request_kinds"] == pytest.approx({"probes": 5 + 10 / 3, "batch": 20 + 10 / 3,
                                                  "properties": 5 + 10 / 3, "benchmark": 20.0})
    line = format_report(rep)
    assert "requests 60.0 s (60%: correctness probes 8.3 s, batch cases 23.3 s, properties 8.3 s, " \
           "benchmark rounds 20.0 s)" in line
    assert line.count("correctness probes") == 1


def test_no_requests_no_kinds_in_the_line() -> None:
    acc = Accounting(start=False)
    acc.add("boot", 0.0, 10.0, "default")
    rep = report({"start": 0.0, "end": 10.0, "intervals": acc.snapshot()["intervals"]})
    assert rep["request_kinds"] == {}
    assert "requests 0.0 s (0%) +" in format_report(rep)
