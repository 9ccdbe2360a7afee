"""One measured round of a benchmark, shared by the gate (:mod:`pytest_llmserve.gates.bench`), the A/B runner
(:mod:`pytest_llmserve.gates.ab`) and the build runner (:mod:`pytest_llmserve.gates.builds`).

A round runs alone on its server (:func:`run_round`: the server's request lock held exclusively, its requests counted
as request time); an invalid round is never a number. A round during which other processes took more of the host
than the bound is not a sample: it is discarded and measured again, and after :data:`MAX_CONTENDED_ROUNDS` of them
the benchmark is "confounded: host busy" (:func:`clean_round`). :func:`round_samples` is a round's sample of every
metric; :func:`sample_series` the rounds' samples by metric. A round invalid only for measurement artefacts of
the machine (chunks merged or buffered on a starved client: none of its reasons says the server's output was wrong)
is discarded and run again, at most :data:`ARTEFACT_RETRIES` times per benchmark (:func:`again_on_artefacts`), by
the gate and the A/B runner alike.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pytest_llmserve.config import Workload, untrained_reason
from pytest_llmserve.load.contention import contention_reason
from pytest_llmserve.load.metrics import only_artefacts
from pytest_llmserve.load.runner import judge_contention, run_workload
from pytest_llmserve.server.handle import RunningServer, engine_of

# Contended rounds discarded before a benchmark gives up with "confounded: host busy": one or two let a
# passing burst (a cron job, a package index refresh) go by at the cost of a round each; a host that stays
# busy is told within three rounds' time instead of spending max_rounds on figures that cannot be samples.
MAX_CONTENDED_ROUNDS = 3
# Rounds discarded as measurement artefacts before one more fails the benchmark: seen in CI on 2 cores, a round of
# a healthy server invalid for chunk timing once or twice in a run (7 of 8 requests' chunks in one read, in an A/B
# and in a gated benchmark of one run); a host where it happens three times in one benchmark is too busy to
# measure, and says so.
ARTEFACT_RETRIES = 2
#: The key of a round's host contention (a share of the machine) among its samples.
HOST_CONTENTION = "host_contention"


def round_samples(result: Any) -> dict[str, float]:
    """The per-round sample of every metric (throughputs; latency mean/median/p90/p99 in ms), and the host
    contention measured during the round (:data:`HOST_CONTENTION`, a share of the machine) when sampled."""
    out = {name: float(value) for name, value in result.metrics.items()
           if isinstance(value, int | float) and math.isfinite(value)}
    busy = getattr(result, "host_contention", None)
    if busy is not None and math.isfinite(busy.share):
        out[HOST_CONTENTION] = float(busy.share)
    return out


def clean_round(run: Callable[[str], Any], what: str, *, bound: float, contended: list[dict[str, Any]],
                say: Callable[[str], None], confounded: Callable[[str], None]) -> Any:
    """One round that is a sample: ``run(what)`` again while the host was busier than ``bound`` during it
    (:func:`pytest_llmserve.load.runner.judge_contention`). Each discarded round goes to ``contended`` (shared by
    the benchmark's rounds); at :data:`MAX_CONTENDED_ROUNDS` of them ``confounded`` gets the message
    ("confounded: host busy", naming the processes) and the last result is returned (invalid) if it returns."""
    first = what
    while True:
        result = run(what)
        busy = getattr(result, "host_contention", None)
        if busy is None:  # not sampled (a stand-in round, a script's runner)
            return result
        artefacts = [] if getattr(result, "valid", True) else list(result.invalid_reasons)
        reason = judge_contention(result, bound)
        if reason is None:
            say(f"{what}: {busy.describe()}")
            return result
        if artefacts:  # run_round let it through: only measurement artefacts, on a busy host
            reason += f"; its measurement artefacts, likelier the busy host's than the server's: {'; '.join(artefacts)}"
        contended.append({"round": what, "reason": reason, "host_contention": busy.to_dict()})
        say(f"{what} is not a sample: {reason}")
        if len(contended) >= MAX_CONTENDED_ROUNDS:
            lines = "\n".join(f"  - {c['round']}: {c['reason']}" for c in contended)
            confounded(f"confounded: host busy: {len(contended)} rounds discarded because other processes took "
                       f"more than {bound:.0%} of the host (contention_bound) during them; no verdict, the server "
                       f"is not blamed for the machine:\n{lines}\nRun again on a quiet host (or raise "
                       "contention_bound, knowing the figures then include the others' share).")
            return result
        what = f"{first} (again: {len(contended)} contended so far)"


def run_round(server: RunningServer, workload: Workload, prompts: Any, what: str, fail: Callable[[str], Any], *,
              contention_bound: float | None = None) -> Any:
    """One measured round on a live ``server`` (its requests counted as request time, bounded by the server's
    ``request_timeout_s``); an invalid round is never a number: ``fail`` gets what made it invalid. With a
    ``contention_bound`` (callers that discard contended rounds with :func:`clean_round`), a round invalid only
    for measurement artefacts (chunks merged on a starved client: none of its reasons says the server's output
    was wrong, :func:`pytest_llmserve.load.metrics.output_fault`) during which other processes took more of the
    host than the bound is returned instead: the busy host is the likelier cause, and ``clean_round`` discards
    it as contended (and, on a host that stays busy, says "confounded") rather than failing the server.

    The round has the server to itself: it holds the server's request lock exclusively (no other request
    of this run, from any xdist worker, reaches the server meanwhile), and the engine's own
    running-requests gauge, sampled during the round, must never exceed the round's concurrency. What other
    processes took of the host during it is sampled into ``result.host_contention`` (judged by the caller:
    :func:`clean_round`). On an
    untrained model (:func:`pytest_llmserve.config.untrained_reason`) the sampled answers' collapse is not
    judged; failed requests, wrong lengths and NaN still make the round invalid."""
    server.ensure_alive()
    engine = _engine_of(server)
    with _alone(server), _requests(server):
        result = run_workload(server.base_url, server.model_name, workload, prompts=prompts,
                              api_key=server.spec.api_key, progress=False,
                              timeout_s=server.spec.request_timeout_s,
                              server_counter=engine.generation_counter,
                              running_gauge=engine.running_requests_gauge,
                              untrained=untrained_reason(getattr(server, "spec_for_checks", None) or server.spec),
                              host_contention=True, server_pid=getattr(server, "server_pid", None),
                              gpu_scope=getattr(server, "gpu_scope", None))
    if not result.valid and contention_bound is not None and _busy_artefact(result, contention_bound):
        return result
    if not result.valid:
        busy = f"\nhost: {result.host_contention.describe()}" if result.host_contention is not None else ""
        fail(f"{what} is INVALID (not a number):\n  - " + "\n  - ".join(result.invalid_reasons)
             + f"\nworkload: {asdict(workload)}\nserver: {server.describe()}{busy}")
    return result


def again_on_artefacts(run: Callable[[Callable[[str], None]], Any], what: str, fail: Callable[[str], None], *,
                       discarded: list[dict[str, Any]], say: Callable[[str], None]) -> Any:
    """``run(invalid)`` (a round whose runner calls ``invalid`` with :func:`run_round`'s message when the round is
    invalid), run again while the message's reasons are all measurement artefacts and fewer than
    :data:`ARTEFACT_RETRIES` rounds of the benchmark were discarded so far: each discarded round goes to
    ``discarded`` (shared by the benchmark's rounds: ``round``, ``reasons``) and is said. Any other invalid round
    goes to ``fail``."""

    def invalid(message: str) -> None:
        reasons = invalid_round_reasons(message)
        if not only_artefacts(reasons) or len(discarded) >= ARTEFACT_RETRIES:
            fail(message)
            return
        discarded.append({"round": what, "reasons": reasons})
        say(f"{what} is not a number ({'; '.join(reasons)}): a measurement artefact of the machine, not the "
            f"server's output; discarded and run again ({len(discarded)} of {ARTEFACT_RETRIES} allowed)")
        raise _ArtefactRound

    while True:
        try:
            return run(invalid)
        except _ArtefactRound:
            continue


class _ArtefactRound(Exception):
    """An invalid round that is run again (:func:`again_on_artefacts`): unwinds the round runner."""


def invalid_round_reasons(message: str) -> list[str]:
    """The reasons listed in :func:`run_round`'s message for an invalid round (its "  - " lines)."""
    return [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]


def _busy_artefact(result: Any, bound: float) -> bool:
    """Whether an invalid round has only measurement-artefact reasons and was measured on a host busier than
    ``bound`` (see :func:`run_round`)."""
    return only_artefacts(result.invalid_reasons) and contention_reason(result.host_contention, bound) is not None


def _engine_of(server: RunningServer) -> Any:
    """The engine's adapter, for its metric names: a worker attached to another worker's server reaches it
    as ``external``, but the engine is the one configured (``spec_for_checks``)."""
    return engine_of(server)


def _alone(server: RunningServer) -> Any:
    """The server's request lock held exclusively (none when the server was not given one: a script's)."""
    lock = getattr(server, "request_lock", None)
    return lock.exclusive() if lock is not None else contextlib.nullcontext()


def _requests(server: RunningServer) -> Any:
    acc = server.accounting
    return acc.requests("benchmark") if acc is not None else contextlib.nullcontext()


def sample_series(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    names = sorted(set().union(*[set(s) for s in samples])) if samples else []
    return {n: [s[n] for s in samples if n in s] for n in names}
