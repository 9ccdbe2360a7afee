"""Workload prompts: seeded, distinct, and exactly ``input_len`` tokens long when the server can tokenize.

The exact length is measured with the server's own ``/tokenize`` (the tokenizer under test, not a local
copy): the word count is adjusted by measuring, topped up with filler words, and as a last resort the
prompt is sent as token ids. Each prompt starts with a different word, so no prefix cache can share them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError

__all__ = ["Detokenize", "Tokenize", "WorkloadPrompt", "build_prompts"]

Tokenize = Callable[[str], list[int] | None]  # None: the server has no /tokenize
Detokenize = Callable[[list[int]], str]
_Found = tuple["WorkloadPrompt", float]  # a prompt of the exact length, and the tokens per word learnt on the way

# Common short English words: each is one token in most BPE vocabularies when preceded by a space.
_WORDS = (
    "the of and to in is was that for on with as by at from his her it an were are which this be or "
    "had not but one all their there been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right used take "
    "three small house light water place night point city play story food river table music green "
    "stone paper window garden winter summer morning letter market school friend animal forest "
    "mountain island doctor street orange yellow silver"
).split()

_FILLERS = ("a", "I", "and", "the", "of", ".", ",", "x")


@dataclass(frozen=True, slots=True)
class WorkloadPrompt:
    """One benchmark prompt: text, or token ids when text could not be made exactly ``input_len`` tokens long."""

    prompt: str | tuple[int, ...]
    num_tokens: int  # measured with the tokenizer when ``exact``; the word count otherwise
    exact: bool  # num_tokens was measured (or the prompt is token ids) and equals input_len
    warmup: bool = False

    @property
    def is_token_ids(self) -> bool:
        return isinstance(self.prompt, tuple)

    @property
    def payload(self) -> str | list[int]:
        """What goes in the request's ``prompt`` field."""
        return list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt


def _prompt_words(seed: int, index: int, count: int) -> list[str]:
    """Seeded words for prompt ``index``; the first word cycles through the vocabulary so prompts differ
    from their first token (no shared prefix for a prefix cache to reuse)."""
    rng = random.Random(seed * 1_000_003 + index)
    first = _WORDS[(index * 7919 + seed) % len(_WORDS)]
    return [first.capitalize()] + [rng.choice(_WORDS) for _ in range(max(count - 1, 0))]


def build_prompts(workload: Workload, tokenize: Tokenize | None = None, detokenize: Detokenize | None = None,
                  *, max_tries: int = 6) -> list[WorkloadPrompt]:
    """Seeded, distinct prompts: ``workload.warmup`` warm-up prompts first, then ``workload.num_prompts``.

    With ``tokenize`` (the server's ``/tokenize``), each prompt is exactly ``input_len`` tokens: the word
    count is adjusted by measuring, then topped up with short filler words; if that fails after
    ``max_tries`` measurements, ``detokenize`` of the trimmed ids is tried, and finally the prompt is
    sent as token ids (``/v1/completions`` accepts a list of ints). Without ``tokenize`` the prompt has
    ``input_len`` words and is flagged ``exact=False``.
    """
    target = workload.input_len
    total = workload.warmup + workload.num_prompts
    out: list[WorkloadPrompt] = []
    if tokenize is not None and tokenize(_WORDS[0]) is None:
        tokenize = None  # e.g. LLMClient.tokenize on a server without /tokenize: approximate prompts
    ratio = 1.0  # tokens per word, learnt from the first prompts to save /tokenize calls
    for i in range(total):
        warm = i < workload.warmup
        if tokenize is None:
            out.append(WorkloadPrompt(" ".join(_prompt_words(workload.seed, i, target)), target, False, warm))
            continue
        prompt, ratio = _exact_prompt(workload.seed, i, target, tokenize, detokenize, ratio, max_tries)
        out.append(replace(prompt, warmup=warm))
    return out


class _Measured:
    """A prompt's candidate words and the token count, by the server's tokenizer, of each prefix measured so far."""

    def __init__(self, words: list[str], tokenize: Tokenize) -> None:
        self.words = words
        self.counts: dict[int, int] = {}
        self._tokenize = tokenize

    def measure(self, text: str) -> list[int]:
        ids = self._tokenize(text)
        if ids is None:
            raise LLMServeError("the tokenizer stopped answering while prompts were being built")
        return ids

    def count(self, n: int) -> int:
        """Tokens in the first ``n`` words (each prefix measured once)."""
        if n not in self.counts:
            self.counts[n] = len(self.measure(self.text(n)))
        return self.counts[n]

    def text(self, n: int) -> str:
        return " ".join(self.words[:n])


