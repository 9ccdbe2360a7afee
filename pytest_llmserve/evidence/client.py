"""Requests for correctness checks: completions with logprobs, parsed into plain records
(:mod:`pytest_llmserve.evidence.completion`).

HTTP errors are *returned* as a :class:`Completion` with ``status`` and ``error`` set rather than
raised, because an error can itself be evidence (vLLM answers HTTP 400 "Out of range float values
are not JSON compliant" when a logprob is NaN). Transport failures (refused, timeout, a stream that
stops mid-way) raise :class:`RequestError` with what was sent and what was received.

JSON is parsed with Python's ``json`` module, which accepts ``NaN``/``Infinity`` tokens, so a server
that emits them is seen, not hidden.

Every generation goes out through one of two doors, :meth:`LLMClient.post_json` (``/v1/completions``,
``/v1/chat/completions``) and :meth:`LLMClient.stream` (streamed ``/v1/completions``); a client given
``answers`` (requests already sent together, see :mod:`pytest_llmserve.gates.probes`) takes a request's
answer from there first, so a check reads its responses the same way whether they were sent one at a time
or in one batch ahead of it. A server page (``/metrics``, ``/version``) is read through the one page reader,
:func:`pytest_llmserve.evidence.pages.read_page` (:meth:`LLMClient.page`), on this client's connections.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.completion import Completion, TokenLogprob, short_repr
from pytest_llmserve.evidence.pages import Page, auth_headers, read_page


@dataclass(slots=True)
class StreamedCompletion:
    """A streamed /v1/completions response, joined into one :class:`Completion`, and how it streamed."""

    completion: Completion
    chunks: int = 0  # data chunks with a choice
    usage_chunks: int = 0  # chunks that carried ``usage``
    finish_reasons: list[str] = field(default_factory=list)  # every non-null finish_reason seen
    done: bool = False  # "data: [DONE]" arrived


RequestMode = Literal["post", "stream"]
#: What identifies a request among those sent ahead: door, path and the JSON body (keys sorted).
RequestKey = tuple[str, str, str]
#: Request kinds for the suite's accounting of where the request time went.
REQUEST_KINDS = ("probes", "batch", "properties", "benchmark", "other")


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One request as a check sends it: enough to send it again, and to find its answer by :attr:`key`."""

    mode: RequestMode
    path: str
    body: dict[str, object]
    kind: str = "other"  # one of REQUEST_KINDS: whose time it is in the accounting

    @property
    def key(self) -> RequestKey:
        return request_key(self.mode, self.path, self.body)


def request_key(mode: str, path: str, body: dict[str, object]) -> RequestKey:
    return (mode, path, json.dumps(body, sort_keys=True, ensure_ascii=False, default=str))


#: An answer sent ahead: the response, or the transport failure the request met (raised again on use).
class Answers(Protocol):
    """Answers of requests already sent, each given out once (see :class:`pytest_llmserve.gates.probes.AnswerBook`)."""

    def take(self, key: RequestKey) -> Completion | StreamedCompletion | RequestError | None: ...


def parse_completion_choice(choice: dict[str, Any]) -> tuple[str, list[TokenLogprob], str | None, object]:
    """Parse one ``/v1/completions`` choice (legacy logprobs format) into text and token records."""
    text = choice.get("text") or ""
    tokens: list[TokenLogprob] = []
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        toks = lp.get("tokens") or []
        vals = lp.get("token_logprobs") or []
        tops = lp.get("top_logprobs") or []
        for i, tok in enumerate(toks):
            value = vals[i] if i < len(vals) else None
            top_raw = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            tokens.append(TokenLogprob(str(tok), _as_float(value), {str(k): _as_float(v) for k, v in top_raw.items()}))
    # Chat format: logprobs.content = [{token, logprob, top_logprobs: [{token, logprob}]}]
    if isinstance(lp, dict) and "content" in lp and isinstance(lp["content"], list):
        tokens = [TokenLogprob(str(c.get("token")), _as_float(c.get("logprob")),
                               {str(t.get("token")): _as_float(t.get("logprob")) for t in c.get("top_logprobs") or []})
                  for c in lp["content"]]
    return text, tokens, choice.get("finish_reason"), choice.get("matched_stop", choice.get("stop_reason"))


