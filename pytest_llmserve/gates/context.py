"""The context a benchmark records: everything that must match for two runs to be comparable, built here and
nowhere else.

The engine and its version, the model, the server arguments (:func:`server_args`), the hardware (this host's
identity, :mod:`pytest_llmserve.server.hardware`), the workload, the plugin and the Python version
(:func:`python_label`), the environment variables a launched server inherits from the shell and its engine reads
(:func:`pytest_llmserve.engines.engine_environment`, under ``engine_env``; none for a server attached by url), and,
read from the engine's own counters before a benchmark, the server's state (:func:`read_server_state`). Before it is
returned the context is made portable (paths under the plugin's cache are written ``<cache>/...``,
:func:`portable_paths`), plain JSON data (:func:`pytest_llmserve.json_encoding.to_plain`) and safe to store (secrets
masked, :func:`pytest_llmserve.redaction.redact_context`). :func:`configuration_differences` is what two
configurations' contexts differ in (the A/B runner's and the build runner's question).
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Mapping
from typing import Any, cast

from pytest_llmserve.config import ServerSpec, Workload, cache_dir
from pytest_llmserve.engines import engine_environment
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.json_encoding import to_plain
from pytest_llmserve.redaction import redact_context
from pytest_llmserve.server.handle import RunningServer, engine_of
from pytest_llmserve.server.hardware import hardware_context
from pytest_llmserve.verdicts.comparability import Comparability, ContextDiff, comparability, diff_context
from pytest_llmserve.version import __version__

# Fields of ServerSpec.public_dict() left out of context["server_args"]: identity/bookkeeping
# (name, source, port, variant), where an attached server's log is read (log: a place, not a setting; and
# leaving it out keeps baselines recorded before the field existed comparable), those stored at the top
# level of the context (engine, model), and random_weights (a statement about the model, which the
# context names already; left out, baselines recorded before the key existed stay comparable). An
# attached server's url stays: this run cannot see the hardware behind it, so the url is what tells one
# remote server from another. differential_max_logprob_delta is a check's tolerance, not how the server runs.
# build: what the build is shows in python (its interpreter) and args (the server arguments it declares), as
# before the field existed, so that baselines recorded then stay comparable.
_SPEC_FIELDS_NOT_IN_ARGS = ("name", "source", "port", "variant", "log", "engine", "model", "random_weights",
                            "differential_max_logprob_delta", "build")


def python_label() -> str:
    """Interpreter that ran the client, e.g. ``CPython 3.11``; patch releases are deliberately left out."""
    major, minor, _ = platform.python_version_tuple()
    return f"{platform.python_implementation()} {major}.{minor}"


def server_args(spec: ServerSpec) -> dict[str, Any]:
    """``spec.public_dict()`` (secrets redacted) without identity fields and those kept at the top level, as plain
    JSON data."""
    return cast(dict[str, Any], to_plain(_spec_args(spec)))


def _spec_args(spec: ServerSpec) -> dict[str, Any]:
    out = spec.public_dict()
    for name in _SPEC_FIELDS_NOT_IN_ARGS:
        out.pop(name, None)
    return out


def portable_paths(value: Any) -> Any:
    """Paths under the plugin's cache (the embedded default's venv and model) written as ``<cache>/...``,
    so a baseline recorded by one user compares with another user's run of the same set-up."""
    prefix = str(cache_dir())
    if isinstance(value, str):
        return "<cache>" + value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v) for v in value]
    return value



