"""The load generator against the zero-cost server (a subprocess), and its pure parts on synthetic data."""

from __future__ import annotations

import asyncio
import io
import json
import math
import random
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from pytest_llmserve import load
from pytest_llmserve.config import Workload
from pytest_llmserve.load import (
    METRIC_DEFINITIONS,
    InvalidRunError,
    Progress,
    Prompt,
    RequestRecord,
    _Dechunker,
    _StreamParser,
    arrival_offsets,
    build_prompts,
    compute_metrics,
    counter_value,
    cross_check,
    evaluate,
    invalid_reasons,
    merge_records,
    percentile,
    run_workload,
    run_workload_multiprocess,
    server_counter_throughput,
    split_evenly,
)

SERVER = Path(__file__).resolve().parents[2] / "tools" / "zero_cost_server.py"
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


# --------------------------------------------------------------------------- end to end, zero-cost server

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
        monkeypatch.setenv(load.LOOP_ENV, loop)
        assert load.event_loop_name() == loop
        results[loop] = run_workload(url, MODEL, SMALL, prompts=prompts, progress=False, timeout_s=30)
    for loop, res in results.items():
        assert res.valid, (loop, res.invalid_reasons)
        assert res.event_loop == loop and res.to_dict()["event_loop"] == loop
    a, b = results["asyncio"], results["uvloop"]
    assert [r.chunks for r in a.per_request] == [r.chunks for r in b.per_request]
    assert [r.output_tokens for r in a.per_request] == [r.output_tokens for r in b.per_request]


def test_a_bad_event_loop_choice_names_the_variable_and_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(load.LOOP_ENV, "trio")
    with pytest.raises(ValueError, match=r"\$PYTEST_LLMSERVE_EVENT_LOOP = 'trio': must be auto, uvloop or asyncio"):
        load.event_loop_name()
    monkeypatch.setenv(load.LOOP_ENV, "auto")
    assert load.event_loop_name() == "uvloop"  # installed with the package on Linux


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
    assert res.summaries["itl"].count == SMALL.num_prompts * (SMALL.output_len - 1)


# --------------------------------------------------------------------------- metric definitions

def rec(index: int, start: float, ttft: float, gaps: list[float], *, n: int | None = None,
        process: int = 0, error: str | None = None) -> RequestRecord:
    """A synthetic record: content chunks at start+ttft, then after each gap."""
    e2e = ttft + sum(gaps)
    return RequestRecord(index=index, start=start, end=start + e2e + 0.001, ttft=ttft, e2e=e2e,
                         itl=list(gaps), output_tokens=len(gaps) + 1 if n is None else n, prompt_tokens=10,
                         chunks=len(gaps) + 1, error=error, process=process)


def test_tpot_and_itl_definitions() -> None:
    r = rec(0, 100.0, 0.5, [0.1, 0.2, 0.3])
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / (4 - 1))  # type: ignore[operator]
    assert r.tpot == pytest.approx(0.2)
    assert len(r.itl) == r.output_tokens - 1  # type: ignore[operator]
    assert rec(1, 0.0, 0.5, []).tpot is None  # n = 1: undefined
    assert rec(2, 0.0, 0.5, [0.1], error="boom").tpot is None
    for key in ("output_throughput", "ttft", "tpot", "itl", "e2e", "duration_s", "total_token_throughput",
                "request_throughput"):
        assert key in METRIC_DEFINITIONS


def test_compute_metrics_on_synthetic_records() -> None:
    records = [rec(0, 10.0, 0.1, [0.01] * 9), rec(1, 10.5, 0.2, [0.02] * 9)]
    metrics, summaries = compute_metrics(records)
    duration = records[1].end - records[0].start
    assert metrics["duration_s"] == pytest.approx(duration)
    assert metrics["output_throughput"] == pytest.approx(20 / duration)
    assert metrics["total_token_throughput"] == pytest.approx(40 / duration)
    assert metrics["request_throughput"] == pytest.approx(2 / duration)
    assert summaries["itl"].count == 18
    assert metrics["median_ttft_ms"] == pytest.approx(150.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(15.0)
    assert metrics["p99_e2e_ms"] == pytest.approx(statistics.quantiles([190.0, 380.0], n=100,
                                                                        method="inclusive")[98])
    wl = Workload("w", num_prompts=2, output_len=10)
    assert invalid_reasons(records, wl) == []
    assert evaluate(records, wl, transport="lean").valid


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    vals = sorted(rng.random() for _ in range(101))
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))


