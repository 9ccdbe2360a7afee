"""The differential's tolerances against measured envelopes: healthy pairs' figures and injected faults' figures.

Sources (each figure says where it was measured):
* the H200 runs of 2026-12-02 (docs/gpu-runs/dsa-2026-12-02/results-*.json.gz: SGLang 0.5.15, a tiny random-weight
  DeepSeek-V3.2, the DSA backends against a recorded flashmla_sparse reference, and batch N against batch 1): every
  divergence the reports kept (both sides' top-5 at it) and the per-request |Δlogprob| of the reference tables;
* the real vLLM CPU engine serving SmolLM2-135M-Instruct and its fault checkpoints, recorded by the catalogue run
  (tests/power/test_checkpoint_faults.py writes tests/data/power/cpu_answers.json.gz): full answers, so every figure
  of :class:`~pytest_llmserve.verdicts.differential.PairComparison`.

:func:`envelopes` reduces them to the largest healthy and the smallest faulty figure per measure, the table
docs/power.md shows beside each tolerance (tools/calibrate_differential.py prints it and draws the plot).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.store.reference_answers import completion_from_dict
from pytest_llmserve.verdicts.differential import (
    DEFAULT_TOLERANCE,
    DifferentialTolerance,
    Gap,
    PairComparison,
    compare_pair,
    divergence_gap,
)

ROOT = Path(__file__).resolve().parents[2]
H200_RUNS = ROOT / "docs" / "gpu-runs" / "dsa-2026-12-02"
CPU_ANSWERS = ROOT / "tests" / "data" / "power" / "cpu_answers.json.gz"

# A row of the old per-request table (docs/gpu-runs' reports): "  differential[x]  token 7: 'a' vs 'b'  yes  yes
# 0.031 @1" — the request, its first divergence, and the largest |Δlogprob| before it with its position.
_TABLE_ROW = re.compile(r"^\s+(differential\[[^\]]+\])\s+(identical|token (\d+):.*?)\s{2,}.*?(\d+\.\d+) @(\d+)\s*$")


@dataclass(frozen=True)
class Divergence:
    """One first divergence with both sides' top-k at it: where it was measured and the two gaps."""

    source: str  # e.g. "H200 results-d2-matrix: dsa[...] vs reference"
    probe: str
    position: int
    ref_gap: Gap | None
    cand_gap: Gap | None

    @property
    def widest(self) -> float:
        gaps = [g.nats for g in (self.ref_gap, self.cand_gap) if g is not None]
        return max(gaps) if gaps else math.inf


@dataclass
class PairSet:
    """The figures of one pair of configurations over a set of prompts (healthy or a fault)."""

    name: str
    healthy: bool
    source: str
    max_deltas: list[float] = field(default_factory=list)
    max_distances: list[float] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    early: int = 0  # near-tie divergences before the tolerance's early_tokens
    answers: int = 0
    not_compared: int = 0  # a side failed (e.g. NaN's HTTP 400) or sent no logprobs: other checks' business
    vllm_rule_failures: int = 0  # answers vLLM's check_logprobs_close fails (CPU pairs only: full answers)
    truncation_fractions: list[float] = field(default_factory=list)


def _token(evidence: Mapping[str, Any]) -> TokenLogprob:
    """A finding's offending token (verdicts.findings.TokenAt as JSON) as the logprob record it came from."""
    return TokenLogprob(str(evidence["token"]), evidence["logprob"],
                        {str(t): v for t, v in evidence.get("top") or []})