def build_context(
    spec: ServerSpec,
    workload: Workload,
    *,
    engine_version: str | None,
    hardware: Mapping[str, Any] | None = None,
    plugin_version: str | None = None,
    python: str | None = None,
    extra: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything that must match for two benchmark runs to be comparable.

    ``hardware`` defaults to :func:`~pytest_llmserve.server.hardware.hardware_context`, ``plugin_version`` to
    this package's version, ``python`` to :func:`python_label`,
    ``environ`` (the shell the server inherits) to ``os.environ``.
    ``extra`` adds keys (they take part in comparisons).
    """
    inherited = engine_environment(spec, environ)
    ctx: dict[str, Any] = {
        "engine": spec.engine,
        "engine_version": engine_version,
        "model": spec.model,
        "server_args": _spec_args(spec),  # made plain data with the rest (redact_context)
        "hardware": dict(hardware) if hardware is not None else hardware_context(),
        "workload": workload.to_dict(),
        "plugin_version": __version__ if plugin_version is None else plugin_version,
        "python": python or python_label(),
    }
    if inherited:  # only when there is one, so that baselines recorded without such variables still compare
        ctx["engine_env"] = inherited
    if extra:
        ctx.update(extra)
    # Masked first, then made portable (the two touch different values: secrets are no paths under the cache).
    masked = redact_context(ctx)
    return cast(dict[str, Any], portable_paths(masked))


def configuration_differences(a: ServerSpec, b: ServerSpec, workload: Workload) -> list[ContextDiff]:
    """What the contexts of two configurations of this host differ in, for the same workload (engine versions
    unknown before their servers boot)."""
    context_a = build_context(a, workload, engine_version=None)
    context_b = build_context(b, workload, engine_version=None)
    return diff_context(context_a, context_b)


def configuration_comparability(a: ServerSpec, b: ServerSpec, workload: Workload, *, variable: str,
                                ignore: tuple[str, ...]) -> Comparability:
    """Whether two configurations' contexts differ in ``variable`` only (keys under ``ignore`` aside)."""
    context_a = build_context(a, workload, engine_version=None)
    context_b = build_context(b, workload, engine_version=None)
    return comparability(context_a, context_b, variable=variable, ignore=ignore)


#: Tokens a server may have generated before a benchmark and still count as "fresh": what the plugin itself asks of
#: a server it boots (the readiness probe's generation and the facts it reads) stays far below.
FRESH_TOKEN_ALLOWANCE = 256


def server_state(generated_before: float | None, seconds_since_ready: float | None, *,
                 requests_before: float | None = None, prefix_cache_hits_before: float | None = None
                 ) -> dict[str, Any]:
    """The server's state when a benchmark starts, for its context: ``state`` is compared ("fresh": at most
    :data:`FRESH_TOKEN_ALLOWANCE` tokens generated since boot; "after traffic"; "unknown" where the engine's
    generation counter could not be read), the figures beside it are not (verdicts/comparability.py ignores them):
    tokens generated and requests finished since boot, prompt tokens its prefix cache served (a warm cache), the
    seconds since it became ready. The benchmark's own warm-up rounds come after this reading.

    A benchmark alone on a fresh boot and the same benchmark after a suite's other traffic differ (+31.5 % on the
    development host, docs/changelog.md, 2026-12-03): a comparison across states is refused, naming them."""
    if generated_before is None:
        state = "unknown"
    elif generated_before <= FRESH_TOKEN_ALLOWANCE:
        state = "fresh"
    else:
        state = "after traffic"
    return {"state": state,
            "generated_tokens_before": None if generated_before is None else round(generated_before),
            "requests_before": None if requests_before is None else round(requests_before),
            "prefix_cache_hit_tokens_before": None if prefix_cache_hits_before is None
            else round(prefix_cache_hits_before),
            "seconds_since_ready": None if seconds_since_ready is None else round(seconds_since_ready, 1)}


def read_server_state(server: RunningServer) -> dict[str, Any]:
    """:func:`server_state` of a running server: its engine's counters read from its metrics page (an unreadable
    page, or a script's stand-in server without an engine adapter, is an "unknown" state, not an error of the
    benchmark) and the seconds since it became ready."""
    engine = None
    with contextlib.suppress(AttributeError):  # a script's stand-in server has no engine adapter
        engine = engine_of(server)
    page = None
    if engine is not None and engine.generation_counter:
        try:
            page = server.metrics_text()
        except Exception:  # noqa: BLE001 - an unreadable page is an unknown state, not an error of the benchmark
            page = None

    def read(counter: str | None) -> float | None:
        return counter_total(page, counter) if page and counter else None

    ready_at = getattr(server, "ready_at", None)
    return server_state(read(engine.generation_counter if engine else None),
                        time.monotonic() - ready_at if ready_at is not None else None,
                        requests_before=read(engine.request_counter if engine else None),
                        prefix_cache_hits_before=read(engine.prefix_cache_hit_counter if engine else None))
