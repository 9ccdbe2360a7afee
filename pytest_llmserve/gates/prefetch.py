"""Which tests' independent probes go out together, and how they are planned: by a dry run of each test.

The first independent test of a server plans and sends, together, the probes of every independent test
of that server this process will run, by running each once against a recording client
(:func:`pytest_llmserve.gates.probes.plan`); later ones find their answers waiting. Which tests those are
is the plugin's to say (it knows the collected items and the xdist groups): it hands in plain
:class:`ProbeTest` values, so nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates.decode import CheckFailed, DecodeCheck
from pytest_llmserve.gates.probes import AnswerBook, ServerProbes, concurrency_bound, plan
from pytest_llmserve.server.handle import RunningServer


@dataclass(frozen=True)
class ProbeTest:
    """A built-in test whose probes are independent: its id, its function (None: nothing to dry-run) and
    its request kind in the suite's time accounting."""

    nodeid: str
    function: Callable[..., Any] | None
    kind: str


def server_probes(made: dict[str, ServerProbes], server: RunningServer, spec: ServerSpec,
                  requested: int | None) -> ServerProbes:
    """This process's independent probes of ``server``, bounded by its batch capacity (made once, kept in
    ``made`` by server id; made again for a new server of the same configuration)."""
    probes = made.get(spec.id)
    if probes is None or probes.server is not server:
        reported = None
        if requested != 1 and not spec.max_batch_size:
            reported = getattr(server.facts(), "max_batch_size", None)
        probes = ServerProbes(server, concurrency_bound(requested, spec.max_batch_size, reported))
        made[spec.id] = probes
    return probes


def prefetched(probes: ServerProbes, nodeid: str, server: RunningServer,
               scope: Callable[[], Iterable[ProbeTest]]) -> AnswerBook | None:
    """Test ``nodeid``'s answers sent ahead (None when probes go one at a time). Unless it was planned
    already, the tests in ``scope`` (itself among them) are planned now and their probes sent together."""
    if not probes.together:
        return None
    if nodeid not in probes.planned_items:
        plans = {}
        for test in scope():
            if test.nodeid not in probes.planned_items:
                plans[test.nodeid] = plan(functools.partial(dry_run, test.function, server), server.model_name,
                                          test.kind)
        probes.prefetch(plans)
    return probes.answers_for(nodeid)


def dry_run(function: Callable[..., Any] | None, server: RunningServer, recorder: LLMClient) -> None:
    """Run a built-in test's function once against ``recorder`` (its Hypothesis examples included: the
    same derandomized draws as the real run): what it would send is recorded, nothing is judged."""

    planning = {"llm_server": server, "llm_client": recorder, "decode_check": DecodeCheck(server, planning=recorder)}
    if function is None:
        return
    names = list(inspect.signature(function).parameters)
    if all(name in planning for name in names):
        with contextlib.suppress(CheckFailed):  # a dry run concludes nothing: what it would send is all it yields
            function(**{name: planning[name] for name in names})
