"""The load generator end to end against the zero-cost server (a subprocess): both transports, both event
loops, concurrency, faults, schedules, several client processes; and the seeded arrivals and progress line."""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.load import runner
from pytest_llmserve.load.metrics import InvalidRunError
from pytest_llmserve.load.prompts import build_prompts
from pytest_llmserve.load.runner import (
    Progress,
    arrival_offsets,
    run_workload,
    run_workload_multiprocess,
)

SERVER = Path(__file__).resolve().parents[3] / "tools" / "zero_cost_server.py"


MODEL = "zero-cost"


StartServer = Callable[..., str]


@pytest.fixture(scope="module")
def start_server() -> Iterator[StartServer]:
    """Start zero-cost servers on free ports (``start_server("--short", "3")``); all killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    cache: dict[tuple[str, ...], str] = {}

    def start(*args: str) -> str:
        if args in cache:
            return cache[args]
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"zero-cost server did not start: {line!r} {err}")
        url = line.strip().rsplit(" ", 1)[-1]
        cache[args] = url
        return url

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def server_tokenize(url: str) -> Callable[[str], list[int]]:
    def tokenize(text: str) -> list[int]:
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": text}, timeout=10).json()["tokens"]
        return list(tokens)
    return tokenize


SMALL = Workload("small", num_prompts=8, input_len=16, output_len=24, warmup=1, max_concurrency=4)


DELAY = ("--token-delay-ms", "0.3")  # real gaps between chunks, as an engine's decode steps give


def test_lean_and_httpx_give_identical_counts_and_valid_runs(start_server: StartServer) -> None:
    url = start_server(*DELAY)
    prompts = build_prompts(SMALL, server_tokenize(url))
    assert all(p.exact and p.num_tokens == SMALL.input_len for p in prompts)
    results = {t: run_workload(url, MODEL, SMALL, prompts=prompts, transport=t, progress=False,
                               server_counter="vllm:generation_tokens", timeout_s=30)
               for t in ("lean", "httpx")}
    for transport, res in results.items():
        assert res.valid, (transport, res.invalid_reasons)
        assert len(res.per_request) == SMALL.num_prompts
        assert len(res.warmup) == SMALL.warmup
        assert res.metrics["total_output_tokens"] == SMALL.num_prompts * SMALL.output_len
        assert res.metrics["client_chunks"] == res.metrics["total_output_tokens"]
        assert res.metrics["total_input_tokens"] == SMALL.num_prompts * SMALL.input_len
        assert res.server_check is not None
        assert "agree" in res.server_check
        for rec in res.per_request:
            assert rec.output_tokens == rec.chunks == SMALL.output_len
            assert len(rec.itl) == SMALL.output_len - 1
            assert rec.tpot is not None
            assert rec.tpot > 0
        assert res.started_at < res.ended_at
        assert res.metric("output_throughput") > 0
        json.dumps(res.to_dict(), allow_nan=False)
    lean, hx = results["lean"], results["httpx"]
    assert sorted((r.index, r.output_tokens, r.chunks, r.prompt_tokens) for r in lean.per_request) == \
        sorted((r.index, r.output_tokens, r.chunks, r.prompt_tokens) for r in hx.per_request)


def test_uvloop_and_asyncio_loops_give_identical_counts(start_server: StartServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = start_server()
    prompts = build_prompts(SMALL)
    results = {}
    for loop in ("asyncio", "uvloop"):
        monkeypatch.setenv(runner.LOOP_ENV, loop)
        assert runner.event_loop_name() == loop
        results[loop] = run_workload(url, MODEL, SMALL, prompts=prompts, progress=False, timeout_s=30)
    for loop, res in results.items():
        # On a starved machine the client may read a whole short stream at once (seen with load average 29:
        # "TPOT = 0 (all chunks in one read)"); that rule is not what this test is about, the counts are.
        other = [r for r in res.invalid_reasons if "all chunks in one read" not in r]
        assert res.valid or not other, (loop, res.invalid_reasons)
        assert res.event_loop == loop and res.to_dict()["event_loop"] == loop
    a, b = results["asyncio"], results["uvloop"]
    assert [r.chunks for r in a.per_request] == [r.chunks for r in b.per_request]
    assert [r.output_tokens for r in a.per_request] == [r.output_tokens for r in b.per_request]


def test_a_bad_event_loop_choice_names_the_variable_and_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runner.LOOP_ENV, "trio")
    with pytest.raises(ValueError, match=r"\$PYTEST_LLMSERVE_EVENT_LOOP = 'trio': must be auto, uvloop or asyncio"):
        runner.event_loop_name()
    monkeypatch.setenv(runner.LOOP_ENV, "auto")
    assert runner.event_loop_name() == "uvloop"  # installed with the package on Linux


def test_max_concurrency_is_respected(start_server: StartServer) -> None:
    url = start_server(*DELAY)
    res = run_workload(url, MODEL, SMALL, progress=False, timeout_s=30)
    assert res.valid, res.invalid_reasons
    events = sorted([(r.start, 1) for r in res.per_request] + [(r.end, -1) for r in res.per_request],
                    key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak <= (SMALL.max_concurrency or 0)
    assert "approximate" in " ".join(res.notes)  # no tokenizer given: word-count prompts are flagged


def test_short_outputs_make_the_run_invalid(start_server: StartServer) -> None:
    url = start_server("--short", "3", *DELAY)
    res = run_workload(url, MODEL, SMALL, progress=False, timeout_s=30)
    assert not res.valid
    assert any("output_len=24" in r and "21 tokens" in r for r in res.invalid_reasons), res.invalid_reasons
    assert res.metrics == {}
    assert res.summaries == {}
    assert res.diagnostics["total_output_tokens"] == SMALL.num_prompts * 21
    with pytest.raises(InvalidRunError, match="output_len"):
        res.metric("output_throughput")


def test_stream_dropped_mid_way_is_an_error_with_what_was_received(start_server: StartServer) -> None:
    url = start_server("--drop-after", "5", "--fault-every", "2", *DELAY)
    for transport in ("lean", "httpx"):
        res = run_workload(url, MODEL, replace(SMALL, warmup=0), progress=False, transport=transport,
                           timeout_s=30)
        assert not res.valid
        failed = [r for r in res.per_request if not r.ok]
        assert len(failed) == SMALL.num_prompts // 2, transport
        for rec in failed:
            assert rec.error is not None
            assert "without [DONE]" in rec.error, rec.error
            assert rec.chunks == 5  # what was received is kept
        assert any("requests failed" in r for r in res.invalid_reasons)


def test_buffered_stream_gives_empty_itl_and_is_invalid(start_server: StartServer) -> None:
    url = start_server("--one-chunk")
    res = run_workload(url, MODEL, SMALL, progress=False, timeout_s=30)
    assert not res.valid
    text = " | ".join(res.invalid_reasons)
    assert "single chunk (empty ITL)" in text
    assert "content chunks" in text  # 1 chunk vs 24 tokens
    assert all(r.itl == [] and r.chunks == 1 for r in res.per_request)


def test_http_errors_and_missing_usage_are_reported(start_server: StartServer) -> None:
    url = start_server("--error-status", "503", "--fault-every", "3", *DELAY)
    res = run_workload(url, MODEL, replace(SMALL, warmup=0), progress=False, timeout_s=30)
    errors = [r.error for r in res.per_request if r.error]
    assert errors
    assert all(e.startswith("HTTP 503: ") and "injected fault" in e for e in errors)
    assert not res.valid
    url = start_server("--no-usage", *DELAY)
    res = run_workload(url, MODEL, SMALL, progress=False, timeout_s=30)
    assert not res.valid
    assert any("usage.completion_tokens" in r for r in res.invalid_reasons)


def test_poisson_schedule_is_followed(start_server: StartServer) -> None:
    url = start_server(*DELAY)
    wl = Workload("poisson", num_prompts=10, input_len=8, output_len=8, warmup=0, request_rate=40.0, seed=3)
    res = run_workload(url, MODEL, wl, progress=False, timeout_s=30)
    assert res.valid, res.invalid_reasons
    offsets = arrival_offsets(10, 40.0, 1.0, 3)
    starts = sorted(r.start for r in res.per_request)
    for got, want in zip(starts, offsets, strict=True):
        assert abs((got - starts[0]) - want) < 0.1


def test_sync_wrapper_works_inside_a_running_event_loop(start_server: StartServer) -> None:
    url = start_server(*DELAY)

    async def caller() -> bool:
        return run_workload(url, MODEL, replace(SMALL, num_prompts=2), progress=False, timeout_s=30).valid

    assert asyncio.run(caller())


def test_multiprocess_run_merges_all_records(start_server: StartServer) -> None:
    url = start_server(*DELAY)
    res = run_workload_multiprocess(url, MODEL, SMALL, processes=2, progress=False, timeout_s=30,
                                    server_counter="vllm:generation_tokens")
    assert res.valid, res.invalid_reasons
    assert res.processes == 2
    assert sorted(r.index for r in res.per_request) == list(range(SMALL.num_prompts))
    assert {r.process for r in res.per_request} == {0, 1}
    assert res.metrics["total_output_tokens"] == SMALL.num_prompts * SMALL.output_len
    assert res.summaries["itl"].n == SMALL.num_prompts * (SMALL.output_len - 1)


SLOW = ("--token-delay-ms", "20")  # 24 tokens: about half a second per request, long enough to read the gauge
GAUGE = "vllm:num_requests_running"


@pytest.mark.parametrize("processes", [1, 2])
def test_the_gauge_is_read_while_the_round_s_requests_run(start_server: StartServer, processes: int) -> None:
    # The sampler is a task on the loop that sends the requests (in the parent's loop with client processes):
    # it reads while they stream, never more than the round's concurrency.
    url = start_server(*SLOW)
    res = run_workload_multiprocess(url, MODEL, SMALL, processes=processes, progress=False, timeout_s=30,
                                    running_gauge=GAUGE)
    assert res.valid, res.invalid_reasons
    found = re.search(rf"{GAUGE} sampled (\d+) times during the round: at most (\d+) running", res.notes[-1])
    assert found, res.notes
    assert int(found.group(1)) >= 2 and 1 <= int(found.group(2)) <= SMALL.max_concurrency  # type: ignore[operator]
    assert res.diagnostics["server_running_requests_max"] == int(found.group(2))


def test_a_request_beside_the_round_makes_it_contaminated(start_server: StartServer) -> None:
    # Another client's long request runs through the whole round: the gauge sees more than the round sent.
    url = start_server(*SLOW)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=30) as other, other.stream("POST", f"{url}/v1/completions", json=body) as resp:
        next(resp.iter_bytes())  # it is streaming
        res = run_workload(url, MODEL, SMALL, progress=False, timeout_s=30, running_gauge=GAUGE)
    assert not res.valid
    assert "contaminated: 5 running requests during a round of concurrency 4" in res.invalid_reasons


def test_poisson_arrivals_are_seeded_and_reproducible() -> None:
    one = arrival_offsets(2000, 10.0, 1.0, seed=42)
    assert one == arrival_offsets(2000, 10.0, 1.0, seed=42)
    assert one != arrival_offsets(2000, 10.0, 1.0, seed=43)
    assert one[0] == 0.0
    assert all(b >= a for a, b in zip(one, one[1:], strict=False))
    gaps = [b - a for a, b in zip(one, one[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.1)
    cv2 = statistics.pvariance(gaps) / statistics.mean(gaps) ** 2
    assert cv2 == pytest.approx(1.0, rel=0.2)  # exponential gaps
    bursty = arrival_offsets(2000, 10.0, 0.25, seed=42)
    bgaps = [b - a for a, b in zip(bursty, bursty[1:], strict=False)]
    assert statistics.pvariance(bgaps) / statistics.mean(bgaps) ** 2 == pytest.approx(4.0, rel=0.3)
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_offsets(3, 0.0)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_only_on_a_terminal() -> None:
    quiet = io.StringIO()
    bar = Progress(4, "w", True, stream=quiet)
    bar.update(1, 0, 10, force=True)
    bar.close()
    assert quiet.getvalue() == ""
    tty = FakeTTY()
    bar = Progress(4, "w", True, stream=tty)
    bar.update(4, 1, 100, force=True)
    bar.close()
    assert tty.getvalue().startswith("\r[llmserve] w [")
    assert "4/4 failed=1" in tty.getvalue()
    off = FakeTTY()
    Progress(4, "w", False, stream=off).update(1, 0, 1, force=True)
    assert off.getvalue() == ""


def test_a_failed_client_process_fails_the_run_naming_each_process() -> None:
    # Characterization (issue 36, before run_workload_multiprocess was split into steps): a child that raises aborts
    # both barriers, and the parent fails the run with every child's message, in process order.
    prompts = build_prompts(replace(SMALL, num_prompts=4, warmup=0))
    with pytest.raises(LLMServeError) as caught:
        run_workload_multiprocess("http://127.0.0.1:9", MODEL, replace(SMALL, num_prompts=4, warmup=0), processes=2,
                                  prompts=prompts, transport="bogus", progress=False,  # type: ignore[arg-type]
                                  timeout_s=5)
    bogus = "ValueError: transport must be 'lean' or 'httpx', got 'bogus'"
    assert str(caught.value) == (f"multi-process load generation failed: client process 0: {bogus}; "
                                 f"client process 1: {bogus}")
