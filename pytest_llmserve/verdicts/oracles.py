"""Correctness oracles: NaN evidence, known answers, determinism and the differential rule, judged over the
answers a server gave; and the probe prompts they are asked with.

Everything here works on plain :class:`~pytest_llmserve.evidence.completion.Completion` records, so each
check can be tested without a server, and nothing here sends a request: :mod:`pytest_llmserve.gates.oracle_runs`
sends the probes and hands what comes back to these decisions. Every oracle request is greedy (temperature 0)
and asks for logprobs (``logprobs=5`` by default): logprobs are the only channel through which NaN is visible
while the text still looks normal, and the top-k alternatives are what the differential rule needs.

The other oracle modules beside this one: :mod:`~pytest_llmserve.verdicts.findings` (what every oracle reports),
:mod:`~pytest_llmserve.verdicts.coherence` (decode collapse), :mod:`~pytest_llmserve.verdicts.batch_sizes`
(the CUDA-graph batch sizes to exercise) and :mod:`~pytest_llmserve.verdicts.divergence` (a differential's
per-request table).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.evidence.facts import NanLogPattern
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.verdicts.findings import Finding, OracleReport, TokenAt, format_logprob, make_finding

DEFAULT_LOGPROBS = 5

# Engine sentinels. vLLM's OpenAI layer clamps logprobs with max(logprob, -9999.0), so -inf arrives as
# -9999.0 (NaN is not clamped and breaks JSON: HTTP 400). SGLang clamps to torch.finfo(float32).min
# and serializes NaN/inf as null with orjson. SGLang's NaN sanitizers replace NaN logits by -1e5 (0.5.9
# --enable-nan-detection) or -1e30 (SGLANG_SANITIZE_NAN_LOGITS), which also lands far below -9999.
VLLM_LOGPROB_CLAMP = -9999.0
FLOAT32_LOWEST = -3.4028234663852886e38
SGLANG_NAN_FINISH = "NaN happened"
JSON_NAN_ERROR = "Out of range float values are not JSON compliant"

# An HTTP error body that mentions any of these is NaN evidence, not an ordinary failure.
_NAN_BODY_RE = re.compile(
    r"out of range float values are not json compliant|nan happened|nan detected|\bnan\b|"
    r"probability tensor contains|\b-?inf(?:inity)?\b",
    re.IGNORECASE,
)

# Log lines that report NaN whatever the engine: (source, pattern, what it means). Each engine's own lines and NaN
# counters are in its folder (engines/<engine>/facts.py) and reach these functions through its adapter.
GENERIC_NAN_LOG_PATTERNS: tuple[NanLogPattern, ...] = (
    ("torch", re.compile(r"probability tensor contains either `?inf`?, `?nan`? or element < 0"),
     "torch.multinomial was given NaN/inf probabilities"),
)

# A greedy token whose logprob is this far below the best alternative was not the argmax: the logprobs
# belong to other logits than the ones sampled from (e.g. rows mixed up inside a batch).
_GREEDY_ARGMAX_SLACK = 1.0
_POSITIVE_LOGPROB_SLACK = 1e-3
_TOPK_MASS_SLACK = 0.02
# Without logprobs, NaN shows as text that stops growing: greedy argmax over NaN picks token id 0,
# usually a special token that detokenizes to "". English runs ~4 characters per token, CJK ~1.
_EMPTY_TEXT_CHARS_PER_TOKEN = 0.5
_EMPTY_TEXT_MIN_TOKENS = 8


# --------------------------------------------------------------------------------------------------
# NaN evidence
# --------------------------------------------------------------------------------------------------

def _bad_value(value: float | None) -> str | None:
    """Why a logprob value is NaN evidence, or None when it is an ordinary number."""
    if value is None:
        return "null (SGLang serializes NaN/inf as null)"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return f"{value} (not finite)"
    if value == VLLM_LOGPROB_CLAMP:
        return "-9999.0 (vLLM's clamp of -inf)"
    if value <= FLOAT32_LOWEST * 0.999:
        return f"{value:.6g} (SGLang's clamp of -inf to float32 lowest)"
    if value < VLLM_LOGPROB_CLAMP:
        return f"{value:.6g} (implausibly low: a sanitized NaN/-inf logit)"
    return None


def nan_evidence(c: Completion, *, probe: str = "", text_symptoms: bool = True) -> list[Finding]:
    """NaN evidence in one response, from every channel a client can see.

    HTTP errors whose body mentions NaN/inf (vLLM: HTTP 400 "Out of range float values are not JSON
    compliant"), null / non-finite / sentinel logprobs in the chosen tokens and their top alternatives,
    SGLang's ``matched_stop == "NaN happened"``, and text that stops growing while tokens are still
    counted (how NaN looks when no logprobs were requested). ``text_symptoms=False`` leaves out that last,
    heuristic channel (for sampled or adversarial requests, where short or odd text is legitimate).
    """
    findings: list[Finding] = []
    if not c.ok:
        body = c.error or ""
        if c.status >= 400 and _NAN_BODY_RE.search(body):
            findings.append(make_finding("nan", "error", f"HTTP {c.status} whose body reports NaN/inf: "
                                         f"{body.strip()[:300]!r}", c, probe=probe))
        return findings
    chosen: list[TokenAt] = []
    alternatives: list[TokenAt] = []
    reasons: Counter[str] = Counter()
    for i, tok in enumerate(c.tokens):
        why = _bad_value(tok.logprob)
        if why is not None:
            reasons[f"chosen-token logprob {why}"] += 1
            chosen.append(TokenAt.of(i, tok))
            continue
        bad_top = [(t, v) for t, v in tok.top.items() if _bad_value(v) is not None]
        if bad_top:
            reasons[f"top-alternative logprob {_bad_value(bad_top[0][1])}"] += 1
            alternatives.append(TokenAt(i, tok.token, tok.logprob, tuple(bad_top[:3])))
    if chosen or alternatives:
        offending = sorted(chosen + alternatives, key=lambda t: t.position)
        summary = "; ".join(f"{n}x {why}" for why, n in reasons.most_common(3))
        findings.append(make_finding(
            "nan", "error", f"{len(offending)} of {len(c.tokens)} token(s) carry non-finite, null or "
            f"sentinel logprobs, first at position {offending[0].position}: {summary}", c, offending[:5],
            probe))
    matched = c.matched_stop if isinstance(c.matched_stop, str) else ""
    marker = SGLANG_NAN_FINISH.lower()
    if marker in matched.lower() or marker in str(c.finish_reason).lower():
        findings.append(make_finding("nan", "error", f"finished with matched_stop={c.matched_stop!r}: SGLang "
                                     "stops a request this way when the sampled token id is out of range "
                                     "(NaN logits)",
                                     c, probe=probe))
    if text_symptoms:
        findings.extend(_empty_text_symptom(c, probe))
    return findings


def _empty_text_symptom(c: Completion, probe: str) -> list[Finding]:
    if c.tokens:  # with logprobs: a tail of tokens whose text is ""
        tail = 0
        for tok in reversed(c.tokens):
            if tok.token != "":
                break
            tail += 1
        if tail >= max(4, len(c.tokens) // 4):
            start = len(c.tokens) - tail
            evidence = [TokenAt.of(i, c.tokens[i]) for i in range(start, start + 3)]
            return [make_finding("nan", "error", f"every token from position {start} on ({tail} of "
                                 f"{len(c.tokens)}) decodes to empty text: greedy argmax over NaN logits picks "
                                 "token id 0, typically a special token", c, evidence, probe)]
    # With or without logprobs: far fewer characters than tokens (special tokens decode to ""). Whitespace
    # counts: a healthy model may answer a blank prompt with newlines, which are text, not NaN.
    n = max(c.completion_tokens or 0, len(c.tokens))
    visible = len(c.text)
    if n >= _EMPTY_TEXT_MIN_TOKENS and visible < _EMPTY_TEXT_CHARS_PER_TOKEN * n:
        return [make_finding("nan", "error", f"{n} tokens were generated but the text has only {visible} "
                             "character(s): tokens after some point decode to empty text, how NaN "
                             "logits look without logprobs (greedy picks token id 0, a special token)", c,
                             [TokenAt.of(i, t) for i, t in enumerate(c.tokens[:3])], probe)]
    return []


def logprob_consistency(c: Completion, *, probe: str = "") -> list[Finding]:
    """Numbers that cannot come from a healthy softmax: logprob > 0, top-k mass above 1, and (greedy
    requests only) a chosen token that is clearly not the most likely one."""
    if not c.ok or not c.tokens:
        return []
    findings: list[Finding] = []
    positive = [TokenAt.of(i, t) for i, t in enumerate(c.tokens)
                if t.logprob is not None and math.isfinite(t.logprob) and t.logprob > _POSITIVE_LOGPROB_SLACK]
    if positive:
        findings.append(make_finding("logprobs", "error", f"{len(positive)} token(s) have a logprob above 0 "
                                     "(probability > 1): corrupted logits, or a server run with "
                                     "--logprobs-mode raw_logits",
                                     c, positive[:5], probe))
    heavy: list[TokenAt] = []
    for i, tok in enumerate(c.tokens):
        values = [v for v in tok.top.values() if v is not None and math.isfinite(v)]
        if values and sum(math.exp(min(v, 50.0)) for v in values) > 1.0 + _TOPK_MASS_SLACK:
            heavy.append(TokenAt.of(i, tok))
    if heavy:
        findings.append(make_finding("logprobs", "error", f"{len(heavy)} position(s) where the top-k "
                                     "probabilities sum to more than 1", c, heavy[:5], probe))
    if _plain_greedy(c.request):
        not_argmax: list[TokenAt] = []
        for i, tok in enumerate(c.tokens):
            values = [v for v in tok.top.values() if v is not None and math.isfinite(v)]
            if tok.logprob is not None and math.isfinite(tok.logprob) and values \
                    and max(values) - tok.logprob > _GREEDY_ARGMAX_SLACK:
                not_argmax.append(TokenAt.of(i, tok))
        if not_argmax:
            findings.append(make_finding("logprobs", "error", f"greedy decode chose {len(not_argmax)} token(s) "
                                         f"that are not the most likely by more than {_GREEDY_ARGMAX_SLACK} nat: "
                                         "the logprobs do not belong to the logits that were sampled "
                                         "(mixed-up rows?)",
                                         c, not_argmax[:5], probe))
    return findings


_SAMPLING_CHANGERS = ("min_tokens", "logit_bias", "bad_words", "allowed_token_ids", "guided_json",
                      "guided_regex", "guided_choice", "response_format", "structured_outputs")


def _plain_greedy(request: dict[str, Any]) -> bool:
    if request.get("temperature", 1.0) != 0:
        return False
    for key in ("repetition_penalty",):
        if request.get(key, 1.0) not in (1, 1.0, None):
            return False
    for key in ("frequency_penalty", "presence_penalty"):
        if request.get(key, 0.0) not in (0, 0.0, None):
            return False
    return not any(request.get(key) for key in _SAMPLING_CHANGERS)


def transport_findings(c: Completion, *, probe: str = "") -> list[Finding]:
    """Failures that are not NaN: other HTTP errors, aborted requests, missing logprobs."""
    if not c.ok:
        if c.status >= 400 and _NAN_BODY_RE.search(c.error or ""):
            return []  # reported by nan_evidence
        body = (c.error or "").strip()[:300]
        return [make_finding("transport", "error", f"request failed: HTTP {c.status}: {body!r}", c, probe=probe)]
    findings: list[Finding] = []
    if c.finish_reason not in (None, "stop", "length", "eos", "eos_token", "stop_sequence"):
        findings.append(make_finding("transport", "error", f"finish_reason={c.finish_reason!r} (aborted or "
                                     "failed inside the engine)", c, probe=probe))
    wants_logprobs = bool(c.request.get("logprobs")) or bool(c.request.get("top_logprobs"))
    if wants_logprobs and not c.tokens and (c.text or c.completion_tokens):
        findings.append(make_finding("transport", "warning", "logprobs were requested but none came back: NaN "
                                     "evidence is limited to the text", c, probe=probe))
    return findings


def response_findings(c: Completion, *, probe: str = "", text_symptoms: bool = True) -> list[Finding]:
    """All per-response numerical and transport checks (NaN evidence, logprob consistency, failures)."""
    return (nan_evidence(c, probe=probe, text_symptoms=text_symptoms) + logprob_consistency(c, probe=probe)
            + transport_findings(c, probe=probe))


def nan_in_log(lines: Iterable[str], patterns: Sequence[NanLogPattern] = (), *,
               limit_per_pattern: int = 3) -> list[Finding]:
    """NaN reports in server log lines: the engine's ``patterns`` and :data:`GENERIC_NAN_LOG_PATTERNS`."""
    all_patterns = (*patterns, *GENERIC_NAN_LOG_PATTERNS)
    hits: dict[int, list[tuple[int, str]]] = {}
    for number, line in enumerate(lines, 1):
        for index, (_, pattern, _) in enumerate(all_patterns):
            if pattern.search(line):
                hits.setdefault(index, []).append((number, line.rstrip()[:400]))
                break
    findings: list[Finding] = []
    for index, found in sorted(hits.items()):
        engine, _, meaning = all_patterns[index]
        shown = "\n".join(f"    line {n}: {text}" for n, text in found[:limit_per_pattern])
        more = f"\n    ... {len(found) - limit_per_pattern} more" if len(found) > limit_per_pattern else ""
        findings.append(Finding("nan", "error", f"{engine} log reports NaN ({len(found)} line(s)): "
                                f"{meaning}\n{shown}{more}", probe="server log"))
    return findings


def _metric_totals(text: str, names: Sequence[str]) -> dict[str, float]:
    samples = parse_prometheus(text)
    totals = {name: counter_total(samples, name) for name in names}
    return {name: value for name, value in totals.items() if value is not None}


def nan_in_metrics(after: str, before: str | None = None, counters: Sequence[str] = ()) -> list[Finding]:
    """NaN counters on the Prometheus page (``vllm:corrupted_requests``; needs VLLM_COMPUTE_NANS_IN_LOGITS=1):
    an increase since ``before``, or any non-zero value when there is no ``before``."""
    now = _metric_totals(after, counters)
    then = _metric_totals(before, counters) if before is not None else {}
    findings = []
    for name, value in sorted(now.items()):
        delta = value - then.get(name, 0.0)
        if delta > 0:
            findings.append(Finding("nan", "error", f"{name} rose by {delta:g} (to {value:g}): the engine "
                                    "counted requests with NaN in their logits", probe="/metrics"))
    return findings


def is_nan_http_error(c: Completion) -> bool:
    """An HTTP error whose body reports NaN/inf (the logprobs could not be serialized)."""
    return not c.ok and c.status >= 400 and bool(_NAN_BODY_RE.search(c.error or ""))


# --------------------------------------------------------------------------------------------------
# known answers, determinism, differential
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KnownAnswer:
    """A prompt whose greedy answer must contain one of ``must_contain`` (case-insensitive)."""

    prompt: str
    must_contain: tuple[str, ...]
    chat: bool = True
    max_tokens: int = 32
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or re.sub(r"\W+", "-", self.prompt.lower()).strip("-")[:40]

    def matches(self, text: str) -> bool:
        low = text.lower()
        return any(word.lower() in low for word in self.must_contain)


# Conservative probes that SmolLM2-135M-Instruct answers correctly at temperature 0 (bf16, HF
# transformers): "The capital of France is Paris.", "The capital of Japan is Tokyo.",
# "The opposite of hot is cold."
DEFAULT_KNOWN_ANSWERS: tuple[KnownAnswer, ...] = (
    KnownAnswer("What is the capital of France? Answer in one word.", ("paris",), name="capital-of-france"),
    KnownAnswer("What is the capital of Japan? Answer in one word.", ("tokyo",), name="capital-of-japan"),
    KnownAnswer("What is the opposite of hot? Answer in one word.", ("cold",), name="opposite-of-hot"),
)


def answer_departure(text: str, expected: Sequence[str]) -> tuple[int, str, int] | None:
    """Where ``text`` leaves the expected answer it came closest to, as (character offset of the first
    character that no longer matches, that expected string, how many of its characters matched).

    The closest answer is the one with the longest prefix (case-insensitive) found in ``text``: "Pari"
    in "...is Parix." departs from "paris" at the "x". A prefix shorter than half the answer (at least 3
    characters) is chance ("to" in "tokyo"), so an answer without one, or too short to have one, gives None.
    """
    low = text.lower()
    best: tuple[int, str, int] | None = None
    for want in expected:
        w = want.lower()
        shortest = max(3, (len(w) + 1) // 2)
        for n in range(len(w) - 1, shortest - 1, -1):  # the longest proper prefix first
            at = low.find(w[:n])
            if at >= 0:
                if best is None or n > best[2]:
                    best = (at + n, want, n)
                break
    return best


def _token_index_at(tokens: Sequence[TokenLogprob], text: str, offset: int) -> int | None:
    """The index of the token that holds character ``offset`` of ``text``; None when the tokens do not
    spell the text (then positions would be guesses)."""
    if "".join(t.token for t in tokens) != text:
        return None
    end = 0
    for i, t in enumerate(tokens):
        end += len(t.token)
        if offset < end:
            return i
    return len(tokens) - 1 if tokens else None


def known_answer_findings(probe: KnownAnswer, c: Completion) -> list[Finding]:
    """A wrong known answer: the answer's text, the expected strings and, where the answer began one of
    them, where it departs, with the tokens around that point as evidence (none otherwise: the first
    tokens of a wrong answer are not, as such, the offending ones)."""
    if not c.ok or probe.matches(c.text):
        return []
    message = f"expected one of {list(probe.must_contain)} (case-insensitive) in the answer, got {c.text[:200]!r}"
    evidence: list[TokenAt] = []
    departure = answer_departure(c.text, probe.must_contain)
    if departure is None:
        message += "; no expected answer is begun in it"
    else:
        offset, want, matched = departure
        then = repr(c.text[offset:offset + 12]) if offset < len(c.text) else "the end of the answer"
        message += (f"; it departs from {want!r} at character {offset}: {c.text[offset - matched:offset]!r} "
                    f"then {then} instead of {want[matched:]!r}")
        index = _token_index_at(c.tokens, c.text, offset)
        if index is not None:
            evidence = [TokenAt.of(i, c.tokens[i]) for i in range(max(0, index - 2), min(len(c.tokens), index + 3))]
    return [make_finding("known-answer", "error", message, c, evidence, f"known-answer[{probe.label}]")]


def first_difference(a: Sequence[TokenLogprob], b: Sequence[TokenLogprob]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.token != y.token:
            return i
    return None


# The differential's bound on max |Δlogprob| of the chosen tokens before the first divergence, for two
# configurations of one engine on the same weights (backend A vs backend B, graphs on vs off). Measured on an
# H200 (SGLang 0.5.15, tiny random DeepSeek-V3.2, greedy, 32 tokens, against flashmla_sparse with graphs):
# flashmla_sparse without graphs 0.016, tilelang 0.016, flashmla_kv with its FP8 KV cache 0.047. 0.25 is
# five times the worst healthy figure (FP8 rounding of K/V), and far below what a broken kernel gives
# (a wrong or scrambled attention moves the chosen token's logprob by whole units). On vLLM 0.32 CPU with
# SmolLM2-135M (bf16), compiled against eager gave up to 0.135 over the same 9 prompts (e2e, 2026-12-02).
DEFAULT_MAX_LOGPROB_DELTA = 0.25


def max_logprob_delta(ref: Completion, cand: Completion) -> tuple[float, int | None]:
    """The largest |Δlogprob| of the chosen tokens where both sides chose the same token, up to the first
    divergence (after it the two sides condition on different text), and its position; positions whose
    logprob is missing or not finite on either side are left out (the NaN oracles report those)."""
    worst, at = 0.0, None
    end = first_difference(ref.tokens, cand.tokens)
    for i, (r, c) in enumerate(zip(ref.tokens, cand.tokens, strict=False)):
        if end is not None and i >= end:
            break
        if r.logprob is None or c.logprob is None or not (math.isfinite(r.logprob) and math.isfinite(c.logprob)):
            continue
        delta = abs(r.logprob - c.logprob)
        if at is None or delta > worst:
            worst, at = delta, i
    return worst, at


def check_logprobs_close(ref: Completion, cand: Completion, *, name_ref: str = "reference",
                         name_cand: str = "candidate", oracle: str = "differential",
                         probe: str = "", max_delta: float | None = None) -> list[Finding]:
    """vLLM's ``check_logprobs_close`` rule for two greedy outputs of the same prompt.

    Walk the generated tokens; at the first position where they differ, each side's token must be among
    the other side's top-k alternatives (a near-tie that batching or kernels may legitimately flip), and
    then stop, because the sequences diverge from there. A divergence inside the top-k is a warning; a
    token outside the other's top-k is an error.

    ``max_delta`` (None: not checked, vLLM's rule alone) also bounds the largest |Δlogprob| of the chosen
    tokens before the divergence (:func:`max_logprob_delta`): over it is an error, however the tokens agree.
    """
    findings = _logprobs_close(ref, cand, name_ref=name_ref, name_cand=name_cand, oracle=oracle, probe=probe)
    if max_delta is not None and ref.ok and cand.ok and ref.tokens and cand.tokens:
        delta, at = max_logprob_delta(ref, cand)
        if at is not None and delta > max_delta:
            r, c = ref.tokens[at], cand.tokens[at]
            findings.append(make_finding(oracle, "error", f"{name_cand} vs {name_ref}: max |Δlogprob| {delta:.3f} "
                                         f"before the first divergence exceeds the tolerance {max_delta:g}, at "
                                         f"position {at} ({r.token!r}: {name_ref} {format_logprob(r.logprob)}, "
                                         f"{name_cand} {format_logprob(c.logprob)})", cand,
                                         (TokenAt.of(at, r, 5), TokenAt.of(at, c, 5)), probe))
    return findings


def _logprobs_close(ref: Completion, cand: Completion, *, name_ref: str, name_cand: str, oracle: str,
                    probe: str) -> list[Finding]:
    who = f"{name_cand} vs {name_ref}"
    if not ref.ok or not cand.ok:
        bad = name_ref if not ref.ok else name_cand
        which = ref if not ref.ok else cand
        return [make_finding(oracle, "error", f"cannot compare {who}: {bad} failed (HTTP {which.status})", which,
                             probe=probe)]
    if not ref.tokens or not cand.tokens:
        if ref.text != cand.text:
            return [make_finding(oracle, "warning", f"{who}: texts differ and there are no logprobs to judge the "
                                 f"divergence ({name_ref}: {ref.text[:120]!r}; {name_cand}: {cand.text[:120]!r})",
                                 cand, probe=probe)]
        return []
    i = first_difference(ref.tokens, cand.tokens)
    if i is None:
        if len(ref.tokens) != len(cand.tokens):
            ref_shorter = len(ref.tokens) < len(cand.tokens)
            shorter, longer = (name_ref, name_cand) if ref_shorter else (name_cand, name_ref)
            n = min(len(ref.tokens), len(cand.tokens))
            return [make_finding(oracle, "warning", f"{who}: identical for {n} tokens, then {shorter} stopped "
                                 f"and {longer} went on", cand, probe=probe)]
        return []
    r, k = ref.tokens[i], cand.tokens[i]
    evidence = (TokenAt.of(i, r, top_n=5), TokenAt.of(i, k, top_n=5))
    if not r.top or not k.top:
        return [make_finding(oracle, "error", f"{who}: first divergence at position {i} ({name_ref} "
                             f"{r.token!r}, {name_cand} {k.token!r}) and no top-k alternatives to judge it",
                             cand, evidence, probe)]
    cand_in_ref, ref_in_cand = k.token in r.top, r.token in k.top
    prefix = "".join(t.token for t in ref.tokens[:i])[-80:]
    where = f"position {i} after {prefix!r}"
    if cand_in_ref and ref_in_cand:
        return [make_finding(oracle, "warning", f"{who}: diverge at {where}: {name_ref} {r.token!r} "
                             f"({format_logprob(r.logprob)}) vs {name_cand} {k.token!r} "
                             f"({format_logprob(k.logprob)}), each inside the other's top-k (a near-tie; allowed)",
                             cand, evidence, probe)]
    order = f"offending tokens: {name_ref}'s first, then {name_cand}'s"
    missing = []
    if not cand_in_ref:
        missing.append(f"{name_cand}'s {k.token!r} is not in {name_ref}'s top-{len(r.top)}")
    if not ref_in_cand:
        missing.append(f"{name_ref}'s {r.token!r} is not in {name_cand}'s top-{len(k.top)}")
    return [make_finding(oracle, "error", f"{who}: diverge at {where}: " + "; ".join(missing)
                         + f" (texts: {name_ref} {ref.text[:100]!r}; {name_cand} {cand.text[:100]!r}; {order})",
                         cand, evidence, probe)]


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
                         probe: str = "") -> list[Finding]:
    """Two greedy runs of the same request: identical when ``exact``, else judged by the
    check_logprobs_close rule (a divergence inside each other's top-k is only a warning)."""
    if exact:
        return exact_equal_findings(a, b, name_ref="run 1", name_cand="run 2", oracle="determinism",
                                    probe=probe)
    return check_logprobs_close(a, b, name_ref="run 1", name_cand="run 2", oracle="determinism", probe=probe)

# --------------------------------------------------------------------------------------------------
# probe prompts
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbePrompt:
    """A probe prompt: sent to /v1/chat/completions when ``chat`` (the chat template applies), else as
    raw text to /v1/completions."""

    text: str
    chat: bool = False
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or re.sub(r"\W+", "-", self.text.lower()).strip("-")[:32]


# Long greedy decodes. Instruct models at temperature 0 stay most varied on open narrative tasks; list
# prompts ("twenty animals, one fact each") sent SmolLM2-135M into a one-line loop at once. These two
# stayed the most varied over 256 greedy tokens (compression 2.1 and 2.9, 119 and 82 distinct tokens).
DEFAULT_LONG_DECODE_PROMPTS: tuple[ProbePrompt, ...] = (
    ProbePrompt("Write a short story about a lighthouse keeper who finds a message in a bottle.", chat=True,
                name="story"),
    ProbePrompt("Describe the life cycle of a butterfly in detail.", chat=True, name="butterfly"),
)
# Short prompts for the NaN check and for the batch cases: plain text continuations of different
# lengths (a batch mixes sequence lengths, as real traffic does), sent to /v1/completions.
DEFAULT_BATCH_PROMPTS: tuple[ProbePrompt, ...] = (
    ProbePrompt("The capital of France is"),
    ProbePrompt("Once upon a time, in a small village by the sea, there lived"),
    ProbePrompt("The three primary colors are"),
    ProbePrompt("In 1969, the first humans to walk on the Moon were"),
    ProbePrompt("Water boils at a temperature of"),
    ProbePrompt("To make a simple tomato soup, you first need to"),
    ProbePrompt("Photosynthesis is the process by which plants"),
    ProbePrompt("The most important thing to remember when learning a new language is"),
)
DEFAULT_NAN_PROMPTS: tuple[ProbePrompt, ...] = (
    ProbePrompt("What is the capital of France? Answer in one word.", chat=True, name="chat-capital"),
    *DEFAULT_BATCH_PROMPTS[:3],
)
DEFAULT_DETERMINISM_PROMPT = ProbePrompt("Write a letter to a friend describing your last holiday in the "
                                         "mountains.", chat=True, name="letter")


# The differential's prompts: the chat probe and the raw-text batch prompts (mixed lengths), 32 greedy
# tokens each. SmolLM2 on vLLM CPU: the two sides agree, at most with near-tie warnings.
DEFAULT_DIFFERENTIAL_PROMPTS: tuple[ProbePrompt, ...] = (DEFAULT_NAN_PROMPTS[0], *DEFAULT_BATCH_PROMPTS)


def batch_prompts(size: int, prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS) -> list[ProbePrompt]:
    """The prompts of a batch of ``size``: the pool in order, repeated when the batch is larger."""
    if not prompts:
        raise ValueError("no prompts")
    return [prompts[i % len(prompts)] for i in range(size)]


def usable_reference(completions: Sequence[Completion]) -> list[Completion | None]:
    """The batch-1 answers a batch case can be compared with: None where the answer failed or carries NaN
    evidence (a comparison with it is impossible, and :func:`pytest_llmserve.gates.oracle_runs.run_batch_case`
    says so). Coherence is not judged here: a reference is the engine's own output, however (un)trained the
    model."""
    return [c if c.ok and not any(f.severity == "error" for f in response_findings(c)) else None
            for c in completions]


def compare_runs(reference: Sequence[Completion], candidate: Sequence[Completion], *, name_ref: str,
                 name_cand: str, exact: bool = False, probes: Sequence[str] | None = None,
                 max_delta: float | None = None) -> OracleReport:
    """Differential check of two servers' answers to the same prompts (e.g. eager vs CUDA graphs).

    ``reference[i]`` and ``candidate[i]`` answer the same request; ``probes[i]`` names it in findings.
    Each pair is judged by the check_logprobs_close rule (with ``max_delta``, the bound on |Δlogprob|
    before the first divergence), or by exact equality when ``exact`` (deterministic mode on both sides)."""
    report = OracleReport(f"differential[{name_cand} vs {name_ref}]")
    report.completions.extend(candidate)
    for i, (r, c) in enumerate(zip(reference, candidate, strict=False)):
        probe = probes[i] if probes is not None and i < len(probes) else f"prompt {i + 1}"
        if exact:
            report.add(exact_equal_findings(r, c, name_ref=name_ref, name_cand=name_cand, probe=probe))
        else:
            report.add(check_logprobs_close(r, c, name_ref=name_ref, name_cand=name_cand, probe=probe,
                                            max_delta=max_delta))
    if len(reference) != len(candidate):
        report.add([Finding("differential", "error", f"{len(reference)} reference answers but "
                            f"{len(candidate)} candidate answers")])
    return report
