"""The differential rule: two greedy answers to the same request judged position by position.

It judges every pair of answers the oracles compare: a configuration against its matrix's recorded reference
(backend A vs backend B, graphs vs eager), batch N against batch 1 on one server, a run against itself
(determinism), a candidate against a reference booted beside it (``decode_check.matches``).

vLLM's ``check_logprobs_close`` (in vLLM's tests/models/utils.py) walks the two answers to their first different
token, asks that each side's token be in the other side's top-k there, and stops. That rule passes a decode kernel
that is off by a nat: its first decode token flips to the reference's fifth choice 4 nats down, which is still in the
top-5, and nothing before or after is measured. This rule is stricter in four ways, each a typed figure of
:class:`PairComparison`:

1. Every compared position is judged, not only the divergence: the chosen token's |Δlogprob| (both sides chose
   it, on the same prefix) and the distance between the two top-k distributions there (total variation over the
   union of both lists; a token one side did not list has at most the probability of that side's last listed
   token and at most what its list leaves of 1, and the distance is the smallest the lists allow: a lower bound,
   so a number the server did not send never fails a pair).
2. At the first divergence, a near-tie only when it is one on *both* sides: the reference's logprob of the
   candidate's token is within ``near_tie_gap`` of the reference's own choice, and the candidate's logprob of the
   reference's token within it of the candidate's own (a token outside a side's top-k is at least as far below as
   that side's last listed alternative, so it is a near-tie only if that bound already is).
3. A bound on how many answers may diverge early (:func:`early_divergence_findings`): a kernel that is slightly
   off flips every near-tie it meets, each flip on its own a near-tie; many of them in the first tokens are not
   chance.
4. An answer that stops well before one that ran to length is truncated (a wrong EOS id, a stop-string bug), not
   "identical for n tokens".

After the first divergence the two sides condition on different text, so nothing after it is compared.
The tolerances (:class:`DifferentialTolerance`) are placed between measured envelopes: the healthy pairs' largest
figures and the injected faults' smallest (docs/power.md, tools/calibrate_differential.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.verdicts.findings import Finding, OracleReport, Severity, TokenAt, format_logprob, make_finding

#: finish_reason values of an answer that ran to its max_tokens (the engines' spellings).
_LENGTH_FINISH = ("length",)


@dataclass(frozen=True, slots=True)
class DifferentialTolerance:
    """The bounds of the differential rule; docs/power.md shows each between the healthy envelope and the faults.

    ``max_logprob_delta``: the chosen token's |Δlogprob| at any position before the first divergence.
    ``max_topk_distance``: the total-variation distance (lower bound) between the two sides' top-k at any compared
    position, the divergence included.
    ``near_tie_gap``: at the first divergence, each side's logprob of its own choice minus its logprob of the other
    side's token: a near-tie (allowed, a warning) only when both are at most this.
    ``early_tokens`` / ``max_early_fraction``: at most this fraction of a set's answers (and never fewer than one)
    may first diverge before position ``early_tokens``.
    ``min_length_fraction``: an answer that stopped with fewer than this fraction of the tokens of an answer to the
    same request that ran to length is truncated (an error; a shorter stop inside it is a warning).
    """

    max_logprob_delta: float = 0.25
    max_topk_distance: float = 0.15
    near_tie_gap: float = 0.5
    early_tokens: int = 4
    max_early_fraction: float = 1 / 3
    min_length_fraction: float = 0.75

    def early_allowed(self, answers: int) -> int:
        """How many of ``answers`` may diverge before ``early_tokens``."""
        return max(1, math.floor(self.max_early_fraction * answers))


DEFAULT_TOLERANCE = DifferentialTolerance()


@dataclass(frozen=True, slots=True)
class Gap:
    """One side's logprob of its own choice minus its logprob of the other side's token, at a divergence.
    ``exact`` False: the other token is not in this side's top-k, so ``nats`` is a lower bound (this side's own
    choice minus its last listed alternative)."""

    nats: float
    exact: bool

    def render(self) -> str:
        return f"{self.nats:.3f}" if self.exact else f">= {self.nats:.3f} (not in top-k)"


Side = Literal["reference", "candidate"]


@dataclass(frozen=True, slots=True)
class Truncation:
    """One answer stopped (``finish_reason`` stop/eos) after ``stopped_after`` tokens while the other, identical
    up to there, ran to length with ``other_tokens``."""

    short_side: Side
    stopped_after: int
    other_tokens: int
    finish_reason: str | None

    @property
    def fraction(self) -> float:
        return self.stopped_after / self.other_tokens if self.other_tokens else 1.0


@dataclass(frozen=True, slots=True)
class PairComparison:
    """Two answers to one request, as the differential sees them (one row of its per-request table).

    ``tokens_compared``: the positions judged (up to and including the first divergence); ``first_divergence``:
    None when the tokens agree wherever both sides have one. ``ref_gap`` / ``cand_gap``: each side's gap at the
    divergence (:class:`Gap`); None without a divergence or without top-k there. ``max_delta``: the largest
    |Δlogprob| of a token both sides chose; ``max_distance``: the largest top-k distance; ``problem``: a side that
    failed or sent no logprobs, so nothing was compared."""

    probe: str
    tokens_compared: int
    first_divergence: int | None
    ref_token: str | None = None
    cand_token: str | None = None
    ref_gap: Gap | None = None
    cand_gap: Gap | None = None
    max_delta: float = 0.0
    max_delta_position: int | None = None
    max_distance: float = 0.0
    max_distance_position: int | None = None
    truncation: Truncation | None = None
    ref_tokens: int = 0
    cand_tokens: int = 0
    problem: str | None = None  # e.g. "failed (HTTP 500)", "sent no logprobs": nothing compared
    problem_side: Side | None = None

    def near_tie(self, tolerance: DifferentialTolerance) -> bool | None:
        """Whether the divergence is a near-tie on both sides (None: no divergence, or no top-k to judge it)."""
        if self.ref_gap is None or self.cand_gap is None:
            return None
        return all(g.exact and g.nats <= tolerance.near_tie_gap for g in (self.ref_gap, self.cand_gap))

    def early(self, tolerance: DifferentialTolerance) -> bool:
        return self.first_divergence is not None and self.first_divergence < tolerance.early_tokens

    @property
    def divergence(self) -> str:
        if self.problem:
            return f"{self.problem_side} {self.problem}" if self.problem_side else self.problem
        if self.first_divergence is None:
            if self.truncation is not None:
                t = self.truncation
                return f"{t.short_side} stopped after {t.stopped_after} of {t.other_tokens} tokens"
            return "identical"
        return f"token {self.first_divergence}: {self.ref_token!r} vs {self.cand_token!r}"

    @property
    def widest_gap(self) -> str:
        """The near-tie gap at the divergence as the table shows it: the wider of the two sides'."""
        gaps = [g for g in (self.ref_gap, self.cand_gap) if g is not None]
        if not gaps:
            return "-"
        return max(gaps, key=lambda g: (not g.exact, g.nats)).render()

    def summary(self) -> str:
        """The row in words, for a failure's first line."""
        text = f"{self.probe}: {self.divergence} ({self.tokens_compared} token(s) compared)"
        if self.ref_gap is not None and self.cand_gap is not None:
            text += f"; near-tie gap: reference {self.ref_gap.render()}, candidate {self.cand_gap.render()}"
        return (text + f"; max |Δlogprob| {self.max_delta:.3f}, max top-k distance {self.max_distance:.3f}")


