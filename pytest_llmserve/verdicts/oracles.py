"""Correctness oracles: NaN evidence, coherence, known answers, determinism, differential comparison,
and the CUDA-graph batch sizes to exercise.

Everything here works on plain :class:`~pytest_llmserve.evidence.client.Completion` records, so each check can
be tested without a server; the ``run_*`` orchestrators send the requests through an
:class:`~pytest_llmserve.evidence.client.LLMClient` that the caller passes in, and return an
:class:`OracleReport`. Every oracle request is greedy (temperature 0) and asks for logprobs
(``logprobs=5`` by default): logprobs are the only channel through which NaN is visible while the text
still looks normal, and the top-k alternatives are what the differential rule needs.

A failure message says what was sent, what came back (the first offending tokens with their positions
and logprobs) and on which server configuration (the server id passed in), so it can be acted on from
a CI log alone.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, TypeVar

from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import Completion, LLMClient, TokenLogprob
from pytest_llmserve.evidence.facts import NanLogPattern
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus

Severity = Literal["error", "warning"]
_T = TypeVar("_T")
_P = TypeVar("_P", bound="ProbePrompt | KnownAnswer")

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
# findings and reports
# --------------------------------------------------------------------------------------------------

# The default failure message is short enough to read in a CI log: the first findings, each cut to a few
# screen lines; ``-vv`` and the results file hold all of them in full.
BRIEF_FINDINGS = 3
BRIEF_TOKENS = 3
BRIEF_MESSAGE_CHARS = 320
BRIEF_CONTEXT_CHARS = 160


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut_middle(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters in its middle: a finding states what is wrong first and
    often says how to read its evidence last (e.g. which side's tokens come first)."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 5] + " ... " + text[-tail:]


@dataclass(frozen=True, slots=True)
class TokenAt:
    """One generated token at its position, with its logprob and top alternatives, as evidence."""

    position: int
    token: str
    logprob: float | None
    top: tuple[tuple[str, float | None], ...] = ()

    @classmethod
    def of(cls, position: int, tok: TokenLogprob, top_n: int = 3) -> TokenAt:
        ranked = sorted(tok.top.items(), key=lambda kv: _sort_key(kv[1]))[:top_n]
        return cls(position, tok.token, tok.logprob, tuple(ranked))

    def render(self) -> str:
        text = f"#{self.position} {self.token!r} {_fmt(self.logprob)}"
        if self.top:
            text += " [top: " + ", ".join(f"{t!r} {_fmt(v)}" for t, v in self.top) + "]"
        return text


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of evidence that something is wrong (``error``) or worth a look (``warning``)."""

    oracle: str  # nan | logprobs | transport | coherence | known-answer | determinism | differential
    severity: Severity
    message: str
    tokens: tuple[TokenAt, ...] = ()  # the first offending tokens, with positions and logprobs
    request: str = ""  # Completion.describe(): what was sent and what came back
    probe: str = ""  # which probe or request, e.g. "long-decode[story]" or "bs=3-padded-to-4 #2/3"

    def render(self, *, brief: bool = False) -> str:
        """The finding with its evidence. ``brief``: the message and each line of context cut to one
        screen line, the first :data:`BRIEF_TOKENS` offending tokens (the default failure message);
        otherwise everything (``-vv``, and the results' full evidence)."""
        head = f"[{self.oracle}] {self.severity}" + (f" in {self.probe}" if self.probe else "")
        lines = [f"{head}: {_cut_middle(self.message, BRIEF_MESSAGE_CHARS) if brief else self.message}"]
        context = self.request.splitlines()
        if brief:
            # What was sent and what came back; the first tokens are repeated by the offending tokens.
            context = [_cut(line, BRIEF_CONTEXT_CHARS) for line in context
                       if not (self.tokens and line.startswith("first tokens"))]
        lines.extend("    " + line for line in context)
        tokens = self.tokens[:BRIEF_TOKENS] if brief else self.tokens
        if tokens:
            lines.append("    offending tokens (#position token logprob [top alternatives]):")
            lines.extend("      " + _cut(t.render(), BRIEF_CONTEXT_CHARS) if brief else "      " + t.render()
                         for t in tokens)
            if len(tokens) < len(self.tokens):
                lines.append(f"      ... {len(self.tokens) - len(tokens)} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class OracleReport:
    """The findings of one check on one server, and the completions it looked at."""

    check: str
    findings: list[Finding] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    server_id: str = ""  # the server configuration the responses came from

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def add(self, findings: Iterable[Finding]) -> OracleReport:
        self.findings.extend(findings)
        return self

    def merge(self, other: OracleReport) -> OracleReport:
        self.findings.extend(other.findings)
        self.completions.extend(other.completions)
        return self

    def message(self, server_id: str | None = None, limit: int | None = BRIEF_FINDINGS, *,
                full: bool = False) -> str:
        """A failure message: the server configuration (``server_id``, else the one recorded by the
        orchestrator), then the first ``limit`` distinct errors and warnings, each with what was sent,
        what came back and the offending tokens, and a count of the rest. Concise by default (each
        finding's context cut to a few lines); ``full`` shows every finding with all its evidence."""
        server_id = server_id or self.server_id or "<unnamed server>"
        errors, warnings = self.errors, self.warnings
        verdict = "FAILED" if errors else "passed"
        lines = [f"{self.check} {verdict} on server {server_id}: {len(errors)} error(s), "
                 f"{len(warnings)} warning(s) over {len(self.completions)} response(s)"]
        # The same finding in several requests (e.g. HTTP 400 on every one) is shown once, with the
        # other probes named, so distinct evidence is not pushed out of the first ``limit``.
        groups: dict[tuple[str, str, str], list[Finding]] = {}
        for f in errors + warnings:
            groups.setdefault((f.oracle, f.severity, f.message), []).append(f)
        every = list(groups.values())
        shown = every if full or limit is None else every[:limit]
        for group in shown:
            lines.append(group[0].render(brief=not full))
            if len(group) > 1:
                others = ", ".join(f.probe or "?" for f in group[1:6]) + (", ..." if len(group) > 6 else "")
                lines.append(f"    (the same in {len(group) - 1} more: {others})")
        hidden = sum(len(g) for g in every[len(shown):])
        if hidden:
            lines.append(f"... and {hidden} more finding(s) (all of them, in full: -vv, or this check's row "
                         "in results.json)")
        return "\n".join(lines)

    def first_finding(self) -> str | None:
        """The first error (else warning) on one line: oracle, probe and message."""
        ranked = self.errors or self.warnings
        if not ranked:
            return None
        first = ranked[0]
        return f"[{first.oracle}]" + (f" {first.probe}" if first.probe else "") + f": {first.message}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "null"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if abs(value) >= 1e4 else f"{value:.3f}"


def _sort_key(value: float | None) -> float:
    return -value if value is not None and math.isfinite(value) else math.inf


def _finding(oracle: str, severity: Severity, message: str, c: Completion | None = None,
             tokens: Iterable[TokenAt] = (), probe: str = "") -> Finding:
    return Finding(oracle, severity, message, tuple(tokens), c.describe() if c is not None else "", probe)


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
            findings.append(_finding("nan", "error", f"HTTP {c.status} whose body reports NaN/inf: "
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
        findings.append(_finding(
            "nan", "error", f"{len(offending)} of {len(c.tokens)} token(s) carry non-finite, null or "
            f"sentinel logprobs, first at position {offending[0].position}: {summary}", c, offending[:5],
            probe))
    matched = c.matched_stop if isinstance(c.matched_stop, str) else ""
    marker = SGLANG_NAN_FINISH.lower()
    if marker in matched.lower() or marker in str(c.finish_reason).lower():
        findings.append(_finding("nan", "error", f"finished with matched_stop={c.matched_stop!r}: SGLang "
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
            return [_finding("nan", "error", f"every token from position {start} on ({tail} of "
                             f"{len(c.tokens)}) decodes to empty text: greedy argmax over NaN logits picks "
                             "token id 0, typically a special token", c, evidence, probe)]
    # With or without logprobs: far fewer characters than tokens (special tokens decode to ""). Whitespace
    # counts: a healthy model may answer a blank prompt with newlines, which are text, not NaN.
    n = max(c.completion_tokens or 0, len(c.tokens))
    visible = len(c.text)
    if n >= _EMPTY_TEXT_MIN_TOKENS and visible < _EMPTY_TEXT_CHARS_PER_TOKEN * n:
        return [_finding("nan", "error", f"{n} tokens were generated but the text has only {visible} "
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
        findings.append(_finding("logprobs", "error", f"{len(positive)} token(s) have a logprob above 0 "
                                 "(probability > 1): corrupted logits, or a server run with "
                                 "--logprobs-mode raw_logits",
                                 c, positive[:5], probe))
    heavy: list[TokenAt] = []
    for i, tok in enumerate(c.tokens):
        values = [v for v in tok.top.values() if v is not None and math.isfinite(v)]
        if values and sum(math.exp(min(v, 50.0)) for v in values) > 1.0 + _TOPK_MASS_SLACK:
            heavy.append(TokenAt.of(i, tok))
    if heavy:
        findings.append(_finding("logprobs", "error", f"{len(heavy)} position(s) where the top-k "
                                 "probabilities sum to more than 1", c, heavy[:5], probe))
    if _plain_greedy(c.request):
        not_argmax: list[TokenAt] = []
        for i, tok in enumerate(c.tokens):
            values = [v for v in tok.top.values() if v is not None and math.isfinite(v)]
            if tok.logprob is not None and math.isfinite(tok.logprob) and values \
                    and max(values) - tok.logprob > _GREEDY_ARGMAX_SLACK:
                not_argmax.append(TokenAt.of(i, tok))
        if not_argmax:
            findings.append(_finding("logprobs", "error", f"greedy decode chose {len(not_argmax)} token(s) "
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
        return [_finding("transport", "error", f"request failed: HTTP {c.status}: {body!r}", c, probe=probe)]
    findings: list[Finding] = []
    if c.finish_reason not in (None, "stop", "length", "eos", "eos_token", "stop_sequence"):
        findings.append(_finding("transport", "error", f"finish_reason={c.finish_reason!r} (aborted or "
                                 "failed inside the engine)", c, probe=probe))
    wants_logprobs = bool(c.request.get("logprobs")) or bool(c.request.get("top_logprobs"))
    if wants_logprobs and not c.tokens and (c.text or c.completion_tokens):
        findings.append(_finding("transport", "warning", "logprobs were requested but none came back: NaN "
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


# --------------------------------------------------------------------------------------------------
# coherence
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CoherenceThresholds:
    """Limits that separate degenerate decoding from healthy (if imperfect) greedy text.

    Calibrated on SmolLM2-135M-Instruct greedy decodes of 256 tokens (bf16): a healthy small model at
    temperature 0 often falls into a loop of a whole sentence after ~100 tokens ("The first printing
    press was created by ..., in 1786." again and again), which must pass; broken decode collapses into
    a loop of a few tokens (" piece, piece. piece in piece"), one token ("!!!!", token id 0 under NaN),
    or replacement characters, which must fail. Measured (healthy loops vs the layer-scrambled model):
    compression ratio 3.7-6.6 vs 8-23, distinct tokens 35-65 vs 6-12, most common token 7-15% vs 44-49%,
    most common 4-gram 3-9% vs 16-43%, mean logprob -0.16..-0.49 vs -0.54..-0.78 (so the logprob floor
    does not catch a scrambled model: it is *more* confident; the repetition metrics do).

    Validated on the real engine (vLLM 0.32 CPU, bf16, the two default long-decode prompts, 256 greedy
    tokens): healthy compression 2.1 / 4.7, distinct tokens 116 / 42, most common token 7% / 15%, most
    common 4-gram 1.2% / 5.5%, mean logprob -0.82 / -0.39; the scrambled model 8.6 / 10.3, 10 / 8,
    46% / 49%, 19% / 17%, -0.57 / -0.47. It fails on distinct tokens and the top-token share (and on
    compression for one prompt), not on the 4-gram share: several limits, so one near miss does not
    let it through. The 32-token batch outputs: healthy distinct 16-28 (need 10), top token 6-17%;
    scrambled distinct 3-9, top token 38-50%.
    """

    # U+FFFD in the text: invalid UTF-8 byte sequences from the detokenizer, i.e. garbage byte tokens.
    max_replacement_ratio: float = 0.01
    # Unicode-printable characters or whitespace; control characters mean byte garbage.
    min_printable_ratio: float = 0.95
    # Printable ASCII or whitespace (SGLang's own gibberish detector uses > 0.85). Catches "BPE salad"
    # (NaN rows sanitized into uniform sampling). For English prompts only: None disables it.
    min_ascii_ratio: float | None = 0.85
    # len(utf8) / len(zlib(utf8)) (Whisper's degeneration test; it uses 2.4 on sampled speech segments).
    # Greedy sentence loops reach 4-7 at 256 tokens, token-level collapse 8-50.
    max_compression_ratio: float = 10.0
    # Share of the most common token n-gram among all n-grams (SGLang's kit: 5-gram < 0.25). A loop of
    # period p gives ~1/p: 0.2 fails loops of five tokens or fewer.
    ngram: int = 4
    max_top_ngram_ratio: float = 0.2
    # Share of the most common single token (healthy prose: " the", ",", "\n" at 5-15%).
    max_top_token_ratio: float = 0.35
    # Longest run of one identical token (NaN -> token 0 -> "!!!!!!" for GLM/Qwen tokenizers).
    max_token_run: int = 8
    # Distinct tokens must reach min(min_distinct_tokens, ceil(min_distinct_ratio * n)).
    min_distinct_tokens: int = 20
    min_distinct_ratio: float = 0.3
    # Mean logprob of the chosen tokens. Greedy healthy text sits around -0.2..-1; uniform "salad" from
    # sanitized NaN rows is far below. Not a repetition detector (collapsed loops are confident).
    min_mean_logprob: float = -3.0
    # Below these sizes the length-sensitive statistics (compression, n-grams, top token) are skipped.
    min_chars: int = 64
    min_tokens: int = 32


DEFAULT_THRESHOLDS = CoherenceThresholds()

_PSEUDO_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def _token_strings(text: str, tokens: Sequence[TokenLogprob | str] | None) -> tuple[list[str], bool]:
    if tokens:
        return [t if isinstance(t, str) else t.token for t in tokens], False
    # No logprobs: words and single punctuation marks stand in for tokens ("!!!!" -> "!", "!", ...).
    return _PSEUDO_TOKEN_RE.findall(text), True


def _longest_run(items: Sequence[str]) -> tuple[int, int]:
    """(length, start index) of the longest run of identical items."""
    best, best_start, run, start = 0, 0, 0, 0
    for i, item in enumerate(items):
        if i and item == items[i - 1]:
            run += 1
        else:
            run, start = 1, i
        if run > best:
            best, best_start = run, start
    return best, best_start


def _top_ngram(items: Sequence[str], n: int) -> tuple[float, tuple[str, ...], int]:
    grams = [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]
    if not grams:
        return 0.0, (), 0
    gram, count = Counter(grams).most_common(1)[0]
    return count / len(grams), gram, count


def coherence_metrics(text: str, tokens: Sequence[TokenLogprob | str] | None = None,
                      ngram: int = DEFAULT_THRESHOLDS.ngram) -> dict[str, float]:
    """Text statistics of one output. Keys: chars, tokens, pseudo_tokens (1.0 when words stood in for
    missing tokens), replacement_ratio, printable_ratio, ascii_ratio, compression_ratio, top_ngram_ratio,
    top_token_ratio, longest_token_run, distinct_tokens, and mean_logprob (only when logprobs exist)."""
    items, pseudo = _token_strings(text, tokens)
    chars = len(text)
    data = text.encode("utf-8", "surrogatepass")
    metrics: dict[str, float] = {"chars": float(chars), "tokens": float(len(items)),
                                 "pseudo_tokens": float(pseudo)}
    if chars:
        metrics["replacement_ratio"] = text.count("\ufffd") / chars
        metrics["printable_ratio"] = sum(1 for ch in text if ch.isprintable() or ch.isspace()) / chars
        metrics["ascii_ratio"] = sum(1 for ch in text if (" " <= ch <= "~") or ch in "\n\r\t") / chars
        metrics["compression_ratio"] = len(data) / len(zlib.compress(data, 9))
    else:
        metrics.update(replacement_ratio=0.0, printable_ratio=1.0, ascii_ratio=1.0, compression_ratio=0.0)
    metrics["top_ngram_ratio"] = _top_ngram(items, ngram)[0]
    metrics["top_token_ratio"] = (Counter(items).most_common(1)[0][1] / len(items)) if items else 0.0
    metrics["longest_token_run"] = float(_longest_run(items)[0])
    metrics["distinct_tokens"] = float(len(set(items)))
    if tokens and not pseudo:
        values = [t.logprob for t in tokens if isinstance(t, TokenLogprob) and t.logprob is not None
                  and math.isfinite(t.logprob) and t.logprob > VLLM_LOGPROB_CLAMP]
        if values:
            metrics["mean_logprob"] = sum(values) / len(values)
    return metrics


def _excerpt(text: str, start: int = 0, width: int = 160) -> str:
    return repr(text[start:start + width]) + ("..." if len(text) > start + width else "")


def coherence_findings(c: Completion, thresholds: CoherenceThresholds | None = None, *,
                       probe: str = "") -> list[Finding]:
    """Decode collapse in one response (see :class:`CoherenceThresholds`). Failed requests give none."""
    t = thresholds or DEFAULT_THRESHOLDS
    if not c.ok:
        return []
    text = c.text
    if not text.strip():
        if c.tokens or c.completion_tokens:
            return [_finding("coherence", "error", "the output has no visible text", c,
                             [TokenAt.of(i, tok) for i, tok in enumerate(c.tokens[:3])], probe)]
        return []
    items, pseudo = _token_strings(text, c.tokens)
    m = coherence_metrics(text, c.tokens, t.ngram)
    toks = c.tokens
    unit = "word" if pseudo else "token"  # without logprobs, words and punctuation stand in for tokens
    joiner = " " if pseudo else ""
    out: list[Finding] = []

    def at(indices: Iterable[int]) -> list[TokenAt]:
        return [TokenAt.of(i, toks[i]) for i in indices if 0 <= i < len(toks)] if not pseudo else []

    def fail(message: str, evidence: Iterable[int] = ()) -> None:
        out.append(_finding("coherence", "error", message, c, at(evidence), probe))

    if m["replacement_ratio"] > t.max_replacement_ratio:
        bad = [i for i, tok in enumerate(toks) if "\ufffd" in tok.token][:5]
        fail(f"{m['replacement_ratio']:.1%} of the characters are U+FFFD (limit "
             f"{t.max_replacement_ratio:.1%}): the detokenizer got invalid byte sequences; text "
             f"{_excerpt(text, text.find(chr(0xFFFD)))}", bad)
    if m["printable_ratio"] < t.min_printable_ratio:
        fail(f"only {m['printable_ratio']:.1%} of the characters are printable (floor "
             f"{t.min_printable_ratio:.0%}); text {_excerpt(text)}", range(5))
    if t.min_ascii_ratio is not None and m["ascii_ratio"] < t.min_ascii_ratio and len(text) >= 16:
        fail(f"only {m['ascii_ratio']:.1%} of the characters are printable ASCII (floor "
             f"{t.min_ascii_ratio:.0%}; set min_ascii_ratio=None for non-English probes); text "
             f"{_excerpt(text)}", range(5))
    run, run_start = _longest_run(items)
    if run > t.max_token_run:
        fail(f"the {unit} {items[run_start]!r} repeats {run} times in a row from position {run_start} "
             f"(limit {t.max_token_run})", range(run_start, run_start + 5))
    n = len(items)
    if n >= 8:
        need = min(t.min_distinct_tokens, math.ceil(t.min_distinct_ratio * n))
        if m["distinct_tokens"] < need:
            common = ", ".join(f"{tok!r}x{k}" for tok, k in Counter(items).most_common(5))
            fail(f"only {int(m['distinct_tokens'])} distinct {unit}s in {n} (need {need}): vocabulary "
                 f"collapse; most common: {common}", range(8))
    if len(text) >= t.min_chars and m["compression_ratio"] > t.max_compression_ratio:
        fail(f"the text compresses {m['compression_ratio']:.1f}x (limit {t.max_compression_ratio:g}x): "
             f"repetitive collapse; text {_excerpt(text)}", range(8))
    if n >= t.min_tokens:
        ratio, gram, count = _top_ngram(items, t.ngram)
        if ratio > t.max_top_ngram_ratio:
            starts = [i for i in range(n - t.ngram + 1) if tuple(items[i:i + t.ngram]) == gram][:2]
            fail(f"the {t.ngram}-gram {joiner.join(gram)!r} makes up {ratio:.0%} of all {t.ngram}-grams "
                 f"({count}x; limit {t.max_top_ngram_ratio:.0%}): a short loop",
                 [i for s in starts for i in range(s, s + t.ngram)])
        if m["top_token_ratio"] > t.max_top_token_ratio:
            tok, k = Counter(items).most_common(1)[0]
            fail(f"the {unit} {tok!r} is {m['top_token_ratio']:.0%} of the output ({k} of {n}; limit "
                 f"{t.max_top_token_ratio:.0%})", [i for i, x in enumerate(items) if x == tok][:5])
    mean = m.get("mean_logprob")
    if mean is not None and mean < t.min_mean_logprob:
        worst = sorted(range(len(toks)), key=lambda i: _sort_key(toks[i].logprob), reverse=True)
        fail(f"mean logprob {mean:.2f} is below the floor {t.min_mean_logprob:g}: the model is guessing",
             sorted(worst[:5]))
    return out


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
    return [_finding("known-answer", "error", message, c, evidence, f"known-answer[{probe.label}]")]


def _first_difference(a: Sequence[TokenLogprob], b: Sequence[TokenLogprob]) -> int | None:
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
    end = _first_difference(ref.tokens, cand.tokens)
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
            findings.append(_finding(oracle, "error", f"{name_cand} vs {name_ref}: max |Δlogprob| {delta:.3f} "
                                     f"before the first divergence exceeds the tolerance {max_delta:g}, at "
                                     f"position {at} ({r.token!r}: {name_ref} {_fmt(r.logprob)}, {name_cand} "
                                     f"{_fmt(c.logprob)})", cand, (TokenAt.of(at, r, 5), TokenAt.of(at, c, 5)),
                                     probe))
    return findings


def _logprobs_close(ref: Completion, cand: Completion, *, name_ref: str, name_cand: str, oracle: str,
                    probe: str) -> list[Finding]:
    who = f"{name_cand} vs {name_ref}"
    if not ref.ok or not cand.ok:
        bad = name_ref if not ref.ok else name_cand
        which = ref if not ref.ok else cand
        return [_finding(oracle, "error", f"cannot compare {who}: {bad} failed (HTTP {which.status})", which,
                         probe=probe)]
    if not ref.tokens or not cand.tokens:
        if ref.text != cand.text:
            return [_finding(oracle, "warning", f"{who}: texts differ and there are no logprobs to judge the "
                             f"divergence ({name_ref}: {ref.text[:120]!r}; {name_cand}: {cand.text[:120]!r})",
                             cand, probe=probe)]
        return []
    i = _first_difference(ref.tokens, cand.tokens)
    if i is None:
        if len(ref.tokens) != len(cand.tokens):
            ref_shorter = len(ref.tokens) < len(cand.tokens)
            shorter, longer = (name_ref, name_cand) if ref_shorter else (name_cand, name_ref)
            n = min(len(ref.tokens), len(cand.tokens))
            return [_finding(oracle, "warning", f"{who}: identical for {n} tokens, then {shorter} stopped "
                             f"and {longer} went on", cand, probe=probe)]
        return []
    r, k = ref.tokens[i], cand.tokens[i]
    evidence = (TokenAt.of(i, r, top_n=5), TokenAt.of(i, k, top_n=5))
    if not r.top or not k.top:
        return [_finding(oracle, "error", f"{who}: first divergence at position {i} ({name_ref} "
                         f"{r.token!r}, {name_cand} {k.token!r}) and no top-k alternatives to judge it",
                         cand, evidence, probe)]
    cand_in_ref, ref_in_cand = k.token in r.top, r.token in k.top
    prefix = "".join(t.token for t in ref.tokens[:i])[-80:]
    where = f"position {i} after {prefix!r}"
    if cand_in_ref and ref_in_cand:
        return [_finding(oracle, "warning", f"{who}: diverge at {where}: {name_ref} {r.token!r} "
                         f"({_fmt(r.logprob)}) vs {name_cand} {k.token!r} ({_fmt(k.logprob)}), each "
                         "inside the other's top-k (a near-tie; allowed)", cand, evidence, probe)]
    order = f"offending tokens: {name_ref}'s first, then {name_cand}'s"
    missing = []
    if not cand_in_ref:
        missing.append(f"{name_cand}'s {k.token!r} is not in {name_ref}'s top-{len(r.top)}")
    if not ref_in_cand:
        missing.append(f"{name_ref}'s {r.token!r} is not in {name_cand}'s top-{len(k.top)}")
    return [_finding(oracle, "error", f"{who}: diverge at {where}: " + "; ".join(missing)
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
        return [_finding(oracle, "error", f"cannot compare {who}: a request failed (HTTP {which.status})",
                         which, probe=probe)]
    i = _first_difference(ref.tokens, cand.tokens)
    if i is not None:
        return [_finding(oracle, "error", f"{who}: deterministic mode, but the tokens differ at position "
                         f"{i}: {ref.tokens[i].token!r} vs {cand.tokens[i].token!r}", cand,
                         (TokenAt.of(i, ref.tokens[i], 5), TokenAt.of(i, cand.tokens[i], 5)), probe)]
    if len(ref.tokens) != len(cand.tokens) or ref.text != cand.text:
        return [_finding(oracle, "error", f"{who}: deterministic mode, but the outputs differ: "
                         f"{ref.text[:120]!r} vs {cand.text[:120]!r}", cand, probe=probe)]
    if compare_logprobs:
        for j, (x, y) in enumerate(zip(ref.tokens, cand.tokens, strict=True)):
            if x.logprob != y.logprob:
                return [_finding(oracle, "error", f"{who}: same tokens, but the logprob at position {j} "
                                 f"differs: {_fmt(x.logprob)} vs {_fmt(y.logprob)} (bitwise equality "
                                 "expected)", cand,
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
# CUDA-graph batch sizes
# --------------------------------------------------------------------------------------------------

BatchKind = Literal["captured", "padded", "above-max", "no-graph"]

# Sizes sent when the server captured no graphs (or none are known): small batches, including 3,
# which broke FP8 MLA decode in vLLM #57017.
NO_GRAPH_SIZES = (1, 2, 3, 4, 8)
# At most this many batch cases per server unless the caller says otherwise. The engines' default
# capture lists have 35-70 sizes (vLLM: 1, 2, 4, 8, then every 8 up to 512); sending all of them, each
# with a padded neighbour, would cost thousands of requests per configuration.
DEFAULT_COVERAGE_CAP = 24


@dataclass(frozen=True, slots=True)
class BatchCase:
    """One batch size to send as concurrent greedy requests, and how the graph runner should treat it."""

    size: int
    kind: BatchKind
    padded_to: int | None = None  # the captured size it runs as (itself when captured); None above max
    graph_max: int | None = None  # largest captured size, for the above-max id

    @property
    def id(self) -> str:
        if self.kind == "padded":
            return f"bs={self.size}-padded-to-{self.padded_to}"
        if self.kind == "above-max":
            return f"bs={self.size}-above-max-{self.graph_max}"
        if self.kind == "no-graph":
            return f"bs={self.size}-no-graph"
        return f"bs={self.size}"


def _clean_sizes(sizes: Sequence[int] | None) -> list[int]:
    if not sizes:
        return []
    bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ValueError(f"batch sizes must be positive integers, got {bad!r}")
    return sorted(set(sizes))


def coverage_plan(captured: Sequence[int] | None, configured: Sequence[int] | None = None, max_extra: int = 1,
                  cap: int | None = None, *, server_max_batch: int | None = None) -> list[BatchCase]:
    """The batch sizes that exercise every CUDA-graph path, in ascending order.

    ``captured`` (what the engine reports it captured) wins over ``configured`` (what was asked for).
    For each captured size there is one case; in each gap below or between captured sizes,
    ``max_extra`` padded sizes (first the one just above the lower size, which pads the most, then
    the one just below the upper size, then midpoints); and the largest size + 1, which runs without
    a graph. ``server_max_batch`` (max running requests) drops sizes the server cannot batch at once.

    The total is capped (``cap``, default :data:`DEFAULT_COVERAGE_CAP`): the smallest and largest
    captured sizes, above-max and the padded sizes are kept first; captured sizes in the middle are
    thinned evenly, then padded ones if still needed. With no sizes known: 1, 2, 3, 4, 8 as ``no-graph``.
    """
    if max_extra < 0:
        raise ValueError(f"max_extra = {max_extra}: must be >= 0")
    limit = DEFAULT_COVERAGE_CAP if cap is None else cap
    if limit < 1:
        raise ValueError(f"cap = {cap}: must be >= 1")
    sizes = _clean_sizes(captured) or _clean_sizes(configured)
    if not sizes:
        cases = [BatchCase(s, "no-graph") for s in NO_GRAPH_SIZES]
        if server_max_batch is not None:
            cases = [c for c in cases if c.size <= server_max_batch] or [BatchCase(1, "no-graph")]
        return cases[:limit]
    top = sizes[-1]
    captured_cases = [BatchCase(s, "captured", s, top) for s in sizes]
    padded: list[BatchCase] = []
    for lower, upper in zip([0, *sizes[:-1]], sizes, strict=True):
        gap = list(range(lower + 1, upper))
        if lower == 0:
            gap = gap[:1]  # below the smallest captured size: batch 1 is the interesting one
        for s in _pick_in_gap(gap, max_extra):
            padded.append(BatchCase(s, "padded", upper, top))
    above = [BatchCase(top + 1, "above-max", None, top)]
    if server_max_batch is not None:
        captured_cases = [c for c in captured_cases if c.size <= server_max_batch]
        padded = [c for c in padded if c.size <= server_max_batch]
        above = [c for c in above if c.size <= server_max_batch]
    return sorted(_cap_cases(captured_cases, padded, above, limit), key=lambda c: (c.size, c.kind))


def _pick_in_gap(gap: list[int], count: int) -> list[int]:
    if not gap or count == 0:
        return []
    picks = [gap[0]]  # pads the most (e.g. 9 -> 16)
    if count > 1 and gap[-1] not in picks:
        picks.append(gap[-1])  # pads one slot
    remaining = [s for s in gap if s not in picks]
    extra = count - len(picks)
    if extra > 0 and remaining:
        picks.extend(_spread(remaining, extra))
    return sorted(picks)


def _spread(items: Sequence[_T], count: int) -> list[_T]:
    """``count`` items evenly spread over ``items`` (both ends included when count >= 2)."""
    if count >= len(items):
        return list(items)
    if count <= 0:
        return []
    if count == 1:
        return [items[len(items) // 2]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def _cap_cases(captured: list[BatchCase], padded: list[BatchCase], above: list[BatchCase],
               limit: int) -> list[BatchCase]:
    total = len(captured) + len(padded) + len(above)
    if total <= limit:
        return captured + padded + above
    ends = [captured[0], captured[-1]] if len(captured) >= 2 else captured[:]
    keep: list[BatchCase] = above[:limit] + ends[:max(0, limit - len(above))]
    room = limit - len(keep)
    middle = captured[1:-1] if len(captured) >= 2 else []
    if room >= len(padded):
        keep += padded
        keep += _spread(middle, limit - len(keep))
    else:
        keep += _spread(padded, room)
    return keep


# --------------------------------------------------------------------------------------------------
# orchestrators
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

# Coherence limits for short batch outputs: the same metrics; the length-sensitive ones are skipped
# automatically below CoherenceThresholds.min_chars / min_tokens.
BATCH_THRESHOLDS = DEFAULT_THRESHOLDS


def _send(client: LLMClient, prompt: ProbePrompt | KnownAnswer, max_tokens: int,
          logprobs: int | None) -> Completion:
    text = prompt.text if isinstance(prompt, ProbePrompt) else prompt.prompt
    if prompt.chat:
        return client.chat(text, max_tokens, temperature=0.0, logprobs=logprobs)
    return client.complete(text, max_tokens, temperature=0.0, logprobs=logprobs)


def _transport_failure(exc: RequestError, probe: str) -> Finding:
    return Finding("transport", "error", f"request raised {exc} (is the server still alive? see its log); "
                   "the remaining requests of this check were not sent", probe=probe)


def run_nan_check(client: LLMClient, server_id: str, *, prompts: Sequence[ProbePrompt] = DEFAULT_NAN_PROMPTS,
                  max_tokens: int = 32, logprobs: int = DEFAULT_LOGPROBS,
                  read_log: Callable[[], Iterable[str]] | None = None,
                  log_patterns: Sequence[NanLogPattern] = (), nan_counters: Sequence[str] = (),
                  metrics_before: str | None = None) -> OracleReport:
    """Greedy requests with logprobs on each prompt, a one-token request, and the engine's own
    NaN counters (/metrics before and after) and log lines (``read_log``: the lines written since the
    check began, e.g. from the server's log file). ``metrics_before``: /metrics as it was before the
    check's requests, when they were sent ahead (else read now)."""
    report = OracleReport("nan-check", server_id=server_id)
    before = metrics_before if metrics_before is not None else client.metrics_text()
    followed_up = False
    try:
        for prompt in prompts:
            c = _send(client, prompt, max_tokens, logprobs)
            report.completions.append(c)
            report.add(response_findings(c, probe=f"nan-check[{prompt.label}]"))
            if not followed_up and _is_nan_http_error(c):
                # The 400 hides the tokens; the same request without logprobs shows what users get.
                followed_up = True
                label = f"nan-check[{prompt.label}]"
                report.add(_without_logprobs(client, prompt, max_tokens, label, report))
        # A one-token decode takes paths a longer one does not (SGLang's kit checks it for graph bugs).
        one = _send(client, prompts[0], 1, logprobs) if prompts else None
    except RequestError as exc:
        report.add([_transport_failure(exc, "nan-check")])
        one = None
    if one is not None:
        report.completions.append(one)
        report.add(response_findings(one, probe="nan-check[max_tokens=1]"))
        if one.ok and not one.tokens and not one.text:
            report.add([_finding("transport", "error", "a max_tokens=1 request returned no token", one,
                                 probe="nan-check[max_tokens=1]")])
    after = client.metrics_text()
    if after is not None:
        report.add(nan_in_metrics(after, before, nan_counters))
    if read_log is not None:
        report.add(nan_in_log(read_log(), log_patterns))
    return report


def _is_nan_http_error(c: Completion) -> bool:
    return not c.ok and c.status >= 400 and bool(_NAN_BODY_RE.search(c.error or ""))


def _without_logprobs(client: LLMClient, prompt: ProbePrompt, max_tokens: int, label: str,
                      report: OracleReport) -> list[Finding]:
    """Resend a request whose logprobs could not be serialized, without logprobs, as further evidence."""
    probe = f"{label} resent without logprobs"
    c = _send(client, prompt, max_tokens, None)
    report.completions.append(c)
    if not c.ok:
        return nan_evidence(c, probe=probe) or transport_findings(c, probe=probe)
    found = nan_evidence(c, probe=probe)
    if found:
        return [replace(f, message="without logprobs the same request answers HTTP 200, and " + f.message)
                for f in found]
    return [_finding("nan", "warning", "without logprobs the same request answers HTTP 200 with "
                     "normal-looking text: the non-finite values may be confined to logprobs (e.g. -inf/NaN "
                     "among the top-k alternatives) or appear later in the decode", c, probe=probe)]


def _send_each(report: OracleReport, client: LLMClient, items: Sequence[_P], label: Callable[[_P], str],
               max_tokens: Callable[[_P], int], logprobs: int | None,
               judge: Callable[[_P, Completion, str], list[Finding]]) -> OracleReport:
    """The sequential shape of the oracles: send each item greedily (batch 1), keep the answer, add its NaN
    and transport findings and what ``judge`` finds; a transport failure ends the check with what it has."""
    for item in items:
        probe = label(item)
        try:
            c = _send(client, item, max_tokens(item), logprobs)
        except RequestError as exc:
            report.add([_transport_failure(exc, probe)])
            break
        report.completions.append(c)
        report.add(response_findings(c, probe=probe))
        report.add(judge(item, c, probe))
    return report


def run_known_answers(client: LLMClient, probes: Sequence[KnownAnswer] = DEFAULT_KNOWN_ANSWERS,
                      server_id: str = "", *, logprobs: int = DEFAULT_LOGPROBS) -> OracleReport:
    """Each probe's greedy answer must contain one of its expected words (and carry no NaN)."""
    return _send_each(OracleReport("known-answers", server_id=server_id), client, probes,
                      lambda p: f"known-answer[{p.label}]", lambda p: p.max_tokens, logprobs,
                      lambda p, c, _probe: known_answer_findings(p, c) if c.ok else [])


def run_long_decode(client: LLMClient, server_id: str = "", max_tokens: int = 256,
                    thresholds: CoherenceThresholds | None = None, *,
                    prompts: Sequence[ProbePrompt] = DEFAULT_LONG_DECODE_PROMPTS,
                    logprobs: int = DEFAULT_LOGPROBS) -> OracleReport:
    """Long greedy decodes (bugs often show only after ~100 tokens) checked for NaN and collapse."""
    def judge(_prompt: ProbePrompt, c: Completion, probe: str) -> list[Finding]:
        found = coherence_findings(c, thresholds, probe=probe)
        n = c.completion_tokens if c.completion_tokens is not None else len(c.tokens)
        if c.ok and n < max_tokens // 2:
            found.append(_finding("coherence", "warning", f"the decode stopped after {n} of {max_tokens} "
                                  f"tokens (finish_reason={c.finish_reason!r}): long-decode coverage is short",
                                  c, probe=probe))
        return found

    return _send_each(OracleReport("long-decode", server_id=server_id), client, prompts,
                      lambda p: f"long-decode[{p.label}]", lambda _p: max_tokens, logprobs, judge)


def batch_prompts(size: int, prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS) -> list[ProbePrompt]:
    """The prompts of a batch of ``size``: the pool in order, repeated when the batch is larger."""
    if not prompts:
        raise ValueError("no prompts")
    return [prompts[i % len(prompts)] for i in range(size)]


def run_batch_reference(client: LLMClient, server_id: str = "", *, max_tokens: int = 32,
                        prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS,
                        logprobs: int = DEFAULT_LOGPROBS,
                        thresholds: CoherenceThresholds | None = None,
                        judge_coherence: bool = True) -> OracleReport:
    """One request at a time (batch 1) for every prompt of the pool. ``report.completions`` is the
    reference that :func:`run_batch_case` compares with (from this server, or from an eager one).
    ``judge_coherence``: also judge each answer's coherence (False on an untrained model, where it means
    nothing); NaN and transport findings are always made."""
    def judge(_p: ProbePrompt, c: Completion, probe: str) -> list[Finding]:
        return coherence_findings(c, thresholds or BATCH_THRESHOLDS, probe=probe) if judge_coherence else []

    return _send_each(OracleReport("batch-reference", server_id=server_id), client, prompts,
                      lambda p: f"bs=1-reference[{p.label}]", lambda _p: max_tokens, logprobs, judge)


def usable_reference(completions: Sequence[Completion]) -> list[Completion | None]:
    """The batch-1 answers a batch case can be compared with: None where the answer failed or carries NaN
    evidence (a comparison with it is impossible, and :func:`run_batch_case` says so). Coherence is not
    judged here: a reference is the engine's own output, however (un)trained the model."""
    return [c if c.ok and not any(f.severity == "error" for f in response_findings(c)) else None
            for c in completions]


def run_batch_case(client: LLMClient, case: BatchCase, reference: Sequence[Completion | None] | None,
                   server_id: str = "", max_tokens: int = 32, *,
                   prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS, logprobs: int = DEFAULT_LOGPROBS,
                   thresholds: CoherenceThresholds | None = None, name_ref: str = "bs=1 reference",
                   exact: bool = False, judge_coherence: bool = True) -> OracleReport:
    """Send ``case.size`` greedy requests at once, so the server decodes them as one batch, and check
    every output: NaN evidence, coherence (unless ``judge_coherence`` is False: an untrained model), and
    agreement with the reference of the same prompt (``reference[i]`` answers ``prompts[i]``; see
    :func:`run_batch_reference`; None, or missing: that answer was broken, and the impossible comparison
    is an error) by the check_logprobs_close rule, or exact equality when ``exact`` (deterministic mode).
    Identical prompts inside the batch are also compared with each other. Chat prompts are sent as raw
    text here."""
    report = OracleReport(f"batch[{case.id}]", server_id=server_id)
    batch = batch_prompts(case.size, prompts)
    try:
        outputs = client.complete_concurrently([p.text for p in batch], max_tokens, temperature=0.0,
                                               logprobs=logprobs)
    except RequestError as exc:
        report.add([_transport_failure(exc, case.id)])
        return report
    report.completions.extend(outputs)
    first_of: dict[str, int] = {}
    for i, (prompt, c) in enumerate(zip(batch, outputs, strict=True)):
        label = f"{case.id} request {i + 1}/{case.size} [{prompt.label}]"
        numeric = response_findings(c, probe=label)
        report.add(numeric)
        if judge_coherence:
            report.add(coherence_findings(c, thresholds or BATCH_THRESHOLDS, probe=label))
        if any(f.severity == "error" for f in numeric):
            continue  # nothing sensible to compare
        compare = exact_equal_findings if exact else check_logprobs_close
        pool_index = i % len(prompts)
        if reference is not None:
            ref = reference[pool_index] if pool_index < len(reference) else None
            if ref is not None and ref.ok:
                report.add(compare(ref, c, name_ref=name_ref, name_cand=f"{case.id} #{i + 1}", probe=label))
            else:
                report.add([_finding("differential", "error", f"no comparison with the {name_ref}: its answer "
                                     "to this prompt failed or carries NaN evidence (see its findings)", c,
                                     probe=label)])
        j = first_of.setdefault(prompt.text, i)
        if j != i and outputs[j].ok:
            report.add(compare(outputs[j], c, name_ref=f"{case.id} #{j + 1}", name_cand=f"{case.id} #{i + 1}",
                               probe=label))
    return report


def run_determinism(client: LLMClient, server_id: str = "", *,
                    prompt: ProbePrompt = DEFAULT_DETERMINISM_PROMPT, max_tokens: int = 64, exact: bool = False,
                    logprobs: int = DEFAULT_LOGPROBS) -> OracleReport:
    """The same greedy request twice, one after the other."""
    report = OracleReport("determinism", server_id=server_id)
    label = f"determinism[{prompt.label}]"
    try:
        a = _send(client, prompt, max_tokens, logprobs)
        b = _send(client, prompt, max_tokens, logprobs)
    except RequestError as exc:
        return report.add([_transport_failure(exc, label)])
    report.completions.extend([a, b])
    report.add(response_findings(a, probe=label + " run 1"))
    report.add(response_findings(b, probe=label + " run 2"))
    if a.ok and b.ok:
        report.add(determinism_findings(a, b, exact=exact, probe=label))
    return report


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


@dataclass(frozen=True, slots=True)
class DivergenceRow:
    """One request of a differential, as its table shows it: where the two sides first chose different
    tokens (None: identical over the tokens both have), whether each side's token there is in the other's
    top-k, and the largest |Δlogprob| of the chosen tokens before it."""

    probe: str
    tokens: int  # tokens compared (the shorter side's count)
    first_divergence: int | None
    ref_token: str | None = None
    cand_token: str | None = None
    cand_in_ref_top: bool | None = None  # None: no divergence, or no top-k to judge it
    ref_in_cand_top: bool | None = None
    top_k: int = 0
    max_delta: float = 0.0
    max_delta_position: int | None = None
    problem: str | None = None  # a side that failed or sent no logprobs: nothing to compare

    @property
    def divergence(self) -> str:
        if self.problem:
            return self.problem
        if self.first_divergence is None:
            return "identical"
        return f"token {self.first_divergence}: {self.ref_token!r} vs {self.cand_token!r}"

    def summary(self) -> str:
        """The row in words, for a failure's first line."""
        return (f"{self.probe}: {self.divergence}; candidate's token in the reference's top-k: "
                f"{_yes_no(self.cand_in_ref_top)}, reference's in the candidate's: {_yes_no(self.ref_in_cand_top)}; "
                f"max |Δlogprob| before it {self.max_delta:.3f}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["divergence"] = self.divergence
        return out


def divergence_row(ref: Completion, cand: Completion, probe: str) -> DivergenceRow:
    """The table row of one request answered by both sides."""
    if not ref.ok or not cand.ok:
        side = "reference" if not ref.ok else "candidate"
        return DivergenceRow(probe, 0, None, problem=f"{side} failed (HTTP {(ref if not ref.ok else cand).status})")
    if not ref.tokens or not cand.tokens:
        return DivergenceRow(probe, 0, None, problem="no logprobs")
    tokens = min(len(ref.tokens), len(cand.tokens))
    delta, at = max_logprob_delta(ref, cand)
    i = _first_difference(ref.tokens, cand.tokens)
    if i is None:
        return DivergenceRow(probe, tokens, None, max_delta=delta, max_delta_position=at)
    r, c = ref.tokens[i], cand.tokens[i]
    judged = bool(r.top) and bool(c.top)
    return DivergenceRow(probe, tokens, i, r.token, c.token,
                         cand_in_ref_top=(c.token in r.top) if judged else None,
                         ref_in_cand_top=(r.token in c.top) if judged else None,
                         top_k=min(len(r.top), len(c.top)), max_delta=delta, max_delta_position=at)


def divergence_rows(reference: Sequence[Completion], candidate: Sequence[Completion],
                    probes: Sequence[str]) -> list[DivergenceRow]:
    return [divergence_row(r, c, probe) for r, c, probe in zip(reference, candidate, probes, strict=False)]


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def divergence_table(rows: Sequence[DivergenceRow], *, name_ref: str = "reference",
                     name_cand: str = "candidate", max_delta: float | None = None) -> str:
    """The per-request table of a differential (plain text, one request a line)."""
    bound = f" (tolerance {max_delta:g})" if max_delta is not None else ""
    head = ["request", f"first divergence ({name_ref} vs {name_cand})", "cand in ref top-k",
            "ref in cand top-k", f"max |Δlogprob| before{bound}"]
    body = [[row.probe, row.divergence, _yes_no(row.cand_in_ref_top), _yes_no(row.ref_in_cand_top),
             f"{row.max_delta:.3f}" + (f" @{row.max_delta_position}" if row.max_delta_position is not None else "")]
            for row in rows]
    widths = [max(len(line[j]) for line in [head, *body]) for j in range(len(head))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in [head, *body])


def worst_row(rows: Sequence[DivergenceRow], max_delta: float | None = None) -> DivergenceRow | None:
    """The request that argues most against agreement: a failed side, then a token outside the other's
    top-k, then |Δlogprob| over ``max_delta``, then the earliest divergence, then the largest |Δlogprob|."""
    def badness(row: DivergenceRow) -> tuple[int, int, int, float, int]:
        outside = row.cand_in_ref_top is False or row.ref_in_cand_top is False
        over = max_delta is not None and row.max_delta > max_delta
        first = row.first_divergence if row.first_divergence is not None else row.tokens + 1
        return (row.problem is not None, outside, over, row.max_delta, -first)

    return max(rows, key=badness) if rows else None


# The differential's prompts: the chat probe and the raw-text batch prompts (mixed lengths), 32 greedy
# tokens each. SmolLM2 on vLLM CPU: the two sides agree, at most with near-tie warnings.
DEFAULT_DIFFERENTIAL_PROMPTS: tuple[ProbePrompt, ...] = (DEFAULT_NAN_PROMPTS[0], *DEFAULT_BATCH_PROMPTS)


def send_prompts(client: LLMClient, prompts: Sequence[ProbePrompt], max_tokens: int, *,
                 logprobs: int | None = DEFAULT_LOGPROBS, concurrent: bool = False) -> list[Completion]:
    """Greedy requests for ``prompts``, one after the other (batch 1), or all at once when ``concurrent``
    (so the server decodes them as one batch). Raises :class:`RequestError` on a transport failure."""
    if not concurrent or len(prompts) < 2:
        return [_send(client, p, max_tokens, logprobs) for p in prompts]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(_send, client, p, max_tokens, logprobs) for p in prompts]
        return [f.result() for f in futures]


def run_differential(reference: LLMClient | Sequence[Completion], candidate: LLMClient, *, name_ref: str,
                     name_cand: str, prompts: Sequence[ProbePrompt] = DEFAULT_DIFFERENTIAL_PROMPTS,
                     max_tokens: int = 32, logprobs: int = DEFAULT_LOGPROBS, exact: bool = False,
                     concurrent: bool = False, max_delta: float | None = None) -> OracleReport:
    """The same greedy prompts on a reference configuration and on the candidate, compared answer by answer.

    ``reference``: a client of the reference server, which runs one request at a time (batch 1), or its
    answers to ``prompts`` recorded earlier (a matrix reference's recording). The candidate runs one at a
    time too, or all prompts at once when ``concurrent`` (batch N against the batch-1 reference). Both sides'
    responses are also checked for NaN and transport failures: a broken reference is reported as such, not as
    a divergence. Exact equality when ``exact`` (deterministic mode on both servers), else vLLM's
    check_logprobs_close rule (with ``max_delta``, the bound on |Δlogprob| before the first divergence).
    """
    mode = f"all {len(prompts)} at once" if concurrent else "one at a time"
    report = OracleReport(f"differential[{name_cand} vs reference {name_ref}; {len(prompts)} greedy prompts, "
                          f"{max_tokens} tokens, candidate {mode}]", server_id=name_cand)
    if name_ref == name_cand:  # one server against itself (batch N against batch 1): tell the sides apart
        name_ref, name_cand = f"{name_ref} (one at a time)", f"{name_cand} ({mode})"
    labels = [f"differential[{p.label}]" for p in prompts]
    if isinstance(reference, Sequence):
        ref = list(reference)
    else:
        try:
            ref = send_prompts(reference, prompts, max_tokens, logprobs=logprobs)
        except RequestError as exc:
            return report.add([_transport_failure(exc, f"reference {name_ref}")])
    for label, c in zip(labels, ref, strict=True):
        report.add(replace(f, message=f"reference {name_ref}: {f.message}")
                   for f in response_findings(c, probe=label))
    try:
        cand = send_prompts(candidate, prompts, max_tokens, logprobs=logprobs, concurrent=concurrent)
    except RequestError as exc:
        return report.add([_transport_failure(exc, f"candidate {name_cand}")])
    for label, c in zip(labels, cand, strict=True):
        report.add(response_findings(c, probe=label))
    compared = compare_runs(ref, cand, name_ref=name_ref, name_cand=name_cand, exact=exact, probes=labels,
                            max_delta=max_delta)
    report.findings.extend(compared.findings)
    report.completions.extend(cand)
    return report

__all__ = [
    "BATCH_THRESHOLDS", "DEFAULT_COVERAGE_CAP", "DEFAULT_DIFFERENTIAL_PROMPTS", "DEFAULT_KNOWN_ANSWERS",
    "DEFAULT_LONG_DECODE_PROMPTS",
    "DEFAULT_BATCH_PROMPTS", "DEFAULT_NAN_PROMPTS", "DEFAULT_THRESHOLDS", "NO_GRAPH_SIZES", "BatchCase",
    "CoherenceThresholds", "DEFAULT_MAX_LOGPROB_DELTA", "DivergenceRow", "Finding", "KnownAnswer", "OracleReport",
    "ProbePrompt", "TokenAt", "batch_prompts",
    "check_logprobs_close", "coherence_findings", "coherence_metrics", "compare_runs", "coverage_plan",
    "answer_departure", "determinism_findings", "divergence_row", "divergence_rows", "divergence_table",
    "exact_equal_findings", "known_answer_findings", "logprob_consistency",
    "max_logprob_delta", "nan_evidence", "nan_in_log", "nan_in_metrics", "response_findings", "run_batch_case",
    "run_batch_reference", "run_determinism", "run_differential", "run_known_answers", "run_long_decode",
    "run_nan_check", "send_prompts", "transport_findings", "usable_reference", "worst_row",
]
