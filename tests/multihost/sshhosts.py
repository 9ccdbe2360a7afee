"""Loopback "hosts" for the multi-host tests: one OpenSSH server per host, on 127.0.0.2, 127.0.0.3, ...

Each host has its own sshd (its own host key, authorized key, config and pid), listening on its loopback
address only, on a free port, and its own working directory. sshd's ``SetEnv`` gives every session of
that host its own HOME, TMPDIR and registry of running servers (``PYTEST_LLMSERVE_CACHE``), so the two
hosts share nothing but the machine, as two machines would (and nothing of other runs on this one).
The client side is one ``ssh_config`` file with a ``Host`` alias per host, passed to execnet with
``ssh_config=FILE//ssh=ALIAS``. No traffic leaves 127.0.0.0/8.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def available() -> str | None:
    """Why the loopback hosts cannot run here, or None."""
    if not Path(SSHD).is_file():
        return f"OpenSSH's server is not installed ({SSHD}): apt-get install openssh-server"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is not installed"
    return None


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Host:
    alias: str
    address: str
    port: int
    root: Path  # its sshd's files
    workdir: Path  # the worker's chdir
    home: Path
    cache: Path  # PYTEST_LLMSERVE_CACHE of its sessions
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "TMPDIR": str(self.root / "tmp"), "PYTEST_LLMSERVE_CACHE": str(self.cache),
                "PYTHONDONTWRITEBYTECODE": "1"}

    def session_processes(self) -> list[psutil.Process]:
        """Everything the host's sshd runs (its per-connection sshd processes, shells, pytest workers)."""
        if self.sshd is None:
            return []
        try:
            return list(psutil.Process(self.sshd.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []


class Hosts:
    """Start ``count`` loopback hosts under ``root``; :meth:`stop` ends every sshd and session."""

    def __init__(self, root: Path, count: int = 2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.key = root / "client_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.hosts: list[Host] = []
        for index in range(count):
            address = f"127.0.0.{index + 2}"
            host_root = root / f"host{index + 1}"
            host = Host(alias=f"host{index + 1}", address=address, port=free_port(address), root=host_root,
                        workdir=host_root / "work", home=host_root / "home", cache=host_root / "llmserve-cache")
            for path in (host.workdir, host.home, host.cache, host_root / "tmp"):
                path.mkdir(parents=True)
            self.hosts.append(host)
        self.config = root / "ssh_config"
        known = []
        blocks = []
        for host in self.hosts:
            self._write_sshd(host)
            pub = (host.root / "ssh_host_ed25519_key.pub").read_text().split()
            known.append(f"[{host.address}]:{host.port} {pub[0]} {pub[1]}")
            blocks.append(f"Host {host.alias}\n  HostName {host.address}\n  Port {host.port}\n  User root\n"
                          f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
                          f"  UserKnownHostsFile {root / 'known_hosts'}\n  BatchMode yes\n  LogLevel ERROR\n"
                          "  ServerAliveInterval 2\n  ServerAliveCountMax 3\n")
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        self.config.write_text("\n".join(blocks))
        for host in self.hosts:
            self._start(host)

    def _write_sshd(self, host: Host) -> None:
        key = host.root / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (host.root / "authorized_keys").write_text(Path(str(self.key) + ".pub").read_text())
        env = " ".join(f"{name}={value}" for name, value in host.env.items())
        (host.root / "sshd_config").write_text(
            f"ListenAddress {host.address}:{host.port}\nHostKey {key}\n"
            f"AuthorizedKeysFile {host.root / 'authorized_keys'}\nPidFile {host.root / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nX11Forwarding no\nAllowTcpForwarding no\nPrintMotd no\n"
            f"SetEnv {env}\n")

    def _start(self, host: Host) -> None:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        log = open(host.root / "sshd.log", "wb")  # noqa: SIM115  # lives as long as the sshd
        host.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(host.root / "sshd_config")],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if host.sshd.poll() is not None:
                raise RuntimeError(f"sshd for {host.alias} exited: {(host.root / 'sshd.log').read_text()}")
            probe = subprocess.run(["ssh", "-F", str(self.config), host.alias, "true"], capture_output=True,
                                   timeout=30)
            if probe.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"sshd for {host.alias} never accepted a login: {(host.root / 'sshd.log').read_text()}")

    def tx(self, host: Host, python: str) -> str:
        return f"ssh_config={self.config}//ssh={host.alias}//python={python}//chdir={host.workdir}"

    def kill(self, host: Host, *, spare: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
        """The host dies: SIGKILL its sshd and every session process (its pytest worker), except ``spare``
        (the servers: a dead machine's processes die with it, here they stay behind for the sweep)."""
        victims = [p for p in host.session_processes() if p.pid not in spare]
        if host.sshd is not None:
            host.sshd.send_signal(signal.SIGKILL)
            host.sshd.wait(30)
        for proc in victims:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        return [p.pid for p in victims]

    def stop(self) -> None:
        for host in self.hosts:
            sessions = host.session_processes()
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.terminate()
                try:
                    host.sshd.wait(10)
                except subprocess.TimeoutExpired:
                    host.sshd.kill()
                    host.sshd.wait(10)
            for proc in sessions:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
