"""``llmserve baselines list|show|diff|accept`` and ``llmserve compare A B``.

:func:`add_parser` registers the subcommands on the ``llmserve`` command's subparsers; every one sets
``func=run``, so the main command dispatches with ``args.func(args)``.

Exit codes: 0 fine; 1 ``compare`` found a regression (or, with ``--fail-on-inconclusive``, could not
decide); 2 bad input (unreadable/corrupt file, unknown metric) or a comparison refused because the
contexts differ in more than the variable under test. Refusal outranks regression: a refused
comparison means part of the answer is missing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pytest_llmserve.errors import BaselineError
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.report.json import RESULTS_FORMAT, load_json_file, read_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.text import aligned_columns, format_markdown, format_table
from pytest_llmserve.store.baselines import (
    DEFAULT_ROOT,
    BaselineDoc,
    BaselineStore,
    BenchKey,
    Mode,
    parse_baseline,
    read_baseline_file,
)
from pytest_llmserve.verdicts.comparability import comparability
from pytest_llmserve.verdicts.stats import DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES, decide, negligible_change, summarize

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_BAD = 2
DEFAULT_TOLERANCE = BenchDefaults().tolerance  # the gate's: the change to catch

Handler = Callable[[argparse.Namespace], int]


def _out(args: argparse.Namespace) -> TextIO:
    stream: TextIO = getattr(args, "stdout", None) or sys.stdout
    return stream


def _err(args: argparse.Namespace) -> TextIO:
    stream: TextIO = getattr(args, "stderr", None) or sys.stderr
    return stream


# --------------------------------------------------------------------------- parser


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 0.05 or 5%)") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1) (e.g. 0.05 or 5%)")
    return value


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        dest="baselines_dir",
        default=DEFAULT_ROOT,
        metavar="DIR",
        help=f"baseline directory (default: {DEFAULT_ROOT})",
    )


def _add_decision(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metric", default=None, help="metric to compare (default: the gated metric of each benchmark)"
    )
    p.add_argument(
        "--tolerance",
        type=_fraction,
        default=None,
        help=f"the relative change to catch, 0.10 or 10%% (default: the benchmark's, else {DEFAULT_TOLERANCE})",
    )
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="significance level (default: 0.05)")
    p.add_argument("--min-samples", type=int, default=DEFAULT_MIN_SAMPLES, help="samples needed on each side")
    p.add_argument(
        "--records",
        type=int,
        default=1,
        metavar="N",
        help="pool the samples of the last N records of a baseline file (0 = all; default 1)",
    )
    p.add_argument(
        "--variable",
        default=None,
        metavar="KEY",
        help="the context key under test, allowed to differ (e.g. server_args.cuda_graph, "
        "cuda_graph, engine_version)",
    )
    p.add_argument(
        "--allow-confounded",
        action="store_true",
        help="compare even when other context keys differ (reported as FORCED)",
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``baselines`` (list/show/diff/accept) and ``compare`` on an argparse subparsers object."""
    base = subparsers.add_parser(
        "baselines",
        help="list, show, diff and accept stored baselines",
        description="Inspect and update the baseline store.",
    )
    sub = base.add_subparsers(dest="baselines_command", metavar="{list,show,diff,accept}")
    sub.required = True

    p = sub.add_parser("list", help="one line per baseline file")
    _add_dir(p)
    p.set_defaults(func=run, llmserve_handler=cmd_list)

    p = sub.add_parser("show", help="a baseline's key, context and records")
    p.add_argument("ref", metavar="KEY|FILE", help="a file, or a file name, key hash or unique part of one")
    p.add_argument("--json", action="store_true", help="print the file's JSON")
    _add_dir(p)
    p.set_defaults(func=run, llmserve_handler=cmd_show)

    p = sub.add_parser(
        "diff", help="context diff and verdict between the latest records of two baseline files"
    )
    p.add_argument("file_a", metavar="FILE_A", help="the reference (baseline) file")
    p.add_argument("file_b", metavar="FILE_B", help="the candidate file")
    _add_decision(p)
    _add_dir(p)
    p.set_defaults(func=run, llmserve_handler=cmd_diff)

    p = sub.add_parser("accept", help="append a results file's samples to the baselines as new records")
    p.add_argument("results", metavar="RESULTS_JSON", help="results file written by the plugin")
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace each baseline with this record instead of appending (needed when the context changed)",
    )
    p.add_argument(
        "-k",
        dest="select",
        default=None,
        metavar="SUBSTRING",
        help="accept only benchmarks whose test id, server or workload contains SUBSTRING",
    )
    _add_dir(p)
    p.set_defaults(func=run, llmserve_handler=cmd_accept)

    p = subparsers.add_parser(
        "compare",
        help="compare two runs (baseline or results files); exit 1 on regression, 2 on refusal",
        description="Compare A (reference) with B (candidate). Each is a baseline file or a results JSON. "
        "Benchmarks are paired by key, else by test function, workload and metric.",
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    _add_decision(p)
    p.add_argument(
        "--fail-on-inconclusive", action="store_true", help="exit 1 when a comparison is inconclusive"
    )
    p.add_argument("--markdown", default=None, metavar="PATH", help="also write a Markdown summary here")
    p.set_defaults(func=run, llmserve_handler=cmd_compare)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand that ``args`` was parsed for; returns the exit code."""
    handler: Handler | None = getattr(args, "llmserve_handler", None)
    if handler is None:
        print("llmserve: no baselines subcommand given", file=_err(args))
        return EXIT_BAD
    try:
        return handler(args)
    except BaselineError as exc:
        print(f"llmserve: error: {exc}", file=_err(args))
        return EXIT_BAD


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m pytest_llmserve.cli.baselines``) for these subcommands only."""
    parser = argparse.ArgumentParser(prog="llmserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


# --------------------------------------------------------------------------- list / show


def _latest_cell(doc: BaselineDoc) -> str:
    if not doc.records:
        return "-"
    values = doc.records[-1].samples.get(doc.metric)
    if not values:
        return "-"
    s = summarize(values)
    return f"{s.median:.4g} ±{s.cv * 100:.1f}% (n={s.n})"


def cmd_list(args: argparse.Namespace) -> int:
    store = BaselineStore(args.baselines_dir)
    out, err = _out(args), _err(args)
    files = store.list()
    if not files:
        print(f"no baselines in {store.root}", file=out)
        return EXIT_OK
    rows = [["file", "test", "server", "workload", "metric", "records", "latest (median)", "recorded"]]
    bad = 0
    for path in files:
        try:
            doc = read_baseline_file(path)
        except BaselineError as exc:
            bad += 1
            print(f"ERROR {exc}", file=err)
            continue
        latest = doc.records[-1].recorded_at if doc.records else "-"
        rows.append(
            [
                path.name,
                doc.key.test,
                doc.key.server,
                doc.key.workload,
                doc.metric,
                str(len(doc.records)),
                _latest_cell(doc),
                latest,
            ]
        )
    for line in aligned_columns(rows):
        print(line, file=out)
    return EXIT_BAD if bad else EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = BaselineStore(args.baselines_dir)
    path = store.resolve(args.ref)
    doc = read_baseline_file(path)
    out = _out(args)
    if args.json:
        print(dumps(doc.to_dict(), indent=2), file=out)
        return EXIT_OK
    direction = "higher is better" if doc.higher_is_better else "lower is better"
    print(f"file:     {path}", file=out)
    print(f"test:     {doc.key.test}\nserver:   {doc.key.server}\nworkload: {doc.key.workload}", file=out)
    print(f"metric:   {doc.metric} ({direction})", file=out)
    print("context:", file=out)
    for line in dumps(doc.context, indent=2, sort_keys=True).splitlines():
        print("  " + line, file=out)
    print(f"records ({len(doc.records)}):", file=out)
    for rec in doc.records:
        values = rec.samples.get(doc.metric) or []
        cell = "-"
        if values:
            s = summarize(values)
            shown = [round(v, 4) for v in values]
            cell = f"median {s.median:.4g}  cv {s.cv * 100:.1f}%  n={s.n}  samples {shown}"
        print(f"  {rec.recorded_at}  run {rec.run_id}  {cell}", file=out)
    if doc.records:
        others = sorted(set(doc.records[-1].samples) - {doc.metric})
        if others:
            print("latest record, other metrics (median):", file=out)
            for name in others:
                print(f"  {name}: {summarize(doc.records[-1].samples[name]).median:.4g}", file=out)
    return EXIT_OK


# --------------------------------------------------------------------------- comparisons


@dataclass
class _Side:
    key: BenchKey
    context: dict[str, object]
    metric: str
    higher_is_better: bool
    samples: dict[str, list[float]]
    tolerance: float | None
    source: str


def _load_sides(path_text: str, records: int) -> list[_Side]:
    path = Path(path_text)
    data = load_json_file(path)
    if isinstance(data, list) or (isinstance(data, dict) and data.get("format") == RESULTS_FORMAT):
        _, outcomes = read_results_json(path)
        sides = [
            _Side(o.key, o.context, o.metric, o.higher_is_better, o.samples, o.tolerance, str(path))
            for o in outcomes
            if not o.error and o.samples
        ]
        if not sides:
            raise BaselineError(f"{path}: holds no valid benchmark samples")
        return sides
    doc = parse_baseline(data, path)
    chosen = doc.records if records <= 0 else doc.records[-records:]
    if not chosen:
        raise BaselineError(f"{path}: holds no records")
    pooled: dict[str, list[float]] = {}
    for rec in chosen:
        for name, values in rec.samples.items():
            pooled.setdefault(name, []).extend(values)
    return [_Side(doc.key, doc.context, doc.metric, doc.higher_is_better, pooled, None, str(path))]


def _base_test(test: str) -> str:
    return test.split("[", 1)[0]


def _pair(
    a_sides: list[_Side], b_sides: list[_Side]
) -> tuple[list[tuple[_Side, _Side]], list[_Side], list[_Side]]:
    """Pair by key; then by (test function, workload, metric) when unique on both sides; then 1:1."""
    pairs: list[tuple[_Side, _Side]] = []
    rest_a = list(a_sides)
    rest_b = list(b_sides)
    for a in list(rest_a):
        match = [b for b in rest_b if b.key == a.key]
        if len(match) == 1:
            pairs.append((a, match[0]))
            rest_a.remove(a)
            rest_b.remove(match[0])

    def loose(s: _Side) -> tuple[str, str, str]:
        return (_base_test(s.key.test), s.key.workload, s.metric)

    for a in list(rest_a):
        match = [b for b in rest_b if loose(b) == loose(a)]
        same_a = [x for x in rest_a if loose(x) == loose(a)]
        if len(match) == 1 and len(same_a) == 1:
            pairs.append((a, match[0]))
            rest_a.remove(a)
            rest_b.remove(match[0])
    if len(rest_a) == 1 and len(rest_b) == 1 and not pairs:
        pairs.append((rest_a[0], rest_b[0]))
        rest_a, rest_b = [], []
    return pairs, rest_a, rest_b


def _compare_pair(a: _Side, b: _Side, args: argparse.Namespace) -> BenchOutcome:
    metric = args.metric or a.metric
    higher = a.higher_is_better if metric == a.metric else b.higher_is_better if metric == b.metric else None
    if higher is None:
        higher = higher_is_better(metric)
    tolerance = (
        args.tolerance
        if args.tolerance is not None
        else (b.tolerance if b.tolerance is not None else DEFAULT_TOLERANCE)
    )
    for side, name in ((a, "A"), (b, "B")):
        if metric not in side.samples:
            raise BaselineError(
                f"{side.source} ({name}): no samples of {metric!r} for {side.key} "
                f"(has: {', '.join(sorted(side.samples))})"
            )
    comp = comparability(a.context, b.context, args.variable, args.allow_confounded)
    verdict = None
    if comp.ok:
        verdict = decide(
            a.samples[metric],
            b.samples[metric],
            higher_is_better=higher,
            # The fixed-sample rule's tolerance is its size threshold and CI bound: the gate's negligible change,
            # half the tolerance the gate catches (verdicts/stats.py), so both read a tolerance the same way.
            tolerance=negligible_change(tolerance),
            alpha=args.alpha,
            min_samples=args.min_samples,
            metric=metric,
        )
    test_id, server = b.key.test, b.key.server
    if a.key.server != b.key.server:  # an A/B of two server configurations
        test_id, server = _base_test(b.key.test), f"{a.key.server} -> {b.key.server}"
    return BenchOutcome(
        test_id=test_id,
        server_id=server,
        workload=b.key.workload,
        metric=metric,
        higher_is_better=higher,
        tolerance=tolerance,
        verdict=verdict,
        comparability=comp,
        samples=b.samples,
        baseline_samples=a.samples[metric],
        context=b.context,
        baseline_path=a.source,
    )


def _print_outcomes(outcomes: list[BenchOutcome], args: argparse.Namespace) -> None:
    out = _out(args)
    print(format_table(outcomes), file=out)
    for o in outcomes:
        comp = o.comparability
        if comp is not None and comp.status == "allowed-variable":
            print(f"\n{o.name}: {comp.message}", file=out)
        if o.verdict is not None and o.status == "pass":
            print(f"{o.name}: {o.verdict.reason}", file=out)


def cmd_diff(args: argparse.Namespace) -> int:
    a = _load_sides(args.file_a, args.records)
    b = _load_sides(args.file_b, args.records)
    out = _out(args)
    pair_a, pair_b = a[0], b[0]
    comp = comparability(pair_a.context, pair_b.context, args.variable, args.allow_confounded)
    print(f"A: {pair_a.source}\n   {pair_a.key}\nB: {pair_b.source}\n   {pair_b.key}", file=out)
    label = f" ({comp.label})" if comp.label != comp.status else ""
    print(f"context: {comp.status}{label}", file=out)
    for d in comp.diffs:
        print(f"  {d.describe()}", file=out)
    for d in comp.ignored:
        print(f"  (ignored) {d.describe()}", file=out)
    # diff shows the verdict even for a refused comparison (it is information, not a gate), labelled so.
    forced_args = argparse.Namespace(**{**vars(args), "allow_confounded": True})
    outcome = _compare_pair(pair_a, pair_b, forced_args)
    if outcome.verdict is not None:
        note = " (contexts differ: for information only)" if comp.status in ("refused", "forced") else ""
        print(f"verdict: {outcome.verdict.outcome}{note}: {outcome.verdict.reason}", file=out)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    a_sides = _load_sides(args.a, args.records)
    b_sides = _load_sides(args.b, args.records)
    pairs, lone_a, lone_b = _pair(a_sides, b_sides)
    out, err = _out(args), _err(args)
    if not pairs:
        print(f"llmserve: error: no benchmark of {args.a} matches one of {args.b}", file=err)
        return EXIT_BAD
    outcomes = [_compare_pair(a, b, args) for a, b in pairs]
    _print_outcomes(outcomes, args)
    for side in lone_a:
        print(f"only in A: {side.key}", file=out)
    for side in lone_b:
        print(f"only in B: {side.key}", file=out)
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(outcomes, title="llmserve compare"), encoding="utf-8")
    statuses = {o.status for o in outcomes}
    if "refused" in statuses:
        return EXIT_BAD
    if "regressed" in statuses or (args.fail_on_inconclusive and "inconclusive" in statuses):
        return EXIT_REGRESSION
    return EXIT_OK


# --------------------------------------------------------------------------- accept


def cmd_accept(args: argparse.Namespace) -> int:
    header, outcomes = read_results_json(args.results)
    store = BaselineStore(args.baselines_dir)
    out, err = _out(args), _err(args)
    mode: Mode = "replace" if args.replace else "append"
    problems = 0
    accepted = 0
    for o in outcomes:
        if args.select and not any(args.select in s for s in (o.test_id, o.server_id, o.workload)):
            continue
        if o.error:
            print(f"skipped {o.key}: the run was invalid ({o.error})", file=err)
            problems += 1
            continue
        if not o.samples or o.metric not in o.samples:
            print(f"skipped {o.key}: no samples of {o.metric!r}", file=err)
            problems += 1
            continue
        if not o.context:
            print(f"skipped {o.key}: the results hold no context, so it cannot become a baseline", file=err)
            problems += 1
            continue
        try:
            doc = store.save(
                o.key,
                o.context,
                o.samples,
                metric=o.metric,
                higher_is_better=o.higher_is_better,
                mode=mode,
                run_id=o.run_id or header.get("run_id"),
                info={"accepted_from": str(args.results), "results_created_at": header.get("created_at")},
            )
        except BaselineError as exc:
            print(f"not accepted {o.key}: {exc}", file=err)
            problems += 1
            continue
        accepted += 1
        verb = "replaced" if mode == "replace" else f"record {len(doc.records)} appended to"
        print(f"{verb} {doc.path}", file=out)
    if accepted == 0 and problems == 0:
        print(f"nothing to accept in {args.results}", file=err)
        return EXIT_BAD
    return EXIT_BAD if problems else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