# ------------------------------------------------------------------------------------------------ figures

def first_difference(a: Sequence[TokenLogprob], b: Sequence[TokenLogprob]) -> int | None:
    """The first position where the two answers chose different tokens (None: they agree where both have one)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.token != y.token:
            return i
    return None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _logprob(tok: TokenLogprob) -> float:
    """The chosen token's logprob, for a caller that checked it with :func:`_finite`."""
    assert tok.logprob is not None
    return tok.logprob


def _probabilities(top: Mapping[str, float | None]) -> dict[str, float]:
    return {t: math.exp(min(v, 0.0)) for t, v in top.items() if v is not None and math.isfinite(v)}


def topk_distance(a: TokenLogprob, b: TokenLogprob) -> float:
    """The smallest total variation between the two distributions that their top-k lists allow.

    For each token in either list: a probability the side listed is known; one it did not list lies between 0 and
    the smaller of its last listed probability and the mass its list leaves. Each token adds the distance between
    the two sides' intervals; half the sum is a lower bound of the total variation over the whole vocabulary (the
    tokens neither side listed can only add to it). 0 when a side listed nothing."""
    pa, pb = _probabilities(a.top), _probabilities(b.top)
    if not pa or not pb:
        return 0.0
    cap_a = min(min(pa.values()), max(0.0, 1.0 - sum(pa.values())))
    cap_b = min(min(pb.values()), max(0.0, 1.0 - sum(pb.values())))
    total = 0.0
    for token in pa.keys() | pb.keys():
        lo_a, hi_a = (pa[token], pa[token]) if token in pa else (0.0, cap_a)
        lo_b, hi_b = (pb[token], pb[token]) if token in pb else (0.0, cap_b)
        total += max(0.0, lo_a - hi_b, lo_b - hi_a)
    return total / 2


