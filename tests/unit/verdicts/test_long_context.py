"""The long-context probes for DSA models: contexts past index_topk, the same text everywhere, and a reach that is
judged from the server's own token count (a probe that did not reach sparse selection is never taken for one that
did)."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from pytest_llmserve.engines import embedded
from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.store.reference_answers import _prompt_dict
from pytest_llmserve.verdicts.long_context import (
    ANIMALS,
    COLOURS,
    PLACES,
    Reach,
    ledger_text,
    long_context_prompts,
    reach_needed,
    reach_of,
    unreached,
)
from pytest_llmserve.verdicts.oracles import DEFAULT_BATCH_PROMPTS, ProbePrompt


def test_probes_for_index_topk_2048_are_the_issues_2_5k_4k_and_8k() -> None:
    probes = long_context_prompts(2048)
    assert [p.name for p in probes] == ["long-2560", "long-4096", "long-8192"]
    assert {p.min_context_tokens for p in probes} == {2048 + 256}
    assert all(not p.chat for p in probes)  # no chat template adds to the context or counts in it
    # Longer probes are longer texts (8 tokens a sentence in SmolLM2's tokenizer).
    assert [p.text.count(" lives near the ") for p in probes] == [2560 // 8, 4096 // 8, 8192 // 8]


def test_the_text_is_the_same_on_every_call_and_machine() -> None:
    # The digest pins the generator: a change to it changes every recorded long-context answer.
    text = ledger_text(2560)
    assert text == ledger_text(2560)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "7a3b49d477eb31b6"
    assert text.endswith("Answer: near the")
    first = text.split(".")[0].split()  # The {colour} {animal} lives near the {place}
    assert f"where does the first {first[1]} {first[2]} live?" in text
    assert ledger_text(2560, seed=1) != text


def test_no_probe_shares_its_sentences_with_another() -> None:
    """A prefix cache must not serve one probe's prefill from another's KV: on the H200 (2026-12-06) the probes were
    drawn from one stream, each a prefix of the next, and the longer ones' first prefills extended the shorter one's
    cached KV (1,600 and 4,160 new tokens). Shown failing on that construction."""

    def shared_sentences(texts: list[str]) -> int:
        first = [t.split(".")[:64] for t in texts]  # the first 64 sentences: 512 tokens, 8 pages of 64
        return max(sum(x == y for x, y in zip(a, b, strict=True)) for i, a in enumerate(first) for b in first[i + 1:])

    assert shared_sentences([p.text for p in long_context_prompts(2048)]) <= 2  # chance agreement only
    assert shared_sentences([ledger_text(n) for n in (2560, 4096, 8192)]) == 64  # the old construction: all shared


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        long_context_prompts(0)
    with pytest.raises(ValueError, match="positive number of tokens, not -5"):
        ledger_text(-5)


def test_every_word_is_one_token_in_smollm2s_vocabulary() -> None:
    tokenizer = embedded.model_dir() / "tokenizer.json"
    if not tokenizer.is_file():
        pytest.skip(f"no SmolLM2 tokenizer at {tokenizer} (llmserve setup writes it)")
    vocab = json.loads(tokenizer.read_text())["model"]["vocab"]
    words = {*COLOURS, *ANIMALS, *PLACES, "The", "lives", "near", "the"}
    assert sorted(w for w in words if "Ġ" + w not in vocab) == []


def test_smollm2s_own_tokenizer_counts_each_probe_past_its_nominal_size() -> None:
    """The real tokenizers library (in the embedded engine's venv) counts the tokens: each probe has at least its
    nominal context and not many more (the question at its end)."""
    python = embedded.engine_python()
    tokenizer = embedded.model_dir() / "tokenizer.json"
    probe = subprocess.run([python, "-c", "import tokenizers"], capture_output=True, check=False) \
        if tokenizer.is_file() else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no engine venv with the tokenizers library and SmolLM2's tokenizer (llmserve setup)")
    texts = {p.name: p.text for p in long_context_prompts(2048)}
    script = ("import json, sys\nfrom tokenizers import Tokenizer\nt = Tokenizer.from_file(sys.argv[1])\n"
              "print(json.dumps({k: len(t.encode(v).ids) for k, v in json.loads(sys.stdin.read()).items()}))\n")
    proc = subprocess.run([python, "-c", script, str(tokenizer)], input=json.dumps(texts), capture_output=True,
                          text=True, check=True, timeout=120)
    counts = json.loads(proc.stdout)
    for name, count in counts.items():
        nominal = int(name.removeprefix("long-"))
        assert nominal <= count <= nominal + 20, (name, count)


def _answer(tokens: int | None, status: int = 200) -> Completion:
    return Completion(request={}, status=status, text=" river", prompt_tokens=tokens)


def test_reach_is_judged_from_the_servers_count() -> None:
    probes = long_context_prompts(2048)
    short = DEFAULT_BATCH_PROMPTS[0]
    reaches = reach_of([short, *probes], [_answer(6), _answer(2575), _answer(4111), _answer(8207)])
    assert [r.probe for r in reaches] == ["long-2560", "long-4096", "long-8192"]  # the short prompt has no purpose
    assert unreached(reaches) == []
    assert reaches[0].describe() == ("long-2560: 2,575 tokens of context, reached sparse selection (needs more "
                                     "than 2,304)")


def test_a_probe_that_did_not_reach_selection_is_said_so() -> None:
    """A tokenizer that counts fewer tokens, a server that truncated the prompt, a failed request or one without a
    count: none of these shows selection."""
    probes = long_context_prompts(2048)
    reaches = reach_of(probes, [_answer(2304), _answer(None), _answer(8207, status=400)])
    assert [r.probe for r in unreached(reaches)] == ["long-2560", "long-4096", "long-8192"]
    assert reaches[0].describe() == ("long-2560: 2,304 tokens of context, did NOT reach sparse selection (needs "
                                     "more than 2,304)")
    assert "an unknown number of tokens" in reaches[1].describe()
    assert Reach("x", reach_needed(2048), 2305).reached


def test_a_recording_keeps_the_probes_purpose_and_older_ones_read_unchanged() -> None:
    probe = long_context_prompts(2048)[0]
    assert _prompt_dict(probe)["min_context_tokens"] == 2304
    assert "min_context_tokens" not in _prompt_dict(ProbePrompt("The capital of France is"))