def h200_pair_sets(runs: Path = H200_RUNS,
                   tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> list[PairSet]:
    """The healthy pairs of the H200 runs: per (run, check, server) the divergences the reports kept and the
    reference tables' |Δlogprob|. Every pair there is healthy: the DSA backends on the same random weights, and
    batch N against batch 1 (the runs' fault checkpoints, nan-late and fp8-kv-outlier, left no differential
    divergences: nan-late failed before comparing, fp8-kv-outlier on the bf16 backends is healthy)."""
    sets: dict[str, PairSet] = {}
    for path in sorted(runs.glob("results-*.json.gz")):
        doc = json.loads(gzip.open(path).read())
        for row in doc["checks"]:
            name = f"H200 {path.name.removesuffix('.json.gz')}: {row['check']} on {row['server_id']}"
            found = sets.setdefault(name, PairSet(name, True, f"docs/gpu-runs/dsa-2026-12-02/{path.name}"))
            for finding in row.get("findings") or []:
                tokens = finding.get("tokens") or []
                if finding["oracle"] not in ("differential", "determinism") or len(tokens) != 2:
                    continue
                ref, cand = _token(tokens[0]), _token(tokens[1])
                if ref.token == cand.token:
                    continue  # a |Δlogprob| finding, not a divergence
                found.divergences.append(Divergence(name, finding.get("probe") or "", int(tokens[0]["position"]),
                                                    divergence_gap(ref, cand.token), divergence_gap(cand, ref.token)))
            if row["check"] == "test_matches_reference" and row["verdict"] == "pass":
                for line in str(row.get("detail") or "").splitlines():
                    match = _TABLE_ROW.match(line)
                    if match:
                        found.answers += 1
                        found.max_deltas.append(float(match.group(4)))
                        if match.group(3) is not None and int(match.group(3)) < tolerance.early_tokens:
                            found.early += 1
    return [s for s in sets.values() if s.divergences or s.max_deltas]


def load_cpu_answers(path: Path = CPU_ANSWERS) -> dict[str, Any]:
    return dict(json.loads(gzip.open(path).read()))


def answers_of(doc: Mapping[str, Any], server: str, mode: str) -> list[Completion]:
    return [completion_from_dict(c) for c in doc["servers"][server][mode]]


def vllm_rule_passes(ref: Completion, cand: Completion) -> bool:
    """vLLM's ``check_logprobs_close`` (in vLLM's tests/models/utils.py), the anchor this rule must beat: at the
    first different token each side's token is among the other side's top-k; nothing else is judged."""
    for r, c in zip(ref.tokens, cand.tokens, strict=False):
        if r.token != c.token:
            return c.token in r.top and r.token in c.top
    return True


def cpu_pair_set(name: str, healthy: bool, reference: Sequence[Completion], candidate: Sequence[Completion],
                 probes: Sequence[str], source: str,
                 tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> PairSet:
    """The figures of one recorded pair of answer lists (every prompt compared in full)."""
    pairs = PairSet(name, healthy, source)
    for probe, r, c in zip(probes, reference, candidate, strict=True):
        cmp: PairComparison = compare_pair(r, c, probe)
        if cmp.problem is not None:
            pairs.not_compared += 1
            continue
        pairs.answers += 1
        pairs.vllm_rule_failures += not vllm_rule_passes(r, c)
        pairs.max_deltas.append(cmp.max_delta)
        pairs.max_distances.append(cmp.max_distance)
        if cmp.first_divergence is not None:
            pairs.divergences.append(Divergence(name, probe, cmp.first_divergence, cmp.ref_gap, cmp.cand_gap))
            if cmp.early(tolerance) and cmp.near_tie(tolerance):
                pairs.early += 1
        if cmp.truncation is not None:
            pairs.truncation_fractions.append(cmp.truncation.fraction)
    return pairs


@dataclass(frozen=True)
class Envelope:
    """One measure: the worst figure of any healthy pair (and which), the faults beyond its tolerance (they are
    the ones this measure catches: each fault is caught by the measures it breaks, not by all) with the figure of
    the nearest of them, and the tolerance between the two."""

    measure: str
    tolerance: float
    healthy_worst: float | None
    healthy_where: str
    caught: tuple[str, ...]  # the fault pairs beyond the tolerance, nearest first
    fault_nearest: float | None

    def render_tolerance(self) -> str:
        return f"{'<=' if self.higher_is_worse else '>='} {self.tolerance:.3g}"

    @property
    def higher_is_worse(self) -> bool:
        return not self.measure.startswith("shortest")


def _measures(tolerance: DifferentialTolerance) -> tuple[tuple[str, Callable[[PairSet], float | None], float], ...]:
    """(name, the pair set's worst figure, tolerance); a measure named "shortest..." is worse when lower."""
    def worst(values: Sequence[float]) -> float | None:
        finite = [v for v in values if math.isfinite(v)]
        return max(finite) if finite else None

    return (
        ("max |Δlogprob| of a token both chose", lambda s: worst(s.max_deltas), tolerance.max_logprob_delta),
        ("max top-k distance (total variation, lower bound)", lambda s: worst(s.max_distances),
         tolerance.max_topk_distance),
        ("near-tie gap at a divergence (wider side)", lambda s: worst([d.widest for d in s.divergences]),
         tolerance.near_tie_gap),
        (f"share of answers diverging as near-ties before token {tolerance.early_tokens}",
         lambda s: s.early / s.answers if s.answers else None, tolerance.max_early_fraction),
        ("shortest stop against an answer that ran to length (fraction)",
         lambda s: min(s.truncation_fractions) if s.truncation_fractions else None, tolerance.min_length_fraction),
    )


def envelopes(sets: Sequence[PairSet], tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> list[Envelope]:
    """Per measure, the healthy pairs' worst figure against the faults that break it (nearest first)."""
    rows = []
    for measure, of, limit in _measures(tolerance):
        lower_is_worse = measure.startswith("shortest")

        def beyond(value: float, limit: float = limit, lower_is_worse: bool = lower_is_worse) -> bool:
            return value < limit if lower_is_worse else value > limit

        healthy = [(v, s.name) for s in sets if s.healthy and (v := of(s)) is not None]
        faults = sorted(((v, s.name) for s in sets if not s.healthy and (v := of(s)) is not None and beyond(v)),
                        reverse=lower_is_worse)
        worst_healthy = (min if lower_is_worse else max)(healthy) if healthy else None
        rows.append(Envelope(measure, limit, worst_healthy[0] if worst_healthy else None,
                             worst_healthy[1] if worst_healthy else "-", tuple(name for _, name in faults),
                             faults[0][0] if faults else None))
    return rows


def caught_by(sets: Sequence[PairSet], tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> dict[str, list[str]]:
    """Per fault pair, the measures it breaks (an empty list: the differential lets it through)."""
    out: dict[str, list[str]] = {}
    for s in sets:
        if s.healthy:
            continue
        out[s.name] = []
        for measure, of, limit in _measures(tolerance):
            value = of(s)
            lower_is_worse = measure.startswith("shortest")
            if value is not None and (value < limit if lower_is_worse else value > limit):
                out[s.name].append(measure)
    return out


def first_decode_flip(answer: Completion, rank: int = 5) -> Completion | None:
    """``answer`` with its first decode token (position 1; position 0 comes from the prefill) replaced by the
    answer's own ``rank``-th choice there, raised just above its choice: the issue's "decode kernel off by a nat"
    constructed on a real answer (None when the answer is too short or lists fewer alternatives)."""
    if len(answer.tokens) < 2:
        return None
    at = answer.tokens[1]
    ranked = sorted(((t, v) for t, v in at.top.items() if v is not None and math.isfinite(v)), key=lambda kv: -kv[1])
    if len(ranked) < rank or at.logprob is None:
        return None
    token = ranked[rank - 1][0]
    top = dict(at.top)
    top[token] = at.logprob + 0.01
    tokens = [*answer.tokens[:1], TokenLogprob(token, at.logprob + 0.01, top)]
    return Completion(request=answer.request, status=200, text="".join(t.token for t in tokens), tokens=tokens,
                      finish_reason="length", completion_tokens=len(tokens))


def cpu_pair_sets(path: Path = CPU_ANSWERS, tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> list[PairSet]:
    """The recorded CPU pairs: each server's answers (one at a time) against the healthy server's, the healthy
    server against itself (a rerun, and its batch of all prompts at once), and the first-decode-token flip
    constructed on the healthy answers."""
    doc = load_cpu_answers(path)
    probes = list(doc["prompts"])
    where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({doc['recorded']['host']})"
    reference = answers_of(doc, "healthy", "one_at_a_time")
    sets = [cpu_pair_set("CPU healthy: rerun", True, reference, answers_of(doc, "healthy", "rerun"), probes, where,
                         tolerance),
            cpu_pair_set("CPU healthy: all prompts at once vs one at a time", True, reference,
                         answers_of(doc, "healthy", "batch"), probes, where, tolerance)]
    for name, server in doc["servers"].items():
        if name == "healthy":
            continue
        label = f"CPU {name} vs healthy" if server["healthy"] else f"CPU fault {name} vs healthy"
        sets.append(cpu_pair_set(label, bool(server["healthy"]), reference, answers_of(doc, name, "one_at_a_time"),
                                 probes, where, tolerance))
    flipped = [(p, r, f) for p, r in zip(probes, reference, strict=True) if (f := first_decode_flip(r)) is not None]
    sets.append(cpu_pair_set("constructed: first decode token flipped to the reference's 5th choice", False,
                             [r for _, r, _ in flipped], [f for _, _, f in flipped], [p for p, _, _ in flipped],
                             f"{where}, healthy answers edited", tolerance))
    return sets
