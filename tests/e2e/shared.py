"""Real servers shared by the e2e modules: each configuration booted once for the whole test run.

A vLLM CPU boot costs 30-60 s on 2 cores. An inner pytest run whose case is not about booting attaches to
one of these through the plugin's own attach path (``url`` and ``log`` in its configuration, as a user
attaches to a server a cluster manager launched), so a configuration boots once per test session however
many modules use it. Tests about booting, readiness, teardown, faults or the launch configuration itself
keep booting their own.

A module whose tests attach names the servers it uses in ``SHARED_SERVERS``; the session boots all that the
collected tests name at once. The servers are launched with the package's own ``ServerHandle`` (the pytest-free core), each with its log
in a file the inner runs read for facts, and are stopped at the end of the session, their whole process tree
checked gone.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_llmserve.engines import embedded
from pytest_llmserve.server.handle import ServerHandle
from pytest_llmserve.testing.checkpoints import derive_checkpoint
from tests.standins.helpers import MARK_ENV, describe, marked_processes, server_toml

#: The configurations the e2e modules share: the embedded default ("healthy") and the two broken checkpoints
#: derived from it (one layer of NaN; scrambled layers), which the oracle and report tests serve.
CHECKPOINTS = ("nan", "scrambled")


@dataclass(frozen=True)
class SharedServer:
    """One running shared server: where it answers and where its log is."""

    name: str
    url: str
    log: Path
    model: str

    def toml(self, name: str | None = None, **fields: Any) -> str:
        """A ``[servers.NAME]`` table attaching to this server (the engine's log read for its facts)."""
        return server_toml(name or self.name, engine="vllm", url=self.url, log=str(self.log), eager=True, **fields)


class SharedServers:
    """Boots the configurations the collected tests declare (``SHARED_SERVERS`` in their module) at once, in
    parallel, and keeps them for the session.

    Why in parallel: a boot is mostly three Python processes importing torch and vLLM one after another, so
    two cores boot three servers in much less than three boot times. Why wait for all before the first test
    uses one: a boot beside a measured round is host contention, and rounds would be confounded."""

    def __init__(self, root: Path, derived: Path) -> None:
        self.root = root
        self.derived = derived  # where the broken checkpoints are derived (kept in the real cache)
        self.token = f"e2e-shared-{uuid.uuid4().hex[:10]}"  # in every shared server's environment
        self._handles: dict[str, ServerHandle] = {}
        self._booting: dict[str, threading.Thread] = {}
        self._errors: dict[str, BaseException] = {}
        self.boots: dict[str, float] = {}  # name -> seconds to ready, for the suite's own account

    def start(self, names: Iterable[str]) -> None:
        """Start booting each of ``names`` not yet running or booting (in the background)."""
        for name in names:
            if name in self._handles or name in self._booting:
                continue
            if name != "healthy" and name not in CHECKPOINTS:
                raise ValueError(f"no shared server named {name!r}: healthy or one of {CHECKPOINTS}")
            self._booting[name] = threading.Thread(target=self._boot, args=(name,), name=f"boot-{name}")
            self._booting[name].start()

    def get(self, name: str) -> SharedServer:
        self.start([name])
        self._wait()
        if name in self._errors:
            raise AssertionError(f"shared server {name} did not boot: {self._errors[name]}")
        handle = self._handles[name]
        assert handle.log_path is not None
        handle.ensure_alive()  # a test that killed a shared server would be a bug in that test: say so at once
        return SharedServer(name, handle.base_url, handle.log_path, str(handle.spec.model))

    def _wait(self) -> None:
        for thread in self._booting.values():
            thread.join()
        self._booting.clear()

    def _boot(self, name: str) -> None:
        spec = embedded.default_spec()
        if name in CHECKPOINTS:
            spec = replace(spec, model=str(derive_checkpoint(embedded.model_dir(), self.derived / name, name)))
        spec = replace(spec, name=f"shared-{name}", env=(*spec.env, (MARK_ENV, self.token)))
        handle = ServerHandle(spec, log_dir=self.root / name)
        try:
            handle.start()  # stops what it launched if it fails
        except BaseException as exc:  # noqa: BLE001 - reported by get(), in the test that needs this server
            self._errors[name] = exc
            return
        self._handles[name] = handle
        self.boots[name] = handle.boot.boot_s

    def stop_all(self) -> None:
        """Stop every shared server; fail if any process carrying their token is left."""
        self._wait()
        for handle in self._handles.values():
            handle.stop()
        self._handles.clear()
        self._errors.clear()
        left = marked_processes(self.token)
        assert not left, f"shared e2e servers left running: {describe(left)}"
