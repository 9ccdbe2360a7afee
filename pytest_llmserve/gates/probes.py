"""Independent probes sent together: requests whose verdict does not depend on the batch they share.

Known answers, NaN probes, long greedy decodes and property examples judge each response on its own, so
they need not go out one after another: a server answers a batch of them at several times the throughput
of one (vLLM on 2 CPU cores: ~160 vs ~25 output tok/s at 8 vs 1 in flight). Checks whose verdict depends
on what shares the batch (greedy determinism, batch-size cases and their batch-1 references, the
differential) never come here and keep their controlled composition.

Three steps, each check's requests written once, in its own oracle:

* **plan**: run the check against a :class:`RecordingClient`, which records every request and answers
  with a neutral placeholder (an empty response that stops at once and breaks no invariant), so the
  check's code says what it will send and nothing is written twice;
* **send**: :meth:`ServerProbes.send` sends the planned requests of one or many checks at once, at most
  ``concurrency`` in flight (the server's batch capacity, :func:`concurrency_bound`), holding the
  server's request lock shared for the whole batch (a benchmark round never runs inside it);
* **judge**: the check runs again on a client whose ``answers`` are those responses
  (:class:`AnswerBook`: each given out once, so the same request sent twice, e.g. a seeded request
  repeated, gets its two own answers); what it did not plan (a follow-up that depends on an answer)
  is sent then, as before. Findings, messages and verdicts are those of the check run alone.

No pytest import: the plugin decides which tests' probes go together (:meth:`ServerProbes.prefetch`,
once per server and process, for the built-in suite) and hands each test its own answers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import (
    LLMClient,
    ProbeRequest,
    RequestKey,
    StreamedCompletion,
)
from pytest_llmserve.evidence.completion import Completion

#: In flight at once when the server's batch capacity is neither configured nor reported.
DEFAULT_PROBE_CONCURRENCY = 8

Answer = Completion | StreamedCompletion | RequestError


def concurrency_bound(requested: int | None, configured: int | None = None, reported: int | None = None) -> int:
    """How many independent probes to keep in flight: the server's batch capacity (``configured``
    max_batch_size / max-num-seqs, else ``reported`` by the server's facts, else
    :data:`DEFAULT_PROBE_CONCURRENCY`), and never more than ``requested`` (the probe_concurrency
    setting; 1 sends them one at a time, as checks did before)."""
    capacity = configured or reported or DEFAULT_PROBE_CONCURRENCY
    return max(1, min(requested, capacity) if requested is not None else capacity)


# ------------------------------------------------------------------------------------------ plan

class RecordingClient(LLMClient):
    """Stands in for the server while a check is planned: records each request it would send and
    answers with :func:`placeholder`; sends nothing (auxiliary GETs answer None)."""

    def __init__(self, model: str, kind: str = "other") -> None:  # no super().__init__: no connection pool
        self.base_url = "http://planning.invalid"
        self.model = model
        self.timeout_s = 1.0
        self.accounting = None
        self.request_lock = None
        self.request_kind = kind
        self.answers = None
        self.planned: list[ProbeRequest] = []

    def close(self) -> None:
        pass

    def post_json(self, path: str, body: dict[str, Any], timeout_s: float | None = None, *,
                  kind: str | None = None) -> Completion:
        self.planned.append(ProbeRequest("post", path, dict(body), kind or self.request_kind))
        return placeholder(body)

    def stream_now(self, body: dict[str, Any], timeout_s: float | None = None, *,
                   kind: str | None = None) -> StreamedCompletion:
        self.planned.append(ProbeRequest("stream", "/v1/completions", dict(body), kind or self.request_kind))
        return StreamedCompletion(placeholder(body), chunks=1, usage_chunks=1, finish_reasons=["stop"], done=True)

    def complete_concurrently(self, prompts: list[str | list[int]], max_tokens: int,
                              **kwargs: Any) -> list[Completion]:
        return [self.complete(p, max_tokens, **kwargs) for p in prompts]

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        raise RequestError(f"GET {path}: not sent while planning")

    def tokenize(self, text: str) -> list[int] | None:
        return None

    def metrics_text(self) -> str | None:
        return None


def placeholder(body: dict[str, Any]) -> Completion:
    """The planning answer: HTTP 200, no token, finished by ``stop``: it breaks no invariant a check
    holds a response to, so a check that stops at its first failure (Hypothesis) plans every request."""
    return Completion(request=dict(body), status=200, text="", finish_reason="stop", prompt_tokens=1,
                      completion_tokens=0)


def plan(check: Callable[[LLMClient], Any], model: str, kind: str = "other") -> list[ProbeRequest]:
    """The requests ``check`` sends, in order, from a dry run against a :class:`RecordingClient`. A check
    that raises on the placeholders has planned what it sent until then."""
    recorder = RecordingClient(model, kind)
    try:
        check(recorder)
    except Exception:  # noqa: BLE001 - a failed dry run only plans less; the real run reports
        pass
    return recorder.planned


# ------------------------------------------------------------------------------------------ answers

@dataclass(frozen=True, slots=True)
class SentBatch:
    """One batch of requests sent together, and the server's state just before it (for the checks that
    read what their requests left behind: NaN lines in the log, NaN counters in /metrics)."""

    size: int
    concurrency: int
    log_offset: int  # length of the server's log before the batch
    metrics_before: str | None  # /metrics before the batch
    wall_s: float = 0.0


class AnswerBook:
    """Answers by request, each given out once (thread-safe); remembers the batch each came from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[RequestKey, deque[tuple[Answer, SentBatch | None]]] = {}

    def put(self, key: RequestKey, answer: Answer, batch: SentBatch | None = None) -> None:
        with self._lock:
            self._answers.setdefault(key, deque()).append((answer, batch))

    def take(self, key: RequestKey) -> Answer | None:
        got = self.take_with_batch(key)
        return got[0] if got is not None else None

    def take_with_batch(self, key: RequestKey) -> tuple[Answer, SentBatch | None] | None:
        with self._lock:
            queue = self._answers.get(key)
            if not queue:
                return None
            answer = queue.popleft()
            if not queue:
                del self._answers[key]
            return answer

    def __len__(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._answers.values())