def test_invalid_reasons_cover_each_fault() -> None:
    wl = Workload("w", num_prompts=1, output_len=4)
    assert any("TPOT = 0" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.0, 0.0, 0.0])], wl))
    neg = rec(0, 0.0, 0.5, [0.1, 0.1, 0.1])
    neg.e2e = 0.4  # last chunk stamped before the first: what parsing-before-timestamping produces
    assert any("negative TPOT" in r for r in invalid_reasons([neg], wl))
    # One coalesced request of four (a starved machine) is a note, not an invalid run; half or more is.
    healthy = [rec(i, 0.0, 0.5, [0.1, 0.1, 0.1]) for i in range(1, 4)]
    wl4 = Workload("w", num_prompts=4, output_len=4)
    assert invalid_reasons([rec(0, 0.0, 0.5, [0.0, 0.0, 0.0]), *healthy], wl4) == []
    assert any("TPOT = 0" in r for r in invalid_reasons(
        [rec(0, 0.0, 0.5, [0.0, 0.0, 0.0]), rec(9, 0.0, 0.5, [0.0, 0.0, 0.0]), *healthy[:2]], wl4))
    assert any("output_len=4" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.1, 0.1])], wl))
    mismatch = rec(0, 0.0, 0.5, [0.1], n=4)
    assert any("content chunks" in r for r in invalid_reasons([mismatch], wl))
    relaxed = invalid_reasons([mismatch], wl, allow_multi_token_chunks=True)
    assert not any("content chunks" in r for r in relaxed)
    assert invalid_reasons([], wl) == ["no timed requests were sent"]
    warm_fail = rec(-1, 0.0, 0.5, [0.1] * 3, error="HTTP 500: x")
    assert any("warm-up" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.1] * 3)], wl, warmup=[warm_fail]))


def test_merge_gives_percentiles_over_all_samples() -> None:
    rng = random.Random(7)
    a = [rec(i, 1000.0 + i * 0.01, rng.uniform(0.05, 0.1), [rng.uniform(0.001, 0.002)] * 15, process=0)
         for i in range(0, 40, 2)]
    # the second process is slower and started 3 ms later: averaging per-process percentiles would hide it
    b = [rec(i, 1000.003 + i * 0.01, rng.uniform(0.4, 0.9), [rng.uniform(0.010, 0.030)] * 15, process=1)
         for i in range(1, 40, 2)]
    merged = merge_records([a, b])
    assert [r.start for r in merged] == sorted(r.start for r in a + b)
    metrics, summaries = compute_metrics(merged)
    union_ttft = sorted(r.ttft * 1000 for r in a + b)  # type: ignore[operator]
    assert metrics["p90_ttft_ms"] == pytest.approx(percentile(union_ttft, 90))
    assert metrics["median_ttft_ms"] == pytest.approx(percentile(union_ttft, 50))
    avg_of_p90 = (compute_metrics(a)[0]["p90_ttft_ms"] + compute_metrics(b)[0]["p90_ttft_ms"]) / 2
    assert metrics["p90_ttft_ms"] != pytest.approx(avg_of_p90)
    assert summaries["itl"].count == 40 * 15
    assert metrics["duration_s"] == pytest.approx(max(r.end for r in a + b) - min(r.start for r in a + b))
    assert split_evenly(10, 3) == [4, 3, 3]


# --------------------------------------------------------------------------- arrivals

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


# --------------------------------------------------------------------------- prompts

