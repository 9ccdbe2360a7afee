"""Workloads and the load generator: fixed-length prompts, streamed requests, one definition per metric.

Every request streams ``/v1/completions`` with ``stream: true``, ``stream_options: {include_usage: true}``,
``ignore_eos: true``, ``temperature: 0``, ``max_tokens = output_len`` and the workload's seed, and is
never retried. Each SSE chunk is timestamped with :func:`time.perf_counter` as soon as its bytes are
read, before any parsing (parsing before timestamping is how sglang.bench_serving gets negative TPOT).

Metric definitions (also in :data:`METRIC_DEFINITIONS`; ``n`` = ``usage.completion_tokens`` of a request):

* ``output_throughput``: Σ ``usage.completion_tokens`` over the timed requests / ``duration_s`` (tokens/s).
* ``total_token_throughput``: Σ (``usage.prompt_tokens`` + ``usage.completion_tokens``) / ``duration_s``.
* ``input_throughput``: Σ ``usage.prompt_tokens`` / ``duration_s``.
* ``request_throughput``: completed requests / ``duration_s``.
* ``duration_s``: from the start of the first timed request to the end of the last one (the end of a
  request is when its stream closed); warm-up requests are excluded.
* ``ttft``: time from sending the request to the arrival of the first *content chunk* (an SSE event
  with a non-empty ``choices`` list: one decode step; its text may be empty for special tokens. A
  trailing empty-text chunk that only carries ``finish_reason`` beyond ``usage.completion_tokens`` is a
  finish marker, not a content chunk).
* ``e2e``: time from sending the request to the arrival of its last content chunk.
* ``tpot``: ``(e2e − ttft) / (n − 1)`` per request (undefined for n < 2).
* ``itl``: the gaps between consecutive content chunks of a request, pooled over all requests
  (a request with c content chunks gives c − 1 samples). Equal to TPOT only when every chunk is one token.
* ``mean_concurrency``: Σ (end − start) over requests / ``duration_s``.
* Latency summaries (``ttft``, ``tpot``, ``itl``, ``e2e``) are given in milliseconds as ``mean_*_ms``,
  ``median_*_ms``, ``p90_*_ms``, ``p99_*_ms`` (linear interpolation between order statistics, as
  ``numpy.percentile``), ``std_*_ms``; percentiles are computed over every sample, never averaged.

A run is **invalid** (``RunResult.valid`` false, ``RunResult.metrics`` empty, the figures kept only in
``RunResult.diagnostics``) when a request failed, when a request's ``usage.completion_tokens`` differs
from ``output_len`` or is missing, when the client's content-chunk count differs from the server's
token count, when a TPOT is zero or negative, when a request of n ≥ 2 tokens arrived as one chunk
(empty ITL: the stream was buffered), or when the server's own token counter disagrees.

Two transports share the SSE parser: ``"lean"`` (a minimal HTTP/1.1 client over
:func:`asyncio.open_connection` with keep-alive connections, chunked decoding and byte-level SSE
splitting; JSON is parsed only for the usage/finish/error events) and ``"httpx"`` (for proxies and to
compare). The openai SDK costs ~10x more CPU per streamed token, which on a small machine is taken
from the server under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import queue as queue_mod
import random
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError

Transport = Literal["lean", "httpx"]
Tokenize = Callable[[str], list[int] | None]  # None: the server has no /tokenize
Detokenize = Callable[[list[int]], str]
_R = TypeVar("_R")

DEFAULT_TIMEOUT_S = 300.0
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")

METRIC_DEFINITIONS: dict[str, str] = {
    "output_throughput": "sum of usage.completion_tokens over timed requests / duration_s (tokens/s)",
    "total_token_throughput": "sum of usage.prompt_tokens + usage.completion_tokens / duration_s (tokens/s)",
    "input_throughput": "sum of usage.prompt_tokens / duration_s (tokens/s)",
    "request_throughput": "completed requests / duration_s (requests/s)",
    "duration_s": "first timed request start to last timed request end (stream closed); warm-up excluded",
    "ttft": "request sent to arrival of the first content chunk (SSE event with a choice: one decode step)",
    "e2e": "request sent to arrival of the last content chunk",
    "tpot": "(e2e - ttft) / (n - 1) per request, n = usage.completion_tokens (undefined for n < 2)",
    "itl": "gaps between consecutive content chunks, pooled over requests (c chunks give c - 1 samples)",
    "mean_concurrency": "sum over requests of (end - start) / duration_s",
    "total_output_tokens": "sum of usage.completion_tokens over timed requests",
    "total_input_tokens": "sum of usage.prompt_tokens over timed requests",
    "client_chunks": "content chunks counted by the client (cross-check of usage.completion_tokens)",
    "empty_chunks": "content chunks whose text was empty (special tokens; all empty = suspect NaN logits)",
    "completed": "timed requests that finished without error",
    "failed": "timed requests that ended with an error (never retried)",
    "percentiles": "mean/median/p90/p99/std over all samples, ms; linear interpolation as numpy.percentile",
}

# Which way is better, for the regression gate.
HIGHER_IS_BETTER = frozenset({"output_throughput", "total_token_throughput", "input_throughput",
                              "request_throughput"})


class InvalidRunError(LLMServeError):
    """A figure was asked of a run whose measurement is invalid; the message lists the reasons."""


# --------------------------------------------------------------------------- prompts

# Common short English words: each is one token in most BPE vocabularies when preceded by a space.
_WORDS = (
    "the of and to in is was that for on with as by at from his her it an were are which this be or "
    "had not but one all their there been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right used take "
    "three small house light water place night point city play story food river table music green "
    "stone paper window garden winter summer morning letter market school friend animal forest "
    "mountain island doctor street orange yellow silver"
).split()

_FILLERS = ("a", "I", "and", "the", "of", ".", ",", "x")


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: text, or token ids when text could not be made exactly ``input_len`` tokens long."""

    prompt: str | tuple[int, ...]
    num_tokens: int  # measured with the tokenizer when ``exact``; the word count otherwise
    exact: bool  # num_tokens was measured (or the prompt is token ids) and equals input_len
    warmup: bool = False

    @property
    def is_token_ids(self) -> bool:
        return isinstance(self.prompt, tuple)

    @property
    def payload(self) -> str | list[int]:
        """What goes in the request's ``prompt`` field."""
        return list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt


def _prompt_words(seed: int, index: int, count: int) -> list[str]:
    """Seeded words for prompt ``index``; the first word cycles through the vocabulary so prompts differ
    from their first token (no shared prefix for a prefix cache to reuse)."""
    rng = random.Random(seed * 1_000_003 + index)
    first = _WORDS[(index * 7919 + seed) % len(_WORDS)]
    return [first.capitalize()] + [rng.choice(_WORDS) for _ in range(max(count - 1, 0))]


