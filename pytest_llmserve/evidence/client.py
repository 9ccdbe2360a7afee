"""Requests for correctness checks: completions with logprobs, parsed into plain records.

HTTP errors are *returned* as a :class:`Completion` with ``status`` and ``error`` set rather than
raised, because an error can itself be evidence (vLLM answers HTTP 400 "Out of range float values
are not JSON compliant" when a logprob is NaN). Transport failures (refused, timeout, a stream that
stops mid-way) raise :class:`RequestError` with what was sent and what was received.

JSON is parsed with Python's ``json`` module, which accepts ``NaN``/``Infinity`` tokens, so a server
that emits them is seen, not hidden.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from pytest_llmserve.errors import RequestError


@dataclass(slots=True)
class TokenLogprob:
    """One generated token, its logprob (None when the server sent null) and the top alternatives."""

    token: str
    logprob: float | None
    top: dict[str, float | None] = field(default_factory=dict)


@dataclass(slots=True)
class Completion:
    """What one request sent and what came back."""

    request: dict[str, Any]
    status: int
    text: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: Any = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    raw: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def logprobs(self) -> list[float | None]:
        return [t.logprob for t in self.tokens]

    def describe(self, limit: int = 12) -> str:
        """A short, human-readable account of the request and the first tokens that came back."""
        prompt = self.request.get("prompt", self.request.get("messages"))
        lines = [f"sent: prompt={_short(prompt)} max_tokens={self.request.get('max_tokens')} "
                 f"temperature={self.request.get('temperature')}"]
        if not self.ok:
            lines.append(f"got: HTTP {self.status}: {_short(self.error, 300)}")
            return "\n".join(lines)
        lines.append(f"got: finish_reason={self.finish_reason} completion_tokens={self.completion_tokens} "
                     f"text={_short(self.text, 200)}")
        if self.tokens:
            shown = ", ".join(f"{t.token!r}:{_fmt_lp(t.logprob)}" for t in self.tokens[:limit])
            lines.append(f"first tokens (token:logprob): {shown}")
        return "\n".join(lines)


def _fmt_lp(value: float | None) -> str:
    if value is None:
        return "null"
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_completion_choice(choice: dict[str, Any]) -> tuple[str, list[TokenLogprob], str | None, Any]:
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


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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
                 accounting: Any = None, request_lock: SharedRequestLock | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.accounting = accounting  # counts the time spent waiting on the server as request time
        self.request_lock = request_lock
        self.model = model
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response:
        return self._http.get(path, timeout=self._aux(timeout_s))

    def complete(self, prompt: str | list[int], max_tokens: int = 16, *, temperature: float = 0.0,
                 logprobs: int | None = 5, seed: int | None = 0, ignore_eos: bool = False,
                 stop: list[str] | None = None, timeout_s: float | None = None, **extra: Any) -> Completion:
        """POST /v1/completions and parse the first choice. HTTP errors come back as a Completion."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
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
             seed: int | None = 0, timeout_s: float | None = None, **extra: Any) -> Completion:
        """POST /v1/chat/completions with one user message (the chat template applies)."""
        body: dict[str, Any] = {"model": self.model, "messages": [{"role": "user", "content": content}],
                                "max_tokens": max_tokens, "temperature": temperature}
        if logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = logprobs
        if seed is not None:
            body["seed"] = seed
        body.update(extra)
        return self._post("/v1/chat/completions", body, timeout_s)

    def _post(self, path: str, body: dict[str, Any], timeout_s: float | None) -> Completion:
        if self.accounting is not None:
            with self.accounting.requests():
                return self._post_timed(path, body, timeout_s)
        return self._post_timed(path, body, timeout_s)

    def _post_timed(self, path: str, body: dict[str, Any], timeout_s: float | None) -> Completion:
        start = time.monotonic()
        try:
            resp = self._http.post(path, content=json.dumps(body), timeout=timeout_s or self.timeout_s,
                                   headers={"Content-Type": "application/json"})
        except httpx.TimeoutException as exc:
            raise RequestError(f"POST {self.base_url}{path} timed out after {timeout_s or self.timeout_s:.0f} s "
                               f"(sent {_short(body, 300)})") from exc
        except httpx.HTTPError as exc:
            raise RequestError(f"POST {self.base_url}{path} failed: {exc!r} (sent {_short(body, 300)})") from exc
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

    def _tokenize(self, body: dict[str, Any]) -> list[int] | None:
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
        try:
            resp = self._http.get("/metrics", timeout=self._aux(10))
        except httpx.HTTPError:
            return None
        return resp.text if resp.status_code == 200 else None
