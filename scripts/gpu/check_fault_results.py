"""Whether a DSA fault run caught its fault on the backends it targets, with the oracle meant to, and nowhere else.

A fault run (scripts/gpu/dsa_suite.sh: the built-in suite on a fault checkpoint of
``pytest_llmserve/testing/dsa_checkpoint.py``, servers ``dsa-nan-late`` and ``dsa-fp8-fault`` of
scripts/gpu/dsa_gpu.toml.in) is *meant* to have failing tests, so pytest's exit code says nothing about it. This
reads the run's results.json (its check rows, through the package's own reader) and compares every row of the
fault's server with :data:`FAULTS`: for each decode backend the run covers, each check's expected verdict and, for a
failure, the oracle whose error finding it must carry. A row that is missing (a boot cut by the call's limit, a
test deselected) is a failure too: a fault that was not looked for was not caught.

    python scripts/gpu/check_fault_results.py RESULTS... --server dsa-nan-late [--backends a,b]

RESULTS: a results.json, or a results directory (``--llmserve-results-dir``), whose latest run's is read.

Exit 0 when every expectation holds, 1 otherwise (each miss named on its own line), 2 for a usage error or an
unreadable file. Rows of the server that no expectation names are printed, not judged.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.report.checks import CheckOutcome
from pytest_llmserve.report.json import read_check_outcomes
from pytest_llmserve.report.session import latest_run_dir

#: The matrix key the fault servers vary (scripts/gpu/dsa_gpu.toml.in).
BACKEND_KEY = "nsa_decode_backend"


@dataclass(frozen=True)
class Expected:
    """One check's expected verdict on one backend. ``oracle_run``: the oracle run the verdict must come from (the
    row's ``oracles`` entry whose name starts with it, with that verdict), so a pass is one the oracle gave and not a
    check that compared nothing; ``finding_oracle``: for a failure, the oracle (``Finding.oracle``) of an error
    finding the row must carry, so the fault is caught by the oracle that exists for it."""

    check: str
    verdict: Literal["pass", "fail"]
    oracle_run: str | None = None
    finding_oracle: str | None = None
    # For a failure: every error finding of ``finding_oracle`` must be on a probe whose label holds this, so the
    # fault shows where it must and nowhere else (the topk fault: on the long-context probes, never the short ones).
    only_probes: str | None = None

    def describe(self) -> str:
        by = f" by {self.finding_oracle!r} findings" if self.finding_oracle else ""
        where = f" on {self.only_probes!r} probes only" if self.only_probes else ""
        run = f" (oracle run {self.oracle_run!r}...)" if self.oracle_run else ""
        return f"{self.verdict}{by}{where}{run}"


@dataclass(frozen=True)
class FaultPlan:
    """What one fault server's run must show, per decode backend (the checkpoint variant's prediction)."""

    server: str
    variant: str
    expected: Mapping[str, tuple[Expected, ...]]


BOOTS = Expected("test_boots_and_generates", "pass")
NO_NAN_PASSES = Expected("test_no_nan", "pass", oracle_run="nan-check")
NO_NAN_FAILS = Expected("test_no_nan", "fail", oracle_run="nan-check", finding_oracle="nan")

FAULTS: dict[str, FaultPlan] = {
    # One embedding row NaN (the token " primary" of the NaN probe "The three primary colors are"): the server boots,
    # and every backend's no-NaN oracle fails with NaN findings. Seen on 2026-12-02 on all three
    # (docs/gpu-runs/dsa-2026-12-02/results-d3-nan-late.json.gz, results-d3c.json.gz).
    "dsa-nan-late": FaultPlan(
        server="dsa-nan-late", variant="nan-late",
        expected={backend: (BOOTS, NO_NAN_FAILS) for backend in ("flashmla_sparse", "tilelang", "flashmla_kv")}),
    # Outlier channels that add nothing in bf16 but flush an FP8 KV tile (dsa_checkpoint.py, variant
    # fp8-kv-outlier): the bf16-KV backends agree with the reference (flashmla_sparse; seen on tilelang on
    # 2026-12-02, results-d3-fp8-fault.json.gz), and flashmla_kv, the FP8-KV backend, must fail the reference
    # differential. Its no-NaN check is not judged: the construction predicts a departure from the bf16 answers or
    # NaN (a static FP8 scale would overflow), and the differential fails on either.
    "dsa-fp8-fault": FaultPlan(
        server="dsa-fp8-fault", variant="fp8-kv-outlier",
        expected={
            "flashmla_sparse": (BOOTS, NO_NAN_PASSES,
                                # the reference: its answers recorded in the run, or compared with a replay
                                Expected("test_matches_reference", "pass", oracle_run="reference")),
            "tilelang": (BOOTS, NO_NAN_PASSES,
                         Expected("test_matches_reference", "pass", oracle_run="reference differential")),
            "flashmla_kv": (BOOTS, Expected("test_matches_reference", "fail", oracle_run="reference differential",
                                            finding_oracle="differential")),
        }),
    # The same weights served with index_topk 256 instead of 2048 (--json-model-override-args), replaying the
    # healthy reference's recording: the long-context probes (past both topks) must fail the reference differential,
    # and only they; the short prompts, under either topk, keep every token and agree.
    "dsa-topk-fault": FaultPlan(
        server="dsa-topk-fault", variant="index_topk 256 (--json-model-override-args, torch top-k)",
        expected={"flashmla_sparse": (BOOTS, NO_NAN_PASSES,
                                      Expected("test_matches_reference", "fail", oracle_run="reference differential",
                                               finding_oracle="differential", only_probes="long-"))}),
}


@dataclass(frozen=True)
class RowJudgement:
    """One expected (check, backend) against the rows found: ``problem`` None when it holds."""

    backend: str
    expected: Expected
    found: tuple[CheckOutcome, ...]
    problem: str | None

    def line(self) -> str:
        got = ", ".join(row.verdict for row in self.found) or "no row"
        mark = "ok  " if self.problem is None else "MISS"
        tail = "" if self.problem is None else f": {self.problem}"
        return f"{mark} {self.expected.check} on {self.backend}: expected {self.expected.describe()}, got {got}{tail}"


@dataclass(frozen=True)
class FaultRunJudgement:
    """Every expectation of one fault run judged, and the rows of its server that no expectation names."""

    plan: FaultPlan
    backends: tuple[str, ...]
    rows: tuple[RowJudgement, ...]
    unjudged: tuple[CheckOutcome, ...]

    @property
    def misses(self) -> tuple[RowJudgement, ...]:
        return tuple(r for r in self.rows if r.problem is not None)

    @property
    def holds(self) -> bool:
        return not self.misses

    def report(self) -> str:
        head = (f"fault {self.plan.variant} (server {self.plan.server}) on {', '.join(self.backends)}: "
                + ("every expectation holds" if self.holds else f"{len(self.misses)} of {len(self.rows)} "
                   "expectation(s) NOT met"))
        lines = [head, *(f"  {r.line()}" for r in self.rows)]
        lines += [f"  not judged: {row.check} on {row.server_id}: {row.verdict}" for row in self.unjudged]
        return "\n".join(lines)


def split_server_id(server_id: str) -> tuple[str, dict[str, str]]:
    """``"dsa-nan-late[nsa_decode_backend=tilelang]"`` -> ``("dsa-nan-late", {"nsa_decode_backend": "tilelang"})``;
    commas inside a value's parentheses (``cuda_graph=on(1,2,4,8)``) stay in the value."""
    name, bracket, rest = server_id.partition("[")
    if not bracket or not rest.endswith("]"):
        return server_id, {}
    parts: list[str] = []
    depth, start, body = 0, 0, rest[:-1]
    for i, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    params = {}
    for part in parts:
        key, equals, value = part.partition("=")
        if equals:
            params[key.strip()] = value.strip()
    return name, params


