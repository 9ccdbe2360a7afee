"""The environment a benchmark ran in, as plain JSON data that can be stored and compared.

:func:`build_context` gathers everything that must match for two runs to be comparable: the engine and its
version, the model, the server arguments, the hardware (:func:`hardware_context`: CPU model and count; GPU
name, count, driver and CUDA version read through :mod:`pytest_llmserve.server.gpu`), the workload, the
plugin and the Python version, and the environment variables a launched server inherits from the shell and
its engine reads (:func:`engine_environment`, under ``engine_env``; none for a server attached by url).
Before it is returned the context is made portable (paths under the plugin's cache are written
``<cache>/...``) and safe to store (secrets become ``***``, :func:`redact_context`).
"""

from __future__ import annotations

import functools
import math
import os
import platform
from collections.abc import Iterator, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_llmserve.config import ServerSpec, Workload, cache_dir, is_secret_name, redact_argv
from pytest_llmserve.server import gpu

CPUINFO = Path("/proc/cpuinfo")
REDACTED = "***"

# Fields of ServerSpec.public_dict() left out of context["server_args"]: identity/bookkeeping
# (name, source, port, variant), where an attached server's log is read (log: a place, not a setting; and
# leaving it out keeps baselines recorded before the field existed comparable) and those stored at the
# top level of the context (engine, model). An attached server's url stays: this run cannot see the
# hardware behind it, so the url is what tells one remote server from another.
_SPEC_FIELDS_NOT_IN_ARGS = ("name", "source", "port", "variant", "log", "engine", "model")

# String-valued keys whose names contain a secret word but are not secrets.
_NOT_SECRET_KEYS = frozenset({"tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init"})


def plain_json(value: Any) -> Any:
    """Plain JSON data: tuples → lists, Paths → str, non-finite floats → "inf"/"-inf"/"nan"."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain_json(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [plain_json(v) for v in items]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


# --------------------------------------------------------------------------- hardware


def _read_cpu_model(cpuinfo: Path) -> str | None:
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or None


def _cpu_count() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def probe_hardware(*, gpus: gpu.GpuSnapshot | None = None, cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """CPU model and count; GPU name, count, driver and CUDA version (None/0 where there is no GPU).

    ``gpus`` defaults to a fresh :func:`pytest_llmserve.server.gpu.snapshot` (NVML, else nvidia-smi).
    """
    summary = gpu.gpu_summary(gpus)
    return {
        "cpu_model": _read_cpu_model(cpuinfo),
        "cpu_count": _cpu_count(),
        **{name: summary[name] for name in ("gpu_name", "gpu_count", "driver", "cuda")},
    }


# Cached for the life of the process: a host's hardware does not change while it runs, and the GPU
# query can cost nvidia-smi subprocesses on every benchmark. The value is read-only (a mapping proxy over
# immutable values), so no caller can change what the next one gets; tests call probe_hardware instead.
@functools.cache
def _host_hardware() -> Mapping[str, Any]:
    return MappingProxyType(probe_hardware())


def hardware_context() -> dict[str, Any]:
    """This host's :func:`probe_hardware`, probed once per process; a fresh dict on every call."""
    return dict(_host_hardware())


def python_label() -> str:
    """Interpreter that ran the client, e.g. ``CPython 3.11``; patch releases are deliberately left out."""
    major, minor, _ = platform.python_version_tuple()
    return f"{platform.python_implementation()} {major}.{minor}"


# --------------------------------------------------------------------------- inherited environment

# Variables that say where things are, or which of the host's devices a server gets, not how it runs:
# they differ between users and CI runners of one set-up (the devices' model and count are in "hardware").
_PLACE_ONLY_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                             "CUDA_DEVICE_ORDER"})
_PLACE_ONLY_SUFFIXES = ("_HOME", "_CACHE", "_CACHE_DIR", "_CACHE_ROOT", "_CONFIG_ROOT", "_DIR", "_PATH")


def engine_env_prefixes(engine: str) -> tuple[str, ...]:
    """Prefixes of the variables a server of ``engine`` reads: the libraries' (:data:`GENERIC_ENV_PREFIXES`)
    and the engine's own (its adapter's ``env_prefixes``); every engine's for ``command``, which may run
    any of them; none for an engine that launches nothing (``external``: the shell here is not its shell)."""
    from pytest_llmserve.engines import ADAPTERS, adapter_named
    from pytest_llmserve.engines.base import GENERIC_ENV_PREFIXES

    if engine not in ADAPTERS:
        return GENERIC_ENV_PREFIXES
    adapter = adapter_named(engine)
    if not adapter.launches:
        return ()
    own = adapter.env_prefixes
    if engine == "command":
        own = tuple(prefix for name in ADAPTERS for prefix in adapter_named(name).env_prefixes)
    return tuple(dict.fromkeys(GENERIC_ENV_PREFIXES + own))


