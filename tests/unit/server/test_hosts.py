"""Several hosts through pytest-xdist gateways: the grouping key, the host-local run directory, the merged
per-configuration rows and how a dead host's tests are failed (no ssh here; tests/multihost has the real run)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import execnet
import pytest

from pytest_llmserve import xdist_hooks
from pytest_llmserve.config import ServerSpec
from pytest_llmserve.server import hosts
from pytest_llmserve.server.pool import spec_key


def test_each_configuration_has_its_own_group_the_same_on_every_host() -> None:
    a = ServerSpec(name="default", engine="vllm", model="/m", max_batch_size=4, variant=(("max_batch_size", "4"),))
    b = ServerSpec(name="default", engine="vllm", model="/m", max_batch_size=8, variant=(("max_batch_size", "8"),))
    group_a, group_b = hosts.config_group(a), hosts.config_group(b)
    assert group_a != group_b
    # Every host computes the same group from its own copy of the configuration file (seen on the real
    # run: the file's path was in the pool key, and each host booted both configurations).
    assert hosts.config_group(replace(a, source="/host2/work/proj/llmserve.toml")) == group_a
    assert spec_key(replace(a, source="/host2/x.toml")) != spec_key(a)  # the pool key is per host


def test_the_controller_reads_a_tests_configuration_from_its_node_id() -> None:
    ids = ["default", "default[max_batch_size=4]", "default[max_batch_size=8]", "b"]
    assert hosts.server_of_nodeid("t.py::test_x[default[max_batch_size=4]]", ids) == "default[max_batch_size=4]"
    assert hosts.server_of_nodeid("t.py::test_x[default[max_batch_size=8]]@g", ids) == "default[max_batch_size=8]"
    assert hosts.server_of_nodeid("t.py::test_x[default]", ids) == "default"
    assert hosts.server_of_nodeid("t.py::test_batch[b-batch3]", ids) == "b"  # batch cases: SPEC-CASE
    assert hosts.server_of_nodeid("t.py::test_plain", ids) is None
    assert hosts.server_of_nodeid("t.py::test_p[bb]", ids) is None


@pytest.mark.parametrize(("tx", "remote", "label"), [
    ("ssh=root@gpu-3", True, "root@gpu-3"),
    ("ssh=-p 2222 root@127.0.0.2", True, "root@127.0.0.2"),
    ("ssh=root@127.0.0.3 -p 2222", True, "root@127.0.0.3"),
    ("ssh_config=/x/cfg//ssh=host2//python=/v/bin/python//chdir=/w", True, "host2"),
    ("socket=10.0.0.5:8888", True, "10.0.0.5:8888"),
    ("popen//python=/v/bin/python", False, "localhost"),
])
def test_gateway_label_is_the_host_as_written_and_popen_is_local(tx: str, remote: bool, label: str) -> None:
    spec = execnet.XSpec(tx)
    assert hosts.gateway_is_remote(spec) is remote
    assert hosts.gateway_label(spec) == label


def test_local_worker_shares_the_controllers_run_dir_remote_one_gets_a_host_local_one(tmp_path: Path) -> None:
    controller = tmp_path / "tmp" / "llmserve-run-abc123"
    controller.parent.mkdir()
    results = tmp_path / "results"
    assert hosts.host_run_dir(str(controller), results, remote=False) == (controller, False)
    run_dir, local = hosts.host_run_dir(str(controller), results, remote=True, label="root@gpu-2")
    assert local and run_dir == results.resolve() / "host-runs" / "llmserve-run-abc123-root-gpu-2"
    # Its servers' run marker (<run dir name>/<key>) is not the controller's: its sweep passes them by.
    assert not f"{run_dir.name}/key".startswith(controller.name + "/")
    # A local gateway whose host lacks the controller's temporary directory (a popen gateway with another
    # TMPDIR is not this case, a proxied one is): host-local as well, same id.
    missing = tmp_path / "elsewhere" / "llmserve-run-abc123"
    assert hosts.host_run_dir(str(missing), results, remote=False, label="root@gpu-2") == (run_dir, True)


def test_rows_per_configuration_merge_host_boots_and_verdicts_and_name_a_dead_host() -> None:
    servers = ["default[max_batch_size=4]", "default[max_batch_size=8]"]
    reports = {
        "gw0": hosts.HostReport(gateway="gw0", label="host1", hostname="gpu-1",
                                boots=[{"server": "default[max_batch_size=4]", "launched": True, "ok": False},
                                       {"server": "default[max_batch_size=4]", "launched": True, "ok": True}]),
        "gw1": hosts.HostReport(gateway="gw1", label="host2", hostname=None, down="EOFError: connection lost"),
    }
    outcomes = [(servers[0], "gw0", "passed"), (servers[0], "gw0", "passed"), (servers[1], "gw1", "passed"),
                (servers[1], "gw1", "failed"), (servers[1], "gw1", "failed"), ("other", "gw0", "passed")]
    rows = hosts.merge_by_config(servers, outcomes, reports)
    assert [r.to_dict() for r in rows] == [
        {"server": "default[max_batch_size=4]", "host": "host1", "hostname": "gpu-1", "boots": 2, "failed_boots": 1,
         "verdicts": {"passed": 2}, "down": None},
        {"server": "default[max_batch_size=8]", "host": "host2", "hostname": None, "boots": None, "failed_boots": 0,
         "verdicts": {"failed": 2, "passed": 1}, "down": "EOFError: connection lost"},
    ]
    assert rows[0].line() == "default[max_batch_size=4]: host host1 (gpu-1); boots 2 (1 failed); 2 passed"
    assert "host went down: EOFError: connection lost" in rows[1].line()
    assert "boots unknown" in rows[1].line()


def test_dead_host_message_names_host_gateway_reason_and_configuration() -> None:
    message = hosts.host_down_message("host2", "gw1", "Traceback ...\n  ...\nOSError: cannot send (already closed?)",
                                      "t.py::test_b[x]@g", "default[max_batch_size=8]")
    assert message.startswith("host host2 (gw1) went down before t.py::test_b[x]@g ran: "
                              "OSError: cannot send (already closed?)")
    assert "configuration default[max_batch_size=8] did not run there" in message


# ---------------------------------------------------------------------- the scheduler, with stand-in nodes

@dataclass(eq=False)
class FakeNode:
    gateway: Any
    sent: list[int] = field(default_factory=list)
    shut: bool = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shut = True

    @property
    def shutting_down(self) -> bool:
        return self.shut


def _node(gw: str, label: str) -> FakeNode:
    return FakeNode(gateway=SimpleNamespace(id=gw, spec=execnet.XSpec(f"ssh={label}")))


def test_scheduler_places_each_configuration_on_one_host_and_fails_a_dead_hosts_rest() -> None:
    logged: list[Any] = []
    config = SimpleNamespace(getvalue=lambda name: ["ssh=host1", "ssh=host2"] if name == "tx" else "loadgroup",
                             option=SimpleNamespace(tx=["ssh=host1", "ssh=host2"], numprocesses=None),
                             hook=SimpleNamespace(pytest_runtest_logreport=lambda report: logged.append(report)))
    groups = {"a": "llmserve-config-a", "b": "llmserve-config-b", "c": "llmserve-config-c"}
    controller = xdist_hooks.XdistController("/tmp/run", config, lambda: groups, by_config=True)  # type: ignore[arg-type]
    sched = xdist_hooks.by_config_scheduler(config, None, controller)  # type: ignore[arg-type]
    collection = [f"t.py::test_{n}[{g}]" for g in "abc" for n in (1, 2)]
    one, two = _node("gw0", "host1"), _node("gw1", "host2")
    for node in (one, two):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    # Whole configurations, round-robin: a, c on host1; b on host2; both told to end after their work.
    assert [collection[i] for i in one.sent] == collection[0:2] + collection[4:6]
    assert [collection[i] for i in two.sent] == collection[2:4]
    assert one.shut and two.shut
    # host2 ran test_1[b], then went down.
    sched.mark_test_complete(two, two.sent[0])
    controller.host_reports["gw1"] = hosts.HostReport(gateway="gw1", label="host2", down="EOFError")
    crash = sched.remove_node(two)
    assert crash == collection[3]  # xdist reports it as the crash item
    assert [r.nodeid for r in logged] == []  # nothing else was left
    # Nothing of host2's went to host1 (it would boot configuration b again there).
    assert [collection[i] for i in one.sent] == collection[0:2] + collection[4:6]
    for index in one.sent:
        sched.mark_test_complete(one, index)
    assert sched.tests_finished and not sched.has_pending


def _scheduler(groups: dict[str, str]) -> tuple[xdist_hooks.ByConfigScheduling, list[Any]]:
    logged: list[Any] = []
    config = SimpleNamespace(getvalue=lambda name: "loadgroup", option=SimpleNamespace(tx=["2*ssh=host1"]),
                             hook=SimpleNamespace(pytest_collectreport=lambda report: logged.append(report)))
    controller = xdist_hooks.XdistController("/tmp/run", config, lambda: groups, by_config=True)  # type: ignore[arg-type]
    sched = xdist_hooks.by_config_scheduler(config, None, controller)  # type: ignore[arg-type]
    assert isinstance(sched, xdist_hooks.ByConfigScheduling) and sched.numnodes == 2  # "2*spec": two workers
    return sched, logged


def test_scheduler_refuses_differing_collections_and_ends_a_worker_that_came_late() -> None:
    sched, logged = _scheduler({"a": "llmserve-config-a"})
    one, two = _node("gw0", "host1"), _node("gw1", "host1")
    for node, collection in ((one, ["t.py::test_1[a]"]), (two, ["t.py::test_1[a]", "t.py::test_2[a]"])):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    assert not one.sent and not two.sent  # nothing runs
    assert [r.outcome for r in logged] == ["failed"] and "+t.py::test_2[a]" in str(logged[0].longrepr)

    sched, _ = _scheduler({"a": "llmserve-config-a"})
    first, second = _node("gw0", "host1"), _node("gw1", "host1")
    for node in (first, second):
        sched.add_node(node)
        sched.add_node_collection(node, ["t.py::test_1[a]", "t.py::test_plain@g"])
    sched.schedule()
    assert first.sent == [0] and second.sent == [1]  # configuration a on one worker, group g on the other
    late = _node("gw2", "host1")  # a restarted worker
    sched.add_node(late)
    sched.add_node_collection(late, ["t.py::test_1[a]", "t.py::test_plain@g"])
    sched.schedule()
    assert late.sent == [] and late.shut


def test_the_scheduler_has_every_member_of_xdists_scheduler_protocol() -> None:
    """pytest-xdist's ``Scheduling`` protocol (3.6 on) is what ``pytest_xdist_make_scheduler`` returns: a member it
    adds fails here (pytest-xdist ships no type information, so mypy cannot check it)."""
    protocol = pytest.importorskip("xdist.scheduler.protocol", reason="pytest-xdist before 3.6 has no protocol module")
    members = {name for name in vars(protocol.Scheduling) if not name.startswith("_")}
    assert members and members <= set(dir(xdist_hooks.ByConfigScheduling))


def test_dead_hosts_untouched_tests_are_each_failed_naming_host_and_configuration() -> None:
    logged: list[Any] = []
    config = SimpleNamespace(getvalue=lambda name: ["ssh=host1", "ssh=host2"] if name == "tx" else "loadgroup",
                             option=SimpleNamespace(tx=["ssh=host1", "ssh=host2"], numprocesses=None),
                             hook=SimpleNamespace(pytest_runtest_logreport=lambda report: logged.append(report)))
    groups = {"srv[b]": "llmserve-config-b"}
    controller = xdist_hooks.XdistController("/tmp/run", config, lambda: groups, by_config=True)  # type: ignore[arg-type]
    node = _node("gw1", "root@127.0.0.3")
    controller.host_reports["gw1"] = hosts.HostReport(gateway="gw1", label="root@127.0.0.3",
                                                 down="OSError: cannot send (already closed?)")
    controller.fail_abandoned(node, ["t.py::test_2[srv[b]]", "t.py::test_3[srv[b]]"])
    assert [(r.nodeid, r.outcome) for r in logged] == [("t.py::test_2[srv[b]]", "failed"),
                                                       ("t.py::test_3[srv[b]]", "failed")]
    text = str(logged[0].longrepr)
    assert "host root@127.0.0.3 (gw1) went down" in text
    assert "OSError: cannot send (already closed?)" in text and "configuration srv[b]" in text
    assert logged[0].node is node


# ---------------------------------------------------------------------- a host-local worker's pool (stand-in)

@pytest.mark.usefixtures("private_registry")
def test_host_local_worker_owns_stops_its_previous_configuration_and_stops_its_servers_at_the_end(
        tmp_path: Path, token: str) -> None:
    import os

    from pytest_llmserve.server.pool import AttachedHandle, ServerPool
    from tests.standins.helpers import MARK_ENV, marked_processes, standin_argv

    def standin(name: str) -> ServerSpec:
        return ServerSpec(name=name, engine="command", argv=tuple(standin_argv("fail_once.py")),
                          served_model_name="standin", env=((MARK_ENV, token),), startup_timeout_s=30.0)

    run_dir = tmp_path / "host-runs" / "llmserve-run-x-host2"
    pool = ServerPool(run_dir, tmp_path / "logs", shared=True, host_local=True)
    other_worker = ServerPool(run_dir, tmp_path / "logs", shared=True, host_local=True)
    a = pool.get(standin("a"))
    # The owner is this worker (the controller is on another machine): if it dies, the server is an orphan.
    assert a.run_pid == os.getpid()
    assert isinstance(other_worker.get(standin("a")), AttachedHandle)  # a second worker of the host attaches
    b = pool.get(standin("b"))  # the next configuration: the previous one is stopped first
    assert not a.is_alive() and b.is_alive()
    assert other_worker.stop_owned() == []  # attached only: it stops nothing
    assert b.is_alive()
    assert pool.stop_owned() == []
    assert not b.is_alive()
    assert marked_processes(token) == []