def build_prompts(workload: Workload, tokenize: Tokenize | None = None, detokenize: Detokenize | None = None,
                  *, max_tries: int = 6) -> list[Prompt]:
    """Seeded, distinct prompts: ``workload.warmup`` warm-up prompts first, then ``workload.num_prompts``.

    With ``tokenize`` (the server's ``/tokenize``), each prompt is exactly ``input_len`` tokens: the word
    count is adjusted by measuring, then topped up with short filler words; if that fails after
    ``max_tries`` measurements, ``detokenize`` of the trimmed ids is tried, and finally the prompt is
    sent as token ids (``/v1/completions`` accepts a list of ints). Without ``tokenize`` the prompt has
    ``input_len`` words and is flagged ``exact=False``.
    """
    target = workload.input_len
    total = workload.warmup + workload.num_prompts
    out: list[Prompt] = []
    if tokenize is not None and tokenize(_WORDS[0]) is None:
        tokenize = None  # e.g. LLMClient.tokenize on a server without /tokenize: approximate prompts
    ratio = 1.0  # tokens per word, learnt from the first prompts to save /tokenize calls
    for i in range(total):
        warm = i < workload.warmup
        if tokenize is None:
            out.append(Prompt(" ".join(_prompt_words(workload.seed, i, target)), target, False, warm))
            continue
        prompt, ratio = _exact_prompt(workload.seed, i, target, tokenize, detokenize, ratio, max_tries)
        out.append(replace(prompt, warmup=warm))
    return out


def _exact_prompt(seed: int, index: int, target: int, tokenize: Tokenize, detokenize: Detokenize | None,
                  ratio: float, max_tries: int) -> tuple[Prompt, float]:
    words = _prompt_words(seed, index, max(16, int(target / max(ratio, 0.05) * 1.5) + 8))
    counts: dict[int, int] = {}

    def measure(text: str) -> list[int]:
        ids = tokenize(text)
        if ids is None:
            raise LLMServeError("the tokenizer stopped answering while prompts were being built")
        return ids

    def count(n: int) -> int:
        if n not in counts:
            counts[n] = len(measure(" ".join(words[:n])))
        return counts[n]

    # Make sure the word list is long enough to exceed the target.
    for _ in range(12):
        if count(len(words)) >= target:
            break
        words.extend(_prompt_words(seed + 1 + len(words), index, len(words)))
    else:
        raise LLMServeError(f"cannot build a prompt of {target} tokens: the tokenizer gave "
                            f"{count(len(words))} tokens for {len(words)} words")
    n = min(len(words), max(1, round(target / max(ratio, 0.05))))
    for _ in range(max_tries):
        got = count(n)
        if got == target:
            return Prompt(" ".join(words[:n]), target, True), got / n
        per_word = got / n if got else ratio
        step = round((target - got) / max(per_word, 0.05)) or (1 if got < target else -1)
        nxt = min(len(words), max(1, n + step))
        if nxt in counts:
            break
        n = nxt
    below = [k for k, v in counts.items() if v < target]
    above = [k for k, v in counts.items() if v > target]
    lo = max(below) if below else 0
    hi = min(above) if above else len(words)
    # Walk up from the largest word count below the target (bounded number of measurements).
    while lo + 1 < hi and len(counts) < 4 * max_tries:
        got = count(lo + 1)
        if got == target:
            return Prompt(" ".join(words[: lo + 1]), target, True), got / (lo + 1)
        if got > target:
            hi = lo + 1
            break
        lo += 1
    new_ratio = counts[hi] / hi if hi in counts and hi else ratio
    if lo > 0:
        base = " ".join(words[:lo])
        deficit = target - count(lo)
        for filler in _FILLERS[:max_tries]:
            text = base + (" " + filler) * deficit
            if len(measure(text)) == target:
                return Prompt(text, target, True), new_ratio
    ids = measure(" ".join(words[:hi]))[:target]
    if detokenize is not None:
        text = detokenize(ids)
        if len(measure(text)) == target:
            return Prompt(text, target, True), new_ratio
    if len(ids) != target:
        raise LLMServeError(f"could not build a prompt of {target} tokens (tokenizer gave {len(ids)})")
    return Prompt(tuple(ids), target, True), new_ratio


# --------------------------------------------------------------------------- arrivals

def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s from the start) of ``n`` requests: all 0 for an infinite rate; otherwise the first
    at 0 and gamma-distributed gaps with shape ``burstiness`` and mean ``1/rate`` (1.0 = Poisson)."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"request rate ({rate}) and burstiness ({burstiness}) must be > 0")
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    out = [0.0]
    for _ in range(n - 1):
        out.append(out[-1] + rng.gammavariate(burstiness, scale))
    return out


# --------------------------------------------------------------------------- records and SSE parsing

@dataclass(slots=True)
class RequestRecord:
    """One request. ``start``/``end`` are wall-clock seconds (time.time() scale, derived from perf_counter
    so they are as precise as it), so records from several processes share one clock; ``ttft``, ``e2e``
    and ``itl`` are perf_counter differences in seconds."""

    index: int
    start: float
    end: float
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens
    chunks: int = 0  # content chunks (events with a choice) the client saw
    empty_chunks: int = 0  # of which with empty text
    error: str | None = None
    finish_reason: str | None = None
    process: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """(e2e − ttft) / (n − 1) with n = usage.completion_tokens; None when undefined."""
        n = self.output_tokens
        if self.error is not None or self.ttft is None or self.e2e is None or n is None or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RequestRecord:
        return RequestRecord(**data)


_DONE = b"[DONE]"
# Byte markers of events that the bulk path leaves to the per-event path.
_SPECIAL = (b'"finish_reason":"', b'"finish_reason": "', b'"completion_tokens"', b"data: [DONE]", b'"error"',
            b'"choices":[]')


