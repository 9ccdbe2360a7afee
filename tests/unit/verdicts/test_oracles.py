"""Oracles on recorded and realistic responses: NaN evidence from every channel, coherence, the
differential rule, CUDA-graph batch coverage. The runs that send the probes: tests/unit/gates/test_oracle_runs.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.engines import adapter_named
from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.verdicts.batch_sizes import BatchCase, coverage_plan
from pytest_llmserve.verdicts.coherence import CoherenceThresholds, coherence_findings, coherence_metrics
from pytest_llmserve.verdicts.findings import Finding, OracleReport
from pytest_llmserve.verdicts.oracles import (
    DEFAULT_BATCH_PROMPTS,
    DEFAULT_KNOWN_ANSWERS,
    KnownAnswer,
    batch_prompts,
    known_answer_findings,
    logprob_consistency,
    nan_evidence,
    nan_in_log,
    nan_in_metrics,
    response_findings,
    transport_findings,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "oracles" / "smollm2_hf_greedy.json"
RECORDED: dict[str, Any] = json.loads(DATA.read_text())

# What vLLM (0.32 CPU here) answers when a logprob is NaN and logprobs were requested.
VLLM_NAN_400 = ('{"error":{"message":"Out of range float values are not JSON compliant: nan",'
                '"type":"BadRequestError","param":null,"code":400}}')

# A healthy English paragraph of about 256 tokens (no logprobs: words stand in for tokens).
HEALTHY_PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt and "
    "wind. Every evening, Martha climbed the spiral staircase to light the lamp, counting the one hundred "
    "and twelve steps as her father had taught her. From the top she could see the fishing boats returning "
    "to the harbour, their lanterns bobbing like fireflies on the dark water. One stormy night in October, "
    "a small sailboat appeared far beyond the rocks, drifting without a light. Martha grabbed her father's "
    "brass telescope and watched as the boat struggled against the waves. She knew the reef was close, and "
    "that the current would pull the boat towards it within the hour. Without waiting, she rang the bell "
    "that woke the village, then ran down to the beach where the rescue crew was already pulling on their "
    "coats. Together they launched the rowing boat into the surf. The journey took nearly forty minutes, "
    "and twice a wave almost turned them over. When they finally reached the sailboat, they found a young "
    "boy clutching a wooden box, shivering but unhurt. He explained that his grandfather had built the boat "
    "and that he had wanted to sail it alone, just once, before the winter came. Back on shore, the "
    "villagers wrapped him in blankets and gave him hot soup. The next morning, the boy opened the box and "
    "showed Martha what was inside: a hand-drawn chart of the coast, with the lighthouse marked in red ink "
    "and a note that read, simply, 'Follow the light home.'"
)


def recorded(kind: str, index: int, **request: Any) -> Completion:
    item = RECORDED[kind][index]
    tokens = [TokenLogprob(t[0], t[1], dict(t[2])) for t in item["tokens"]]
    req = {"prompt": item["prompt"], "max_tokens": item["n"], "temperature": 0.0, "logprobs": 5, **request}
    return Completion(request=req, status=200, text=item["text"], tokens=tokens, finish_reason="length",
                      completion_tokens=item["n"])


def completion(text: str = "", tokens: list[TokenLogprob] | None = None, *, status: int = 200,
               error: str | None = None, completion_tokens: int | None = None, **kw: Any) -> Completion:
    toks = tokens or []
    request = kw.pop("request", {"prompt": "The capital of France is", "max_tokens": 32, "temperature": 0.0,
                                 "logprobs": 5})
    if completion_tokens is None and status == 200:
        completion_tokens = len(toks)
    return Completion(request=request, status=status, text=text, tokens=toks, error=error,
                      completion_tokens=completion_tokens, finish_reason=kw.pop("finish_reason", "length"),
                      **kw)


def tok(token: str, lp: float | None, top: dict[str, float | None] | None = None) -> TokenLogprob:
    return TokenLogprob(token, lp, top if top is not None else {token: lp})


def toks_of(pieces: list[str], lp: float = -0.5) -> list[TokenLogprob]:
    return [TokenLogprob(p, lp, {p: lp, " the": lp - 2.0}) for p in pieces]


def errors(findings: list[Finding], oracle: str | None = None) -> list[Finding]:
    return [f for f in findings if f.severity == "error" and (oracle is None or f.oracle == oracle)]


HEALTHY_TOKENS = toks_of([" Paris", ".", " It", " is", " the", " capital", " of", " France", "."])


# --------------------------------------------------------------------------------------------------
# NaN evidence
# --------------------------------------------------------------------------------------------------

def test_vllm_http_400_nan_body_is_nan_evidence_not_a_transport_failure() -> None:
    c = completion(status=400, error=VLLM_NAN_400)
    found = nan_evidence(c)
    assert len(found) == 1
    assert found[0].oracle == "nan"
    assert found[0].severity == "error"
    assert "HTTP 400" in found[0].message
    assert "Out of range float values" in found[0].message
    assert transport_findings(c) == []
    assert "sent: prompt='The capital of France is'" in found[0].request


@pytest.mark.parametrize("body", ['{"detail": "Internal Server Error"}', "upstream connect error", ""])
def test_other_http_errors_are_transport_failures(body: str) -> None:
    c = completion(status=500, error=body)
    assert nan_evidence(c) == []
    found = transport_findings(c)
    assert len(found) == 1
    assert found[0].oracle == "transport"
    assert "HTTP 500" in found[0].message


def test_sglang_500_with_nan_in_body_is_nan_evidence() -> None:
    c = completion(status=500, error="ValueError: Out of range float values are not JSON compliant")
    assert errors(nan_evidence(c), "nan")


@pytest.mark.parametrize(("value", "words"), [
    (-9999.0, "vLLM's clamp"),
    (-3.4028234663852886e38, "float32 lowest"),
    (None, "null"),
    (math.nan, "NaN"),
    (-math.inf, "not finite"),
    (-1e30, "implausibly low"),
])
def test_sentinel_and_non_finite_chosen_logprobs(value: float | None, words: str) -> None:
    tokens = HEALTHY_TOKENS[:3] + [tok(" Lyon", value, {" Lyon": value, " Paris": -0.1})] + HEALTHY_TOKENS[4:]
    found = nan_evidence(completion("Paris. It Lyon the capital of France.", tokens))
    assert len(found) == 1
    assert words in found[0].message
    assert "first at position 3" in found[0].message
    assert found[0].tokens[0].position == 3
    assert found[0].tokens[0].token == " Lyon"


def test_sentinel_in_top_alternatives_only() -> None:
    tokens = list(HEALTHY_TOKENS)
    tokens[5] = tok(" capital", -0.2, {" capital": -0.2, "!": -9999.0})
    found = nan_evidence(completion("Paris. It is the capital of France.", tokens))
    assert len(found) == 1
    assert "top-alternative" in found[0].message
    assert "-9999.0" in found[0].message
    assert found[0].tokens[0].position == 5


def test_recorded_nan_model_logprobs_are_caught() -> None:
    c = recorded("nan", 0)
    found = nan_evidence(c)
    assert errors(found, "nan")
    assert "24 of 24" in found[0].message


def test_sglang_nan_happened_finish() -> None:
    c = completion("The capital", toks_of(["The", " capital"]), finish_reason="stop",
                   matched_stop="NaN happened")
    found = nan_evidence(c)
    assert len(found) == 1
    assert "NaN happened" in found[0].message


def test_empty_tokens_after_some_point() -> None:
    tokens = HEALTHY_TOKENS + [tok("", -0.0001) for _ in range(20)]
    found = nan_evidence(completion("Paris. It is the capital of France.", tokens))
    assert len(found) == 1
    assert "from position 9 on (20 of 29)" in found[0].message


def test_empty_text_without_logprobs() -> None:
    req = {"prompt": "The capital of France is", "max_tokens": 64, "temperature": 0.0}
    all_empty = completion("", completion_tokens=64, request=req)
    stops_early = completion(" Paris, the", completion_tokens=64, request=req)
    healthy = completion(HEALTHY_PARAGRAPH[:260], completion_tokens=64, request=req)
    assert errors(nan_evidence(all_empty), "nan")
    assert errors(nan_evidence(stops_early), "nan")
    assert nan_evidence(healthy) == []


def test_healthy_recorded_responses_have_no_findings() -> None:
    for i in range(len(RECORDED["healthy"])):
        c = recorded("healthy", i)
        assert response_findings(c) == [], c.text[:80]
        assert coherence_findings(c) == [], c.text[:80]


def test_logprob_consistency() -> None:
    positive = list(HEALTHY_TOKENS)
    positive[2] = tok(" It", 0.7, {" It": 0.7})
    assert "above 0" in errors(logprob_consistency(completion("x", positive)))[0].message

    heavy = list(HEALTHY_TOKENS)
    heavy[1] = tok(".", -0.1, {".": -0.1, ",": -0.2})  # 0.90 + 0.82 > 1
    assert "sum to more than 1" in errors(logprob_consistency(completion("x", heavy)))[0].message

    not_argmax = list(HEALTHY_TOKENS)
    not_argmax[4] = tok(" the", -3.0, {" a": -0.1, " the": -3.0})
    found = errors(logprob_consistency(completion("x", not_argmax)))
    assert "not the most likely" in found[0].message
    assert found[0].tokens[0].position == 4
    sampled = completion("x", not_argmax, request={"prompt": "p", "temperature": 0.8, "logprobs": 5})
    assert logprob_consistency(sampled) == []
    penalised = completion("x", not_argmax,
                           request={"prompt": "p", "temperature": 0.0, "repetition_penalty": 1.3})
    assert logprob_consistency(penalised) == []


def test_missing_logprobs_are_an_error_when_asked_for_and_nothing_when_not() -> None:
    c = completion("Paris.", [], completion_tokens=2)
    found = transport_findings(c)
    assert [f.severity for f in found] == ["error"]
    assert "logprobs were requested but none came back" in found[0].message
    not_asked = completion("Paris.", [], completion_tokens=2,
                           request={"prompt": "The capital of France is", "max_tokens": 32, "temperature": 0.0})
    assert transport_findings(not_asked) == []


def test_aborted_finish_reason() -> None:
    c = completion("Paris", toks_of(["Paris"]), finish_reason="abort")
    assert errors(transport_findings(c), "transport")


def test_nan_in_log_lines() -> None:
    lines = [
        "(EngineCore pid=1) INFO 11-30 12:00:00 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0",
        "(APIServer pid=2) INFO 11-30 12:00:01 Corrupted: 0 reqs",
        "(APIServer pid=2) INFO 11-30 12:00:02 Running: 3 reqs, Corrupted: 2 reqs",
        "[2026-11-30 12:00:03] Detected errors during sampling! NaN in the logits.",
        "[2026-11-30 12:00:04] NaN detected in sampler: next_token_logits; values were sanitized.",
        "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
        "ValueError: Out of range float values are not JSON compliant: nan",
        "INFO: 127.0.0.1 - \"POST /v1/completions HTTP/1.1\" 200 OK",
    ]
    patterns = adapter_named("vllm").nan_log_patterns + adapter_named("sglang").nan_log_patterns
    found = nan_in_log(lines, patterns)
    text = "\n".join(f.message for f in found)
    assert len(found) == 5
    assert "line 3" in text
    assert "line 2:" not in text
    assert "SGLANG_SANITIZE_NAN_LOGITS" in text
    assert "torch.multinomial" in text
    assert nan_in_log(lines[:2] + lines[-1:], patterns) == []
    assert len(nan_in_log(lines)) == 1  # without an engine's patterns only the generic torch line


def test_nan_in_metrics_counts_increase() -> None:
    before = ('# HELP vllm:corrupted_requests_total Corrupted requests\n'
              'vllm:corrupted_requests_total{engine="0",model_name="m"} 1.0\n')
    after = before.replace("} 1.0", "} 4.0")
    counters = adapter_named("vllm").nan_counters
    assert "rose by 3" in nan_in_metrics(after, before, counters)[0].message
    assert nan_in_metrics(before, before, counters) == []
    assert nan_in_metrics('vllm:corrupted_requests_total{engine="0"} 0.0\n', counters=counters) == []
    assert nan_in_metrics("vllm:num_requests_running 3\n", counters=counters) == []
    assert adapter_named("external").nan_counters == counters  # an attached server is checked for every engine's


# --------------------------------------------------------------------------------------------------
# coherence
# --------------------------------------------------------------------------------------------------

SCRAMBLED_TEXT = " piece, piece. piece in piece" * 40


def test_healthy_paragraph_without_logprobs_passes() -> None:
    c = completion(HEALTHY_PARAGRAPH, [], completion_tokens=256)
    assert coherence_findings(c) == []
    m = coherence_metrics(HEALTHY_PARAGRAPH)
    assert m["pseudo_tokens"] == 1.0
    assert m["compression_ratio"] < 2.5
    assert m["distinct_tokens"] > 100


def test_healthy_greedy_sentence_loop_passes() -> None:
    # A healthy 135M model at temperature 0 repeats a whole sentence after ~60 tokens: allowed.
    c = recorded("healthy", 1)
    m = coherence_metrics(c.text, c.tokens)
    assert m["compression_ratio"] > 5
    assert coherence_findings(c) == []


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4])
def test_recorded_scrambled_model_fails_coherence(index: int) -> None:
    c = recorded("scrambled", index)
    found = errors(coherence_findings(c), "coherence")
    assert found, c.text
    assert response_findings(c) == []  # finite, confident logprobs: only coherence can tell


def test_scrambled_model_is_confident_so_the_logprob_floor_does_not_fire() -> None:
    c = recorded("scrambled", 0)
    m = coherence_metrics(c.text, c.tokens)
    assert -1.0 < m["mean_logprob"] < -0.3
    assert not any("mean logprob" in f.message for f in coherence_findings(c))


def test_scrambled_text_without_tokens_fails() -> None:
    found = errors(coherence_findings(completion(SCRAMBLED_TEXT, [], completion_tokens=200)))
    messages = " ".join(f.message for f in found)
    assert "compresses" in messages
    assert "only 4 distinct words in 280" in messages


def test_scrambled_text_with_tokens_fails_with_positions() -> None:
    pieces = [" piece", ",", " piece", ".", " piece", " in", " piece"] * 30
    c = completion(SCRAMBLED_TEXT, toks_of(pieces, -0.7))
    found = errors(coherence_findings(c))
    assert found
    assert all(f.tokens for f in found if "compresses" not in f.message)
    report = OracleReport("long-decode", found, [c])
    message = report.message("default[cuda_graph=on(1,2,4)]")
    assert "server default[cuda_graph=on(1,2,4)]" in message
    assert "#0 ' piece' -0.700" in message
    assert "sent: prompt='The capital of France is'" in message


def test_exclamation_collapse_fails() -> None:
    c = completion("!" * 64, toks_of(["!"] * 64, -0.01))
    messages = " ".join(f.message for f in errors(coherence_findings(c)))
    assert "repeats 64 times in a row from position 0" in messages
    no_tokens = completion("!" * 200, [], completion_tokens=200)
    assert errors(coherence_findings(no_tokens))


def test_same_token_thirty_times_fails() -> None:
    c = completion(" the" * 30, toks_of([" the"] * 30, -0.3))
    found = errors(coherence_findings(c))
    assert any("repeats 30 times" in f.message for f in found)
    assert any("distinct" in f.message for f in found)


def test_replacement_character_spam_fails() -> None:
    text = "The answer is " + "\ufffd" * 40
    c = completion(text, toks_of(["The", " answer", " is", " "] + ["\ufffd"] * 40, -1.0))
    assert any("U+FFFD" in f.message for f in errors(coherence_findings(c)))


def test_control_characters_and_salad_fail() -> None:
    control = completion("abc\x00\x01\x02\x03\x04\x05\x06\x07\x08" * 10, [], completion_tokens=100)
    assert any("printable" in f.message for f in errors(coherence_findings(control)))
    salad = "Привет мир 你好世界 こんにちは 안녕하세요 مرحبا " * 6
    c = completion(salad, [], completion_tokens=120)
    assert any("ASCII" in f.message for f in errors(coherence_findings(c)))
    relaxed = CoherenceThresholds(min_ascii_ratio=None)
    assert not any("ASCII" in f.message for f in coherence_findings(c, relaxed))


def test_low_mean_logprob_fails() -> None:
    words = HEALTHY_PARAGRAPH.split()[:64]
    c = completion(" ".join(words), toks_of([" " + w for w in words], -6.0))
    assert any("mean logprob -6.00" in f.message for f in errors(coherence_findings(c)))


def test_short_healthy_answers_pass() -> None:
    for text, pieces in [("Paris", ["Paris"]), ("2 + 2 = 4", ["2", " +", " 2", " =", " 4"]),
                         ("The capital of France is Paris.", ["The", " capital", " of", " France", " is",
                                                              " Paris", "."])]:
        assert coherence_findings(completion(text, toks_of(pieces))) == []


def test_empty_output_is_a_coherence_error_and_failed_requests_are_skipped() -> None:
    assert "no visible text" in coherence_findings(completion("", [tok("", -0.1)] * 3))[0].message
    assert coherence_findings(completion(status=400, error=VLLM_NAN_400)) == []


# --------------------------------------------------------------------------------------------------
# known answers, differential, determinism
# --------------------------------------------------------------------------------------------------

def test_known_answers() -> None:
    paris = DEFAULT_KNOWN_ANSWERS[0]
    assert paris.chat
    assert paris.must_contain == ("paris",)
    assert known_answer_findings(paris, completion("The capital of France is Paris.", HEALTHY_TOKENS)) == []
    wrong = known_answer_findings(paris, completion("The capital of France is Lyon.", HEALTHY_TOKENS))
    assert "expected one of ['paris']" in wrong[0].message
    assert "Lyon" in wrong[0].message
    assert wrong[0].probe == "known-answer[capital-of-france]"
    assert KnownAnswer("2+2?", ("4", "four")).matches("It is FOUR")
    assert len(DEFAULT_KNOWN_ANSWERS) == 3


def _run(pieces: list[tuple[str, float, dict[str, float]]]) -> Completion:
    tokens = [TokenLogprob(p, lp, dict(top)) for p, lp, top in pieces]
    return completion("".join(p for p, _, _ in pieces), tokens)


# --------------------------------------------------------------------------------------------------
# CUDA-graph batch coverage
# --------------------------------------------------------------------------------------------------

def ids(cases: list[BatchCase]) -> list[str]:
    return [c.id for c in cases]


def test_coverage_plan_captured_sizes() -> None:
    plan = coverage_plan([1, 2, 4, 8])
    assert ids(plan) == ["bs=1", "bs=2", "bs=3-padded-to-4", "bs=4", "bs=5-padded-to-8", "bs=8",
                         "bs=9-above-max-8"]
    assert [c.kind for c in plan] == ["captured", "captured", "padded", "captured", "padded", "captured",
                                      "above-max"]
    assert plan[2].padded_to == 4
    assert plan[-1].padded_to is None


def test_coverage_plan_prefers_captured_and_handles_gaps_below_the_smallest() -> None:
    assert ids(coverage_plan([8, 16], [1, 2])) == ["bs=1-padded-to-8", "bs=8", "bs=9-padded-to-16", "bs=16",
                                                   "bs=17-above-max-16"]
    assert ids(coverage_plan(None, [4, 2, 2, 1])) == ["bs=1", "bs=2", "bs=3-padded-to-4", "bs=4",
                                                      "bs=5-above-max-4"]
    assert ids(coverage_plan([], None)) == ["bs=1-no-graph", "bs=2-no-graph", "bs=3-no-graph",
                                            "bs=4-no-graph", "bs=8-no-graph"]


def test_coverage_plan_more_extras_per_gap() -> None:
    assert ids(coverage_plan([8, 16], max_extra=3)) == [
        "bs=1-padded-to-8", "bs=8", "bs=9-padded-to-16", "bs=12-padded-to-16", "bs=15-padded-to-16", "bs=16",
        "bs=17-above-max-16"]
    assert ids(coverage_plan([1, 2, 4], max_extra=0)) == ["bs=1", "bs=2", "bs=4", "bs=5-above-max-4"]


def test_coverage_plan_cap_keeps_ends_above_max_and_padded() -> None:
    vllm_default = [1, 2, 4, *range(8, 513, 8)]
    plan = coverage_plan(vllm_default)
    assert len(plan) == 24
    assert plan == coverage_plan(vllm_default)
    assert [c.size for c in plan] == sorted(c.size for c in plan)
    got = ids(plan)
    assert got[0] == "bs=1"
    assert "bs=512" in got
    assert got[-1] == "bs=513-above-max-512"
    assert "bs=3-padded-to-4" in got
    assert "bs=505-padded-to-512" in got
    small = coverage_plan([1, 2, 4, 8, 16, 32, 64], cap=10)
    assert len(small) == 10
    assert {"bs=1", "bs=64", "bs=65-above-max-64"} <= set(ids(small))
    assert sum(c.kind == "padded" for c in small) == 5  # every padded size kept before middle captured ones


def test_coverage_plan_server_max_batch_and_validation() -> None:
    assert ids(coverage_plan([1, 2, 4, 8], server_max_batch=8))[-1] == "bs=8"
    assert ids(coverage_plan(None, server_max_batch=2)) == ["bs=1-no-graph", "bs=2-no-graph"]
    with pytest.raises(ValueError, match="positive integers"):
        coverage_plan([0, 4])
    with pytest.raises(ValueError, match="cap"):
        coverage_plan([1], cap=0)


def test_batch_prompts_cycle() -> None:
    texts = [p.text for p in batch_prompts(10)]
    assert texts[8:] == [DEFAULT_BATCH_PROMPTS[0].text, DEFAULT_BATCH_PROMPTS[1].text]


def test_message_folds_identical_findings_and_counts_the_hidden_ones() -> None:
    report = OracleReport("x", server_id="s")
    report.add([Finding("nan", "error", "same", probe=f"p{i}") for i in range(8)])
    report.add([Finding("coherence", "error", f"distinct {i}", probe="q") for i in range(6)])
    message = report.message(limit=3)
    assert "x FAILED on server s: 14 error(s)" in message
    assert "(the same in 7 more: p1, p2, p3, p4, p5, ...)" in message
    assert "distinct 0" in message and "distinct 1" in message and "distinct 2" not in message
    assert message.endswith("... and 4 more finding(s) (all of them, in full: -vv, or this check's row in "
                            "results.json)")
    assert "distinct 5" in report.message(full=True) and "more finding" not in report.message(full=True)


def test_special_tokens_decoding_to_nothing_are_a_nan_symptom() -> None:
    # Finite logprobs, but every token is a special token that the detokenizer drops from the text.
    c = completion("", [tok("<|endoftext|>", -0.01) for _ in range(24)])
    found = errors(nan_evidence(c), "nan")
    assert len(found) == 1
    assert "24 tokens were generated but the text has only 0 character(s)" in found[0].message
