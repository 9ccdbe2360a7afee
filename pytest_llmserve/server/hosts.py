"""Several hosts through pytest-xdist's own gateways (``--tx ssh=...``): the plain decisions, no pytest.

* **Grouping.** Every test of one server configuration carries ``xdist_group(config_group(spec))``, so one
  host runs (and boots) that configuration, once.
* **Where a worker keeps its run directory.** On the controller's host (``-n N``, ``popen`` gateways) the
  workers share the controller's run directory (its path is handed to them), as before. A worker behind a
  remote gateway cannot assume that path exists on its host, nor that another host sees what it writes:
  it derives a host-local one from the controller's run id, under its own results directory. Workers of
  one host still share it (same id, same results directory), so they still boot each configuration once.
* **Who stops a server.** Under a shared run directory the controller stops every server. A host-local
  server is out of the controller's reach: the worker that booted it stops it at its own session end, and
  its run marker names that worker as its owner, so if the host's worker dies the server is an orphan that
  ``llmserve kill-stale`` (or the next run's preflight) finds there.
* **A host that went down** fails the tests it had left, naming the host and the reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from pytest_llmserve.config import ServerSpec

#: The xdist_group name prefix of a configuration's tests.
GROUP_PREFIX = "llmserve-config-"


def config_group(spec: ServerSpec) -> str:
    """The ``xdist_group`` of every test of ``spec``'s configuration: the same on every host, so the
    configuration file's path (``source``, where each host has its own copy) is left out of it."""
    digest = hashlib.sha256(repr(replace(spec, source="")).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in spec.id)[:60]
    return f"{GROUP_PREFIX}{safe}-{digest}"


def config_groups(specs: Iterable[ServerSpec]) -> dict[str, str]:
    """Each configuration's server id -> its xdist group (how the controller places and names tests)."""
    return {spec.id: config_group(spec) for spec in specs}


def server_of_nodeid(nodeid: str, server_ids: Iterable[str]) -> str | None:
    """The configuration a test's node id names in its parametrization (``test_x[default[max_batch_size=4]]``,
    ``test_y[a-batch3]``), longest id first; None for a test of no configuration.

    Read from the node id on the controller, which sees nothing else of an item: pytest-xdist's
    ``loadgroup`` carries groups in a node id suffix, which pytest 9 items no longer take (xdist 3.8 sets
    ``item._nodeid``; pytest 9.2 reads ``item._id``), so groups by marker never reach the scheduler there."""
    head = nodeid.split("::")[-1]
    if "[" not in head or not head.endswith(("]", "]@")) and "]@" not in head:
        return None
    params = head[head.index("[") + 1:head.rindex("]")]
    for sid in sorted(server_ids, key=len, reverse=True):
        if params == sid or params.startswith(sid + "-") or params.endswith("-" + sid) or f"-{sid}-" in params:
            return sid
    return None


def this_host() -> str:
    return socket.gethostname()


def gateway_is_remote(spec: object) -> bool:
    """Whether an execnet ``XSpec`` reaches another host (ssh, socket, vagrant) rather than a local popen."""
    return bool(getattr(spec, "ssh", None) or getattr(spec, "socket", None) or getattr(spec, "vagrant_ssh", None))


def gateway_label(spec: object) -> str:
    """The host a gateway reaches, as the user wrote it: ``root@gpu-3`` for ``ssh=root@gpu-3 -p 2222``,
    the ``Host`` alias for an ``ssh_config`` entry, ``ADDR:PORT`` for a socket; ``localhost`` for popen."""
    ssh = getattr(spec, "ssh", None) or getattr(spec, "vagrant_ssh", None)
    if ssh:
        words = str(ssh).split()
        # The destination is the first word that is neither an option nor an option's argument.
        takes_value = set("BbcDEeFIiJLlmOopQRSWw")
        skip = False
        for word in words:
            if skip:
                skip = False
                continue
            if word.startswith("-"):
                skip = len(word) == 2 and word[1] in takes_value
                continue
            return word
        return str(ssh)
    socket_addr = getattr(spec, "socket", None)
    if socket_addr:
        return str(socket_addr)
    return "localhost"


def host_run_dir(controller_run_dir: str, results_dir: Path, *, remote: bool, label: str = "host") -> tuple[Path, bool]:
    """The run directory a worker uses and whether it is host-local (the worker stops what it boots).

    A worker behind a local gateway keeps the controller's directory (shared, the controller stops the
    servers); a remote worker, or one whose host lacks the controller's temporary directory, uses
    ``<results_dir>/host-runs/<run id>-<host>`` on its own host (beside, not among, the report directories
    in ``runs/``). The host in the name keeps its servers' run marker apart from the controller's: the
    controller's sweep of its own run's strays must never reach a host's servers (it would on a machine
    that is both, and it would hide a host's missing teardown)."""
    given = Path(controller_run_dir)
    if not remote and given.parent.is_dir() and os.access(given.parent, os.W_OK):
        return given, False
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in label)[:60]
    return results_dir.resolve() / "host-runs" / f"{given.name}-{safe}", True