def _problem(expected: Expected, rows: Sequence[CheckOutcome]) -> str | None:
    if not rows:
        return "no such row in the results (not run: deselected, or cut before it ran)"
    for row in rows:
        if row.verdict != expected.verdict:
            return f"{row.verdict}: {row.first_finding or row.message or 'no finding recorded'}"
        if expected.oracle_run is not None:
            runs = [o for o in row.oracles if str(o.get("check", "")).startswith(expected.oracle_run)]
            if not any(o.get("verdict") == expected.verdict for o in runs):
                seen = ", ".join(f"{o.get('check')}: {o.get('verdict')}" for o in row.oracles) or "none"
                return f"no {expected.oracle_run!r} oracle run with verdict {expected.verdict} (oracle runs: {seen})"
        if expected.finding_oracle is not None:
            errors = [f for f in row.findings if f.get("severity") == "error"]
            if not any(f.get("oracle") == expected.finding_oracle for f in errors):
                seen = ", ".join(sorted({str(f.get("oracle")) for f in errors})) or "none"
                return (f"failed, but with no error finding of the {expected.finding_oracle!r} oracle "
                        f"(error findings from: {seen})")
            if expected.only_probes is not None:
                elsewhere = sorted({str(f.get("probe")) for f in errors if f.get("oracle") == expected.finding_oracle
                                    and expected.only_probes not in str(f.get("probe"))})
                if elsewhere:
                    return (f"failed, but also on probes without {expected.only_probes!r} in their label: "
                            f"{', '.join(elsewhere)}")
    return None