def divergence_gap(own: TokenLogprob, other_token: str) -> Gap | None:
    """``own``'s logprob of its choice minus its logprob of ``other_token`` (a lower bound when not listed)."""
    if not _finite(own.logprob):
        return None
    listed = {t: v for t, v in own.top.items() if v is not None and math.isfinite(v)}
    if other_token in listed:
        return Gap(max(0.0, _logprob(own) - listed[other_token]), True)
    if not listed:
        return None
    return Gap(max(0.0, _logprob(own) - min(listed.values())), False)


def _ran_to_length(c: Completion) -> bool:
    wanted = c.request.get("max_tokens")
    return c.finish_reason in _LENGTH_FINISH or (isinstance(wanted, int) and len(c.tokens) >= wanted)


def _truncation(ref: Completion, cand: Completion) -> Truncation | None:
    """The shorter answer, when it stopped by itself while the other, identical up to there, ran to length."""
    if len(ref.tokens) == len(cand.tokens):
        return None
    side: Side = "candidate" if len(cand.tokens) < len(ref.tokens) else "reference"
    short, long_ = (cand, ref) if side == "candidate" else (ref, cand)
    if short.finish_reason in _LENGTH_FINISH or not _ran_to_length(long_):
        return None
    return Truncation(side, len(short.tokens), len(long_.tokens), short.finish_reason)


def _unjudgeable(ref: Completion, cand: Completion, probe: str) -> PairComparison | None:
    """The comparison of two answers that cannot be compared token by token: one failed, neither sent logprobs (the
    texts must agree), or one side sent none; None when both sent tokens with logprobs."""
    if not ref.ok or not cand.ok:
        side: Side = "reference" if not ref.ok else "candidate"
        which = ref if not ref.ok else cand
        return PairComparison(probe, 0, None, problem=f"failed (HTTP {which.status})", problem_side=side)
    if not ref.tokens and not cand.tokens:  # no logprobs asked for: the texts must agree
        return PairComparison(probe, 0, None, problem=None if ref.text == cand.text else
                              "texts differ, and neither side sent logprobs to judge the divergence")
    if not ref.tokens or not cand.tokens:
        return PairComparison(probe, 0, None, problem="sent no logprobs",
                              problem_side="reference" if not ref.tokens else "candidate")
    return None


def _worst_positions(ref: Sequence[TokenLogprob], cand: Sequence[TokenLogprob], last: int,
                     end: int | None) -> tuple[float, int | None, float, int | None]:
    """Over positions 0..``last``: the largest |Δlogprob| of the token both chose and where (the divergence ``end``
    and positions without two finite logprobs left out), and the largest top-k distance and where."""
    worst_delta, delta_at = 0.0, None
    worst_distance, distance_at = 0.0, None
    for i in range(last + 1):
        r, c = ref[i], cand[i]
        distance = topk_distance(r, c)
        if distance_at is None or distance > worst_distance:
            worst_distance, distance_at = distance, i
        if i == end or not (_finite(r.logprob) and _finite(c.logprob)):
            continue  # the divergence is judged by its gaps; a missing number by the NaN oracles
        delta = abs(_logprob(r) - _logprob(c))
        if delta_at is None or delta > worst_delta:
            worst_delta, delta_at = delta, i
    return worst_delta, delta_at, worst_distance, distance_at