class _StreamParser:
    """Splits SSE bytes into ``data:`` events and keeps the timestamps of content chunks.

    A *content chunk* is an event whose ``choices`` list is not empty: one decode step. Its text may be
    empty (special tokens such as EOS under ``ignore_eos``; vLLM sends those chunks too), so every such
    chunk counts, as in vLLM's own client; empty ones are also counted apart (``empty_chunks``: a
    stream of empty text is what NaN logits give). A trailing chunk with empty text that only carries
    ``finish_reason`` and makes the count one more than ``usage.completion_tokens`` is a finish marker,
    not a token, and is removed from the count and the timings.

    Content chunks are recognised on bytes; JSON is parsed only for events that may carry usage, a
    finish reason or an error. Inside a JSON string every ``"`` is escaped, so these byte patterns
    cannot be produced by generated text.
    """

    __slots__ = ("pending", "first", "last", "prev_last", "itl", "chunks", "empty_chunks", "events", "done",
                 "completion_tokens", "prompt_tokens", "error", "finish_reason", "finish_only", "tail")

    def __init__(self) -> None:
        self.pending = b""
        self.first = -1.0
        self.last = -1.0
        self.prev_last = -1.0
        self.itl: list[float] = []
        self.chunks = 0
        self.empty_chunks = 0
        self.events = 0
        self.done = False
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.error: str | None = None
        self.finish_reason: str | None = None
        self.finish_only = False  # the last content chunk had empty text and a finish_reason
        self.tail = b""

    def feed(self, data: bytes, ts: float) -> None:
        if not data:
            return
        if (not self.pending and data[:5] == b"data:" and data.find(b"\n") == len(data) - 2
                and data[-1:] == b"\n" and data.rfind(b'"finish_reason":null') > 0
                and b'"completion_tokens"' not in data):
            # Fast path: the read is exactly one plain content chunk (one decode step, most reads). A
            # null finish_reason is only in a choice; an event without usage and error is then content.
            self.tail = data
            self.events += 1
            self._content(ts, b'"text":""' in data)
            self.finish_only = False
            return
        if self.pending:
            data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            self.pending = data
            return
        self.pending = data[cut:]
        if cut < len(data):
            data = data[:cut]
        self.tail = data  # sliced only when an error message needs its last bytes
        # Bulk path for the plain content chunks before the first event that needs a look (finish, usage,
        # [DONE], error): those all arrived at ``ts``, so only their number matters.
        if self._bulk(data, ts):
            return
        first_special = min((i for i in (data.find(m) for m in _SPECIAL) if i >= 0), default=-1)
        if first_special < 0:
            rest = data
        else:
            line_start = data.rfind(b"\n", 0, first_special) + 1
            if line_start and self._bulk(data[:line_start], ts):
                rest = data[line_start:]
            else:
                rest = data
        for line in rest.split(b"\n"):
            if line[:5] == b"data:":
                self._event(line[5:].strip(), ts)

    def _bulk(self, data: bytes, ts: float) -> bool:
        """Account for ``data`` (whole lines) at once if every event in it is a plain content chunk.
        Literal newlines and unescaped quotes never occur inside JSON strings, so counting is exact."""
        n = data.count(b"\ndata:") + (data[:5] == b"data:")
        if not n or data.count(b'"choices":[{') != n or \
                data.count(b'"finish_reason":null') + data.count(b'"finish_reason": null') != n:
            return False
        self.events += n
        if self.first < 0:
            self.first = ts
        else:
            self.itl.append(ts - self.last)
        if n > 1:
            self.itl.extend([0.0] * (n - 1))  # read together: the same arrival time
        self.prev_last = self.last if n == 1 else ts
        self.last = ts
        self.chunks += n
        self.empty_chunks += data.count(b'"text":""') + data.count(b'"text": ""')
        self.finish_only = False
        return True

    def close(self, ts: float) -> None:
        """The stream ended. An unterminated last line is an incomplete event (dropped, as SSE says),
        except a bare ``data: [DONE]`` that only lacks its newline."""
        if self.pending.strip() == b"data: " + _DONE:
            self.done = True
        self.pending = b""

    def interrupted(self, exc: BaseException) -> None:
        """The transport failed: mid-stream that is a truncated stream, with what was received."""
        if self.error is not None:
            return
        if self.events and not self.done:
            self.error = (f"stream ended after {self.events} chunks without [DONE]: last bytes "
                          f"{self.tail[-200:]!r} ({type(exc).__name__}: {exc})")
        else:
            self.error = f"{type(exc).__name__}: {exc} (after {self.events} chunks)"

    def _content(self, ts: float, empty: bool) -> None:
        if self.first < 0:
            self.first = ts
        else:
            self.itl.append(ts - self.last)
        self.prev_last = self.last
        self.last = ts
        self.chunks += 1
        if empty:
            self.empty_chunks += 1

    def _event(self, p: bytes, ts: float) -> None:
        if p == _DONE:
            self.done = True
            return
        self.events += 1
        if (b'"completion_tokens"' not in p and b'"choices":[{' in p
                and (b'"finish_reason":null' in p or b'"finish_reason": null' in p)):
            self._content(ts, b'"text":""' in p or b'"text": ""' in p)
            self.finish_only = False
            return
        self._slow_event(p, ts)

    def _slow_event(self, p: bytes, ts: float) -> None:
        try:
            data = json.loads(p)
        except ValueError:
            self.error = self.error or f"invalid JSON in stream after {self.events - 1} events: {p[:300]!r}"
            return
        if not isinstance(data, dict):
            self.error = self.error or f"unexpected stream event: {p[:300]!r}"
            return
        if "error" in data or data.get("object") == "error":
            self.error = self.error or f"server error in stream after {self.chunks} chunks: {p[:1000]!r}"
            return
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):
                text = choice["delta"].get("content")
            self._content(ts, not text)
            finish = choice.get("finish_reason")
            if finish is not None:
                self.finish_reason = str(finish)
            self.finish_only = finish is not None and not text
        usage = data.get("usage")
        if isinstance(usage, dict):
            ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if isinstance(ct, int):
                self.completion_tokens = ct
            if isinstance(pt, int):
                self.prompt_tokens = pt

    def _drop_finish_marker(self) -> None:
        if (self.finish_only and self.completion_tokens is not None
                and self.chunks == self.completion_tokens + 1):
            self.chunks -= 1
            self.empty_chunks -= 1
            if self.itl:
                self.itl.pop()
                self.last = self.prev_last
            else:
                self.first = self.last = -1.0
            self.finish_only = False

    def record(self, index: int, start: float, end: float, wall_offset: float) -> RequestRecord:
        """The request's record; ``wall_offset`` converts perf_counter to wall-clock seconds."""
        self._drop_finish_marker()
        error = self.error
        if error is None and not self.done:
            error = (f"stream ended after {self.events} chunks without [DONE]: "
                     f"last bytes {self.tail[-200:]!r}")
        ok_times = self.first >= 0
        return RequestRecord(
            index=index, start=start + wall_offset, end=end + wall_offset,
            ttft=(self.first - start) if ok_times else None, e2e=(self.last - start) if ok_times else None,
            itl=self.itl, output_tokens=self.completion_tokens, prompt_tokens=self.prompt_tokens,
            chunks=self.chunks, empty_chunks=self.empty_chunks, error=error, finish_reason=self.finish_reason)