def whitespace_tokenize(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


def chunky_tokenize(text: str) -> list[int]:
    """Words of more than 4 characters cost two tokens; punctuation one."""
    out: list[int] = []
    for w in text.split():
        out.extend([len(w)] * (2 if len(w) > 4 else 1))
    return out


def even_tokenize(text: str) -> list[int]:
    """Only even token counts are reachable with text: the builder must fall back to token ids."""
    words = text.split()
    return [7] * (2 * len(words))


@pytest.mark.parametrize("tokenize", [whitespace_tokenize, chunky_tokenize])
@pytest.mark.parametrize("input_len", [1, 7, 64, 257])
def test_prompt_builder_gives_exact_lengths(tokenize: Callable[[str], list[int]], input_len: int) -> None:
    calls: list[str] = []

    def counted(text: str) -> list[int]:
        calls.append(text)
        return tokenize(text)

    wl = Workload("p", num_prompts=12, input_len=input_len, warmup=2, seed=5)
    prompts = build_prompts(wl, counted)
    assert len(prompts) == 14
    assert [p.warmup for p in prompts] == [True, True] + [False] * 12
    for p in prompts:
        assert p.exact
        assert p.num_tokens == input_len
        if isinstance(p.prompt, str):
            assert len(tokenize(p.prompt)) == input_len
        else:  # one token cannot always be made of text: token ids, still exact
            assert input_len == 1
            assert len(p.prompt) == 1
    if input_len > 1:
        assert all(isinstance(p.prompt, str) for p in prompts)
    if input_len > 1:
        assert len({p.prompt for p in prompts}) == 14  # distinct
    assert build_prompts(wl, tokenize) == prompts  # seeded
    assert build_prompts(replace(wl, seed=6), tokenize) != prompts
    assert len(calls) < 14 * 12  # a bounded number of /tokenize calls


def test_prompt_builder_falls_back_to_token_ids_or_detokenize() -> None:
    wl = Workload("p", num_prompts=3, input_len=9, warmup=0)
    prompts = build_prompts(wl, even_tokenize)
    assert all(p.is_token_ids and p.exact and len(p.payload) == 9 for p in prompts)
    assert isinstance(prompts[0].payload, list)

    def detok(ids: list[int]) -> str:
        return "y " * (len(ids) // 2) + "odd"

    def odd_ok(text: str) -> list[int]:
        return even_tokenize(text.replace(" odd", "")) + ([1] if text.endswith("odd") else [])

    prompts = build_prompts(wl, odd_ok, detok)
    assert all(isinstance(p.prompt, str) and len(odd_ok(p.prompt)) == 9 for p in prompts)


def test_prompt_builder_without_tokenizer_is_approximate() -> None:
    wl = Workload("p", num_prompts=4, input_len=20, warmup=1)
    prompts = build_prompts(wl)
    assert build_prompts(wl, lambda text: None) == prompts  # a server without /tokenize
    assert all(not p.exact and isinstance(p.prompt, str) and len(p.prompt.split()) == 20 for p in prompts)
    assert len({p.prompt for p in prompts}) == 5
    res = evaluate([rec(0, 0.0, 0.1, [0.01])], replace(wl, output_len=2), transport="lean", prompts=prompts)
    assert not res.prompts_exact
    assert any("approximate" in n for n in res.notes)


# --------------------------------------------------------------------------- stream parsing

def sse_body(n: int, *, spaced: bool = False) -> bytes:
    sep = b": " if spaced else b":"
    events = []
    for i in range(n):
        finish = b'"length"' if i == n - 1 else b"null"
        events.append(b'data: {"choices":[{"index":0,"text"' + sep + b'" t\\"ok\\n"' + b',"finish_reason"'
                      + sep + finish + b"}],\"usage\":null}\n\n")
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n)
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def chunked(body: bytes, rng: random.Random) -> bytes:
    out = b""
    pos = 0
    while pos < len(body):
        size = rng.randint(1, 300)
        piece = body[pos:pos + size]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        pos += size
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize("spaced", [False, True])
def test_parser_and_dechunker_survive_arbitrary_splits(spaced: bool) -> None:
    rng = random.Random(0)
    body = sse_body(50, spaced=spaced)
    for _ in range(30):
        wire = chunked(body, rng)
        dechunk, parser = _Dechunker(), _StreamParser()
        pos, ts = 0, 0.0
        while pos < len(wire):
            step = rng.randint(1, 97)
            ts += 0.001
            parser.feed(dechunk.feed(wire[pos:pos + step]), ts)
            pos += step
        parser.close(ts)
        assert dechunk.ended
        assert parser.done
        assert parser.error is None
        assert parser.chunks == 50
        assert parser.completion_tokens == 50
        assert parser.prompt_tokens == 3
        assert len(parser.itl) == 49
        assert parser.finish_reason == "length"
        record = parser.record(0, 0.0, ts, 0.0)
        assert record.ok
        assert record.ttft is not None
        assert record.ttft > 0


@pytest.mark.parametrize("spaced", [False, True])
def test_one_event_per_read_takes_the_fast_paths_and_agrees_with_split_reads(spaced: bool) -> None:
    events = [e + b"\n\n" for e in sse_body(40, spaced=spaced).split(b"\n\n") if e]
    events.insert(3, b'data: {"choices":[{"index":0,"text":"","finish_reason":null}],"usage":null}\n\n')  # empty
    wire = [b"%x\r\n" % len(e) + e + b"\r\n" for e in events]  # one event per chunk, one chunk per read
    whole = b"".join(wire) + b"0\r\n\r\n"

    def run(reads: list[bytes]) -> tuple[RequestRecord, bool]:
        dechunk, parser = _Dechunker(), _StreamParser()
        for i, read in enumerate(reads):
            parser.feed(dechunk.feed(read), float(i + 1))
        parser.close(float(len(reads)))
        return parser.record(0, 0.0, float(len(reads)), 0.0), dechunk.ended

    fast, ended = run([*wire, b"0\r\n\r\n"])
    rng = random.Random(1)
    cuts = sorted(rng.sample(range(1, len(whole)), 200))
    split, split_ended = run([whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)])
    assert ended and split_ended
    assert fast.ok and split.ok, (fast.error, split.error)
    assert (fast.chunks, fast.empty_chunks, fast.output_tokens, fast.finish_reason) == (41, 1, 40, "length")
    assert (split.chunks, split.empty_chunks, split.output_tokens) == (41, 1, 40)
    assert len(fast.itl) == 40 and all(x == 1.0 for x in fast.itl)  # one read per event: one step apart


