"""Characterization of the exact-length prompt search (load/prompts.py), pinned before _exact_prompt was split into
its steps (issue 36): on tokenizers that make each step decide (the ratio guess, the walk up, the filler words, the
detokenized ids, token ids, the errors), the prompts built and the /tokenize calls they cost."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.load.prompts import build_prompts


def tokenizer(kind: str, calls: list[str]) -> Callable[[str], list[int] | None]:
    def tokenize(text: str) -> list[int] | None:
        calls.append(text)
        words = text.split(" ")
        if kind == "two-per-word":  # odd counts unreachable with words
            return [7] * (2 * len(words))
        if kind == "fillers-one-words-two":
            return [0 for w in words for _ in range(1 if len(w) <= 1 else 2)]
        if kind == "long-words-two":
            return [ord(c) for w in words for c in w[: 1 + (len(w) > 4)]]
        if kind == "jittery":  # a count that is not monotonic in the words: the walk up must stop somewhere
            return list(range(len(words) + zlib.crc32(text.encode()) % 3))
        if kind == "saturating":
            return list(range(min(len(words), 5)))
        if kind == "stops-answering":
            return None if len(calls) > 3 else list(range(len(words)))
        raise AssertionError(kind)
    return tokenize


def detok_words(ids: list[int]) -> str:
    return " ".join("w" for _ in ids)


# (tokenizer, input_len, detokenize) -> (the prompts built, /tokenize calls), as e369d3a built them.
CASES = {
    ("two-per-word", 7, None): ("[(7, 7, 7, 7, 7, 7, 7), (7, 7, 7, 7, 7, 7, 7), (7, 7, 7, 7, 7, 7, 7)]", 32),
    ("two-per-word", 7, "words"): ("[(7, 7, 7, 7, 7, 7, 7), (7, 7, 7, 7, 7, 7, 7), (7, 7, 7, 7, 7, 7, 7)]", 35),
    ("fillers-one-words-two", 7, None): ("['Of against doctor a', 'Should old so a', 'Is man his a']", 14),
    ("fillers-one-words-two", 8, None): ("['Of against doctor through', 'Should old so if', 'Is man his are']", 8),
    ("long-words-two", 16, None): (
        "['Of against doctor through go up since up day night will', 'Should old so if because new the my yellow "
        "orange your old', 'Is man his are under light green man those be life time']", 9),
    ("long-words-two", 1, None): ("['Of', (83,), 'Is']", 8),
    ("jittery", 7, None): (
        "['Of against doctor through go up since', 'Should old so if because new the', 'Is man his are under "
        "light']", 9),
    ("jittery", 3, "words"): ("['Of against doctor', 'Should I I', 'Is man']", 11),
    ("jittery", 33, None): (
        "['Of against doctor through go up since up day night will get more from letter years two great in might is "
        "point it under down our was these years place how man', 'Should old so if because new the my yellow orange "
        "your old way winter then like also how this been might did will each work yellow or did between than them', "
        "'Is man his are under light green man those be life time table with do to island winter her window before "
        "green who last its house from can morning how on still']", 12),
    ("jittery", 2, "words"): ("['Of I', 'Should and', 'w w']", 16),
    ("saturating", 9, None): (
        "LLMServeError: cannot build a prompt of 9 tokens: the tokenizer gave 5 tokens for 86016 words", 14),
    ("stops-answering", 16, None): (
        "LLMServeError: the tokenizer stopped answering while prompts were being built", 4),
}


@pytest.mark.parametrize(("kind", "target", "detok"), list(CASES))
def test_prompts_and_tokenize_calls(kind: str, target: int, detok: str | None) -> None:
    calls: list[str] = []
    wl = Workload("p", num_prompts=3, input_len=target, warmup=0, seed=1)
    try:
        built = build_prompts(wl, tokenizer(kind, calls), detok_words if detok else None)
        got = repr([p.prompt for p in built])
        assert all(p.exact and p.num_tokens == target for p in built)
    except LLMServeError as exc:
        got = f"LLMServeError: {exc}"
    assert (got, len(calls)) == CASES[kind, target, detok]