def _as_float(value: object) -> float | None:
    if not isinstance(value, int | float | str):  # null, or not a number a JSON answer could hold
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class RequestTimer(Protocol):
    """Where a client's request time is counted: the suite's accounting, as a server hands it on
    (:class:`pytest_llmserve.server.handle.TimeAccount`)."""

    def requests(self, kind: str = "other") -> AbstractContextManager[object]: ...


class SharedRequestLock(Protocol):
    """The server's request lock as a correctness client sees it (see
    :class:`pytest_llmserve.server.isolation.RequestLock`): held shared while a request is in flight."""

    def acquire_shared(self) -> None: ...

    def release_shared(self) -> None: ...

    def shared(self) -> AbstractContextManager[None]: ...


class _ReleasingStream(httpx.SyncByteStream):
    """A response body that gives the shared lock back when it is closed (read to the end, or left)."""

    def __init__(self, inner: httpx.SyncByteStream, lock: SharedRequestLock) -> None:
        self._inner = inner
        self._lock: SharedRequestLock | None = lock

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        lock, self._lock = self._lock, None
        try:
            self._inner.close()
        finally:
            if lock is not None:
                lock.release_shared()


class SharedLockTransport(httpx.BaseTransport):
    """Every POST (a generation, a tokenization) holds the server's lock shared from the moment it is
    sent until its response is closed, streamed responses included; GETs (``/metrics``, ``/version``)
    leave the engine's running requests alone and go straight through."""

    def __init__(self, inner: httpx.BaseTransport, lock: SharedRequestLock) -> None:
        self._inner = inner
        self._lock = lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return self._inner.handle_request(request)
        self._lock.acquire_shared()
        try:
            response = self._inner.handle_request(request)
        except BaseException:
            self._lock.release_shared()
            raise
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_ReleasingStream(response.stream, self._lock),
                              extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()


