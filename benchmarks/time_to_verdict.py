"""Time to verdict of the throughput gate: how many current rounds each rule needs, and how often it is wrong.

Not a test: a measurement for docs/performance.md ("Time to verdict"). Two parts:

* synthetic trials (seeded): a baseline of 5 rounds, then current rounds shown to the rule one at a time, as
  the gate does, for no change (A/A: the right verdict is "pass") and a 10 % drop ("regressed"), under each
  noise model; both rules see the same draws;
* recorded rounds of the real server (``--real FILE``, written by ``benchmarks/ab_repeat.py --out``): the same
  rules applied to the prefixes of each recorded comparison, as the gate (A's first 5 rounds as the baseline,
  B's rounds one at a time) and as the A/B runner (both sides growing a round at a time).

    .venv/bin/python benchmarks/time_to_verdict.py --trials 2000 --seed 2026 --out docs/time_to_verdict.json
    .venv/bin/python benchmarks/time_to_verdict.py --trials 0 --real docs/time_to_verdict_real.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pytest_llmserve.verdicts import operating as op
from pytest_llmserve.verdicts import stats

NOISES = {
    # Per-round output-throughput noise on the real vLLM CPU server: pooled within-comparison SD of log
    # throughput 2.75 % over 13 sets of 5 rounds (docs/ab_repeat.json, baselines/), rounded up.
    "measured": op.Noise(cv=0.03),
    # Rounds that shared the 2 cores with other work: 5 % of rounds 10-50 % slower (seen under load:
    # docs/performance.md "Under load", single rounds from 36 to 144 tok/s).
    "slow-rounds": op.Noise(cv=0.03, p_slow=0.05),
    # A noisier machine: the CV the tolerance of 5 % is too tight for (both rules lose power).
    "cv5": op.Noise(cv=0.05),
}


def rules(n_baseline: int, tolerance: float, max_rounds: int) -> list[op.Rule]:
    return [
        # today's rule from its first look, 3 (at 5 vs 2 its min_samples = 3 answers "too few" anyway)
        op.fixed_rule(tolerance=tolerance, first=3, max_rounds=max_rounds),
        op.sequential_rule(n_baseline=n_baseline, tolerance=tolerance, max_rounds=max_rounds),
    ]


def synthetic(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for noise_name in args.noise:
        noise = NOISES[noise_name]
        for rule in rules(args.baseline, args.tolerance, args.max_rounds):
            row: dict[str, Any] = {"noise": noise_name, "noise_model": noise.describe(), "rule": rule.name,
                                   "trials": args.trials, "seed": args.seed}
            for label, effect in (("aa", 0.0), ("drop", -0.10)):
                started = time.monotonic()
                found = op.trials(rule, effect=effect, noise=noise, n_trials=args.trials, seed=args.seed,
                                  n_baseline=args.baseline, max_rounds=args.max_rounds)
                row[label] = op.characterise(found).to_dict()
                row[label]["seconds"] = round(time.monotonic() - started, 1)
            rows.append(row)
            print(table_row(row), flush=True)
    return rows


def table_row(row: dict[str, Any]) -> str:
    aa, drop = row["aa"], row["drop"]
    n_aa, n_drop = aa["n_trials"], drop["n_trials"]

    def rate(part: dict[str, Any], outcome: str) -> str:
        return f"{100 * part['outcomes'].get(outcome, 0) / part['n_trials']:.1f} %"

    return (f"| {row['noise_model']} | {row['rule']} | {aa['mean_rounds']:.2f} / {aa['median_rounds']:g} / "
            f"{aa['p90_rounds']:g} | {rate(aa, 'pass')} | {rate(aa, 'regressed')} | {rate(aa, 'inconclusive')} | "
            f"{drop['mean_rounds']:.2f} / {drop['median_rounds']:g} / {drop['p90_rounds']:g} | "
            f"{rate(drop, 'regressed')} | {rate(drop, 'pass')} | {rate(drop, 'inconclusive')} | {n_aa}/{n_drop} |")


HEADER = ("| noise | rule | A/A rounds mean / median / p90 | A/A pass | A/A regressed (false) | A/A inconclusive | "
          "drop rounds mean / median / p90 | drop regressed (power) | drop pass | drop inconclusive | trials |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def real(path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each rule on the prefixes of each recorded comparison: where it stopped and what it said."""
    recorded = json.loads(path.read_text())
    out = []
    for rec in recorded:
        a, b = rec["a_samples"], rec["b_samples"]
        cap = min(len(a), len(b), args.max_rounds)
        row: dict[str, Any] = {"comparison": rec["comparison"], "repeat": rec["repeat"], "a": a, "b": b}
        if len(a) >= args.baseline:
            base = a[:args.baseline]
            for rule in rules(args.baseline, args.tolerance, cap):
                trial = op.run_trial(rule, base, b[:cap])
                row.setdefault("gate", {})[rule.name] = {"outcome": trial.outcome, "rounds": trial.rounds}
        # The A/B runner: both sides grow together, judged at each look by the same rules.
        fixed_ab = stats.decide
        plan = stats.sequential_plan(stats.ab_looks(2, cap), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
        for name, first in (("fixed-sample Mann-Whitney, re-run", 3), ("group-sequential t", 2)):
            n = first
            while True:
                if name.startswith("fixed"):
                    v = fixed_ab(a[:n], b[:n], higher_is_better=True, tolerance=args.tolerance)
                else:
                    v = stats.decide_sequential(a[:n], b[:n], plan=plan, higher_is_better=True,
                                                tolerance=args.tolerance)
                if v.outcome != "inconclusive" or n >= cap:
                    break
                n += 1
            row.setdefault("ab", {})[f"{name} ({first}..{cap} a side)"] = {
                "outcome": v.outcome, "rounds": n, "change": v.change, "set_aside": v.set_aside}
        out.append(row)
        print(f"{rec['comparison']} #{rec['repeat']}: A median {statistics.median(a):.1f}, B median "
              f"{statistics.median(b):.1f} tok/s; gate: "
              + "; ".join(f"{k}: {v['outcome']} after {v['rounds']}" for k, v in row.get("gate", {}).items())
              + " | A/B: " + "; ".join(f"{k}: {v['outcome']} after {v['rounds']}" for k, v in row["ab"].items()),
              flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2000, help="synthetic trials per rule, noise and effect")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--noise", default="measured,slow-rounds,cv5",
                        type=lambda s: [n for n in s.split(",") if n], help=f"of {', '.join(NOISES)}")
    parser.add_argument("--baseline", type=int, default=5, help="baseline rounds")
    parser.add_argument("--max-rounds", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--real", type=Path, action="append", default=[], help="ab_repeat.py --out file")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    unknown = [n for n in args.noise if n not in NOISES]
    if unknown:
        parser.error(f"unknown noise {unknown}: choose from {', '.join(NOISES)}")
    result: dict[str, Any] = {"tolerance": args.tolerance, "baseline_rounds": args.baseline,
                              "max_rounds": args.max_rounds, "seed": args.seed, "trials": args.trials}
    if args.trials > 0:
        print(HEADER)
        result["synthetic"] = synthetic(args)
    for path in args.real:
        result.setdefault("real", {})[str(path)] = real(path, args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
