"""pytest-xdist hooks, in their own module (registered only when pytest-xdist is installed, since pytest
rejects hook implementations it has no specification for), and the tests of which process this is."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import execnet
import pytest

from pytest_llmserve.server import hosts

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


class XdistHooks:
    """Controller side: hands the run directory (a path; created by whichever process boots first) to each
    worker, and collects each worker's time accounting when it finishes (the boots, requests and tests
    all happen in the workers, so the controller's own accounting is empty). Across hosts it also keeps
    each worker's host report, and why a worker went down."""

    def __init__(self, run_dir: str, config: pytest.Config, groups: Callable[[], dict[str, str]],
                 by_config: bool) -> None:
        self.run_dir = run_dir
        self.config = config
        self.groups = groups  # server id -> its configuration group
        # Tests go to hosts by configuration (decided once, at configure): only a configured run asks for it.
        self.by_config = by_config
        self.worker_accounting: list[dict[str, Any]] = []
        self.host_reports: dict[str, hosts.HostReport] = {}  # by gateway id
        self.used = False  # a worker used llmserve (it sent its host report: see WorkerAccounting)

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_DIR_KEY] = self.run_dir
        spec = node.gateway.spec
        node.workerinput[GATEWAY_KEY] = {"id": str(node.gateway.id), "label": hosts.gateway_label(spec),
                                         "remote": hosts.gateway_is_remote(spec),
                                         "by_config": self.by_config}

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
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

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Scheduling | None:
        if self.by_config and config.getvalue("dist") == "loadgroup":
            return by_config_scheduler(config, log, self)
        return None

    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        """The test a worker was running when its host went down: name the host and the reason."""
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


def by_config_scheduler(config: pytest.Config, log: Any, hooks: XdistHooks) -> Scheduling:
    return ByConfigScheduling(len(tx_specs(config)), hooks, config, log)


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

    def __init__(self, numnodes: int, hooks: XdistHooks, config: pytest.Config, log: Any = None) -> None:
        self.numnodes = numnodes  # the workers expected to report a collection before scheduling
        self.hooks = hooks
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
        self.hooks.fail_abandoned(node, pending[1:])
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
        servers = self.hooks.groups()
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


class WorkerAccounting:
    """Worker side: sends this worker's accounting snapshot home in ``workeroutput``, and its host report
    (host name, the boots it made: the controller cannot read a host-local run directory). pytest-xdist
    sends ``workeroutput`` after every ``pytest_sessionfinish`` implementation has run, this one included."""

    def __init__(self, accounting: Accounting, run_dir: Callable[[], Path]) -> None:
        self.accounting = accounting
        self.run_dir = run_dir

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # lazy: the pool's modules (153 ms) load where servers run, not with every configured run's hooks
        from pytest_llmserve.server.pool import read_boots

        snapshot = self.accounting.snapshot()
        if snapshot["intervals"]:
            session.config.workeroutput[ACCOUNTING_KEY] = snapshot  # type: ignore[attr-defined]
        boots = [boot for boot in read_boots(self.run_dir()) if boot.get("worker_pid") == os.getpid()]
        session.config.workeroutput[HOST_REPORT_KEY] = {  # type: ignore[attr-defined]
            "hostname": hosts.this_host(), "boots": boots}


def register(config: pytest.Config, run_dir: str, groups: Callable[[], dict[str, str]], *, configured: bool) -> None:
    """The controller's hooks. Unconfigured (no llmserve configuration file or setting), they only hand the
    run directory's name to the workers: the dist mode, ``--max-worker-restart`` and the scheduler stay
    the user's (pytest-xdist's own)."""
    if config.pluginmanager.hasplugin("xdist"):
        by_config = configured and distributes_by_config(config)
        config.pluginmanager.register(XdistHooks(run_dir, config, groups, by_config), "llmserve-xdist-hooks")
        if by_config:
            prepare_controller(config)


def register_worker(config: pytest.Config, accounting: Accounting, run_dir: Callable[[], Path]) -> None:
    config.pluginmanager.register(WorkerAccounting(accounting, run_dir), "llmserve-xdist-worker-accounting")


def workers_accounting(config: pytest.Config) -> list[dict[str, Any]]:
    """The accounting snapshots of the workers that finished (empty outside an xdist controller)."""
    hooks = config.pluginmanager.get_plugin("llmserve-xdist-hooks")
    return list(hooks.worker_accounting) if isinstance(hooks, XdistHooks) else []


def workers_used_llmserve(config: pytest.Config) -> bool:
    """Whether a finished worker used llmserve (an unconfigured controller collects nothing to tell it)."""
    hooks = config.pluginmanager.get_plugin("llmserve-xdist-hooks")
    return isinstance(hooks, XdistHooks) and hooks.used


def host_reports(config: pytest.Config) -> dict[str, hosts.HostReport]:
    """Each finished or lost worker's host report, by gateway id (empty outside an xdist controller)."""
    hooks = config.pluginmanager.get_plugin("llmserve-xdist-hooks")
    return dict(hooks.host_reports) if isinstance(hooks, XdistHooks) else {}