class LLMClient:
    """A small synchronous client for correctness requests (not for load generation).

    Given the server's ``request_lock`` (the plugin's servers have one), each request holds it shared,
    so no request of this client reaches the server while a benchmark round holds it exclusively.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 300.0,
                 accounting: RequestTimer | None = None, request_lock: SharedRequestLock | None = None,
                 request_kind: str = "other") -> None:
        self.base_url = base_url.rstrip("/")
        self.accounting = accounting  # counts the time spent waiting on the server as request time
        self.request_kind = request_kind  # ... under this kind (REQUEST_KINDS)
        self.request_lock = request_lock
        # Answers of requests sent ahead, together: a request found there is not sent again.
        self.answers: Answers | None = None
        self.model = model
        self.timeout_s = timeout_s
        headers = auth_headers(api_key)
        # No pool limit: a batch case of N concurrent requests must reach the server as N connections.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        transport: httpx.BaseTransport = httpx.HTTPTransport(limits=limits)
        if request_lock is not None:
            transport = SharedLockTransport(transport, request_lock)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _aux(self, timeout_s: float) -> float:
        """An auxiliary request's timeout (metrics, version, tokenize): its own, never above the client's."""
        return min(timeout_s, self.timeout_s)

    def page(self, path: str, timeout_s: float = 10.0) -> Page:
        """A page of the server (``/version``, ``/metrics``): :func:`~pytest_llmserve.evidence.pages.read_page` on
        this client's connections."""
        return read_page(self.base_url, path, timeout_s=self._aux(timeout_s), http=self._http)

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response:
        """Any GET, its raw response; a server's page is read with :meth:`page`."""
        return self._http.get(path, timeout=self._aux(timeout_s))

    def complete(self, prompt: str | list[int], max_tokens: int = 16, *, temperature: float = 0.0,
                 logprobs: int | None = 5, seed: int | None = 0, ignore_eos: bool = False,
                 stop: list[str] | None = None, timeout_s: float | None = None, **extra: object) -> Completion:
        """POST /v1/completions and parse the first choice. HTTP errors come back as a Completion."""
        body: dict[str, object] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": temperature}
        if logprobs is not None:
            body["logprobs"] = logprobs
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        if stop:
            body["stop"] = stop
        body.update(extra)
        return self._post("/v1/completions", body, timeout_s)

    def chat(self, content: str, max_tokens: int = 32, *, temperature: float = 0.0, logprobs: int | None = 5,
             seed: int | None = 0, timeout_s: float | None = None, **extra: object) -> Completion:
        """POST /v1/chat/completions with one user message (the chat template applies)."""
        body: dict[str, object] = {"model": self.model, "messages": [{"role": "user", "content": content}],
                                "max_tokens": max_tokens, "temperature": temperature}
        if logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = logprobs
        if seed is not None:
            body["seed"] = seed
        body.update(extra)
        return self._post("/v1/chat/completions", body, timeout_s)

    def _post(self, path: str, body: dict[str, object], timeout_s: float | None) -> Completion:
        answer = self._answer("post", path, body)
        if answer is not None:
            assert isinstance(answer, Completion)
            return answer
        return self.post_json(path, body, timeout_s)

    def _answer(self, mode: RequestMode, path: str, body: dict[str, object]) -> Completion | StreamedCompletion | None:
        """The answer sent ahead for this request, if any (a transport failure it met is raised again)."""
        if self.answers is None:
            return None
        answer = self.answers.take(request_key(mode, path, body))
        if isinstance(answer, RequestError):
            raise answer
        return answer

    def _timed(self, kind: str | None = None) -> AbstractContextManager[object]:
        if self.accounting is None:
            return nullcontext()
        return self.accounting.requests(kind or self.request_kind)

    def post_json(self, path: str, body: dict[str, object], timeout_s: float | None = None, *,
                  kind: str | None = None) -> Completion:
        """POST ``body`` now (never from ``answers``) and parse the first choice."""
        with self._timed(kind):
            return self._post_timed(path, body, timeout_s)

    def send(self, request: ProbeRequest) -> Completion | StreamedCompletion:
        """Send a recorded request now, its time counted under its own kind."""
        if request.mode == "stream":
            return self.stream_now(request.body, kind=request.kind)
        return self.post_json(request.path, request.body, kind=request.kind)

    def stream(self, body: dict[str, object], timeout_s: float | None = None) -> StreamedCompletion:
        """POST ``body`` to /v1/completions streamed (from ``answers`` when it was sent ahead)."""
        answer = self._answer("stream", "/v1/completions", body)
        if answer is not None:
            assert isinstance(answer, StreamedCompletion)
            return answer
        return self.stream_now(body, timeout_s)

    def stream_now(self, body: dict[str, object], timeout_s: float | None = None, *,
                   kind: str | None = None) -> StreamedCompletion:
        with self._timed(kind):
            return self._stream_timed(body, timeout_s)

    def _stream_timed(self, body: dict[str, object], timeout_s: float | None = None) -> StreamedCompletion:
        """POST ``body`` to /v1/completions with ``stream: true`` and ``stream_options.include_usage`` and
        join the server-sent events. HTTP errors, and error events inside the stream, come back as a failed
        :class:`Completion` (status from the error object, else 500) since they can be NaN evidence;
        transport failures raise :class:`RequestError`."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        out = StreamedCompletion(Completion(request=body, status=0))
        c = out.completion
        text: list[str] = []
        tokens: list[TokenLogprob] = []
        try:
            with self._http.stream("POST", "/v1/completions", content=json.dumps(body),
                                   headers={"Content-Type": "application/json"},
                                   timeout=timeout_s or self.timeout_s) as resp:
                c.status = resp.status_code
                if resp.status_code != 200:
                    c.error = resp.read().decode("utf-8", "replace")
                    return out
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        out.done = True
                        break
                    try:
                        event = json.loads(data)
                    except json.JSONDecodeError as exc:
                        c.status, c.error = 500, f"invalid JSON in the stream: {exc}: {data[:300]}"
                        return out
                    if not isinstance(event, dict):
                        continue
                    if "error" in event:
                        err = event["error"]
                        code = err.get("code") if isinstance(err, dict) else None
                        c.status = code if isinstance(code, int) and code >= 400 else 500
                        c.error = json.dumps(event)
                        return out
                    usage = event.get("usage")
                    if usage:
                        out.usage_chunks += 1
                        c.prompt_tokens = usage.get("prompt_tokens")
                        c.completion_tokens = usage.get("completion_tokens")
                    for choice in event.get("choices") or []:
                        out.chunks += 1
                        piece, toks, finish, matched = parse_completion_choice(choice)
                        text.append(piece)
                        tokens.extend(toks)
                        if finish is not None:
                            out.finish_reasons.append(str(finish))
                            c.finish_reason, c.matched_stop = finish, matched
        except httpx.TimeoutException as exc:
            raise RequestError(f"streamed POST {self.base_url}/v1/completions timed out (sent "
                               f"{short_repr(body, 300)}; received {out.chunks} chunks, text so far "
                               f"{short_repr(''.join(text), 200)})") from exc
        except httpx.HTTPError as exc:
            raise RequestError(f"streamed POST {self.base_url}/v1/completions failed: {exc!r} (sent "
                               f"{short_repr(body, 300)}; received {out.chunks} chunks)") from exc
        c.text = "".join(text)
        c.tokens = tokens
        return out

    def _post_timed(self, path: str, body: dict[str, object], timeout_s: float | None) -> Completion:
        start = time.monotonic()
        try:
            resp = self._http.post(path, content=json.dumps(body), timeout=timeout_s or self.timeout_s,
                                   headers={"Content-Type": "application/json"})
        except httpx.TimeoutException as exc:
            raise RequestError(f"POST {self.base_url}{path} timed out after {timeout_s or self.timeout_s:.0f} s "
                               f"(sent {short_repr(body, 300)})") from exc
        except httpx.HTTPError as exc:
            raise RequestError(f"POST {self.base_url}{path} failed: {exc!r} (sent {short_repr(body, 300)})") from exc
        elapsed = time.monotonic() - start
        if resp.status_code != 200:
            return Completion(request=body, status=resp.status_code, error=resp.text, elapsed_s=elapsed)
        try:
            data = json.loads(resp.text)
        except json.JSONDecodeError as exc:
            return Completion(request=body, status=resp.status_code, error=f"invalid JSON: {exc}: {resp.text[:500]}",
                              elapsed_s=elapsed)
        choices = data.get("choices") or []
        if not choices:
            return Completion(request=body, status=resp.status_code, error=f"no choices in {resp.text[:500]}",
                              elapsed_s=elapsed, raw=data)
        choice = choices[0]
        if "message" in choice:
            text = (choice.get("message") or {}).get("content") or ""
            _, tokens, finish, matched = parse_completion_choice({**choice, "text": text})
        else:
            text, tokens, finish, matched = parse_completion_choice(choice)
        usage = data.get("usage") or {}
        return Completion(request=body, status=resp.status_code, text=text, tokens=tokens, finish_reason=finish,
                          matched_stop=matched, prompt_tokens=usage.get("prompt_tokens"),
                          completion_tokens=usage.get("completion_tokens"), elapsed_s=elapsed, raw=data)

    def complete_concurrently(self, prompts: list[str | list[int]], max_tokens: int, **kwargs: Any) -> list[Completion]:
        """Send all prompts at once (one thread each) so the server batches them together.

        The batch holds the server's lock once for all its requests, so a benchmark round of another
        worker never splits it (half the batch before the round, half after)."""
        if not prompts:
            return []
        held = self.request_lock.shared() if self.request_lock is not None else nullcontext()
        with held, ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [pool.submit(self.complete, p, max_tokens, **kwargs) for p in prompts]
            return [f.result() for f in futures]

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids from the server's /tokenize (vLLM, SGLang, llama.cpp); None when the server has none."""
        tokens = self._tokenize({"model": self.model, "prompt": text, "add_special_tokens": False})
        if tokens == [] and text:
            # llama-server reads "content", and answers {"tokens": []} (200) to a body without it.
            tokens = self._tokenize({"content": text, "add_special": False})
        return tokens

    def _tokenize(self, body: dict[str, object]) -> list[int] | None:
        try:
            resp = self._http.post("/tokenize", json=body, timeout=self._aux(30))
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        data = resp.json()
        tokens = data.get("tokens")
        return list(tokens) if isinstance(tokens, list) else None

    def metrics_text(self) -> str | None:
        """The Prometheus /metrics page, or None when the server has none."""
        return self.page("/metrics").body
