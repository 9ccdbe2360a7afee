"""Decode collapse in one response: text statistics (repetition, compression, vocabulary, printable share,
mean logprob) against :class:`CoherenceThresholds`, calibrated on healthy and scrambled greedy decodes."""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.verdicts.findings import Finding, TokenAt, make_finding, most_likely_first
from pytest_llmserve.verdicts.oracles import VLLM_LOGPROB_CLAMP


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


@dataclass(frozen=True, slots=True)
class _Decoded:
    """One response as the collapse checks read it: its text, its tokens (``items``: their strings, or words and
    punctuation standing in for them when ``pseudo``), its statistics (:func:`coherence_metrics`) and the limits."""

    text: str
    tokens: list[TokenLogprob]
    items: list[str]
    pseudo: bool
    m: dict[str, float]
    t: CoherenceThresholds

    @property
    def unit(self) -> str:
        return "word" if self.pseudo else "token"  # without logprobs, words and punctuation stand in for tokens

    @property
    def joiner(self) -> str:
        return " " if self.pseudo else ""

    def at(self, indices: Iterable[int]) -> list[TokenAt]:
        """The tokens at these positions, as a finding's evidence (none when words stood in for tokens)."""
        toks = self.tokens
        return [TokenAt.of(i, toks[i]) for i in indices if 0 <= i < len(toks)] if not self.pseudo else []


# A collapse found: the message, and the positions of the tokens that show it. The checks below test each limit as
# it is written (``not ratio > limit``), so a NaN limit passes as it always did.
_Collapse = tuple[str, Iterable[int]]


def _replacement_characters(d: _Decoded) -> _Collapse | None:
    if not d.m["replacement_ratio"] > d.t.max_replacement_ratio:
        return None
    bad = [i for i, tok in enumerate(d.tokens) if "\ufffd" in tok.token][:5]
    return (f"{d.m['replacement_ratio']:.1%} of the characters are U+FFFD (limit "
            f"{d.t.max_replacement_ratio:.1%}): the detokenizer got invalid byte sequences; text "
            f"{_excerpt(d.text, d.text.find(chr(0xFFFD)))}", bad)


def _unprintable(d: _Decoded) -> _Collapse | None:
    if not d.m["printable_ratio"] < d.t.min_printable_ratio:
        return None
    return (f"only {d.m['printable_ratio']:.1%} of the characters are printable (floor "
            f"{d.t.min_printable_ratio:.0%}); text {_excerpt(d.text)}", range(5))


def _not_ascii(d: _Decoded) -> _Collapse | None:
    floor = d.t.min_ascii_ratio
    if floor is None or not d.m["ascii_ratio"] < floor or len(d.text) < 16:
        return None
    return (f"only {d.m['ascii_ratio']:.1%} of the characters are printable ASCII (floor "
            f"{floor:.0%}; set min_ascii_ratio=None for non-English probes); text "
            f"{_excerpt(d.text)}", range(5))


def _token_run(d: _Decoded) -> _Collapse | None:
    run, run_start = _longest_run(d.items)
    if not run > d.t.max_token_run:
        return None
    return (f"the {d.unit} {d.items[run_start]!r} repeats {run} times in a row from position {run_start} "
            f"(limit {d.t.max_token_run})", range(run_start, run_start + 5))


def _few_distinct(d: _Decoded) -> _Collapse | None:
    n = len(d.items)
    if n < 8:
        return None
    need = min(d.t.min_distinct_tokens, math.ceil(d.t.min_distinct_ratio * n))
    if not d.m["distinct_tokens"] < need:
        return None
    common = ", ".join(f"{tok!r}x{k}" for tok, k in Counter(d.items).most_common(5))
    return (f"only {int(d.m['distinct_tokens'])} distinct {d.unit}s in {n} (need {need}): vocabulary "
            f"collapse; most common: {common}", range(8))


def _compressible(d: _Decoded) -> _Collapse | None:
    if len(d.text) < d.t.min_chars or not d.m["compression_ratio"] > d.t.max_compression_ratio:
        return None
    return (f"the text compresses {d.m['compression_ratio']:.1f}x (limit {d.t.max_compression_ratio:g}x): "
            f"repetitive collapse; text {_excerpt(d.text)}", range(8))


def _short_loop(d: _Decoded) -> _Collapse | None:
    n, size = len(d.items), d.t.ngram
    if n < d.t.min_tokens:
        return None
    ratio, gram, count = _top_ngram(d.items, size)
    if not ratio > d.t.max_top_ngram_ratio:
        return None
    starts = [i for i in range(n - size + 1) if tuple(d.items[i:i + size]) == gram][:2]
    return (f"the {size}-gram {d.joiner.join(gram)!r} makes up {ratio:.0%} of all {size}-grams "
            f"({count}x; limit {d.t.max_top_ngram_ratio:.0%}): a short loop",
            [i for s in starts for i in range(s, s + size)])


def _dominant_token(d: _Decoded) -> _Collapse | None:
    n = len(d.items)
    if n < d.t.min_tokens or not d.m["top_token_ratio"] > d.t.max_top_token_ratio:
        return None
    tok, k = Counter(d.items).most_common(1)[0]
    return (f"the {d.unit} {tok!r} is {d.m['top_token_ratio']:.0%} of the output ({k} of {n}; limit "
            f"{d.t.max_top_token_ratio:.0%})", [i for i, x in enumerate(d.items) if x == tok][:5])


def _guessing(d: _Decoded) -> _Collapse | None:
    mean = d.m.get("mean_logprob")
    if mean is None or not mean < d.t.min_mean_logprob:
        return None
    toks = d.tokens
    worst = sorted(range(len(toks)), key=lambda i: most_likely_first(toks[i].logprob), reverse=True)
    return (f"mean logprob {mean:.2f} is below the floor {d.t.min_mean_logprob:g}: the model is guessing",
            sorted(worst[:5]))


# The collapse checks, in the order their findings are listed.
_COLLAPSE_CHECKS: tuple[Callable[[_Decoded], _Collapse | None], ...] = (
    _replacement_characters, _unprintable, _not_ascii, _token_run, _few_distinct, _compressible, _short_loop,
    _dominant_token, _guessing)


def coherence_findings(c: Completion, thresholds: CoherenceThresholds | None = None, *,
                       probe: str = "") -> list[Finding]:
    """Decode collapse in one response (see :class:`CoherenceThresholds`). Failed requests give none."""
    t = thresholds or DEFAULT_THRESHOLDS
    if not c.ok:
        return []
    text = c.text
    if not text.strip():
        if c.tokens or c.completion_tokens:
            return [make_finding("coherence", "error", "the output has no visible text", c,
                                 [TokenAt.of(i, tok) for i, tok in enumerate(c.tokens[:3])], probe)]
        return []
    items, pseudo = _token_strings(text, c.tokens)
    decoded = _Decoded(text, c.tokens, items, pseudo, coherence_metrics(text, c.tokens, t.ngram), t)
    collapses = [found for check in _COLLAPSE_CHECKS if (found := check(decoded)) is not None]
    return [make_finding("coherence", "error", message, c, decoded.at(evidence), probe)
            for message, evidence in collapses]


# Coherence limits for short batch outputs: the same metrics; the length-sensitive ones are skipped
# automatically below CoherenceThresholds.min_chars / min_tokens.
BATCH_THRESHOLDS = DEFAULT_THRESHOLDS
