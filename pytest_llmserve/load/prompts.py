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


def _exact_prompt(seed: int, index: int, target: int, tokenize: Tokenize, detokenize: Detokenize | None,
                  ratio: float, max_tries: int) -> tuple[WorkloadPrompt, float]:
    words = _prompt_words(seed, index, max(16, int(target / max(ratio, 0.05) * 1.5) + 8))
    counts: dict[int, int] = {}

    def measure(text: str) -> list[int]:
        ids = tokenize(text)
        if ids is None:
            raise LLMServeError("the tokenizer stopped answering while prompts were being built")
        return ids

    def count(n: int) -> int:
        if n not in counts:
            counts[n] = len(measure(" ".join(words[:n])))
        return counts[n]

    # Make sure the word list is long enough to exceed the target.
    for _ in range(12):
        if count(len(words)) >= target:
            break
        words.extend(_prompt_words(seed + 1 + len(words), index, len(words)))
    else:
        raise LLMServeError(f"cannot build a prompt of {target} tokens: the tokenizer gave "
                            f"{count(len(words))} tokens for {len(words)} words")
    n = min(len(words), max(1, round(target / max(ratio, 0.05))))
    for _ in range(max_tries):
        got = count(n)
        if got == target:
            return WorkloadPrompt(" ".join(words[:n]), target, True), got / n
        per_word = got / n if got else ratio
        step = round((target - got) / max(per_word, 0.05)) or (1 if got < target else -1)
        nxt = min(len(words), max(1, n + step))
        if nxt in counts:
            break
        n = nxt
    below = [k for k, v in counts.items() if v < target]
    above = [k for k, v in counts.items() if v > target]
    lo = max(below) if below else 0
    hi = min(above) if above else len(words)
    # Walk up from the largest word count below the target (bounded number of measurements).
    while lo + 1 < hi and len(counts) < 4 * max_tries:
        got = count(lo + 1)
        if got == target:
            return WorkloadPrompt(" ".join(words[: lo + 1]), target, True), got / (lo + 1)
        if got > target:
            hi = lo + 1
            break
        lo += 1
    new_ratio = counts[hi] / hi if hi in counts and hi else ratio
    if lo > 0:
        base = " ".join(words[:lo])
        deficit = target - count(lo)
        for filler in _FILLERS[:max_tries]:
            text = base + (" " + filler) * deficit
            if len(measure(text)) == target:
                return WorkloadPrompt(text, target, True), new_ratio
    ids = measure(" ".join(words[:hi]))[:target]
    if detokenize is not None:
        text = detokenize(ids)
        if len(measure(text)) == target:
            return WorkloadPrompt(text, target, True), new_ratio
    if len(ids) != target:
        raise LLMServeError(f"could not build a prompt of {target} tokens (tokenizer gave {len(ids)})")
    return WorkloadPrompt(tuple(ids), target, True), new_ratio
