"""The baseline store: one JSON file per benchmark, every sample kept, the full context beside it.

Layout: ``<root>/<readable-slug>-<hash10>.json`` where the hash is of the benchmark key
(:class:`BenchKey`: test id, server id, workload name). The context (engine and its version, model,
server arguments, hardware, workload, plugin and Python version) is *not* part of the key: a run in
another context finds the same file and the comparison is refused with the differences shown
(:func:`comparability`), instead of silently starting a new baseline.

File format (``schema`` 1)::

    {"schema": 1,
     "key": {"test": ..., "server": ..., "workload": ...},
     "context": {"engine", "engine_version", "model", "server_args", "hardware": {cpu_model, cpu_count,
                 gpu_name, gpu_count, driver, cuda}, "workload", "plugin_version", "python"},
     "metric": {"name": "output_throughput", "higher_is_better": true},
     "records": [{"recorded_at": ISO-8601, "run_id": ..., "samples": {metric: [float, ...]},
                  "summary": {metric: {n, mean, median, stdev, min, max, p90, p99, cv}}, "info": {...}}]}

Writes are atomic (temporary file in the same directory, fsync, ``os.replace``) and serialised by a
``filelock.FileLock`` per file (``.<file>.lock`` beside it; a ``.gitignore`` in the root hides the
lock and temporary files from git), and an append re-reads the file under the
lock, so concurrent writers (xdist workers, two pytest runs) lose no record and a writer killed
mid-write leaves the old file intact. A file that is not valid JSON or of another schema raises
:class:`~pytest_llmserve.errors.BaselineError` naming it and is never overwritten, not even by a
replace. Secrets (API keys, tokens) are redacted before anything is written.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_llmserve.config import ServerSpec, Workload, is_secret_name, redact_argv
from pytest_llmserve.errors import BaselineError

SCHEMA = 1
DEFAULT_ROOT = "baselines"
LOCK_TIMEOUT_S = 120.0
GITIGNORE = "# written by pytest-llmserve: lock and temporary files of the baseline store\n.*.lock\n.*.tmp\n"

# Context keys (dotted paths; a prefix covers everything below it) that may differ between a baseline
# and a run without making them incomparable: identities, bookkeeping, timeouts, where logs went.
IGNORED_CONTEXT_KEYS: tuple[str, ...] = (
    "recorded_at",
    "run_id",
    "log_path",
    "server_args.name",
    "server_args.source",
    "server_args.variant",
    "server_args.port",
    "server_args.log_path",
    "server_args.startup_timeout_s",
    "server_args.request_timeout_s",
    "server_args.api_key",
    "server_args.served_model_name",
)

# Fields of ServerSpec.public_dict() left out of context["server_args"]: identity/bookkeeping
# (name, source, port, variant) and those stored at the top level of the context (engine, model).
_SPEC_FIELDS_NOT_IN_ARGS = ("name", "source", "port", "variant", "engine", "model")

# Declared variables that stand for several context keys.
VARIABLE_GROUPS: dict[str, tuple[str, ...]] = {
    # Two engine builds side by side: another version and usually another interpreter/venv.
    "engine_version": ("engine_version", "server_args.python"),
    "engine_build": ("engine_version", "server_args.python"),
}
ENGINE_BUILD_VARIABLES = ("engine_version", "engine_build")

# String-valued keys whose names contain a secret word but are not secrets.
_NOT_SECRET_KEYS = frozenset({"tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init"})
_REDACTED = "***"

Mode = Literal["append", "replace"]
Status = Literal["same", "allowed-variable", "refused", "forced"]


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True)
class BenchKey:
    """What identifies a benchmark's baseline: the test, the server configuration and the workload."""

    test: str
    server: str
    workload: str

    def as_dict(self) -> dict[str, str]:
        return {"test": self.test, "server": self.server, "workload": self.workload}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchKey:
        try:
            return cls(test=str(data["test"]), server=str(data["server"]), workload=str(data["workload"]))
        except (KeyError, TypeError):
            raise BaselineError(f"benchmark key {data!r}: needs test, server and workload") from None

    @property
    def digest(self) -> str:
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]

    @property
    def slug(self) -> str:
        """File-name-safe ``<test>--<server>--<workload>``, shortened; the digest keeps it unique."""
        test = self.test.rsplit("::", 1)[-1]
        raw = f"{test}--{self.server}--{self.workload}"
        slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", raw).strip("._-")
        return slug[:80].rstrip("._-") or "benchmark"

    @property
    def filename(self) -> str:
        return f"{self.slug}-{self.digest}.json"

    def __str__(self) -> str:
        return f"{self.test} [{self.server}] workload={self.workload}"


