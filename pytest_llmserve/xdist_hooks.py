"""pytest-xdist's side of the plugin's face (:mod:`pytest_llmserve.face`, whose hooks call what is here): which
process this is, what a controller hands its workers (the run directory's name, each worker's gateway) and hears
back from them (time accounting, host reports, a host that went down), the by-configuration scheduler across hosts,
and what a worker sends home.

pytest-xdist's surfaces used here, none of them private: its hooks (``pytest_configure_node``,
``pytest_testnodedown``, ``pytest_xdist_make_scheduler``, ``pytest_handlecrashitem``), ``workerinput`` (in its
how-to), a report's ``node`` (in its hook specifications), the scheduler protocol, the ``--dist``, ``--tx``, ``-n``
and ``--max-worker-restart`` options; and ``workeroutput``, the attribute a worker sends home in, which its
documentation does not describe (pyproject allows pytest-xdist >= 3.5; every version since 1.22 has it).
tests/plugin/test_pinned_apis.py and tests/unit/server/test_hosts.py fail when one of them changes.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import execnet
import pytest

from pytest_llmserve.server import hosts
from pytest_llmserve.server.pool import read_boots

if TYPE_CHECKING:
    from xdist.scheduler.protocol import Scheduling
    from xdist.workermanage import WorkerController

    from pytest_llmserve.gates.accounting import Accounting

#: The key of ``workerinput`` that carries the run directory from the controller to its workers.
RUN_DIR_KEY = "llmserve_run_dir"
#: The key of ``workeroutput`` that carries a worker's time accounting back to the controller.
ACCOUNTING_KEY = "llmserve_accounting"
#: ``workerinput``: the worker's gateway as the controller sees it (host label, remote or not, grouping).
GATEWAY_KEY = "llmserve_gateway"
#: ``workeroutput``: the worker's host name and the boots it made (its run directory may be host-local).
HOST_REPORT_KEY = "llmserve_host_report"


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    distributing = bool(getattr(config.option, "numprocesses", None)) or bool(getattr(config.option, "tx", None))
    return distributing and not is_worker(config)


def worker_run_dir(config: pytest.Config) -> str:
    return str(config.workerinput[RUN_DIR_KEY])  # type: ignore[attr-defined]


def worker_gateway(config: pytest.Config) -> dict[str, Any]:
    """This worker's gateway as its controller described it ({} from a controller without this plugin)."""
    value = getattr(config, "workerinput", {}).get(GATEWAY_KEY)
    return dict(value) if isinstance(value, dict) else {}


def tx_specs(config: pytest.Config) -> list[Any]:
    """The controller's gateways, one execnet spec per worker; [] without pytest-xdist. pytest-xdist turns ``-n N``
    into N ``popen`` specs in ``--tx`` before configuration; ``--tx 3*ssh=host`` is its documented way to ask for
    three workers of one spec (read here as pytest-xdist does: its own reader, ``parse_tx_spec_config`` from 3.7,
    ``parse_spec_config`` before, is not part of its API, and importing the new name failed on 3.5 and 3.6, which
    pyproject allows)."""
    specs: list[Any] = []
    for spec in getattr(config.option, "tx", None) or ():
        count, star, rest = str(spec).partition("*")
        specs.extend([execnet.XSpec(rest)] * int(count) if star and count.isdigit() else [execnet.XSpec(spec)])
    return specs


def distributes_by_config(config: pytest.Config) -> bool:
    """Tests go to hosts by server configuration when any gateway reaches another host: there, moving a
    configuration's tests between workers would boot it again on each host."""
    if is_worker(config):
        return bool(worker_gateway(config).get("by_config"))
    return is_controller(config) and any(hosts.gateway_is_remote(spec) for spec in tx_specs(config))


def prepare_controller(config: pytest.Config) -> None:
    """Across hosts: ``--dist load`` becomes ``loadgroup`` (groups keep a configuration on one host), and
    a crashed remote worker is not restarted unless the user asked (``--max-worker-restart``): a restart
    would reconnect to a host that may be gone, and the dead host's tests are failed with the reason."""
    if not distributes_by_config(config):
        return
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"
    if getattr(config.option, "maxworkerrestart", None) is None:
        config.option.maxworkerrestart = "0"


def keep_benchmarks_on_one_worker(config: pytest.Config) -> None:
    """``-n`` alone means ``--dist load``: switch it to ``loadgroup``, so the benchmarks, which carry
    ``xdist_group("llmserve-bench")``, run on one worker. An explicit other mode is left alone."""
    if is_controller(config) and getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"


