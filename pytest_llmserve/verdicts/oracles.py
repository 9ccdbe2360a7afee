"""Correctness oracles: NaN evidence, transport failures and known answers, judged over the
answers a server gave; and the probe prompts they are asked with.

Everything here works on plain :class:`~pytest_llmserve.evidence.completion.Completion` records, so each
check can be tested without a server, and nothing here sends a request: :mod:`pytest_llmserve.gates.oracle_runs`
sends the probes and hands what comes back to these decisions. Every oracle request is greedy (temperature 0)
and asks for logprobs (``logprobs=5`` by default): logprobs are the only channel through which NaN is visible
while the text still looks normal, and the top-k alternatives are what the differential rule needs.

The other oracle modules beside this one: :mod:`~pytest_llmserve.verdicts.findings` (what every oracle reports),
:mod:`~pytest_llmserve.verdicts.differential` (two answers to one request compared: the differential rule, exact
equality, determinism), :mod:`~pytest_llmserve.verdicts.coherence` (decode collapse),
:mod:`~pytest_llmserve.verdicts.batch_sizes` (the CUDA-graph batch sizes to exercise) and
:mod:`~pytest_llmserve.verdicts.divergence` (a differential's per-request table).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.evidence.facts import NanLogPattern
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.verdicts.findings import Finding, TokenAt, make_finding

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


def _finite_top(tok: TokenLogprob) -> list[float]:
    return [v for v in tok.top.values() if v is not None and math.isfinite(v)]


def _positive_logprobs(c: Completion, probe: str) -> Finding | None:
    positive = [TokenAt.of(i, t) for i, t in enumerate(c.tokens)
                if t.logprob is not None and math.isfinite(t.logprob) and t.logprob > _POSITIVE_LOGPROB_SLACK]
    if not positive:
        return None
    return make_finding("logprobs", "error", f"{len(positive)} token(s) have a logprob above 0 "
                        "(probability > 1): corrupted logits, or a server run with "
                        "--logprobs-mode raw_logits",
                        c, positive[:5], probe)


def _topk_mass_above_one(c: Completion, probe: str) -> Finding | None:
    heavy = [TokenAt.of(i, tok) for i, tok in enumerate(c.tokens)
             if (values := _finite_top(tok)) and sum(math.exp(min(v, 50.0)) for v in values) > 1.0 + _TOPK_MASS_SLACK]
    if not heavy:
        return None
    return make_finding("logprobs", "error", f"{len(heavy)} position(s) where the top-k "
                        "probabilities sum to more than 1", c, heavy[:5], probe)


def _greedy_not_argmax(c: Completion, probe: str) -> Finding | None:
    if not _plain_greedy(c.request):
        return None
    not_argmax = [TokenAt.of(i, tok) for i, tok in enumerate(c.tokens)
                  if tok.logprob is not None and math.isfinite(tok.logprob) and (values := _finite_top(tok))
                  and max(values) - tok.logprob > _GREEDY_ARGMAX_SLACK]
    if not not_argmax:
        return None
    return make_finding("logprobs", "error", f"greedy decode chose {len(not_argmax)} token(s) "
                        f"that are not the most likely by more than {_GREEDY_ARGMAX_SLACK} nat: "
                        "the logprobs do not belong to the logits that were sampled "
                        "(mixed-up rows?)",
                        c, not_argmax[:5], probe)


def logprob_consistency(c: Completion, *, probe: str = "") -> list[Finding]:
    """Numbers that cannot come from a healthy softmax: logprob > 0, top-k mass above 1, and (greedy
    requests only) a chosen token that is clearly not the most likely one."""
    if not c.ok or not c.tokens:
        return []
    checks = (_positive_logprobs, _topk_mass_above_one, _greedy_not_argmax)
    return [finding for check in checks if (finding := check(c, probe)) is not None]


_SAMPLING_CHANGERS = ("min_tokens", "logit_bias", "bad_words", "allowed_token_ids", "guided_json",
                      "guided_regex", "guided_choice", "response_format", "structured_outputs")


def _plain_greedy(request: dict[str, object]) -> bool:
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
        # An error, not a warning: without them NaN shows only in the text, and no differential can be judged.
        findings.append(make_finding("transport", "error", "logprobs were requested but none came back: NaN "
                                     "evidence is limited to the text and no answer can be compared", c, probe=probe))
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
# known answers
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
    # A long-context probe's purpose: its context must exceed this many tokens (a DSA model's index_topk, so
    # that the indexer selects); the answer's prompt_tokens show whether it did. 0: no such purpose.
    min_context_tokens: int = 0

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
