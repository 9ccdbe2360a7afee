"""The baseline store: round trips, atomicity, locking, corrupt files, secrets never stored."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import BaselineError
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.redaction import find_secrets, redact_context
from pytest_llmserve.store.baselines import BaselineStore, BenchKey, read_baseline_file
from tests.unit.contexts import HW, ctx, spec

KEY = BenchKey(test="tests/test_perf.py::test_throughput[srv]", server="srv", workload="smoke")
METRIC = "output_throughput"

fork = pytest.mark.skipif(sys.platform == "win32", reason="uses fork and SIGKILL")


def samples(base: float = 100.0, n: int = 5) -> dict[str, list[float]]:
    return {METRIC: [base + i for i in range(n)], "median_ttft_ms": [20.0 + i for i in range(n)]}


# --------------------------------------------------------------------------- keys and secrets


def test_key_file_name_is_readable_and_unique() -> None:
    name = KEY.filename
    assert name.startswith("test_throughput_srv_--srv--smoke-")
    assert name.endswith(".json")
    assert len(KEY.digest) == 10
    other = BenchKey(test=KEY.test, server="srv[cuda_graph=off]", workload="smoke")
    assert other.filename != name
    assert "/" not in other.filename
    assert "[" not in other.filename
    long = BenchKey(test="t" * 500, server="s", workload="w")
    assert len(long.filename) < 100
    assert BenchKey.from_dict(KEY.as_dict()) == KEY


def test_secrets_are_never_stored(tmp_path: Path) -> None:
    secret_spec = {
        "api_key": "sk-SECRET1",
        "env": (("HF_TOKEN", "hf_SECRET2"), ("OMP_NUM_THREADS", "2")),
        "args": ("--api-key", "SECRET3", "--hf-token=SECRET4", "--max-num-seqs", "8"),
    }
    c = build_context(spec(**secret_spec), Workload("smoke"), engine_version="1", hardware=HW)
    # even a context assembled by hand with raw secrets is redacted on save
    raw = dict(c, extra={"OPENAI_API_KEY": "SECRET5", "argv": ["serve", "--api-key", "SECRET6"]})
    assert find_secrets(raw) == ["extra.OPENAI_API_KEY", "extra.argv[2]"]
    store = BaselineStore(tmp_path)
    store.save(KEY, raw, samples(), metric=METRIC, higher_is_better=True)
    text = store.path_for(KEY).read_text()
    for n in range(1, 7):
        assert f"SECRET{n}" not in text
    stored = json.loads(text)["context"]
    assert stored["server_args"]["api_key"] == "***"
    assert stored["server_args"]["env"] == {"HF_TOKEN": "***", "OMP_NUM_THREADS": "2"}
    assert stored["server_args"]["args"] == ["--api-key", "***", "--hf-token=***", "--max-num-seqs", "8"]
    assert find_secrets(stored) == []
    assert redact_context(stored) == stored


# --------------------------------------------------------------------------- store round trip


def test_round_trip_and_append_keeps_old_records(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    assert store.load(KEY) is None
    first = store.save(KEY, ctx(), samples(100), metric=METRIC, higher_is_better=True, run_id="run-1")
    path = store.path_for(KEY)
    assert first.path == path
    assert path.parent == tmp_path / "baselines"
    store.save(KEY, ctx(port=9999), samples(110), metric=METRIC, higher_is_better=True, run_id="run-2")
    doc = store.load(KEY)
    assert doc is not None
    assert [r.run_id for r in doc.records] == ["run-1", "run-2"]
    assert doc.records[0].samples == samples(100)  # every sample, every metric, kept
    assert doc.records[1].samples == samples(110)
    assert doc.records[1].summary[METRIC]["median"] == 112.0
    assert doc.samples() == samples(110)[METRIC]
    assert doc.samples(last=0) == samples(100)[METRIC] + samples(110)[METRIC]
    assert doc.samples("median_ttft_ms") == samples(110)["median_ttft_ms"]
    with pytest.raises(BaselineError, match="no samples of 'nope'"):
        doc.samples("nope")
    data = json.loads(path.read_text())
    assert data["schema"] == 1
    assert data["key"] == KEY.as_dict()
    assert data["metric"] == {"name": METRIC, "higher_is_better": True}
    assert set(data["records"][0]) >= {"recorded_at", "samples", "summary", "run_id"}
    assert store.list() == [path]  # lock file hidden
    assert ".*.lock" in (tmp_path / "baselines" / ".gitignore").read_text().splitlines()


def test_replace_and_context_mismatch(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save(KEY, ctx(), samples(100), metric=METRIC, higher_is_better=True, run_id="old")
    with pytest.raises(
        BaselineError, match=r"another context(.|\n)*engine_version: \"0.32.0\" -> \"0.33.0\""
    ):
        store.save(KEY, ctx(engine_version="0.33.0"), samples(120), metric=METRIC, higher_is_better=True)
    doc = store.save(
        KEY,
        ctx(engine_version="0.33.0"),
        samples(120),
        metric=METRIC,
        higher_is_better=True,
        mode="replace",
        run_id="new",
    )
    assert [r.run_id for r in doc.records] == ["new"]
    assert doc.context["engine_version"] == "0.33.0"
    with pytest.raises(BaselineError, match="mode"):
        store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True, mode="overwrite")  # type: ignore[arg-type]


def test_invalid_samples_are_refused(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    with pytest.raises(BaselineError, match="finite"):
        store.save(KEY, ctx(), {METRIC: [1.0, math.nan]}, metric=METRIC, higher_is_better=True)
    with pytest.raises(BaselineError, match="gated metric"):
        store.save(KEY, ctx(), {"other": [1.0]}, metric=METRIC, higher_is_better=True)
    assert not store.path_for(KEY).exists()


@pytest.mark.parametrize(
    "content",
    [
        '{"schema": 1, "key": ',
        "not json at all",
        '{"schema": 1} trailing',
        '{"schema": 1, "key": {}, "x": NaN}',
    ],
)
def test_corrupt_file_errors_and_is_left_untouched(tmp_path: Path, content: str) -> None:
    store = BaselineStore(tmp_path)
    path = store.path_for(KEY)
    path.write_bytes(content.encode())
    before = path.read_bytes()
    with pytest.raises(BaselineError) as info:
        store.load(KEY)
    assert str(path) in str(info.value)
    assert "not valid JSON" in str(info.value)
    for mode in ("append", "replace"):
        with pytest.raises(BaselineError, match="left untouched"):
            store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True, mode=mode)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema=2), "schema 2 is not supported"),
        (lambda d: d.pop("schema"), "schema None is not supported"),
        (lambda d: d.update(records={}), "'records' is missing or not a list"),
        (
            lambda d: d["records"][0]["samples"].update(output_throughput=[]),
            "non-empty list of finite numbers",
        ),
        (lambda d: d["metric"].pop("higher_is_better"), "higher_is_better"),
        (lambda d: d.update(key={"test": "x"}), "needs test, server and workload"),
    ],
)
def test_schema_problems(tmp_path: Path, mutate: Any, message: str) -> None:
    store = BaselineStore(tmp_path)
    store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True)
    path = store.path_for(KEY)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=message) as info:
        store.load(KEY)
    assert str(path) in str(info.value)
    with pytest.raises(BaselineError):
        store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True, mode="replace")
    assert path.read_bytes() == before


def test_file_holding_another_key_is_refused(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    other = BenchKey(test="x", server="y", workload="z")
    store.save(other, ctx(), samples(), metric=METRIC, higher_is_better=True)
    store.path_for(other).rename(store.path_for(KEY))
    with pytest.raises(BaselineError, match="holds the key"):
        store.load(KEY)


def test_resolve(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True)
    other = BenchKey(test="tests/test_perf.py::test_latency", server="srv", workload="smoke")
    store.save(other, ctx(), samples(), metric=METRIC, higher_is_better=True)
    path = store.path_for(KEY)
    assert store.resolve(str(path)) == path
    assert store.resolve(path.name) == path
    assert store.resolve(path.stem) == path
    assert store.resolve(KEY.digest) == path
    assert store.resolve("test_latency") == store.path_for(other)
    with pytest.raises(BaselineError, match="matches 2 baselines"):
        store.resolve("srv")
    with pytest.raises(BaselineError, match="no baseline"):
        store.resolve("nothing-like-it")


# --------------------------------------------------------------------------- concurrency and crashes


def _append_many(root: str, worker: int, count: int) -> None:
    store = BaselineStore(root)
    for i in range(count):
        store.save(
            KEY,
            ctx(),
            {METRIC: [float(worker * 1000 + i)]},
            metric=METRIC,
            higher_is_better=True,
            run_id=f"w{worker}-{i}",
        )


@fork
def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    workers, appends = 4, 8
    mp = multiprocessing.get_context("fork")
    procs = [mp.Process(target=_append_many, args=(str(tmp_path), w, appends)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    doc = BaselineStore(tmp_path).load(KEY)
    assert doc is not None
    ids = sorted(r.run_id for r in doc.records)
    assert ids == sorted(f"w{w}-{i}" for w in range(workers) for i in range(appends))
    assert not list(tmp_path.glob("*.tmp"))
    assert not list(tmp_path.glob(".*.tmp"))


def _write_and_hang(root: str, ready: Any) -> None:
    # Block inside the atomic write, after the temp file got the whole big record and before the rename.
    def hang(fd: int) -> None:
        ready.set()
        time.sleep(60)

    setattr(os, "fsync", hang)  # noqa: B010 - only in this forked child, never in the test process
    store = BaselineStore(root)
    big = {METRIC: [100.0 + (i % 97) / 10 for i in range(200_000)]}
    store.save(KEY, ctx(), big, metric=METRIC, higher_is_better=True, run_id="killed")


@fork
def test_writer_killed_mid_write_leaves_old_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True, run_id="before")
    path = store.path_for(KEY)
    before = path.read_bytes()
    mp = multiprocessing.get_context("fork")
    ready = mp.Event()
    child = mp.Process(target=_write_and_hang, args=(str(tmp_path), ready))
    child.start()
    try:
        assert ready.wait(30), "child never reached the write"
        temps = list(tmp_path.glob(f".{path.name}.*.tmp"))
        assert temps
        assert temps[0].stat().st_size > 1_000_000
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert path.read_bytes() == before
    assert [r.run_id for r in read_baseline_file(path).records] == ["before"]
    # the dead writer's lock is gone with it, and its temp file is swept by the next writer
    fast = BaselineStore(tmp_path, lock_timeout_s=5)
    fast.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True, run_id="after")
    assert [r.run_id for r in read_baseline_file(path).records] == ["before", "after"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_lock_timeout_is_a_baseline_error(tmp_path: Path) -> None:
    from filelock import FileLock

    store = BaselineStore(tmp_path, lock_timeout_s=0.2)
    path = store.path_for(KEY)
    with FileLock(str(store.lock_path(path))):
        # a second FileLock object is another holder, even in this thread
        with pytest.raises(BaselineError, match="could not take the lock"):
            store.save(KEY, ctx(), samples(), metric=METRIC, higher_is_better=True)
    assert not path.exists()


def test_a_baseline_recorded_before_host_identity_loads_and_compares_as_from_an_unknown_host(tmp_path: Path) -> None:
    """The baseline this repository once shipped for the embedded default (recorded 2026-11-30 with the six
    hardware keys of then): it still loads, and against today's context it is an unknown host, refused."""
    from pytest_llmserve.server.hardware import HOST_FIELDS
    from pytest_llmserve.verdicts.comparability import comparability, unknown_host

    shipped = Path(__file__).parents[2] / "data" / "baselines" / "test_throughput--default--smoke-dd9513b7af.json"
    (tmp_path / shipped.name).write_bytes(shipped.read_bytes())
    doc = BaselineStore(tmp_path).load(BenchKey("test_llmserve_suite.py::test_throughput", "default", "smoke"))
    assert doc is not None and len(doc.samples("output_throughput")) == 5
    assert list(doc.context["hardware"]) == list(HOST_FIELDS[:6])
    now = json.loads(json.dumps(doc.context))
    now["hardware"].update(cpu_vendor="AuthenticAMD", cpu_flags=["avx", "avx2"], memory_gib=24)
    comp = comparability(doc.context, now)
    assert comp.status == "refused" and unknown_host(comp.diffs)
    assert {d.key for d in comp.diffs} == {"hardware.cpu_vendor", "hardware.cpu_flags", "hardware.memory_gib"}