def judge_fault_run(checks: Sequence[CheckOutcome], plan: FaultPlan,
                    backends: Sequence[str] | None = None) -> FaultRunJudgement:
    """Judge the check rows of a run (one results file or several) against ``plan`` on ``backends`` (default: every
    backend the plan names). Rows of other servers are ignored."""
    chosen = tuple(backends) if backends is not None else tuple(plan.expected)
    unknown = [b for b in chosen if b not in plan.expected]
    if unknown:
        raise ValueError(f"backend(s) {', '.join(unknown)} not in the {plan.server} plan "
                         f"(known: {', '.join(plan.expected)})")
    ours = []
    for row in checks:
        name, params = split_server_id(row.server_id)
        if name == plan.server:
            ours.append((params.get(BACKEND_KEY, ""), row))
    judged: list[RowJudgement] = []
    claimed: set[int] = set()
    for backend in chosen:
        for expected in plan.expected[backend]:
            found = [(i, row) for i, (b, row) in enumerate(ours) if b == backend and row.check == expected.check]
            claimed.update(i for i, _ in found)
            rows = tuple(row for _, row in found)
            judged.append(RowJudgement(backend, expected, rows, _problem(expected, rows)))
    unjudged = tuple(row for i, (_, row) in enumerate(ours) if i not in claimed)
    return FaultRunJudgement(plan=plan, backends=chosen, rows=tuple(judged), unjudged=unjudged)


def results_file(path: Path) -> Path:
    """``path`` itself, or for a results directory the results.json of its latest run."""
    if not path.is_dir():
        return path
    run = latest_run_dir(path)
    if run is None:
        raise ValueError(f"{path}: no run's report in this results directory (the run wrote none)")
    return run / "results.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("results", nargs="+", type=Path,
                        help="the fault run's results.json or results directory (several: rows merged)")
    parser.add_argument("--server", required=True, choices=sorted(FAULTS), help="the fault server the run served")
    parser.add_argument("--backends", default=None,
                        help="comma-separated decode backends the run covered (default: every one of the plan)")
    args = parser.parse_args(argv)
    plan = FAULTS[args.server]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    checks: list[CheckOutcome] = []
    try:
        for path in args.results:
            checks.extend(read_check_outcomes(results_file(path)))
        judgement = judge_fault_run(checks, plan, backends)
    except (LLMServeError, ValueError) as exc:
        print(f"check_fault_results: {exc}", file=sys.stderr)
        return 2
    print(judgement.report())
    return 0 if judgement.holds else 1


if __name__ == "__main__":
    sys.exit(main())