# ------------------------------------------------------------------------------------------ one server

@dataclass
class ServerProbes:
    """The independent probes of one server in this process.

    ``server``: anything with ``client()``, ``log_text()`` and ``metrics_text()`` (a running server).
    ``concurrency``: at most this many in flight (:func:`concurrency_bound`); 1 means checks send their
    requests themselves, one at a time, as before.
    """

    server: Any
    concurrency: int
    _items: dict[str, AnswerBook] = field(default_factory=dict)
    planned_items: set[str] = field(default_factory=set)  # tests whose requests were sent ahead
    batches: list[SentBatch] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def together(self) -> bool:
        return self.concurrency > 1

    def send(self, requests: Sequence[ProbeRequest], client: LLMClient | None = None) -> tuple[list[Answer], SentBatch]:
        """Send ``requests`` at once (at most :attr:`concurrency` in flight); the answers in their order,
        transport failures as :class:`RequestError` values."""
        own = client is None
        client = client or self.server.client()
        try:
            log_offset = len(self.server.log_text())
            metrics_before = client.metrics_text()
            lock = client.request_lock
            start = time.monotonic()
            # Held shared once for the whole batch: a benchmark round never splits it.
            with lock.shared() if lock is not None else nullcontext(), \
                    ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(requests)))) as pool:
                answers = list(pool.map(lambda r: _send_one(client, r), requests))
            batch = SentBatch(len(requests), self.concurrency, log_offset, metrics_before,
                              time.monotonic() - start)
        finally:
            if own:
                client.close()
        self.batches.append(batch)
        return answers, batch

    def prefetch(self, plans: Mapping[str, Sequence[ProbeRequest]]) -> SentBatch | None:
        """Send the planned requests of several tests (by test id) together; each test then takes its own
        answers with :meth:`answers_for`. A test already planned is not planned again."""
        with self._lock:
            plans = {item: requests for item, requests in plans.items() if item not in self.planned_items}
            self.planned_items.update(plans)
            flat = [(item, request) for item, requests in plans.items() for request in requests]
            if not flat:
                return None
            answers, batch = self.send([request for _, request in flat])
            for (item, request), answer in zip(flat, answers, strict=True):
                self._items.setdefault(item, AnswerBook()).put(request.key, answer, batch)
            return batch

    def answers_for(self, item: str) -> AnswerBook:
        """The answers prefetched for test ``item`` (empty when none), given to it once."""
        with self._lock:
            return self._items.pop(item, None) or AnswerBook()

    def answer(self, planned: Sequence[ProbeRequest], client: LLMClient,
               prefetched: AnswerBook | None = None) -> tuple[AnswerBook, SentBatch | None]:
        """Answers for one check's ``planned`` requests: those in ``prefetched`` (the test's share of the
        prefetch), the rest sent now, together. Also the earliest batch any of them came from."""
        book = AnswerBook()
        missing: list[ProbeRequest] = []
        earliest: SentBatch | None = None
        for request in planned:
            got = prefetched.take_with_batch(request.key) if prefetched is not None else None
            if got is None:
                missing.append(request)
                continue
            book.put(request.key, got[0], got[1])
            earliest = earliest or got[1]
        if missing:
            answers, batch = self.send(missing, client)
            for request, answer in zip(missing, answers, strict=True):
                book.put(request.key, answer, batch)
            earliest = earliest or batch
        return book, earliest


def _send_one(client: LLMClient, request: ProbeRequest) -> Answer:
    try:
        return client.send(request)
    except RequestError as exc:
        return exc


__all__ = ["DEFAULT_PROBE_CONCURRENCY", "AnswerBook", "RecordingClient", "SentBatch", "ServerProbes",
           "concurrency_bound", "placeholder", "plan"]