def compare_pair(ref: Completion, cand: Completion, probe: str = "") -> PairComparison:
    """The differential's figures for two answers to one request (nothing judged yet: see :func:`pair_findings`)."""
    unjudgeable = _unjudgeable(ref, cand, probe)
    if unjudgeable is not None:
        return unjudgeable
    end = first_difference(ref.tokens, cand.tokens)
    last = end if end is not None else min(len(ref.tokens), len(cand.tokens)) - 1
    worst_delta, delta_at, worst_distance, distance_at = _worst_positions(ref.tokens, cand.tokens, last, end)
    base = PairComparison(probe, last + 1, None, max_delta=worst_delta, max_delta_position=delta_at,
                          max_distance=worst_distance, max_distance_position=distance_at, ref_tokens=len(ref.tokens),
                          cand_tokens=len(cand.tokens))
    if end is None:
        return replace(base, truncation=_truncation(ref, cand))
    r, c = ref.tokens[end], cand.tokens[end]
    judged = bool(r.top) and bool(c.top)
    return replace(base, first_divergence=end, ref_token=r.token, cand_token=c.token,
                   ref_gap=divergence_gap(r, c.token) if judged else None,
                   cand_gap=divergence_gap(c, r.token) if judged else None)


# ------------------------------------------------------------------------------------------------ findings

def pair_findings(cmp: PairComparison, ref: Completion, cand: Completion, *,
                  tolerance: DifferentialTolerance = DEFAULT_TOLERANCE, name_ref: str = "reference",
                  name_cand: str = "candidate", oracle: str = "differential", probe: str = "") -> list[Finding]:
    """What the rule finds in one compared pair: an error for each bound it breaks, a warning for a near-tie
    divergence or a short stop inside ``min_length_fraction``."""
    who = f"{name_cand} vs {name_ref}"
    probe = probe or cmp.probe
    if cmp.problem is not None:
        side, which = (name_ref, ref) if cmp.problem_side == "reference" else (name_cand, cand)
        texts = f" (texts: {name_ref} {ref.text[:100]!r}; {name_cand} {cand.text[:100]!r})" if which.ok else ""
        subject = f"{side} {cmp.problem}" if cmp.problem_side else cmp.problem
        return [make_finding(oracle, "error", f"cannot compare {who}: {subject}{texts}", which, probe=probe)]
    findings: list[Finding] = []
    if cmp.max_delta_position is not None and cmp.max_delta > tolerance.max_logprob_delta:
        at = cmp.max_delta_position
        r, c = ref.tokens[at], cand.tokens[at]
        findings.append(make_finding(oracle, "error", f"{who}: |Δlogprob| {cmp.max_delta:.3f} of the token both chose "
                                     f"exceeds the tolerance {tolerance.max_logprob_delta:g}, at position {at} "
                                     f"({r.token!r}: {name_ref} {format_logprob(r.logprob)}, {name_cand} "
                                     f"{format_logprob(c.logprob)})", cand,
                                     (TokenAt.of(at, r, 5), TokenAt.of(at, c, 5)), probe))
    wide_divergence = cmp.first_divergence is not None and cmp.near_tie(tolerance) is not True
    # At a divergence that is no near-tie the gap is the finding; its distance would say the same twice.
    if cmp.max_distance_position is not None and cmp.max_distance > tolerance.max_topk_distance \
            and not (wide_divergence and cmp.max_distance_position == cmp.first_divergence):
        at = cmp.max_distance_position
        r, c = ref.tokens[at], cand.tokens[at]
        findings.append(make_finding(oracle, "error", f"{who}: the top-k distributions at position {at} are "
                                     f"{cmp.max_distance:.3f} apart (total variation, at least), over the tolerance "
                                     f"{tolerance.max_topk_distance:g}", cand,
                                     (TokenAt.of(at, r, 5), TokenAt.of(at, c, 5)), probe))
    if cmp.first_divergence is not None:
        findings.append(_divergence_finding(cmp, ref, cand, tolerance, who, name_ref, name_cand, oracle, probe))
    elif cmp.truncation is not None:
        t = cmp.truncation
        short, long_ = (name_cand, name_ref) if t.short_side == "candidate" else (name_ref, name_cand)
        severity: Severity = "error" if t.fraction < tolerance.min_length_fraction else "warning"
        verdict = ("truncated" if severity == "error" else
                   f"within {1 - tolerance.min_length_fraction:.0%} of the end, allowed")
        findings.append(make_finding(oracle, severity, f"{who}: identical for {t.stopped_after} token(s), then {short} "
                                     f"stopped (finish_reason={t.finish_reason!r}) while {long_} ran to length "
                                     f"({t.other_tokens} tokens): {verdict} (an answer under "
                                     f"{tolerance.min_length_fraction:.0%} of one that ran to length is truncated)",
                                     cand, probe=probe))
    return findings


