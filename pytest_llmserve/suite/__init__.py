"""The built-in suite, collected by ``pytest --llmserve-suite`` for every configured server."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_F = TypeVar("_F", bound=Callable[..., object])

#: The attribute :func:`suite_requests` sets on a test function: ``(kind, independent)``.
SUITE_REQUESTS_ATTR = "llmserve_suite_requests"


def suite_requests(kind: str, *, independent: bool = False) -> Callable[[_F], _F]:
    """Declare what a built-in test's requests are: their ``kind`` in the suite's time accounting
    (``probes``, ``batch``, ``properties``), and whether they are ``independent`` (their verdict does not
    depend on the batch they share), so the plugin may send them ahead, together with the other
    independent tests' of the same server, and hand the test its own answers. Outermost decorator."""

    def mark(test: _F) -> _F:
        setattr(test, SUITE_REQUESTS_ATTR, (kind, independent))
        return test

    return mark