class XdistController:
    """An xdist controller's side of the run: hands the run directory (a path; created by whichever process boots
    first) to each worker, and collects each worker's time accounting when it finishes (the boots, requests and
    tests all happen in the workers, so the controller's own accounting is empty). Across hosts it also keeps
    each worker's host report, and why a worker went down. Unconfigured (no llmserve configuration file or
    setting), it only hands the run directory's name to the workers and hears whether they used llmserve: the
    dist mode, ``--max-worker-restart`` and the scheduler stay the user's (pytest-xdist's own)."""

    def __init__(self, run_dir: str, config: pytest.Config, groups: Callable[[], dict[str, str]],
                 by_config: bool) -> None:
        self.run_dir = run_dir
        self.config = config
        self.groups = groups  # server id -> its configuration group
        # Tests go to hosts by configuration (decided once, at configure): only a configured run asks for it.
        self.by_config = by_config
        self.worker_accounting: list[dict[str, Any]] = []
        self.host_reports: dict[str, hosts.HostReport] = {}  # by gateway id
        self.used = False  # a worker used llmserve (it sent its host report: see send_home)

    def configure_node(self, node: Any) -> None:
        """``pytest_configure_node``: what the worker is told before it starts."""
        node.workerinput[RUN_DIR_KEY] = self.run_dir
        spec = node.gateway.spec
        node.workerinput[GATEWAY_KEY] = {"id": str(node.gateway.id), "label": hosts.gateway_label(spec),
                                         "remote": hosts.gateway_is_remote(spec),
                                         "by_config": self.by_config}

    def node_down(self, node: Any, error: Any) -> None:
        """``pytest_testnodedown``: what the worker sent home, and why it went down if it did."""
        output = getattr(node, "workeroutput", None) or {}
        snapshot = output.get(ACCOUNTING_KEY)
        if isinstance(snapshot, dict):
            self.worker_accounting.append(snapshot)
        sent = output.get(HOST_REPORT_KEY)
        self.used = self.used or isinstance(sent, dict)
        sent = sent if isinstance(sent, dict) else {}
        gateway = str(node.gateway.id)
        self.host_reports[gateway] = hosts.HostReport(
            gateway=gateway, label=hosts.gateway_label(node.gateway.spec), hostname=sent.get("hostname"),
            boots=list(sent.get("boots") or []), down=hosts.short_error(error) if error is not None else None)

    def scheduler(self, config: pytest.Config, log: Any) -> Scheduling | None:
        """``pytest_xdist_make_scheduler``: across hosts, :class:`ByConfigScheduling`; else pytest-xdist's own."""
        if self.by_config and config.getvalue("dist") == "loadgroup":
            return by_config_scheduler(config, log, self)
        return None

    def name_crash(self, crashitem: str, report: Any) -> None:
        """``pytest_handlecrashitem``: the test a worker was running when its host went down names the host and
        the reason."""
        node = getattr(report, "node", None)
        if node is None or not self.by_config:
            return
        gateway = str(node.gateway.id)
        down = self.host_reports.get(gateway)
        label = hosts.gateway_label(node.gateway.spec)
        report.longrepr = (f"host {label} ({gateway}) went down while running {crashitem}: "
                           f"{down.down if down and down.down else 'connection lost'}")

    def fail_abandoned(self, node: Any, nodeids: list[str]) -> None:
        """Fail the tests a dead host still had, one report each, naming the host and the reason."""
        gateway = str(node.gateway.id)
        down = self.host_reports.get(gateway)
        label = hosts.gateway_label(node.gateway.spec)
        servers = self.groups()
        for nodeid in nodeids:
            server = hosts.server_of_nodeid(nodeid, servers)
            message = hosts.host_down_message(label, gateway, down.down if down else None, nodeid, server)
            path = nodeid.split("::")[0]
            report = pytest.TestReport(nodeid, (path, None, path), {}, "failed", message, "call")
            report.node = node  # type: ignore[attr-defined]  # xdist's own reports carry it too
            self.config.hook.pytest_runtest_logreport(report=report)


def by_config_scheduler(config: pytest.Config, log: Any, controller: XdistController) -> Scheduling:
    return ByConfigScheduling(len(tx_specs(config)), controller, config, log)


def loadgroup_scope(nodeid: str) -> str:
    """The work unit ``--dist loadgroup`` gives a test: its ``xdist_group`` (the ``@group`` suffix pytest-xdist's
    worker adds to the node id, read as its loadgroup scheduler reads it), else the test alone."""
    return nodeid.split("@")[-1] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