def test_parser_counts_empty_text_chunks_and_reports_errors() -> None:
    parser = _StreamParser()
    parser.feed(b'data: {"choices":[{"text":"","finish_reason":null}],"usage":null}\n\n', 1.0)
    parser.feed(b'data: {"choices":[{"text":"a","finish_reason":null}],"usage":null}\n\n', 2.0)
    parser.feed(b'data: {"error":{"message":"NaN happened"}}\n\n', 3.0)
    assert parser.chunks == 2  # a special token's chunk has empty text but is a decode step
    assert parser.empty_chunks == 1
    rec_ = parser.record(0, 0.0, 3.0, 0.0)
    assert rec_.error is not None
    assert "NaN happened" in rec_.error
    cut = _StreamParser()
    cut.feed(b'data: {"choices":[{"text":"a","finish_reason":null}],"usage":null}\n\ndata: {"cho', 1.0)
    cut.close(1.0)
    error = cut.record(0, 0.0, 1.0, 0.0).error
    assert error is not None
    assert error.startswith("stream ended after 1 chunks without [DONE]")
    assert "cho" in error


# --------------------------------------------------------------------------- server counters

METRICS_BEFORE = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m a}b"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total 7
"""
METRICS_AFTER = METRICS_BEFORE.replace("} 100.0", "} 1100.0").replace("} 50.0", "} 1050.0")


def test_server_counter_throughput_parses_prometheus_text() -> None:
    assert counter_value(METRICS_BEFORE, "vllm:generation_tokens") == 150.0
    assert counter_value(METRICS_BEFORE, "vllm:generation_tokens_total") == 150.0
    assert counter_value(METRICS_BEFORE, "vllm:prompt_tokens") == 7.0
    assert counter_value(METRICS_BEFORE, "sglang:generation_tokens") is None
    assert server_counter_throughput(METRICS_BEFORE, METRICS_AFTER, "vllm:generation_tokens", 4.0) == 500.0
    assert server_counter_throughput(METRICS_AFTER, METRICS_BEFORE, "vllm:generation_tokens", 4.0) is None
    assert server_counter_throughput(METRICS_BEFORE, "", "vllm:generation_tokens", 4.0) is None
    ok, msg = cross_check(505.0, 500.0)
    assert ok
    assert "+1.0%" in msg
    ok, msg = cross_check(450.0, 500.0, bound=0.03)
    assert not ok
    assert "DISAGREE" in msg
    assert cross_check(1.0, None)[0]


# --------------------------------------------------------------------------- progress

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


def test_prompt_payload_types() -> None:
    assert Prompt("a b", 2, True).payload == "a b"
    assert Prompt((1, 2), 2, True).payload == [1, 2]


def finish_marker_stream(last_text: str) -> bytes:
    token = b'data: {"choices":[{"text":"x","finish_reason":null}],"usage":null}\n\n'
    last = b'data: {"choices":[{"text":"%s","finish_reason":"length"}],"usage":null}\n\n' % last_text.encode()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    return token * 3 + last + usage


def test_trailing_finish_marker_is_not_a_token() -> None:
    parser = _StreamParser()
    for i, line in enumerate(finish_marker_stream("").split(b"\n\n")):
        parser.feed(line + b"\n\n", float(i + 1))
    record = parser.record(0, 0.0, 9.0, 0.0)
    assert record.ok
    assert record.chunks == 3  # 3 tokens + a pure finish marker
    assert record.itl == [1.0, 1.0]
    assert record.e2e == 3.0
    assert record.finish_reason == "length"
    # the same shape where the last chunk carries text is one chunk too many: a real mismatch
    parser = _StreamParser()
    parser.feed(finish_marker_stream("y"), 1.0)
    assert parser.record(0, 0.0, 2.0, 0.0).chunks == 4


def test_client_cpu_per_request_is_recorded() -> None:
    records = [rec(0, 10.0, 0.1, [0.01] * 9), rec(1, 10.5, 0.2, [0.02] * 9)]
    wl = Workload("w", num_prompts=2, output_len=10)
    res = evaluate(records, wl, transport="lean", client_cpu_s=0.004)
    assert res.client_cpu_s == pytest.approx(0.004)
    assert res.client_cpu_ms_per_request == pytest.approx(2.0)
    assert res.to_dict(per_request=False)["client_cpu_ms_per_request"] == pytest.approx(2.0)
    assert evaluate(records, wl, transport="lean").client_cpu_ms_per_request is None
