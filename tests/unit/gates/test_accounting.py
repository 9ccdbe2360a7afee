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