def _lengthen(m: _Measured, seed: int, index: int, target: int) -> None:
    """Make sure the word list is long enough to exceed the target."""
    for _ in range(12):
        if m.count(len(m.words)) >= target:
            return
        m.words.extend(_prompt_words(seed + 1 + len(m.words), index, len(m.words)))
    raise LLMServeError(f"cannot build a prompt of {target} tokens: the tokenizer gave "
                        f"{m.count(len(m.words))} tokens for {len(m.words)} words")


def _search_by_ratio(m: _Measured, target: int, ratio: float, max_tries: int) -> _Found | None:
    """Word counts guessed from the tokens per word measured so far, until one hits the target or repeats."""
    n = min(len(m.words), max(1, round(target / max(ratio, 0.05))))
    for _ in range(max_tries):
        got = m.count(n)
        if got == target:
            return WorkloadPrompt(m.text(n), target, True), got / n
        per_word = got / n if got else ratio
        step = round((target - got) / max(per_word, 0.05)) or (1 if got < target else -1)
        nxt = min(len(m.words), max(1, n + step))
        if nxt in m.counts:
            return None
        n = nxt
    return None


def _walk_up(m: _Measured, target: int, max_tries: int) -> tuple[_Found | None, int, int]:
    """Walk up from the largest word count measured below the target (a bounded number of measurements): the prompt
    if one hits it, and the word counts left below (``lo``, 0 if none) and above it (``hi``)."""
    below = [k for k, v in m.counts.items() if v < target]
    above = [k for k, v in m.counts.items() if v > target]
    lo = max(below) if below else 0
    hi = min(above) if above else len(m.words)
    while lo + 1 < hi and len(m.counts) < 4 * max_tries:
        got = m.count(lo + 1)
        if got == target:
            return (WorkloadPrompt(m.text(lo + 1), target, True), got / (lo + 1)), lo, hi
        if got > target:
            return None, lo, lo + 1
        lo += 1
    return None, lo, hi


def _topped_up(m: _Measured, target: int, lo: int, max_tries: int) -> WorkloadPrompt | None:
    """The ``lo`` words below the target topped up with short filler words, if one filler makes it exact."""
    if lo <= 0:
        return None
    base = m.text(lo)
    deficit = target - m.count(lo)
    for filler in _FILLERS[:max_tries]:
        text = base + (" " + filler) * deficit
        if len(m.measure(text)) == target:
            return WorkloadPrompt(text, target, True)
    return None


def _trimmed(m: _Measured, target: int, hi: int, detokenize: Detokenize | None) -> WorkloadPrompt:
    """The ``hi`` words' ids cut to the target: as text when they detokenize to exactly that, else as token ids."""
    ids = m.measure(m.text(hi))[:target]
    if detokenize is not None:
        text = detokenize(ids)
        if len(m.measure(text)) == target:
            return WorkloadPrompt(text, target, True)
    if len(ids) != target:
        raise LLMServeError(f"could not build a prompt of {target} tokens (tokenizer gave {len(ids)})")
    return WorkloadPrompt(tuple(ids), target, True)


def _exact_prompt(seed: int, index: int, target: int, tokenize: Tokenize, detokenize: Detokenize | None,
                  ratio: float, max_tries: int) -> _Found:
    """A prompt of exactly ``target`` tokens and the tokens per word learnt on the way (module docstring)."""
    m = _Measured(_prompt_words(seed, index, max(16, int(target / max(ratio, 0.05) * 1.5) + 8)), tokenize)
    _lengthen(m, seed, index, target)
    found = _search_by_ratio(m, target, ratio, max_tries)
    if found is not None:
        return found
    found, lo, hi = _walk_up(m, target, max_tries)
    if found is not None:
        return found
    new_ratio = m.counts[hi] / hi if hi in m.counts and hi else ratio
    prompt = _topped_up(m, target, lo, max_tries)
    return (prompt if prompt is not None else _trimmed(m, target, hi, detokenize)), new_ratio
