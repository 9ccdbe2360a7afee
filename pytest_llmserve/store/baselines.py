"""The baseline store: one JSON file per benchmark, every sample kept, the full context beside it.

Layout: ``<root>/<readable-slug>-<hash10>.json`` where the hash is of the benchmark key
(:class:`BenchKey`: test id, server id, workload name). The context (engine and its version, model,
server arguments, hardware, workload, plugin and Python version) is *not* part of the key: a run in
another context finds the same file and the comparison is refused with the differences shown
(:func:`pytest_llmserve.verdicts.comparability.comparability`), instead of silently starting a new baseline.

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
replace. Secrets (API keys, tokens) are redacted before anything is written
(:func:`pytest_llmserve.redaction.redact_context`). Files are strict JSON
(:mod:`pytest_llmserve.json_encoding`: a figure that is not finite is null; samples are refused unless finite).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_llmserve.errors import BaselineError
from pytest_llmserve.json_encoding import dumps, to_plain
from pytest_llmserve.redaction import find_secrets, redact_context
from pytest_llmserve.verdicts.comparability import append_diffs
from pytest_llmserve.verdicts.stats import summarize

SCHEMA = 1
DEFAULT_ROOT = "baselines"
LOCK_TIMEOUT_S = 120.0
GITIGNORE = "# written by pytest-llmserve: lock and temporary files of the baseline store\n.*.lock\n.*.tmp\n"

Mode = Literal["append", "replace"]


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
    def from_dict(cls, data: Mapping[str, object]) -> BenchKey:
        try:
            return cls(test=str(data["test"]), server=str(data["server"]), workload=str(data["workload"]))
        except (KeyError, TypeError):
            raise BaselineError(f"benchmark key {data!r}: needs test, server and workload") from None

    @property
    def digest(self) -> str:
        text = dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
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


# --------------------------------------------------------------------------- documents


@dataclass(slots=True)
class BaselineRecord:
    """One accepted run: every sample of every metric, and their summaries."""

    recorded_at: str
    run_id: str
    samples: dict[str, list[float]]
    summary: dict[str, dict[str, float | int]]
    info: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
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
        return [v for run in self.runs(metric, last=last) for v in run]

    def runs(self, metric: str | None = None, *, last: int = 0) -> list[list[float]]:
        """Samples of ``metric`` (default: the gated one) of the last ``last`` records (0 = all), one list per record:
        each record is one run (one invocation, one boot of the server), the unit the between-run spread is
        estimated over (:mod:`pytest_llmserve.verdicts.between_runs`)."""
        name = metric or self.metric
        chosen = self.records if last <= 0 else self.records[-last:]
        if not chosen:
            raise BaselineError(f"{self.path or self.key}: holds no records")
        out: list[list[float]] = []
        for rec in chosen:
            if name not in rec.samples:
                known = ", ".join(sorted(rec.samples))
                raise BaselineError(
                    f"{self.path or self.key}: record {rec.run_id} has no samples of {name!r} "
                    f"(it has: {known})"
                )
            out.append(list(rec.samples[name]))
        return out

    def to_dict(self) -> dict[str, object]:
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


def _finite_list(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )


def parse_baseline(data: object, path: Path) -> BaselineDoc:
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


def utc_timestamp() -> str:
    """Now in UTC, ISO-8601 to the second (what every file written by this plugin records)."""
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
        # lazy: filelock takes ~40 ms to import (-X importtime)
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
        context: Mapping[str, object],
        samples: Mapping[str, Sequence[float]],
        *,
        metric: str,
        higher_is_better: bool,
        mode: Mode = "append",
        run_id: str | None = None,
        recorded_at: str | None = None,
        info: Mapping[str, object] | None = None,
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

        record = BaselineRecord(
            recorded_at=recorded_at or utc_timestamp(),
            run_id=run_id or uuid.uuid4().hex[:12],
            samples=clean,
            summary={m: summarize(v).to_dict() for m, v in clean.items()},
            info=to_plain(dict(info)) if info else {},
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
                diffs = append_diffs(existing.context, ctx)
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
            atomic_write_text(path, dumps(doc.to_dict(), indent=2) + "\n")
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
