"""The built-in suite, collected by ``pytest --llmserve-suite`` for every configured server."""

from __future__ import annotations

import functools
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


def first_failure_reported(test: _F) -> _F:
    """Wrap a Hypothesis test (``@given`` applied) over a server's sampled output so that a failure that
    its replay does not reproduce is not lost in a bare "Flaky": the test fails with the first failing
    example's own message (its finding, the request and what came back), then a line that says the replay
    passed. Hypothesis 6 raises ``FlakyFailure``, an exception group holding the original exception(s).
    Put it outside ``@given`` and inside :func:`suite_requests`."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis.errors import Flaky

    @functools.wraps(test)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return test(*args, **kwargs)
        except Flaky as exc:
            first = _first_original(exc)
            if first is None:
                raise
            raise AssertionError(
                f"{first}\n\nNOT REPRODUCED: this is the first failing example, as it failed; Hypothesis "
                f"replayed it and the replay passed (Hypothesis raised {type(exc).__name__}). The server "
                "answered the same request differently (a sampled answer, a batch it shared, or a transient "
                "fault): its evidence above is the finding.") from exc

    return wrapper  # type: ignore[return-value]


def _first_original(exc: BaseException) -> BaseException | None:
    """The first exception a Flaky report holds that is not itself Hypothesis's (depth first)."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis.errors import Flaky

    for inner in getattr(exc, "exceptions", ()):
        if isinstance(inner, Flaky):
            found = _first_original(inner)
            if found is not None:
                return found
        else:
            return inner  # type: ignore[no-any-return]
    return None