# --------------------------------------------------------------------------- context


def _jsonable(value: Any) -> Any:
    """Plain JSON data: tuples → lists, Paths → str, non-finite floats → "inf"/"-inf"/"nan"."""
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


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


def _gpu_from_nvidia_smi(exe: str) -> dict[str, Any] | None:
    path = shutil.which(exe)
    if path is None:
        return None
    try:
        query = subprocess.run(
            [path, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        banner = subprocess.run([path], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[part.strip() for part in line.split(",")] for line in query.stdout.splitlines() if line.strip()]
    if not rows:
        return None
    names = sorted({row[0] for row in rows})
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", banner.stdout)
    return {
        "gpu_name": " + ".join(names),
        "gpu_count": len(rows),
        "driver": rows[0][1] if len(rows[0]) > 1 else None,
        "cuda": cuda.group(1) if cuda else None,
    }


def _gpu_from_pynvml() -> dict[str, Any] | None:
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no GPU: pynvml raises its own error types
        return None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            return None
        names = set()
        for i in range(count):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.add(name.decode() if isinstance(name, bytes) else str(name))
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return {
            "gpu_name": " + ".join(sorted(names)),
            "gpu_count": count,
            "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
            "cuda": f"{cuda_int // 1000}.{cuda_int % 1000 // 10}",
        }
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


_HARDWARE_CACHE: dict[tuple[str, str], dict[str, Any]] = {}


def hardware_context(
    *, nvidia_smi: str = "nvidia-smi", cpuinfo: Path = Path("/proc/cpuinfo"), use_cache: bool = True
) -> dict[str, Any]:
    """CPU model and count; GPU name, count, driver and CUDA version (None/0 where there is no GPU).

    GPUs are read with ``nvidia-smi`` when it is on PATH, else with pynvml when it is installed.
    The result is cached per process (the GPU query takes a subprocess).
    """
    cache_key = (nvidia_smi, str(cpuinfo))
    if use_cache and cache_key in _HARDWARE_CACHE:
        return copy.deepcopy(_HARDWARE_CACHE[cache_key])
    gpu = (
        _gpu_from_nvidia_smi(nvidia_smi)
        or _gpu_from_pynvml()
        or {"gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}
    )
    out = {"cpu_model": _read_cpu_model(cpuinfo), "cpu_count": _cpu_count(), **gpu}
    _HARDWARE_CACHE[cache_key] = out
    return copy.deepcopy(out)


def python_label() -> str:
    """Interpreter that ran the client, e.g. ``CPython 3.11``; patch releases are deliberately left out."""
    major, minor, _ = platform.python_version_tuple()
    return f"{platform.python_implementation()} {major}.{minor}"


def server_args(spec: ServerSpec) -> dict[str, Any]:
    """``spec.public_dict()`` (secrets redacted) without identity fields and those kept at the top level."""
    out = spec.public_dict()
    for name in _SPEC_FIELDS_NOT_IN_ARGS:
        out.pop(name, None)
    return _jsonable(out)  # type: ignore[no-any-return]


def build_context(
    spec: ServerSpec,
    workload: Workload,
    *,
    engine_version: str | None,
    hardware: Mapping[str, Any] | None = None,
    plugin_version: str | None = None,
    python: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that must match for two benchmark runs to be comparable.

    ``hardware`` defaults to :func:`hardware_context`, ``plugin_version`` to this package's version,
    ``python`` to :func:`python_label`. ``extra`` adds keys (they take part in comparisons).
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
    if extra:
        ctx.update(extra)
    return redact_context(_portable_paths(ctx))


def _portable_paths(value: Any) -> Any:
    """Paths under the plugin's cache (the embedded default's venv and model) written as ``<cache>/...``,
    so a baseline recorded by one user compares with another user's run of the same set-up."""
    from pytest_llmserve.config import cache_dir

    prefix = str(cache_dir())
    if isinstance(value, str):
        return "<cache>" + value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, dict):
        return {k: _portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable_paths(v) for v in value]
    return value


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
        and value not in ("", _REDACTED)
        and key not in _NOT_SECRET_KEYS
        and is_secret_name(key)
    ):
        return _REDACTED
    return value


def redact_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-plain copy of ``context`` with secrets replaced by ``***``.

    Secret-looking string values (names with KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, by
    :func:`~pytest_llmserve.config.is_secret_name`) anywhere in the tree, the values of secret flags
    in every list of strings (:func:`~pytest_llmserve.config.redact_argv`), and ``server_args.api_key``.
    """
    out: dict[str, Any] = _redact_walk(_jsonable(context), None)
    args = out.get("server_args")
    if isinstance(args, dict) and args.get("api_key") not in (None, "", _REDACTED):
        args["api_key"] = _REDACTED
    return out


def find_secrets(context: Mapping[str, Any]) -> list[str]:
    """Dotted paths of values in ``context`` that the redaction rules would hide (empty = safe to store)."""
    found: list[str] = []
    redacted = redact_context(context)
    for path, old, new in _walk_pairs(_jsonable(context), redacted, ""):
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


# --------------------------------------------------------------------------- context comparison


@dataclass(frozen=True, slots=True)
class ContextDiff:
    """One context key whose value differs (``*_present`` False: the key is absent on that side)."""

    key: str
    old: Any
    new: Any
    old_present: bool = True
    new_present: bool = True

    def describe(self) -> str:
        old = json.dumps(self.old) if self.old_present else "(absent)"
        new = json.dumps(self.new) if self.new_present else "(absent)"
        return f"{self.key}: {old} -> {new}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextDiff:
        return cls(
            key=str(data["key"]),
            old=data.get("old"),
            new=data.get("new"),
            old_present=bool(data.get("old_present", True)),
            new_present=bool(data.get("new_present", True)),
        )


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value
    return out


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _diff_all(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[ContextDiff]:
    flat_old = _flatten(_jsonable(old), "", {})
    flat_new = _flatten(_jsonable(new), "", {})
    diffs = []
    for key in sorted(set(flat_old) | set(flat_new)):
        in_old, in_new = key in flat_old, key in flat_new
        if in_old and in_new and flat_old[key] == flat_new[key]:
            continue
        diffs.append(ContextDiff(key, flat_old.get(key), flat_new.get(key), in_old, in_new))
    return diffs


def diff_context(
    baseline_ctx: Mapping[str, Any],
    current_ctx: Mapping[str, Any],
    *,
    ignore: Iterable[str] = IGNORED_CONTEXT_KEYS,
) -> list[ContextDiff]:
    """Differing keys (dotted paths, sorted) between two contexts, except those under ``ignore``."""
    ignored = tuple(ignore)
    return [d for d in _diff_all(baseline_ctx, current_ctx) if not _under(d.key, ignored)]


@dataclass(frozen=True, slots=True)
class Comparability:
    """Whether a baseline and a run may be compared, and why (``diffs`` holds every counted difference)."""

    status: Status
    label: str
    message: str
    variable: str | None = None
    variable_keys: tuple[str, ...] = ()
    diffs: tuple[ContextDiff, ...] = ()
    ignored: tuple[ContextDiff, ...] = ()

    @property
    def ok(self) -> bool:
        """True unless refused ("forced" is ok to compute, but must be reported as forced)."""
        return self.status != "refused"

    @property
    def confounders(self) -> tuple[ContextDiff, ...]:
        return tuple(d for d in self.diffs if not _under(d.key, self.variable_keys))

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "label": self.label,
            "message": self.message,
            "variable": self.variable,
            "variable_keys": list(self.variable_keys),
            "diffs": [d.to_dict() for d in self.diffs],
            "ignored": [d.to_dict() for d in self.ignored],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparability:
        status = data.get("status")
        if status not in ("same", "allowed-variable", "refused", "forced"):
            raise ValueError(f"comparability status {status!r} is unknown")
        return cls(
            status=status,
            label=str(data.get("label", "")),
            message=str(data.get("message", "")),
            variable=data.get("variable"),
            variable_keys=tuple(data.get("variable_keys", ())),
            diffs=tuple(ContextDiff.from_dict(d) for d in data.get("diffs", ())),
            ignored=tuple(ContextDiff.from_dict(d) for d in data.get("ignored", ())),
        )


def variable_keys(variable: str, *contexts: Mapping[str, Any]) -> tuple[str, ...]:
    """Context keys a declared variable stands for.

    ``engine_version`` (alias ``engine_build``) also covers ``server_args.python`` (two builds side by
    side run from two interpreters); a bare server option (``cuda_graph``) means ``server_args.cuda_graph``.
    """
    if variable in VARIABLE_GROUPS:
        return VARIABLE_GROUPS[variable]
    if "." not in variable and not any(variable in ctx for ctx in contexts):
        return (f"server_args.{variable}",)
    return (variable,)


def comparability(
    baseline_ctx: Mapping[str, Any],
    current_ctx: Mapping[str, Any],
    variable: str | None = None,
    allow_confounded: bool = False,
    *,
    ignore: Iterable[str] = IGNORED_CONTEXT_KEYS,
) -> Comparability:
    """Decide whether ``current_ctx`` may be compared with ``baseline_ctx``.

    * ``same``: no counted key differs.
    * ``allowed-variable``: only the declared variable under test differs (labelled "engine build
      comparison" for ``engine_version``/``engine_build``, else "A/B of <variable>").
    * ``refused``: anything else differs; ``message`` lists every differing key.
    * ``forced``: would be refused, but ``allow_confounded`` is set; the report must say so.
    """
    ignored_keys = tuple(ignore)
    every = _diff_all(baseline_ctx, current_ctx)
    diffs = tuple(d for d in every if not _under(d.key, ignored_keys))
    ignored = tuple(d for d in every if _under(d.key, ignored_keys))
    var_keys = variable_keys(variable, baseline_ctx, current_ctx) if variable else ()
    engine_build = variable in ENGINE_BUILD_VARIABLES
    var_label = "engine build comparison" if engine_build else f"A/B of {variable}"
    if not diffs:
        note = f" (the variable under test, {variable}, is the same on both sides)" if variable else ""
        return Comparability(
            "same", "same context", "contexts match" + note, variable, var_keys, diffs, ignored
        )
    confounders = [d for d in diffs if not _under(d.key, var_keys)]
    listing = "\n".join(f"  {'*' if _under(d.key, var_keys) else '-'} {d.describe()}" for d in diffs)
    if not confounders:
        message = f"{var_label}: only the variable under test differs:\n{listing}"
        return Comparability("allowed-variable", var_label, message, variable, var_keys, diffs, ignored)
    declared = (
        f"the variable under test is {variable!r}" if variable else "no variable under test was declared"
    )
    header = (
        f"{len(confounders)} context key(s) besides the variable under test differ ({declared}); "
        "the change could come from any of them"
    )
    if allow_confounded:
        message = (
            f"FORCED comparison (allow_confounded): {header}:\n{listing}\n"
            "  (* = variable under test, - = confounder)"
        )
        return Comparability(
            "forced",
            f"forced despite {len(confounders)} confounder(s)",
            message,
            variable,
            var_keys,
            diffs,
            ignored,
        )
    message = (
        f"comparison refused: {header}:\n{listing}\n  (* = variable under test, - = confounder)\n"
        "Record a new baseline for this context, declare the variable under test, or allow a "
        "confounded comparison explicitly."
    )
    return Comparability(
        "refused", f"refused: {len(confounders)} confounder(s)", message, variable, var_keys, diffs, ignored
    )


# --------------------------------------------------------------------------- documents


@dataclass(slots=True)
class BaselineRecord:
    """One accepted run: every sample of every metric, and their summaries."""

    recorded_at: str
    run_id: str
    samples: dict[str, list[float]]
    summary: dict[str, dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "recorded_at": self.recorded_at,
            "run_id": self.run_id,
            "samples": self.samples,
            "summary": self.summary,
        }
        if self.info:
            out["info"] = self.info
        return out


@dataclass(slots=True)
class BaselineDoc:
    """A baseline file's content."""

    key: BenchKey
    context: dict[str, Any]
    metric: str
    higher_is_better: bool
    records: list[BaselineRecord]
    path: Path | None = None
    schema: int = SCHEMA

    @property
    def latest(self) -> BaselineRecord:
        if not self.records:
            raise BaselineError(f"{self.path or self.key}: holds no records")
        return self.records[-1]

    def samples(self, metric: str | None = None, *, last: int = 1) -> list[float]:
        """Samples of ``metric`` (default: the gated one) from the last ``last`` records (0 = all), pooled."""
        name = metric or self.metric
        chosen = self.records if last <= 0 else self.records[-last:]
        if not chosen:
            raise BaselineError(f"{self.path or self.key}: holds no records")
        out: list[float] = []
        for rec in chosen:
            if name not in rec.samples:
                known = ", ".join(sorted(rec.samples))
                raise BaselineError(
                    f"{self.path or self.key}: record {rec.run_id} has no samples of {name!r} "
                    f"(it has: {known})"
                )
            out.extend(rec.samples[name])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "key": self.key.as_dict(),
            "context": self.context,
            "metric": {"name": self.metric, "higher_is_better": self.higher_is_better},
            "records": [r.to_dict() for r in self.records],
        }


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not allowed")


def _problem(path: Path, what: str) -> BaselineError:
    return BaselineError(
        f"{path}: {what}; the file was left untouched (fix it, or move it away and record a new baseline)"
    )


def _finite_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )


def parse_baseline(data: Any, path: Path) -> BaselineDoc:
    """Validate parsed JSON as a schema-1 baseline document; BaselineError names the problem."""
    if not isinstance(data, dict):
        raise _problem(path, f"expected a JSON object, found {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise _problem(
            path,
            f"schema {schema!r} is not supported (this version of pytest-llmserve reads schema {SCHEMA})",
        )
    for name, kind in (("key", dict), ("context", dict), ("metric", dict), ("records", list)):
        if not isinstance(data.get(name), kind):
            raise _problem(path, f"{name!r} is missing or not a {'list' if kind is list else 'JSON object'}")
    try:
        key = BenchKey.from_dict(data["key"])
    except BaselineError as exc:
        raise _problem(path, str(exc)) from None
    metric = data["metric"]
    if not isinstance(metric.get("name"), str) or not isinstance(metric.get("higher_is_better"), bool):
        raise _problem(path, "'metric' needs a string 'name' and a boolean 'higher_is_better'")
    records = []
    for i, rec in enumerate(data["records"]):
        where = f"records[{i}]"
        if not isinstance(rec, dict):
            raise _problem(path, f"{where} is not a JSON object")
        samples = rec.get("samples")
        if not isinstance(samples, dict) or not samples:
            raise _problem(path, f"{where}.samples is missing or empty")
        for name, values in samples.items():
            if not _finite_list(values):
                raise _problem(path, f"{where}.samples[{name!r}] must be a non-empty list of finite numbers")
        summary = rec.get("summary", {})
        info = rec.get("info", {})
        if not isinstance(summary, dict) or not isinstance(info, dict):
            raise _problem(path, f"{where}.summary/info must be JSON objects")
        records.append(
            BaselineRecord(
                recorded_at=str(rec.get("recorded_at", "")),
                run_id=str(rec.get("run_id", "")),
                samples={k: [float(v) for v in vs] for k, vs in samples.items()},
                summary=summary,
                info=info,
            )
        )
    return BaselineDoc(
        key=key,
        context=data["context"],
        metric=metric["name"],
        higher_is_better=metric["higher_is_better"],
        records=records,
        path=path,
    )


def read_baseline_file(path: str | os.PathLike[str]) -> BaselineDoc:
    """Read and validate one baseline file (BaselineError names the file and the problem)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{p}: no such baseline file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _problem(p, f"cannot be read ({exc})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise _problem(p, f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:
        raise _problem(p, f"not valid JSON ({exc})") from None
    return parse_baseline(data, p)


def _check_samples(samples: Mapping[str, Sequence[float]], metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, values in samples.items():
        vals = list(values)
        if not _finite_list(vals):
            raise BaselineError(
                f"samples of {name!r} = {vals!r}: must be a non-empty list of finite numbers "
                "(an invalid run is never stored)"
            )
        out[str(name)] = [float(v) for v in vals]
    if metric not in out:
        raise BaselineError(
            f"no samples of the gated metric {metric!r} (have: {', '.join(sorted(out)) or 'none'})"
        )
    return out


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file in the same directory, fsync, os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class BaselineStore:
    """Baseline files under ``root`` (default ``baselines/``), one per :class:`BenchKey`."""

    def __init__(
        self, root: str | os.PathLike[str] = DEFAULT_ROOT, *, lock_timeout_s: float = LOCK_TIMEOUT_S
    ):
        self.root = Path(root)
        self.lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"BaselineStore({str(self.root)!r})"

    def path_for(self, key: BenchKey) -> Path:
        return self.root / key.filename

    def lock_path(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.lock")

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.lock_path(path)), timeout=self.lock_timeout_s)
        try:
            lock.acquire()
        except Timeout:
            raise BaselineError(
                f"{path}: could not take the lock {self.lock_path(path)} within "
                f"{self.lock_timeout_s:g} s (another writer holds it)"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def load(self, key: BenchKey) -> BaselineDoc | None:
        """The baseline of ``key``, or None when none was recorded."""
        path = self.path_for(key)
        if not path.exists():
            return None
        doc = read_baseline_file(path)
        if doc.key != key:
            raise _problem(path, f"holds the key {doc.key.as_dict()!r}, expected {key.as_dict()!r}")
        return doc

    def save(
        self,
        key: BenchKey,
        context: Mapping[str, Any],
        samples: Mapping[str, Sequence[float]],
        *,
        metric: str,
        higher_is_better: bool,
        mode: Mode = "append",
        run_id: str | None = None,
        recorded_at: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> BaselineDoc:
        """Record a run's samples (all metrics) for ``key``.

        ``append`` adds a record and refuses (BaselineError) when the stored context differs from
        ``context`` in a counted key, since the samples would not be comparable; ``replace`` starts the
        file afresh with this record. Either refuses to touch a file it cannot parse.
        """
        if mode not in ("append", "replace"):
            raise BaselineError(f"mode = {mode!r}: must be 'append' or 'replace'")
        clean = _check_samples(samples, metric)
        ctx = redact_context(context)
        leaks = find_secrets(ctx)
        if leaks:  # pragma: no cover - redact_context is idempotent; this guards future edits
            raise BaselineError(f"refusing to store secrets at {', '.join(leaks)}")
        from pytest_llmserve.verdicts.stats import summarize

        record = BaselineRecord(
            recorded_at=recorded_at or _now(),
            run_id=run_id or uuid.uuid4().hex[:12],
            samples=clean,
            summary={m: summarize(v).to_dict() for m, v in clean.items()},
            info=_jsonable(dict(info)) if info else {},
        )
        path = self.path_for(key)
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_gitignore()
        with self._locked(path):
            self._remove_stale_temp_files(path)
            existing = self.load(key) if path.exists() else None  # raises on a corrupt file: left untouched
            if existing is None or mode == "replace":
                doc = BaselineDoc(
                    key=key,
                    context=ctx,
                    metric=metric,
                    higher_is_better=higher_is_better,
                    records=[record],
                    path=path,
                )
            else:
                diffs = diff_context(existing.context, ctx)
                if diffs:
                    listing = "\n".join(f"  - {d.describe()}" for d in diffs)
                    raise BaselineError(
                        f"{path}: not appending: these samples were measured in another context than the "
                        f"stored ones:\n{listing}\nReplace the baseline instead (mode='replace', "
                        "`llmserve baselines accept --replace`)."
                    )
                doc = BaselineDoc(
                    key=key,
                    context=ctx,
                    metric=metric,
                    higher_is_better=higher_is_better,
                    records=[*existing.records, record],
                    path=path,
                )
            atomic_write_text(path, json.dumps(doc.to_dict(), indent=2, allow_nan=False) + "\n")
        return doc

    def _write_gitignore(self) -> None:
        # Baselines are meant to be committed; their lock and temporary files are not.
        ignore = self.root / ".gitignore"
        if not ignore.exists():
            with contextlib.suppress(OSError):
                ignore.write_text(GITIGNORE, encoding="utf-8")

    def _remove_stale_temp_files(self, path: Path) -> None:
        # Under the lock, a temp file of this baseline can only be left by a writer that died.
        for tmp in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def list(self) -> list[Path]:
        """Baseline files under the root, sorted by name (hidden lock and temp files excluded)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*.json") if not p.name.startswith(".") and p.is_file())

    def resolve(self, ref: str) -> Path:
        """A file path, a file name or stem in the root, a key digest, or a unique substring of a name."""
        as_path = Path(ref)
        if as_path.is_file():
            return as_path
        files = self.list()
        for test in (
            lambda p: p.name == ref or p.stem == ref,
            lambda p: p.stem.endswith("-" + ref),
            lambda p: ref in p.name,
        ):
            matches = [p for p in files if test(p)]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                names = ", ".join(p.name for p in matches[:10])
                raise BaselineError(f"{ref!r} matches {len(matches)} baselines in {self.root}: {names}")
        raise BaselineError(f"{ref!r}: no such file and no baseline in {self.root} matches it")


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)