def _divergence_finding(cmp: PairComparison, ref: Completion, cand: Completion, tolerance: DifferentialTolerance,
                        who: str, name_ref: str, name_cand: str, oracle: str, probe: str) -> Finding:
    i = cmp.first_divergence
    assert i is not None
    r, k = ref.tokens[i], cand.tokens[i]
    evidence = (TokenAt.of(i, r, top_n=5), TokenAt.of(i, k, top_n=5))
    prefix = "".join(t.token for t in ref.tokens[:i])[-80:]
    choices = f"{name_ref} {r.token!r} ({format_logprob(r.logprob)}) vs {name_cand} {k.token!r} " \
              f"({format_logprob(k.logprob)}) after {prefix!r}"
    if cmp.ref_gap is None or cmp.cand_gap is None:
        return make_finding(oracle, "error", f"{who}: diverge at position {i} with no top-k alternatives to judge "
                            f"it: {choices}", cand, evidence, probe)
    if cmp.near_tie(tolerance):
        return make_finding(oracle, "warning", f"{who}: diverge at position {i}, a near-tie on both sides "
                            f"({name_ref}'s gap {cmp.ref_gap.render()}, {name_cand}'s {cmp.cand_gap.render()} nats, "
                            f"tolerance {tolerance.near_tie_gap:g}); allowed: {choices}", cand, evidence, probe)
    wide = []
    for side, other, gap, token in ((name_ref, name_cand, cmp.ref_gap, k.token),
                                    (name_cand, name_ref, cmp.cand_gap, r.token)):
        if not gap.exact:
            wide.append(f"{other}'s {token!r} is not in {side}'s top-k (at least {gap.nats:.3f} nats below "
                        f"{side}'s choice)")
        elif gap.nats > tolerance.near_tie_gap:
            wide.append(f"{side} puts {other}'s {token!r} {gap.nats:.3f} nats below its own choice")
    order = f"offending tokens: {name_ref}'s first, then {name_cand}'s"
    return make_finding(oracle, "error", f"{who}: diverge at position {i}, not a near-tie (tolerance "
                        f"{tolerance.near_tie_gap:g} nats): " + "; ".join(wide) + f". {choices} (texts: {name_ref} "
                        f"{ref.text[:100]!r}; {name_cand} {cand.text[:100]!r}; {order})", cand, evidence, probe)


def check_pair(ref: Completion, cand: Completion, *, tolerance: DifferentialTolerance = DEFAULT_TOLERANCE,
               name_ref: str = "reference", name_cand: str = "candidate", oracle: str = "differential",
               probe: str = "") -> list[Finding]:
    """The rule over one pair: :func:`compare_pair`, then :func:`pair_findings`."""
    return pair_findings(compare_pair(ref, cand, probe), ref, cand, tolerance=tolerance, name_ref=name_ref,
                         name_cand=name_cand, oracle=oracle, probe=probe)


def early_divergence_findings(comparisons: Sequence[PairComparison], tolerance: DifferentialTolerance, *,
                              who: str, oracle: str = "differential") -> list[Finding]:
    """An error when more of ``comparisons`` first diverge as a near-tie before ``tolerance.early_tokens`` than it
    allows (a divergence that is no near-tie is an error of its own already)."""
    early = [c for c in comparisons if c.early(tolerance) and c.near_tie(tolerance)]
    allowed = tolerance.early_allowed(len(comparisons))
    if len(early) <= allowed:
        return []
    shown = ", ".join(f"{c.probe or '?'} at {c.first_divergence}" for c in early[:6])
    return [Finding(oracle, "error", f"{who}: {len(early)} of {len(comparisons)} answers diverge as near-ties "
                    f"before token {tolerance.early_tokens} (at most {allowed} may): this many so early is a "
                    f"systematic difference (a kernel slightly off flips every near-tie it meets), not chance: "
                    f"{shown}", probe="all answers")]