class _Dechunker:
    """Incremental decoder of HTTP/1.1 ``Transfer-Encoding: chunked``. A chunk's data is released when
    the whole chunk has arrived (servers put one SSE event in a chunk, so this is when the event is)."""

    __slots__ = ("buf", "ended")

    def __init__(self) -> None:
        self.buf = b""
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        if not self.buf:
            # Fast path: a read that holds exactly one whole chunk (one SSE event per decode step).
            idx = data.find(b"\r\n")
            if 0 < idx <= 8:
                try:
                    size = int(data[:idx], 16)
                except ValueError:
                    size = 0
                if size and len(data) == idx + size + 4 and data[-2:] == b"\r\n":
                    return data[idx + 2:idx + 2 + size]
        buf = self.buf + data if self.buf else data
        end = len(buf)
        pos = 0
        parts: list[bytes] = []
        find = buf.find
        while True:
            idx = find(b"\r\n", pos)
            if idx < 0:
                break
            try:
                size = int(buf[pos:idx], 16)
            except ValueError:
                field_ = buf[pos:idx].split(b";", 1)[0]  # chunk extensions
                try:
                    size = int(field_, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size line {buf[pos:idx][:80]!r}") from None
            if size == 0:
                self.ended = True  # trailers, if any, are ignored
                pos = end
                break
            stop = idx + 2 + size
            if stop + 2 > end:
                break
            parts.append(buf[idx + 2:stop])
            pos = stop + 2
        self.buf = buf[pos:] if pos < end else b""
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


# --------------------------------------------------------------------------- transports

class _Target:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        self.prefix = prefix
        self.netloc = parts.netloc


class _HttpStream(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. Response bytes are handled in ``data_received``, so each
    read is timestamped when the event loop gets it and the waiting request wakes up once, at the end
    of its stream, not once per read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: _StreamParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.reused = False
        self.last_used = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.head = bytearray()
        self.in_head = True
        self.status = 0
        self.chunked = False
        self.remaining = -1
        self.keep_alive = True
        self.dechunk = _Dechunker()
        self.error_body: bytearray | None = None
        self.got_bytes = False
        self.complete = False  # the response ended cleanly (connection reusable if keep_alive)

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None:
            self.parser.close(time.perf_counter())
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def data_received(self, data: bytes) -> None:
        ts = time.perf_counter()
        parser = self.parser
        if parser is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        self.got_bytes = True
        if self.in_head:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > 1 << 16:
                    parser.error = f"response head too long: {bytes(self.head[:200])!r}"
                    self.close()
                return
            if not self._parse_head(bytes(self.head[:end]), parser):
                self.close()
                return
            data = bytes(self.head[end + 4:])
            self.in_head = False
            if self.remaining == 0:
                self._end(parser, ts)
                return
            if not data:
                return
        if self.chunked:
            try:
                payload = self.dechunk.feed(data)
            except ValueError as exc:
                parser.error = f"bad chunked encoding after {parser.events} chunks: {exc}"
                self.close()
                return
            ended = self.dechunk.ended
        else:
            payload = data
            if self.remaining > 0:
                self.remaining -= len(data)
            ended = self.remaining == 0
        if self.error_body is not None:
            self.error_body += payload
        else:
            parser.feed(payload, ts)
        if ended:
            self._end(parser, ts)

    # -- helpers
    def _parse_head(self, head: bytes, parser: _StreamParser) -> bool:
        status_line, _, header_block = head.partition(b"\r\n")
        try:
            self.status = int(status_line.split(b" ", 2)[1])
        except (IndexError, ValueError):
            parser.error = f"malformed HTTP status line {status_line[:200]!r}"
            return False
        headers = header_block.lower()
        self.chunked = b"transfer-encoding: chunked" in headers
        for line in headers.split(b"\r\n"):
            if line.startswith(b"content-length:") and not self.chunked:
                self.remaining = int(line[15:].strip())
        self.keep_alive = b"connection: close" not in headers and (self.chunked or self.remaining >= 0)
        if self.status != 200:
            self.error_body = bytearray()
        return True

    def _end(self, parser: _StreamParser, ts: float) -> None:
        if self.error_body is not None:
            parser.error = f"HTTP {self.status}: {bytes(self.error_body[:2000]).decode('utf-8', 'replace')}"
        else:
            parser.close(ts)
        self.complete = True
        self.parser = None
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def start(self, request: bytes, parser: _StreamParser) -> asyncio.Future[None]:
        self._reset()
        self.parser = parser
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def abort(self) -> None:
        self.closed = True
        self.parser = None
        if self.transport is not None:
            self.transport.abort()


class LeanTransport:
    """HTTP/1.1 over asyncio protocols with a keep-alive pool (one connection per concurrent request)."""

    name = "lean"
    IDLE_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.target = _Target(base_url)
        self._ssl = ssl.create_default_context() if self.target.scheme == "https" else None
        self._idle: list[_HttpStream] = []
        self._all: set[_HttpStream] = set()
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._head = (f"POST {self.target.prefix}/v1/completions HTTP/1.1\r\nHost: {self.target.netloc}\r\n"
                      f"User-Agent: pytest-llmserve\r\nAccept: text/event-stream\r\n"
                      f"Content-Type: application/json\r\n{auth}").encode()

    async def _open(self) -> _HttpStream:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(_HttpStream, self.target.host, self.target.port,
                                                ssl=self._ssl)
        self._all.add(proto)
        return proto

    async def prewarm(self, n: int) -> None:
        """Open ``n`` keep-alive connections before the clock starts."""
        missing = n - len(self._idle)
        if missing > 0:
            conns = await asyncio.gather(*(self._open() for _ in range(missing)), return_exceptions=True)
            for c in conns:
                if isinstance(c, _HttpStream):
                    c.reused = True
                    self._idle.append(c)

    async def _acquire(self) -> _HttpStream:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.last_used < self.IDLE_S and not conn.closed:
                return conn
            conn.close()
        return await self._open()

    async def close(self) -> None:
        self._idle = []
        conns, self._all = self._all, set()
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.sleep(0)  # let the transports run connection_lost

    async def stream(self, body: bytes, parser: _StreamParser) -> None:
        request = self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        conn = await self._acquire()
        try:
            await conn.start(request, parser)
            if conn.closed and not conn.got_bytes and conn.reused and parser.error is None:
                # A pooled connection the server had closed while idle: nothing was answered, so the
                # request never reached the engine; send it once on a fresh connection.
                self._all.discard(conn)
                conn = await self._open()
                await conn.start(request, parser)
            if conn.closed and not conn.got_bytes and parser.error is None:
                parser.error = "connection closed before any response"
        except BaseException:
            conn.abort()  # cancelled (timeout) or failed mid-stream: the connection is not reusable
            self._all.discard(conn)
            raise
        if conn.complete and conn.keep_alive and not conn.closed:
            conn.last_used = time.monotonic()
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)


class HttpxTransport:
    """The same requests through httpx (HTTP proxies, TLS set-ups, comparison with the lean path)."""

    name = "httpx"

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import httpx

        self.target = _Target(base_url)
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json",
                   "User-Agent": "pytest-llmserve"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._path = f"{self.target.prefix}/v1/completions"
        self._client = httpx.AsyncClient(
            base_url=f"{self.target.scheme}://{self.target.netloc}", headers=headers,
            timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(max_connections=None,
                                                                 max_keepalive_connections=None))

    async def prewarm(self, n: int) -> None:
        return None

    async def close(self) -> None:
        await self._client.aclose()

    async def stream(self, body: bytes, parser: _StreamParser) -> None:
        import httpcore
        import httpx

        perf = time.perf_counter
        try:
            async with self._client.stream("POST", self._path, content=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread())[:2000].decode("utf-8", "replace")
                    parser.error = f"HTTP {resp.status_code}: {text}"
                    return
                async for data in resp.aiter_bytes():
                    parser.feed(data, perf())
                parser.close(perf())
        except (httpx.HTTPError, httpcore.ProtocolError, OSError, ValueError, RuntimeError) as exc:
            # httpcore's protocol errors can escape httpx's mapping inside a streamed body: the stream
            # was cut, which is what interrupted() records, never an exception out of the run.
            parser.interrupted(exc)


def make_transport(kind: Transport, base_url: str, api_key: str | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> LeanTransport | HttpxTransport:
    if kind == "lean":
        return LeanTransport(base_url, api_key)
    if kind == "httpx":
        return HttpxTransport(base_url, api_key, timeout_s)
    raise ValueError(f"transport must be 'lean' or 'httpx', got {kind!r}")


def request_body(model: str, prompt: Prompt, workload: Workload) -> bytes:
    """The JSON body of one streamed benchmark request."""
    return json.dumps({
        "model": model, "prompt": prompt.payload, "max_tokens": workload.output_len, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": workload.seed,
    }, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress display on stderr (\\r-updated), silent when stderr is not a terminal."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(enabled and hasattr(self.stream, "isatty") and self.stream.isatty())
        self.total = total
        self.label = label
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: int, failed: int, tokens: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        elapsed = now - self.started
        width = 24
        filled = int(width * done / self.total) if self.total else width
        rate = tokens / elapsed if elapsed > 0 else 0.0
        line = (f"\r[llmserve] {self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
                f" failed={failed} {tokens} tok {rate:,.0f} tok/s {elapsed:.1f}s")
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()


# --------------------------------------------------------------------------- execution

@dataclass(slots=True)
class _Execution:
    records: list[RequestRecord]
    warmup: list[RequestRecord]
    cpu_s: float  # this process's CPU time during the timed phase


async def _execute(base_url: str, model: str, prompts: Sequence[Prompt], workload: Workload, *,
                   api_key: str | None, transport: Transport, timeout_s: float,
                   on_done: Callable[[RequestRecord], None] | None = None,
                   between: Callable[[], Awaitable[None]] | None = None,
                   on_progress: Callable[[int, int, int], None] | None = None,
                   index_of: Sequence[int] | None = None, process: int = 0) -> _Execution:
    """Warm-up, then ``between()``, then the timed requests on the workload's schedule.

    ``on_done(record)`` is called as each timed request ends; ``on_progress(done, failed, tokens)``
    every 0.2 s with the chunks streamed so far (in-flight requests included)."""
    client = make_transport(transport, base_url, api_key, timeout_s)
    warm = [p for p in prompts if p.warmup]
    timed = [p for p in prompts if not p.warmup]
    indices = list(index_of) if index_of is not None else list(range(len(timed)))
    wall_offset = time.time() - time.perf_counter()
    perf = time.perf_counter
    limit = workload.max_concurrency
    sem = asyncio.Semaphore(limit) if limit else None
    active: set[_StreamParser] = set()
    tally = [0, 0, 0]  # done, failed, tokens of finished timed requests

    async def one(index: int, body: bytes) -> RequestRecord:
        parser = _StreamParser()
        active.add(parser)
        start = perf()
        try:
            async with asyncio.timeout(timeout_s):
                await client.stream(body, parser)
        except TimeoutError:
            parser.error = parser.error or (f"timed out after {timeout_s:g} s (received {parser.events} "
                                            f"events, {parser.chunks} content chunks)")
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            parser.interrupted(exc)
        finally:
            active.discard(parser)
        rec = parser.record(index, start, perf(), wall_offset)
        rec.process = process
        return rec

    async def limited(index: int, body: bytes, at: float, t0: float, report: bool) -> RequestRecord:
        delay = t0 + at - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is None:
            rec = await one(index, body)
        else:
            async with sem:
                rec = await one(index, body)
        if report:
            tally[0] += 1
            tally[1] += 0 if rec.ok else 1
            tally[2] += rec.chunks
            if on_done is not None:
                on_done(rec)
        return rec

    async def ticker() -> None:
        assert on_progress is not None
        while True:
            await asyncio.sleep(0.2)
            on_progress(tally[0], tally[1], tally[2] + sum(p.chunks for p in active))

    try:
        t0 = perf()
        warm_records = list(await asyncio.gather(*(
            limited(-1 - k, request_body(model, p, workload), 0.0, t0, False) for k, p in enumerate(warm))))
        bodies = [request_body(model, p, workload) for p in timed]
        offsets = arrival_offsets(len(timed), workload.request_rate, workload.burstiness, workload.seed)
        if between is not None:
            await between()
        # Connections for the timed requests are opened now, outside the clock (servers drop idle ones).
        await client.prewarm(min(limit or len(timed), len(timed), 1024))
        cpu0 = time.process_time()
        tick = asyncio.create_task(ticker()) if on_progress is not None else None
        t0 = perf()
        try:
            records = list(await asyncio.gather(*(limited(indices[k], bodies[k], offsets[k], t0, True)
                                                  for k in range(len(timed)))))
        finally:
            if tick is not None:
                tick.cancel()
        cpu_s = time.process_time() - cpu0
        if on_progress is not None:
            on_progress(tally[0], tally[1], tally[2])
    finally:
        await client.close()
    return _Execution(records, warm_records, cpu_s)


# --------------------------------------------------------------------------- metrics

@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one latency metric in milliseconds, over all samples."""

    count: int
    mean: float
    std: float
    min: float
    median: float
    p90: float
    p99: float
    max: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (linear interpolation) of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    k = (n - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summarize(values_s: Sequence[float]) -> Summary:
    """Summary in ms of values given in seconds."""
    vals = sorted(v * 1000.0 for v in values_s)
    n = len(vals)
    if n == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / n)
    return Summary(n, mean, std, vals[0], percentile(vals, 50), percentile(vals, 90), percentile(vals, 99),
                   vals[-1])


def latency_samples(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Samples in seconds per latency metric, from successful requests, pooled over all of them."""
    ok = [r for r in records if r.ok]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    return {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": tpots,
        "itl": [gap for r in ok for gap in r.itl],
        "e2e": [r.e2e for r in ok if r.e2e is not None],
    }


def compute_metrics(records: Sequence[RequestRecord]) -> tuple[dict[str, float], dict[str, Summary]]:
    """The figures of a set of timed records (whatever their validity): flat metrics and summaries."""
    ok = [r for r in records if r.ok]
    metrics: dict[str, float] = {"completed": float(len(ok)), "failed": float(len(records) - len(ok))}
    if records:
        first = min(r.start for r in records)
        last = max(r.end for r in records)
        duration = last - first
    else:
        duration = 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    metrics["duration_s"] = duration
    metrics["total_output_tokens"] = float(out_tokens)
    metrics["total_input_tokens"] = float(in_tokens)
    metrics["client_chunks"] = float(sum(r.chunks for r in ok))
    metrics["empty_chunks"] = float(sum(r.empty_chunks for r in ok))
    if duration > 0:
        metrics["output_throughput"] = out_tokens / duration
        metrics["input_throughput"] = in_tokens / duration
        metrics["total_token_throughput"] = (in_tokens + out_tokens) / duration
        metrics["request_throughput"] = len(ok) / duration
        metrics["mean_concurrency"] = math.fsum(r.end - r.start for r in records) / duration
    summaries = {name: summarize(vals) for name, vals in latency_samples(records).items()}
    for name, s in summaries.items():
        metrics[f"mean_{name}_ms"] = s.mean
        metrics[f"median_{name}_ms"] = s.median
        metrics[f"p90_{name}_ms"] = s.p90
        metrics[f"p99_{name}_ms"] = s.p99
        metrics[f"std_{name}_ms"] = s.std
    return metrics, summaries


def _examples(items: Sequence[str], limit: int = 3) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; ... ({len(items) - limit} more)" if len(items) > limit else "")


def invalid_reasons(records: Sequence[RequestRecord], workload: Workload, *,
                    warmup: Sequence[RequestRecord] = (),
                    allow_multi_token_chunks: bool = False) -> list[str]:
    """Why these records cannot give a valid measurement (empty list = valid)."""
    reasons: list[str] = []
    if not records:
        return ["no timed requests were sent"]
    failed = [r for r in records if not r.ok]
    if failed:
        reasons.append(f"{len(failed)} of {len(records)} requests failed (requests are never retried): "
                       + _examples([f"request {r.index}: {r.error}" for r in failed], 2))
    warm_failed = [r for r in warmup if not r.ok]
    if warm_failed:
        reasons.append(f"{len(warm_failed)} of {len(warmup)} warm-up requests failed: {warm_failed[0].error}")
    ok = [r for r in records if r.ok]
    no_usage = [r for r in ok if r.output_tokens is None]
    if no_usage:
        reasons.append(f"{len(no_usage)} requests got no usage.completion_tokens from the server "
                       "(stream_options.include_usage not honoured?): output tokens cannot be counted")
    wrong_len = [r for r in ok if r.output_tokens is not None and r.output_tokens != workload.output_len]
    if wrong_len:
        reasons.append(f"{len(wrong_len)} requests produced a number of tokens other than output_len="
                       f"{workload.output_len} (ignore_eos not honoured, or the server stopped early): "
                       + _examples([f"request {r.index}: {r.output_tokens} tokens, finish_reason="
                                    f"{r.finish_reason}" for r in wrong_len]))
    mismatch = [r for r in ok if r.output_tokens is not None and r.chunks != r.output_tokens
                and not (allow_multi_token_chunks and 0 < r.chunks < r.output_tokens)]
    if mismatch:
        reasons.append(f"{len(mismatch)} requests: the client counted a different number of content chunks "
                       "than the server's usage.completion_tokens (multi-token chunks from speculative "
                       "decoding need allow_multi_token_chunks=True): "
                       + _examples([f"request {r.index}: {r.chunks} chunks vs {r.output_tokens} tokens"
                                    for r in mismatch]))
    single = [r for r in ok if (r.output_tokens or 0) >= 2 and not r.itl]
    if single:
        reasons.append(f"{len(single)} requests of >= 2 tokens arrived as a single chunk (empty ITL): the "
                       "stream was buffered (by a proxy, or the server did not stream)")
    negative = [r for r in ok if (t := r.tpot) is not None and t < 0]
    if negative:
        reasons.append(f"{len(negative)} requests have a negative TPOT (last chunk before the first): "
                       + _examples([f"request {r.index}: {r.tpot!r} s" for r in negative]))
    # A zero TPOT means every chunk of that request came in one read. On a starved 2-core machine a
    # few requests can be delivered that way; when half or more are, the stream was not streamed.
    zero = [r for r in ok if r.tpot == 0]
    if zero and 2 * len(zero) >= len(ok):
        reasons.append(f"{len(zero)} of {len(ok)} requests have TPOT = 0 (all chunks in one read): the "
                       "stream was buffered (by a proxy, or the server did not stream): "
                       + _examples([f"request {r.index}" for r in zero]))
    starts = min(r.start for r in records)
    ends = max(r.end for r in records)
    if ends - starts <= 0:
        reasons.append(f"duration {ends - starts!r} s is not positive")
    return reasons


# --------------------------------------------------------------------------- results

@dataclass(slots=True)
class RunResult:
    """One run of a workload. ``metrics``/``summaries`` are empty when the run is invalid; the figures it
    did produce are in ``diagnostics`` (for the report, never for a gate)."""

    workload: Workload
    transport: str
    per_request: list[RequestRecord]
    metrics: dict[str, float]
    summaries: dict[str, Summary]
    valid: bool
    invalid_reasons: list[str]
    started_at: float  # wall clock of the first timed request's start
    ended_at: float  # wall clock of the last timed request's end
    warmup: list[RequestRecord] = field(default_factory=list)
    diagnostics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    prompts_exact: bool = True
    processes: int = 1
    server_counter: str | None = None
    server_output_throughput: float | None = None
    server_check: str | None = None
    client_cpu_fraction: float | None = None  # client CPU seconds / duration, per client process
    client_cpu_s: float | None = None  # the load generator's CPU seconds in the timed phase, all processes
    event_loop: str = "asyncio"  # the client's event loop: "asyncio" or "uvloop" (see event_loop_name)

    @property
    def client_cpu_ms_per_request(self) -> float | None:
        """The load generator's own CPU cost per timed request (ms; all client processes together)."""
        if self.client_cpu_s is None or not self.per_request:
            return None
        return self.client_cpu_s * 1000.0 / len(self.per_request)

    def metric(self, name: str) -> float:
        """A figure of a valid run; raises :class:`InvalidRunError` (with the reasons) otherwise."""
        if not self.valid:
            raise InvalidRunError(f"workload {self.workload.name!r}: the run is invalid, {name} is not a "
                                  "measurement: " + " | ".join(self.invalid_reasons))
        try:
            return self.metrics[name]
        except KeyError:
            raise KeyError(f"unknown metric {name!r} (known: {', '.join(sorted(self.metrics))})") from None

    def to_dict(self, per_request: bool = True) -> dict[str, Any]:
        wl = asdict(self.workload)
        if math.isinf(wl["request_rate"]):
            wl["request_rate"] = "inf"
        out: dict[str, Any] = {
            "workload": wl, "transport": self.transport, "valid": self.valid,
            "invalid_reasons": list(self.invalid_reasons), "metrics": _finite(self.metrics),
            "summaries": {k: _finite(asdict(v)) for k, v in self.summaries.items()},
            "diagnostics": _finite(self.diagnostics), "started_at": self.started_at,
            "ended_at": self.ended_at,
            "notes": list(self.notes), "prompts_exact": self.prompts_exact, "processes": self.processes,
            "server_counter": self.server_counter, "server_output_throughput": self.server_output_throughput,
            "server_check": self.server_check, "client_cpu_fraction": self.client_cpu_fraction,
            "event_loop": self.event_loop,
            "client_cpu_s": self.client_cpu_s, "client_cpu_ms_per_request": self.client_cpu_ms_per_request,
            "metric_definitions": dict(METRIC_DEFINITIONS),
        }
        if per_request:
            out["per_request"] = [r.to_dict() for r in self.per_request]
            out["warmup"] = [r.to_dict() for r in self.warmup]
        return out


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: undefined figures become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def evaluate(records: Sequence[RequestRecord], workload: Workload, *, transport: str,
             warmup: Sequence[RequestRecord] = (), prompts: Sequence[Prompt] = (),
             allow_multi_token_chunks: bool = False, processes: int = 1,
             server_counter: str | None = None, server_tokens: float | None = None,
             cross_check_bound: float = 0.03, client_cpu_s: float | None = None) -> RunResult:
    """Build the :class:`RunResult` of timed records: figures, validity, notes."""
    recs = sorted(records, key=lambda r: (r.start, r.index))
    metrics, summaries = compute_metrics(recs)
    reasons = invalid_reasons(recs, workload, warmup=warmup,
                              allow_multi_token_chunks=allow_multi_token_chunks)
    notes: list[str] = []
    zero_tpot = [r for r in records if r.ok and r.tpot == 0]
    if zero_tpot:
        notes.append(f"{len(zero_tpot)} request(s) had TPOT = 0 (all chunks of the request in one read: "
                     "the server or the client was starved); counted, since fewer than half were")
    exact = all(p.exact for p in prompts) if prompts else False
    if prompts and not exact:
        notes.append(f"prompts are approximate ({workload.input_len} words, no tokenizer given): input "
                     "lengths in tokens are not controlled")
    if any(p.is_token_ids for p in prompts):
        notes.append("some prompts were sent as token ids (text could not be made exactly input_len tokens)")
    prompt_counts = sorted({r.prompt_tokens for r in recs if r.ok and r.prompt_tokens is not None})
    if exact and prompt_counts and prompt_counts != [workload.input_len]:
        notes.append(f"server counted prompt lengths {prompt_counts[:5]} for input_len={workload.input_len} "
                     "(special tokens such as BOS added by the server?)")
    duration = metrics.get("duration_s", 0.0)
    cpu_fraction = client_cpu_s / duration / processes if client_cpu_s is not None and duration > 0 else None
    if cpu_fraction is not None and cpu_fraction > 0.9:
        notes.append(f"the load generator used {cpu_fraction:.0%} of a core per client process: the figures "
                     "may be limited by the client (use more client processes)")
    gaps = [g for r in recs if r.ok for g in r.itl]
    zero = sum(1 for g in gaps if g == 0.0)
    if gaps and zero / len(gaps) > 0.2:
        notes.append(f"{zero / len(gaps):.0%} of ITL gaps are 0 (chunks read together): the client fell "
                     "behind the stream, or the server sends several chunks per step")
    empty = sum(r.empty_chunks for r in recs if r.ok)
    chunks = sum(r.chunks for r in recs if r.ok)
    if chunks and empty / chunks > 0.1:
        notes.append(f"{empty / chunks:.0%} of content chunks had empty text (special tokens after EOS under "
                     "ignore_eos, or NaN logits: see the correctness checks)")
    server_tps: float | None = None
    check: str | None = None
    if server_counter is not None:
        if server_tokens is None or duration <= 0:
            check = f"server counter {server_counter!r} unavailable: not cross-checked"
            notes.append(check)
        else:
            server_tps = server_tokens / duration
            ok, check = cross_check(metrics.get("output_throughput", 0.0), server_tps, cross_check_bound)
            if not ok:
                reasons.append(check + " (other traffic on the server, or a token-counting bug)")
    valid = not reasons
    started = recs[0].start if recs else math.nan
    ended = max((r.end for r in recs), default=math.nan)
    return RunResult(
        workload=workload, transport=transport, per_request=recs, metrics=metrics if valid else {},
        summaries=summaries if valid else {}, valid=valid, invalid_reasons=reasons, started_at=started,
        ended_at=ended, warmup=list(warmup), diagnostics={} if valid else metrics, notes=notes,
        prompts_exact=exact, processes=processes, server_counter=server_counter,
        server_output_throughput=server_tps, server_check=check, client_cpu_fraction=cpu_fraction,
        client_cpu_s=client_cpu_s)


# --------------------------------------------------------------------------- server counters

def _split_sample(line: str) -> tuple[str, str] | None:
    """(metric name, value) of a Prometheus sample line; labels may hold spaces and braces in quotes."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        i, quoted = brace + 1, False
        while i < len(line):
            ch = line[i]
            if ch == "\\" and quoted:
                i += 2
                continue
            if ch == '"':
                quoted = not quoted
            elif ch == "}" and not quoted:
                break
            i += 1
        rest = line[i + 1:].split()
    else:
        parts = line.split()
        if len(parts) < 2:
            return None
        name, rest = parts[0], parts[1:]
    return (name, rest[0]) if rest else None


def counter_value(metrics_text: str, counter: str) -> float | None:
    """Sum over label sets of a counter in Prometheus text; ``counter`` may omit the ``_total`` suffix."""
    names = [counter] if counter.endswith("_total") else [counter, counter + "_total"]
    totals: dict[str, float] = {}
    for raw in metrics_text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None or sample[0] not in names:
            continue
        try:
            value = float(sample[1])
        except ValueError:
            continue
        totals[sample[0]] = totals.get(sample[0], 0.0) + value
    for name in names:
        if name in totals:
            return totals[name]
    return None


def server_counter_throughput(metrics_before: str, metrics_after: str, counter: str,
                              duration_s: float) -> float | None:
    """(counter after − counter before) / duration_s from two /metrics scrapes; None when the counter is
    absent from either scrape, went down (the server restarted) or the duration is not positive."""
    before = counter_value(metrics_before, counter)
    after = counter_value(metrics_after, counter)
    if before is None or after is None or duration_s <= 0 or after < before:
        return None
    return (after - before) / duration_s


def cross_check(client_tps: float, server_tps: float | None, bound: float = 0.03) -> tuple[bool, str]:
    """Does the client's throughput agree with the server's own counter within ``bound`` (relative)?"""
    if server_tps is None:
        return True, "server counter unavailable: not cross-checked"
    if server_tps <= 0:
        ok = client_tps <= 0
        return ok, f"client {client_tps:.1f} tok/s vs server counter {server_tps:.1f} tok/s"
    diff = (client_tps - server_tps) / server_tps
    ok = abs(diff) <= bound
    verdict = "agree" if ok else "DISAGREE"
    return ok, (f"client {client_tps:.1f} tok/s vs server counter {server_tps:.1f} tok/s: {diff:+.1%} "
                f"({verdict}, bound ±{bound:.0%})")


def _fetch_text(base_url: str, path: str, api_key: str | None, timeout_s: float = 10.0) -> str | None:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = _Target(base_url)
    try:
        resp = httpx.get(f"{target.scheme}://{target.netloc}{target.prefix}{path}", headers=headers,
                         timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


# --------------------------------------------------------------------------- entry points

async def run_workload_async(base_url: str, model: str, workload: Workload, *,
                             prompts: Sequence[Prompt] | None = None, tokenize: Tokenize | None = None,
                             detokenize: Detokenize | None = None, api_key: str | None = None,
                             transport: Transport = "lean", progress: bool = True,
                             timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                             allow_multi_token_chunks: bool = False,
                             cross_check_bound: float = 0.03) -> RunResult:
    """Run ``workload`` against ``base_url`` (the server root, e.g. ``http://127.0.0.1:8000``).

    ``prompts`` (from :func:`build_prompts`) are built here when not given. ``server_counter`` (e.g.
    ``vllm:generation_tokens``) is scraped from ``/metrics`` after the warm-up and after the run, and
    the client's output throughput must agree with it within ``cross_check_bound``.
    """
    plist = list(prompts) if prompts is not None else build_prompts(workload, tokenize, detokenize)
    n_timed = sum(1 for p in plist if not p.warmup)
    bar = Progress(n_timed, workload.name, progress)
    scrapes: list[str | None] = []

    async def between() -> None:
        if server_counter is not None:
            scrapes.append(await asyncio.to_thread(_fetch_text, base_url, "/metrics", api_key))
        bar.started = time.monotonic()

    def on_progress(done: int, failed: int, tokens: int) -> None:
        bar.update(done, failed, tokens, force=done == n_timed)

    try:
        execution = await _execute(base_url, model, plist, workload, api_key=api_key, transport=transport,
                                   timeout_s=timeout_s, between=between,
                                   on_progress=on_progress if bar.enabled else None)
    finally:
        bar.close()
    server_tokens: float | None = None
    if server_counter is not None:
        after = await asyncio.to_thread(_fetch_text, base_url, "/metrics", api_key)
        server_tokens = _counter_delta(scrapes[0] if scrapes else None, after, server_counter)
    result = evaluate(execution.records, workload, transport=transport, warmup=execution.warmup, prompts=plist,
                      allow_multi_token_chunks=allow_multi_token_chunks, server_counter=server_counter,
                      server_tokens=server_tokens, cross_check_bound=cross_check_bound,
                      client_cpu_s=execution.cpu_s)
    result.event_loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    return result


def _counter_delta(before: str | None, after: str | None, counter: str) -> float | None:
    if before is None or after is None:
        return None
    tps = server_counter_throughput(before, after, counter, 1.0)
    return tps


def run_workload(base_url: str, model: str, workload: Workload, *, prompts: Sequence[Prompt] | None = None,
                 tokenize: Tokenize | None = None, detokenize: Detokenize | None = None,
                 api_key: str | None = None, transport: Transport = "lean", progress: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                 allow_multi_token_chunks: bool = False, cross_check_bound: float = 0.03) -> RunResult:
    """Synchronous :func:`run_workload_async` (in a helper thread when an event loop is already running)."""
    def coro() -> Awaitable[RunResult]:
        return run_workload_async(base_url, model, workload, prompts=prompts, tokenize=tokenize,
                                  detokenize=detokenize, api_key=api_key, transport=transport,
                                  progress=progress,
                                  timeout_s=timeout_s, server_counter=server_counter,
                                  allow_multi_token_chunks=allow_multi_token_chunks,
                                  cross_check_bound=cross_check_bound)
    return _run_sync(coro)


LOOP_ENV = "PYTEST_LLMSERVE_EVENT_LOOP"


def event_loop_name() -> str:
    """``uvloop`` when it is installed (``pip install pytest-llmserve[fast]``) and not turned off with
    ``$PYTEST_LLMSERVE_EVENT_LOOP=asyncio``; else ``asyncio``. uvloop halves the client's cost per read."""
    choice = os.environ.get(LOOP_ENV, "auto").strip().lower()
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"${LOOP_ENV} = {choice!r}: must be auto, uvloop or asyncio")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError(f"${LOOP_ENV} = 'uvloop' but uvloop is not installed "
                             "(pip install 'pytest-llmserve[fast]')") from None
        return "asyncio"
    return "uvloop"


def run_loop(main: Coroutine[Any, Any, _R]) -> _R:
    """``asyncio.run`` on the load generator's event loop (see :func:`event_loop_name`)."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def _run_sync(coro: Callable[[], Awaitable[RunResult]]) -> RunResult:
    async def main() -> RunResult:
        return await coro()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_loop(main())
    box: list[RunResult] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(run_loop(main()))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="llmserve-load")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


# --------------------------------------------------------------------------- several client processes

def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers differing by at most one (larger first)."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def merge_records(per_process: Sequence[Sequence[RequestRecord]]) -> list[RequestRecord]:
    """All processes' records in one list ordered by start (wall-clock aligned); every sample is kept, so
    percentiles and the duration are computed over the union, never averaged across processes."""
    merged = [r for recs in per_process for r in recs]
    merged.sort(key=lambda r: (r.start, r.index))
    return merged


def _child_main(args: dict[str, Any], ready: Any, go: Any, results: Any, counter: Any) -> None:
    """Entry point of one client process (spawned): run its share, report records as dicts."""
    process = int(args["process"])
    try:
        prompts = [Prompt(tuple(p[0]) if isinstance(p[0], list) else p[0], p[1], p[2], p[3])
                   for p in args["prompts"]]
        workload = Workload(**args["workload"])

        def on_done(rec: RequestRecord) -> None:
            with counter.get_lock():
                counter.value += 1

        async def between() -> None:
            await asyncio.to_thread(ready.wait, args["timeout_s"])
            await asyncio.to_thread(go.wait, args["timeout_s"])

        execution = run_loop(_execute(
            args["base_url"], args["model"], prompts, workload, api_key=args["api_key"],
            transport=args["transport"], timeout_s=args["timeout_s"], on_done=on_done, between=between,
            index_of=args["indices"], process=process))
        results.put((process, [r.to_dict() for r in execution.records],
                     [r.to_dict() for r in execution.warmup], execution.cpu_s, None))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        with contextlib.suppress(Exception):
            ready.abort()
            go.abort()
        results.put((process, [], [], 0.0, f"{type(exc).__name__}: {exc}"))


def run_workload_multiprocess(base_url: str, model: str, workload: Workload, *, processes: int,
                              prompts: Sequence[Prompt] | None = None, tokenize: Tokenize | None = None,
                              detokenize: Detokenize | None = None, api_key: str | None = None,
                              transport: Transport = "lean", progress: bool = True,
                              timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                              allow_multi_token_chunks: bool = False,
                              cross_check_bound: float = 0.03) -> RunResult:
    """Run ``workload`` from ``processes`` client processes (spawned) when one core cannot keep up.

    Prompts are built here and dealt round-robin; each process gets its share of the concurrency limit
    and of the request rate (a sum of independent Poisson streams is Poisson), warms up, then all start
    together (barrier). Records are merged by :func:`merge_records` on a common wall clock.
    """
    plist = list(prompts) if prompts is not None else build_prompts(workload, tokenize, detokenize)
    warm = [p for p in plist if p.warmup]
    timed = [p for p in plist if not p.warmup]
    n = max(1, min(processes, len(timed), workload.max_concurrency or processes))
    if n == 1:
        return run_workload(base_url, model, workload, prompts=plist, api_key=api_key, transport=transport,
                            progress=progress, timeout_s=timeout_s, server_counter=server_counter,
                            allow_multi_token_chunks=allow_multi_token_chunks,
                            cross_check_bound=cross_check_bound)
    conc = split_evenly(workload.max_concurrency, n) if workload.max_concurrency else [0] * n
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(n + 1)
    go = ctx.Barrier(n + 1)
    results = ctx.Queue()
    counter = ctx.Value("i", 0)
    procs = []
    for k in range(n):
        share = timed[k::n]
        warm_share = warm[k::n]
        sub = replace(workload, name=f"{workload.name}#{k}", num_prompts=len(share), warmup=len(warm_share),
                      max_concurrency=conc[k] or None, request_rate=workload.request_rate / n,
                      seed=workload.seed + k)
        args = {
            "process": k, "base_url": base_url, "model": model, "api_key": api_key, "transport": transport,
            "timeout_s": timeout_s, "workload": asdict(sub), "indices": list(range(len(timed)))[k::n],
            "prompts": [(list(p.prompt) if isinstance(p.prompt, tuple) else p.prompt, p.num_tokens, p.exact,
                         p.warmup) for p in warm_share + share],
        }
        proc = ctx.Process(target=_child_main, args=(args, ready, go, results, counter),
                           name=f"llmserve-load-{k}", daemon=True)
        proc.start()
        procs.append(proc)
    bar = Progress(len(timed), f"{workload.name} x{n} processes", progress)
    got: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]], float, str | None]] = {}
    before: str | None = None
    try:
        try:
            ready.wait(timeout_s + 120)
            if server_counter is not None:
                before = _fetch_text(base_url, "/metrics", api_key)
            go.wait(60)
        except threading.BrokenBarrierError:
            pass  # a child failed; its message arrives through the queue
        deadline = time.monotonic() + timeout_s + 120
        while len(got) < n and time.monotonic() < deadline:
            try:
                k, recs, warm_recs, cpu_s, err = results.get(timeout=0.1)
                got[k] = (recs, warm_recs, cpu_s, err)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
            bar.update(counter.value, 0, 0)
    finally:
        bar.close()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    errors = [f"client process {k}: {v[3]}" for k, v in sorted(got.items()) if v[3]]
    missing = [k for k in range(n) if k not in got]
    errors += [f"client process {k} exited without results (exit code {procs[k].exitcode})" for k in missing]
    if errors:
        raise LLMServeError("multi-process load generation failed: " + "; ".join(errors))
    per_process = [[RequestRecord.from_dict(d) for d in got[k][0]] for k in range(n)]
    warm_records = [RequestRecord.from_dict(d) for k in range(n) for d in got[k][1]]
    merged = merge_records(per_process)
    server_tokens: float | None = None
    if server_counter is not None:
        server_tokens = _counter_delta(before, _fetch_text(base_url, "/metrics", api_key), server_counter)
    result = evaluate(merged, workload, transport=transport, warmup=warm_records, prompts=plist,
                      allow_multi_token_chunks=allow_multi_token_chunks, processes=n,
                      server_counter=server_counter, server_tokens=server_tokens,
                      cross_check_bound=cross_check_bound, client_cpu_s=sum(v[2] for v in got.values()))
    result.event_loop = event_loop_name()  # what the client processes ran
    return result


__all__ = [
    "HIGHER_IS_BETTER", "METRIC_DEFINITIONS", "HttpxTransport", "InvalidRunError", "LeanTransport",
    "Progress",
    "Prompt", "RequestRecord", "RunResult", "Summary", "arrival_offsets", "build_prompts", "compute_metrics",
    "counter_value", "cross_check", "evaluate", "event_loop_name", "invalid_reasons", "latency_samples",
    "make_transport",
    "merge_records", "percentile", "request_body", "run_loop", "run_workload", "run_workload_async",
    "run_workload_multiprocess", "server_counter_throughput", "split_evenly", "summarize",
]
