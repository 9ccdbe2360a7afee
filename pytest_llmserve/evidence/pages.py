"""A server's pages, read one way (``GET /metrics``, ``/health``, ``/v1/models``, ``/version``, ``/props``...), and
the one place an API key becomes a header.

:func:`read_page` sends the GET with the API key's Bearer header and a timeout, and hands back a :class:`Page`: the
status and the text, or why nothing came back. The server handle's metrics, server info and readiness probes, the
correctness client's pages, an attached server's model list, llama.cpp's ``/props`` and ``/slots``, and the load
generator's scrapes around a run (``load/transport.py``'s ``fetch_text``) all read through it.

:func:`auth_headers` is the only place the ``Authorization: Bearer`` header is built: the correctness client, the
load generator's two transports, the readiness probes and the page readers carry what it returns.

One reader sends without httpx, for a reason that keeps it a transport of its own: the running-requests gauge is read
while a round's requests stream on the same event loop, and httpx's per-request CPU would be taken from the loop
that timestamps the round's chunks (``load/transport.py``'s ``read_page_on_loop``, over a fresh connection that shares
no pool with the round's, framed by the lean client's own HTTP/1.1 code). It sends the request this module writes
(:func:`raw_get_request`) and hands back a :class:`Page` too, so the URL, the headers and what an answer means are
this module's for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx

__all__ = ["PAGE_TIMEOUT_S", "Page", "answer", "auth_header_lines", "auth_headers", "page_url", "raw_get_request",
           "read_page", "server_root", "unanswered"]

#: An auxiliary page's timeout unless the caller gives one: a page is small, a server that takes longer is not well.
PAGE_TIMEOUT_S = 10.0


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers that carry ``api_key`` (none without one): the only place the Bearer header is built."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def auth_header_lines(api_key: str | None) -> str:
    """:func:`auth_headers` as HTTP/1.1 header lines (``Name: value\\r\\n`` each), for a request written by hand."""
    return "".join(f"{name}: {value}\r\n" for name, value in auth_headers(api_key).items())


def server_root(base_url: str) -> str:
    """The server's root URL: ``base_url`` without a trailing ``/`` or ``/v1`` (pages live beside ``/v1``)."""
    return base_url.rstrip("/").removesuffix("/v1")


def page_url(base_url: str, path: str) -> str:
    """The URL of the page ``path`` (``/metrics``) of the server at ``base_url`` (its root, or its ``/v1``)."""
    return server_root(base_url) + path


@dataclass(frozen=True, slots=True)
class Page:
    """One server page as read: its HTTP status and text, or, when nothing came back, why (``error``)."""

    url: str
    status: int | None = None  # None: no answer (refused, timed out, cut short)
    text: str = ""
    error: str | None = None  # why there is no answer: "ConnectError", "ReadTimeout after 5.0 s"

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def body(self) -> str | None:
        """The text of a 200 answer; None otherwise."""
        return self.text if self.ok else None

    def json(self) -> Any:
        """The JSON of a 200 answer; None otherwise, or when the text is not JSON."""
        if not self.ok:
            return None
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    def failure(self, limit: int = 200) -> str:
        """Why this is not a 200 answer: the error, or the status and the start of the text."""
        if self.error is not None:
            return self.error
        return f"HTTP {self.status} {self.text[:limit]!r}"


def unanswered(url: str, exc: BaseException, timed_out_after_s: float | None = None) -> Page:
    """The page of a request that got no answer: the exception's name, and the time waited when it timed out."""
    waited = f" after {timed_out_after_s:.1f} s" if timed_out_after_s is not None else ""
    return Page(url, error=f"{type(exc).__name__}{waited}")


def answer(url: str, timeout_s: float, send: Callable[[], httpx.Response]) -> Page:
    """What ``send`` (one httpx request to ``url``, its timeout ``timeout_s``) got back, as a :class:`Page`: the one
    place an httpx answer, or its failure, becomes one."""
    # lazy: httpx takes ~120 ms to import (-X importtime)
    import httpx

    try:
        resp = send()
    except httpx.TimeoutException as exc:
        return unanswered(url, exc, timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return unanswered(url, exc)
    return Page(url, resp.status_code, resp.text)


def read_page(base_url: str, path: str, api_key: str | None = None, timeout_s: float = PAGE_TIMEOUT_S, *,
              http: httpx.Client | None = None) -> Page:
    """``GET path`` of the server at ``base_url`` with ``api_key``'s header, within ``timeout_s``.

    ``http``: a client of the caller's to send it through (its connection pool; its default headers, built by
    :func:`auth_headers`, count as well), else a one-off request."""
    # lazy: httpx takes ~120 ms to import (-X importtime)
    import httpx

    url = page_url(base_url, path)
    headers = auth_headers(api_key)
    if http is None:
        return answer(url, timeout_s, lambda: httpx.get(url, headers=headers, timeout=timeout_s))
    return answer(url, timeout_s, lambda: http.get(url, headers=headers, timeout=timeout_s))


def raw_get_request(base_url: str, path: str, api_key: str | None) -> bytes:
    """The HTTP/1.1 request :func:`read_page` sends, written by hand for a client without httpx: one GET on a
    connection it closes (``Connection: close``: the answer ends with it if it has no other framing)."""
    parts = urlsplit(page_url(base_url, path))
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: pytest-llmserve\r\n"
            f"Connection: close\r\n{auth_header_lines(api_key)}\r\n").encode()