class ByConfigScheduling:
    """``loadgroup`` with every group placed once, up front, round-robin over the workers (a host boots
    only its own configurations), and a dead worker's remaining tests failed rather than moved (moving
    them would boot the configuration again elsewhere, and the host's name would be lost).

    Written against pytest-xdist's scheduler protocol (``xdist.scheduler.protocol.Scheduling``, what
    ``pytest_xdist_make_scheduler`` returns; tests/unit/server/test_hosts.py checks its members against the
    installed version's), not by subclassing one of its schedulers, whose internals are private. Of a node it uses
    what that protocol's node type gives every scheduler: ``send_runtest_some``, ``shutdown``, ``shutting_down``
    and ``gateway``."""

    def __init__(self, numnodes: int, controller: XdistController, config: pytest.Config, log: Any = None) -> None:
        self.numnodes = numnodes  # the workers expected to report a collection before scheduling
        self.controller = controller
        self.config = config
        self.log: Callable[..., None] = log if log is not None else (lambda *args: None)
        self.collection: list[str] | None = None  # the one collection every worker reported, once scheduled
        self.collections: dict[WorkerController, list[str]] = {}  # what each worker collected
        # What each worker was given: its configurations' groups, each test's node id and whether it completed.
        self.work: dict[WorkerController, dict[str, dict[str, bool]]] = {}

    @property
    def nodes(self) -> list[WorkerController]:
        return list(self.work)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        # As in pytest-xdist's own schedulers, a worker holds its last test until it learns that no other follows.
        return self.collection_is_completed and all(len(hosts.pending_nodeids(w)) < 2 for w in self.work.values())

    @property
    def has_pending(self) -> bool:
        return any(hosts.pending_nodeids(work) for work in self.work.values())

    def add_node(self, node: WorkerController) -> None:
        assert node not in self.work
        self.work[node] = {}

    def add_node_collection(self, node: WorkerController, collection: Sequence[str]) -> None:
        assert node in self.work
        self.collections[node] = list(collection)

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        nodeid = self.collections[node][item_index]
        for unit in self.work[node].values():
            if nodeid in unit:
                unit[nodeid] = True

    def mark_test_pending(self, item: str) -> None:
        raise NotImplementedError("a test is never moved to another worker (its configuration would boot twice)")

    def remove_pending_tests_from_node(self, node: WorkerController, indices: Sequence[int]) -> None:
        raise NotImplementedError("a test is never moved to another worker (its configuration would boot twice)")

    def remove_node(self, node: WorkerController) -> str | None:
        pending = hosts.pending_nodeids(self.work.pop(node))
        if not pending:
            return None
        self.controller.fail_abandoned(node, pending[1:])
        return pending[0]  # xdist reports it as the crash item

    def schedule(self) -> None:
        if self.collection is not None:
            for node in self.nodes:  # a worker that came later (a restart) gets nothing: it ends
                if not self.work[node] and not node.shutting_down:
                    node.shutdown()
            return
        if not self._same_collections():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.collections.values())))
        if not self.collection:
            return
        servers = self.controller.groups()
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            server = hosts.server_of_nodeid(nodeid, servers)
            units.setdefault(servers[server] if server is not None else loadgroup_scope(nodeid), {})[nodeid] = False
        nodes = self.nodes
        index = {nodeid: i for i, nodeid in enumerate(self.collection)}  # the same on every worker (checked above)
        for turn, (group, unit) in enumerate(units.items()):
            node = nodes[turn % len(nodes)]
            self.work[node][group] = unit
            node.send_runtest_some([index[nodeid] for nodeid in unit])
        for node in nodes:
            node.shutdown()  # a worker runs what it was given, then ends

    def _same_collections(self) -> bool:
        """Whether every worker collected the same tests; each one that did not is reported as a collection
        error naming the difference (as pytest-xdist's own schedulers do)."""
        (first, reference), *others = self.collections.items()
        same = True
        for node, collection in others:
            if collection == reference:
                continue
            same = False
            message = (f"Different tests were collected between {first.gateway.id} and {node.gateway.id}. "
                       "The difference is:\n" + "\n".join(difflib.unified_diff(reference, collection)))
            self.log(message)
            report = pytest.CollectReport(str(node.gateway.id), "failed", message, [])
            self.config.hook.pytest_collectreport(report=report)
        return same


def send_home(config: pytest.Config, accounting: Accounting, run_dir: Path) -> None:
    """On a worker that used llmserve, at its session's end: its accounting snapshot, and its host report (host
    name, the boots it made: the controller cannot read a host-local run directory), in ``workeroutput``, which
    pytest-xdist sends home after every ``pytest_sessionfinish`` implementation has run."""
    output = config.workeroutput  # type: ignore[attr-defined]
    snapshot = accounting.snapshot()
    if snapshot["intervals"]:
        output[ACCOUNTING_KEY] = snapshot
    boots = [boot for boot in read_boots(run_dir) if boot.get("worker_pid") == os.getpid()]
    output[HOST_REPORT_KEY] = {"hostname": hosts.this_host(), "boots": boots}