# ------------------------------------------------------------------------------------------------ exact equality

def exact_equal_findings(ref: Completion, cand: Completion, *, name_ref: str = "reference",
                         name_cand: str = "candidate", compare_logprobs: bool = False,
                         oracle: str = "differential", probe: str = "") -> list[Finding]:
    """Exact equality of tokens and text (and logprob values when asked): for deterministic /
    batch-invariant modes (vLLM VLLM_BATCH_INVARIANT=1, SGLang --enable-deterministic-inference)."""
    who = f"{name_cand} vs {name_ref}"
    if not ref.ok or not cand.ok:
        which = ref if not ref.ok else cand
        return [make_finding(oracle, "error", f"cannot compare {who}: a request failed (HTTP {which.status})",
                             which, probe=probe)]
    i = first_difference(ref.tokens, cand.tokens)
    if i is not None:
        return [make_finding(oracle, "error", f"{who}: deterministic mode, but the tokens differ at position "
                             f"{i}: {ref.tokens[i].token!r} vs {cand.tokens[i].token!r}", cand,
                             (TokenAt.of(i, ref.tokens[i], 5), TokenAt.of(i, cand.tokens[i], 5)), probe)]
    if len(ref.tokens) != len(cand.tokens) or ref.text != cand.text:
        return [make_finding(oracle, "error", f"{who}: deterministic mode, but the outputs differ: "
                             f"{ref.text[:120]!r} vs {cand.text[:120]!r}", cand, probe=probe)]
    if compare_logprobs:
        for j, (x, y) in enumerate(zip(ref.tokens, cand.tokens, strict=True)):
            if x.logprob != y.logprob:
                return [make_finding(oracle, "error", f"{who}: same tokens, but the logprob at position {j} "
                                     f"differs: {format_logprob(x.logprob)} vs {format_logprob(y.logprob)} "
                                     "(bitwise equality expected)", cand,
                                     (TokenAt.of(j, x), TokenAt.of(j, y)), probe)]
    return []


def determinism_findings(a: Completion, b: Completion, *, exact: bool = False,
                         tolerance: DifferentialTolerance = DEFAULT_TOLERANCE, probe: str = "") -> list[Finding]:
    """Two greedy runs of the same request: identical when ``exact``, else judged by the differential rule (a
    flip only as a near-tie on both sides, |Δlogprob| and top-k distance bounded before it)."""
    if exact:
        return exact_equal_findings(a, b, name_ref="run 1", name_cand="run 2", oracle="determinism", probe=probe)
    return check_pair(a, b, tolerance=tolerance, name_ref="run 1", name_cand="run 2", oracle="determinism",
                      probe=probe)


def compare_runs(reference: Sequence[Completion], candidate: Sequence[Completion], *, name_ref: str,
                 name_cand: str, exact: bool = False, probes: Sequence[str] | None = None,
                 tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> OracleReport:
    """Differential check of two servers' answers to the same prompts (e.g. eager vs CUDA graphs).

    ``reference[i]`` and ``candidate[i]`` answer the same request; ``probes[i]`` names it in findings. Each pair is
    judged by the differential rule (or exact equality when ``exact``: deterministic mode on both sides), and the
    set by :func:`early_divergence_findings`."""
    report = OracleReport(f"differential[{name_cand} vs {name_ref}]")
    report.completions.extend(candidate)
    comparisons = []
    for i, (r, c) in enumerate(zip(reference, candidate, strict=False)):
        probe = probes[i] if probes is not None and i < len(probes) else f"prompt {i + 1}"
        if exact:
            report.add(exact_equal_findings(r, c, name_ref=name_ref, name_cand=name_cand, probe=probe))
            continue
        cmp = compare_pair(r, c, probe)
        comparisons.append(cmp)
        report.add(pair_findings(cmp, r, c, tolerance=tolerance, name_ref=name_ref, name_cand=name_cand,
                                 probe=probe))
    report.add(early_divergence_findings(comparisons, tolerance, who=f"{name_cand} vs {name_ref}"))
    if len(reference) != len(candidate):
        report.add([Finding("differential", "error", f"{len(reference)} reference answers but "
                            f"{len(candidate)} candidate answers")])
    return report