# ---------------------------------------------------------------------- what a host reports home

class BootEntry(TypedDict, total=False):
    """One boot (or attachment) as ``boots.jsonl`` of a run directory records it (:mod:`pytest_llmserve.server.pool`)
    and a host reports it home; a launch as ``launches.jsonl`` records it, the moment its process starts (server, key,
    pid, worker_pid, create_time, log). Read back from disk, any key may be missing."""

    server: str  # the configuration's id
    key: str  # the server's key in the pool
    pid: int | None  # the launched process (None: attached)
    create_time: float | None  # a launch's: its start time (a reused pid is not the same process)
    worker_pid: int  # the pytest process that booted it
    started: float  # time.time() at the start
    boot_s: float
    ok: bool
    error: str | None  # the first line of why it failed
    launched: bool  # False: attached to a server launched elsewhere
    url: str | None
    log: str | None
    hostname: str


@dataclass
class HostReport:
    """What one worker sends home in ``workeroutput``: its host name and the boots it made."""

    gateway: str  # the gateway's id, e.g. gw1
    label: str  # the host as the user named it in --tx
    hostname: str | None = None  # socket.gethostname() on that host; None when the worker never reported
    boots: list[BootEntry] = field(default_factory=list)
    down: str | None = None  # why the worker went down, when it did

    def to_dict(self) -> dict[str, object]:
        return {"gateway": self.gateway, "label": self.label, "hostname": self.hostname, "boots": self.boots,
                "down": self.down}


@dataclass
class ConfigRow:
    """One server configuration of the run: where it ran, its boots and its tests' verdicts."""

    server: str
    host: str
    hostname: str | None
    boots: int | None  # None: unknown (the host went down before reporting)
    failed_boots: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    down: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"server": self.server, "host": self.host, "hostname": self.hostname, "boots": self.boots,
                "failed_boots": self.failed_boots, "verdicts": dict(sorted(self.verdicts.items())), "down": self.down}

    def line(self) -> str:
        counts = ", ".join(f"{n} {word}" for word, n in sorted(self.verdicts.items())) or "no tests"
        boots = "boots unknown (host went down before reporting)" if self.boots is None else f"boots {self.boots}"
        boots += f" ({self.failed_boots} failed)" if self.failed_boots else ""
        where = self.host + (f" ({self.hostname})" if self.hostname and self.hostname != self.host else "")
        text = f"{self.server}: host {where}; {boots}; {counts}"
        return text + (f"; host went down: {self.down}" if self.down else "")


def merge_by_config(servers: Iterable[str], outcomes: Iterable[tuple[str, str, str]],
                    hosts: Mapping[str, HostReport]) -> list[ConfigRow]:
    """Per configuration: the host that ran it, its boots (from that host's report) and its verdicts.

    ``servers`` are the configured server ids in order; ``outcomes`` are ``(server id, gateway id,
    outcome)`` per test; ``hosts`` the reports by gateway id. A configuration whose tests ran on several
    gateways (it should not happen under this grouping) lists each."""
    order = list(servers)
    rows: dict[tuple[str, str], ConfigRow] = {}
    for server, gateway, outcome in outcomes:
        if server not in order:
            continue
        report = hosts.get(gateway) or HostReport(gateway=gateway, label=gateway)
        row = rows.get((server, gateway))
        if row is None:
            boots = None if report.hostname is None else sum(
                1 for boot in report.boots if boot.get("server") == server and boot.get("launched") is not False)
            failed = sum(1 for boot in report.boots if boot.get("server") == server and boot.get("ok") is False)
            row = rows[(server, gateway)] = ConfigRow(server=server, host=report.label, hostname=report.hostname,
                                                      boots=boots, failed_boots=failed, down=report.down)
        row.verdicts[outcome] = row.verdicts.get(outcome, 0) + 1
    return sorted(rows.values(), key=lambda r: (order.index(r.server) if r.server in order else len(order), r.host))


# ---------------------------------------------------------------------- a host that went down

def short_error(error: object) -> str:
    """The first meaningful line of why a gateway went down (execnet hands a traceback or a repr)."""
    lines = [ln.strip() for ln in str(error or "connection lost").splitlines() if ln.strip()]
    line = lines[-1] if lines else "connection lost"
    return re.sub(r"\s+", " ", line)[:300]


def host_down_message(label: str, gateway: str, error: object, nodeid: str, server: str | None) -> str:
    what = f"configuration {server}" if server else "its tests"
    return (f"host {label} ({gateway}) went down before {nodeid} ran: {short_error(error)}; "
            f"{what} did not run there and was not moved to another host (its server would boot twice)")


def pending_nodeids(workload: Mapping[str, Mapping[str, bool]]) -> list[str]:
    """The node ids a scheduler assigned to a node that had not completed, in order."""
    return [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
