"""Repeated A/B verdicts on the real vLLM CPU server: eager vs compiled, and A/A (eager vs itself).

Not a test: a measurement for the docs. Boots the two configurations once (both stay up), then runs
the plugin's A/B comparison (interleaved A B A B rounds, the gate's rule) ``--repeats`` times.
``--rounds 8 --max-rounds 8`` records 8 rounds a side whatever the verdict, so that
``benchmarks/time_to_verdict.py --real`` can replay every rule on the same rounds.

    .venv/bin/python benchmarks/ab_repeat.py --repeats 3 --rounds 5 --out docs/ab_repeat.json
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pytest_llmserve.config import WORKLOAD_PRESETS, LLMServeConfig, Workload
from pytest_llmserve.engines import embedded
from pytest_llmserve.gates.ab import ABRunner
from pytest_llmserve.server.pool import ServerPool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="rounds a side before the first look")
    parser.add_argument("--max-rounds", type=int, default=None, help="most rounds a side (default --rounds)")
    parser.add_argument("--only", choices=("compiled", "aa"), default=None, help="run one comparison kind only")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--len", type=int, default=64, help="input and output length")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    # SIGTERM must run the finally below, or the two servers would outlive this script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = embedded.default_spec()
    eager = replace(base, name="cpu", variant=(("eager", "on"),))
    compiled = replace(base, name="cpu", eager=False, variant=(("eager", "off"),))
    wl = Workload("ab", num_prompts=args.num_prompts, input_len=args.len, output_len=args.len, max_concurrency=8,
                  warmup=2)
    cfg = LLMServeConfig(servers=(base,), workloads={**WORKLOAD_PRESETS, "ab": wl}, default_server="default",
                         source="benchmarks/ab_repeat.py", matrices={"default": (eager, compiled)})
    run_dir = Path(tempfile.mkdtemp(prefix="llmserve-ab-"))
    pool = ServerPool(run_dir, run_dir / "logs", say=print, max_alive=2)
    results = []
    try:
        kinds = [k for k in (("eager vs compiled", (eager, compiled)), ("A/A eager vs eager", (eager, eager)))
                 if args.only is None or (args.only == "aa") == k[0].startswith("A/A")]
        for kind, (a, b) in kinds:
            for i in range(args.repeats):
                load_before = Path("/proc/loadavg").read_text().split()[:3]
                invalid: list[str] = []
                outcomes: list = []

                def fail(msg: str, invalid: list[str] = invalid) -> None:
                    # an invalid round is not a number: kept out of the samples, its reasons recorded
                    print("FAIL:", msg.replace("\n", " | ")[:600])
                    invalid.append(msg.split("\nworkload:", 1)[0])

                runner = ABRunner(pool=pool, cfg=cfg, test_id=f"{kind} #{i + 1}", results_dir=run_dir,
                                  record=outcomes.append, fail=fail, say=print)
                started = time.monotonic()
                out = runner.run(a.id, b.id, workload="ab", rounds=args.rounds, tolerance=args.tolerance,
                                 max_rounds=args.max_rounds)
                detail = out.verdict.to_dict() if out.verdict else {}
                results.append({"comparison": kind, "repeat": i + 1, "verdict": out.status,
                                "change": detail.get("change"), "p_worse": detail.get("p_worse"),
                                "p_better": detail.get("p_better"), "ci": [detail.get("ci_low"), detail.get("ci_high")],
                                "cliffs_delta": detail.get("cliffs_delta"),
                                "a_samples": out.baseline_series["output_throughput"],
                                "b_samples": out.samples["output_throughput"],
                                "rounds": out.rounds, "look": detail.get("look"), "looks": detail.get("looks"),
                                "set_aside": detail.get("set_aside"), "invalid_rounds": invalid,
                                "load_before": load_before,
                                "load_after": Path("/proc/loadavg").read_text().split()[:3],
                                "seconds": round(time.monotonic() - started, 1)})
                print(json.dumps(results[-1]))
    finally:
        pool.stop_all()
    print(f"\n{'comparison':<22} {'#':>2} {'A median':>9} {'B median':>9} {'change':>8}  verdict")
    import statistics

    for r in results:
        print(f"{r['comparison']:<22} {r['repeat']:>2} {statistics.median(r['a_samples']):>9.1f} "
              f"{statistics.median(r['b_samples']):>9.1f} {r['change']:>+8.1%}  {r['verdict']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