def engine_environment(spec: ServerSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) that a launched ``spec`` server inherits and
    its engine reads, by prefix (``VLLM_CPU_KVCACHE_SPACE``, ``OMP_NUM_THREADS``...), secrets as ``***``.

    Left out: those the spec's own ``env`` sets (they override the shell's and are in ``server_args``) and
    those that only name a place or a device (:data:`_PLACE_ONLY_ENV`, ``*_HOME``, ``*_CACHE_DIR``...).
    """
    prefixes = engine_env_prefixes(spec.engine)
    if not prefixes or spec.attached:  # attached: launched elsewhere, the shell here is not its shell
        return {}
    environ = os.environ if environ is None else environ
    own = {name for name, _ in spec.env}
    out: dict[str, str] = {}
    for name in sorted(environ):
        if (not name.startswith(prefixes) or name in own or name in _PLACE_ONLY_ENV
                or name.endswith(_PLACE_ONLY_SUFFIXES)):
            continue
        out[name] = REDACTED if is_secret_name(name) else environ[name]
    return out


# --------------------------------------------------------------------------- the context


def server_args(spec: ServerSpec) -> dict[str, Any]:
    """``spec.public_dict()`` (secrets redacted) without identity fields and those kept at the top level."""
    out = spec.public_dict()
    for name in _SPEC_FIELDS_NOT_IN_ARGS:
        out.pop(name, None)
    return plain_json(out)  # type: ignore[no-any-return]


def build_context(
    spec: ServerSpec,
    workload: Workload,
    *,
    engine_version: str | None,
    hardware: Mapping[str, Any] | None = None,
    plugin_version: str | None = None,
    python: str | None = None,
    extra: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything that must match for two benchmark runs to be comparable.

    ``hardware`` defaults to :func:`hardware_context`, ``plugin_version`` to this package's version,
    ``python`` to :func:`python_label`, ``environ`` (the shell the server inherits) to ``os.environ``.
    ``extra`` adds keys (they take part in comparisons).
    """
    if plugin_version is None:
        from pytest_llmserve import __version__ as plugin_version
    ctx: dict[str, Any] = {
        "engine": spec.engine,
        "engine_version": engine_version,
        "model": spec.model,
        "server_args": server_args(spec),
        "hardware": dict(hardware) if hardware is not None else hardware_context(),
        "workload": asdict(workload),
        "plugin_version": plugin_version,
        "python": python or python_label(),
    }
    inherited = engine_environment(spec, environ)
    if inherited:  # only when there is one, so that baselines recorded without such variables still compare
        ctx["engine_env"] = inherited
    if extra:
        ctx.update(extra)
    return redact_context(portable_paths(ctx))


def portable_paths(value: Any) -> Any:
    """Paths under the plugin's cache (the embedded default's venv and model) written as ``<cache>/...``,
    so a baseline recorded by one user compares with another user's run of the same set-up."""
    prefix = str(cache_dir())
    if isinstance(value, str):
        return "<cache>" + value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v) for v in value]
    return value


# --------------------------------------------------------------------------- secrets


def _redact_walk(value: Any, key: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _redact_walk(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(list(value))
        return [_redact_walk(v, None) for v in value]
    if (
        key is not None
        and isinstance(value, str)
        and value not in ("", REDACTED)
        and key not in _NOT_SECRET_KEYS
        and is_secret_name(key)
    ):
        return REDACTED
    return value


def redact_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-plain copy of ``context`` with secrets replaced by ``***``.

    Secret-looking string values (names with KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, by
    :func:`~pytest_llmserve.config.is_secret_name`) anywhere in the tree, the values of secret flags
    in every list of strings (:func:`~pytest_llmserve.config.redact_argv`), and ``server_args.api_key``.
    """
    out: dict[str, Any] = _redact_walk(plain_json(context), None)
    args = out.get("server_args")
    if isinstance(args, dict) and args.get("api_key") not in (None, "", REDACTED):
        args["api_key"] = REDACTED
    return out


def find_secrets(context: Mapping[str, Any]) -> list[str]:
    """Dotted paths of values in ``context`` that the redaction rules would hide (empty = safe to store)."""
    found: list[str] = []
    redacted = redact_context(context)
    for path, old, new in _walk_pairs(plain_json(context), redacted, ""):
        if old != new:
            found.append(path)
    return found


def _walk_pairs(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            yield from _walk_pairs(a[k], b.get(k), f"{path}.{k}" if path else k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _walk_pairs(x, y, f"{path}[{i}]")
    else:
        yield path, a, b
