"""Long-context probes for sparse attention: contexts longer than a DSA model's ``index_topk``.

DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) lets each query attend to the ``index_topk`` KV tokens its indexer
selects. Below ``index_topk`` tokens of context the indexer keeps every token, so sparse attention equals dense
attention and no answer depends on which tokens were selected: a backend matrix run on short prompts cannot see a
selection fault. These probes carry a context of 1.25, 2 and 4 times ``index_topk`` (2,560, 4,096 and 8,192 tokens
for 2,048), so that both the prefill and every decode step select.

The text needs no trained model and is the same on every machine: sentences "The {colour} {animal} lives near the
{place}." drawn by a fixed linear congruential generator, ending with a question about the first sentence (a needle
at the far end of the context, which a trained model can only answer by attending to it). Every word is one token
with its leading space in SmolLM2's tokenizer (tests/unit/verdicts/test_long_context.py checks it against the
tokenizer file), so a sentence is :data:`TOKENS_PER_SENTENCE` tokens there; another tokenizer may count differently,
which is why a probe's reach is judged from the server's own count (``usage.prompt_tokens``), never assumed:
:func:`reach_of`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.verdicts.oracles import ProbePrompt

#: The probes' contexts, as multiples of index_topk (the issue's 2.5k, 4k and 8k for 2,048).
LONG_CONTEXT_FACTORS = (1.25, 2.0, 4.0)
#: A probe counts as reaching sparse selection only when its context exceeds index_topk by this share of it
#: (256 tokens for 2,048): a context of index_topk + 1 tokens drops one token, too little to show a selection.
REACH_MARGIN = 1 / 8
#: Tokens per sentence in SmolLM2's tokenizer: " The red fox lives near the river." is 7 words and the full stop.
TOKENS_PER_SENTENCE = 8

COLOURS = ("red", "blue", "green", "black", "white", "brown", "gray", "pink", "gold", "silver", "orange", "purple",
           "yellow", "dark", "pale", "bright")
ANIMALS = ("cat", "dog", "horse", "bird", "fish", "fox", "wolf", "bear", "lion", "tiger", "mouse", "goat", "sheep",
           "duck", "owl", "frog", "deer", "rabbit", "snake", "whale")
PLACES = ("river", "forest", "garden", "market", "bridge", "tower", "castle", "village", "harbor", "valley",
          "mountain", "island", "desert", "lake", "field", "house", "school", "church", "station", "library",
          "kitchen", "farm", "road", "hill", "beach")


def _lcg(seed: int) -> int:
    # Knuth's MMIX constants: the same stream on every Python and machine (random.Random's may change).
    return (6364136223846793005 * seed + 1442695040888963407) % (1 << 64)


def ledger_text(tokens: int, seed: int = 2048) -> str:
    """At least ``tokens`` tokens (in SmolLM2's tokenizer) of deterministic sentences, then a question about the
    first one."""
    if tokens <= 0:
        raise ValueError(f"a long-context probe needs a positive number of tokens, not {tokens}")
    state = seed
    sentences = []
    for _ in range(math.ceil(tokens / TOKENS_PER_SENTENCE)):
        picks = []
        for pool in (COLOURS, ANIMALS, PLACES):
            state = _lcg(state)
            picks.append(pool[(state >> 33) % len(pool)])
        sentences.append(picks)
    colour, animal, _place = sentences[0]
    body = " ".join(f"The {c} {a} lives near the {p}." for c, a, p in sentences)
    return f"{body} Question: where does the first {colour} {animal} live? Answer: near the"


def reach_needed(index_topk: int) -> int:
    """The context a probe must exceed to show selection: index_topk and its margin."""
    return index_topk + math.ceil(index_topk * REACH_MARGIN)


def long_context_prompts(index_topk: int) -> tuple[ProbePrompt, ...]:
    """The probes for a model of ``index_topk``: plain completions (no chat template adds to or counts in the
    context), named by their nominal context, each carrying the context it must exceed."""
    if index_topk <= 0:
        raise ValueError(f"index_topk must be positive, not {index_topk}")
    needed = reach_needed(index_topk)
    out = []
    for factor in LONG_CONTEXT_FACTORS:
        tokens = round(index_topk * factor)
        # Each probe its own sentences (seeded by its length): no probe is a prefix of another, so an engine's prefix
        # cache cannot serve one probe's prefill from another's KV. On the H200 (2026-12-06) probes that shared
        # their sentences let the longer ones extend the shorter one's cached prefix (1,600 and 4,160 new tokens
        # of 4,110 and 8,206): their first prefill never ran the sparse kernels over the whole context.
        out.append(ProbePrompt(ledger_text(tokens, seed=tokens), name=f"long-{tokens}", min_context_tokens=needed))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Reach:
    """Whether one long-context probe's context exceeded what it needed, by the server's own count."""

    probe: str
    needed: int
    prompt_tokens: int | None  # usage.prompt_tokens; None when the server did not say or the request failed

    @property
    def reached(self) -> bool:
        return self.prompt_tokens is not None and self.prompt_tokens > self.needed

    def describe(self) -> str:
        have = "an unknown number of" if self.prompt_tokens is None else f"{self.prompt_tokens:,}"
        verdict = "reached" if self.reached else "did NOT reach"
        return f"{self.probe}: {have} tokens of context, {verdict} sparse selection (needs more than {self.needed:,})"


def reach_of(prompts: Sequence[ProbePrompt], completions: Sequence[Completion | None]) -> list[Reach]:
    """The reach of each long-context probe among ``prompts`` (those with ``min_context_tokens``), from the answer
    sent for it; prompts without that purpose are left out."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if prompt.min_context_tokens:
            counted = completion.prompt_tokens if completion is not None and completion.ok else None
            out.append(Reach(prompt.label, prompt.min_context_tokens, counted))
    return out


def unreached(reaches: Sequence[Reach]) -> list[Reach]:
    """The probes whose agreement says nothing about selection: their context did not exceed what they needed."""
    return [r for r in reaches if not r.reached]
