"""Workload prompts: exact token lengths through /tokenize, the fallbacks, and the approximate prompts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.load.metrics import RequestRecord, evaluate
from pytest_llmserve.load.prompts import WorkloadPrompt, build_prompts


def whitespace_tokenize(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


def chunky_tokenize(text: str) -> list[int]:
    """Words of more than 4 characters cost two tokens; punctuation one."""
    out: list[int] = []
    for w in text.split():
        out.extend([len(w)] * (2 if len(w) > 4 else 1))
    return out


def even_tokenize(text: str) -> list[int]:
    """Only even token counts are reachable with text: the builder must fall back to token ids."""
    words = text.split()
    return [7] * (2 * len(words))


@pytest.mark.parametrize("tokenize", [whitespace_tokenize, chunky_tokenize])
@pytest.mark.parametrize("input_len", [1, 7, 64, 257])
def test_prompt_builder_gives_exact_lengths(tokenize: Callable[[str], list[int]], input_len: int) -> None:
    calls: list[str] = []

    def counted(text: str) -> list[int]:
        calls.append(text)
        return tokenize(text)

    wl = Workload("p", num_prompts=12, input_len=input_len, warmup=2, seed=5)
    prompts = build_prompts(wl, counted)
    assert len(prompts) == 14
    assert [p.warmup for p in prompts] == [True, True] + [False] * 12
    for p in prompts:
        assert p.exact
        assert p.num_tokens == input_len
        if isinstance(p.prompt, str):
            assert len(tokenize(p.prompt)) == input_len
        else:  # one token cannot always be made of text: token ids, still exact
            assert input_len == 1
            assert len(p.prompt) == 1
    if input_len > 1:
        assert all(isinstance(p.prompt, str) for p in prompts)
    if input_len > 1:
        assert len({p.prompt for p in prompts}) == 14  # distinct
    assert build_prompts(wl, tokenize) == prompts  # seeded
    assert build_prompts(replace(wl, seed=6), tokenize) != prompts
    assert len(calls) < 14 * 12  # a bounded number of /tokenize calls


def test_prompt_builder_falls_back_to_token_ids_or_detokenize() -> None:
    wl = Workload("p", num_prompts=3, input_len=9, warmup=0)
    prompts = build_prompts(wl, even_tokenize)
    assert all(p.is_token_ids and p.exact and len(p.payload) == 9 for p in prompts)
    assert isinstance(prompts[0].payload, list)

    def detok(ids: list[int]) -> str:
        return "y " * (len(ids) // 2) + "odd"

    def odd_ok(text: str) -> list[int]:
        return even_tokenize(text.replace(" odd", "")) + ([1] if text.endswith("odd") else [])

    prompts = build_prompts(wl, odd_ok, detok)
    assert all(isinstance(p.prompt, str) and len(odd_ok(p.prompt)) == 9 for p in prompts)


def test_prompt_builder_without_tokenizer_is_approximate() -> None:
    wl = Workload("p", num_prompts=4, input_len=20, warmup=1)
    prompts = build_prompts(wl)
    assert build_prompts(wl, lambda text: None) == prompts  # a server without /tokenize
    assert all(not p.exact and isinstance(p.prompt, str) and len(p.prompt.split()) == 20 for p in prompts)
    assert len({p.prompt for p in prompts}) == 5
    record = RequestRecord(index=0, start=0.0, end=0.111, ttft=0.1, e2e=0.11, itl=[0.01], output_tokens=2,
                           prompt_tokens=10, chunks=2)
    res = evaluate([record], replace(wl, output_len=2), transport="lean", prompts=prompts)
    assert not res.prompts_exact
    assert any("approximate" in n for n in res.notes)


def test_prompt_payload_types() -> None:
    assert WorkloadPrompt("a b", 2, True).payload == "a b"
    assert WorkloadPrompt((1, 2), 2, True).payload == [1, 2]
