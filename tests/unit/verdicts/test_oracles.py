"""Oracles on recorded and realistic responses: NaN evidence from every channel, coherence, the
differential rule, CUDA-graph batch coverage and the orchestrators (over a mocked HTTP transport)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_llmserve.engines import adapter_named
from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import Completion, LLMClient, TokenLogprob
from pytest_llmserve.verdicts.oracles import (
    DEFAULT_BATCH_PROMPTS,
    DEFAULT_DIFFERENTIAL_PROMPTS,
    DEFAULT_KNOWN_ANSWERS,
    DEFAULT_NAN_PROMPTS,
    BatchCase,
    CoherenceThresholds,
    Finding,
    KnownAnswer,
    OracleReport,
    ProbePrompt,
    batch_prompts,
    check_logprobs_close,
    coherence_findings,
    coherence_metrics,
    compare_runs,
    coverage_plan,
    determinism_findings,
    exact_equal_findings,
    known_answer_findings,
    logprob_consistency,
    nan_evidence,
    nan_in_log,
    nan_in_metrics,
    response_findings,
    run_batch_case,
    run_batch_reference,
    run_determinism,
    run_differential,
    run_known_answers,
    run_long_decode,
    run_nan_check,
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


def test_missing_logprobs_is_a_warning() -> None:
    c = completion("Paris.", [], completion_tokens=2)
    found = transport_findings(c)
    assert [f.severity for f in found] == ["warning"]
    assert "no" in found[0].message


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


REF = _run([(" Paris", -0.1, {" Paris": -0.1, " Lyon": -3.0}),
            (",", -0.6, {",": -0.6, ".": -0.9, " and": -2.5}),
            (" the", -0.2, {" the": -0.2, " a": -2.0})])


def test_check_logprobs_close_identical() -> None:
    assert check_logprobs_close(REF, REF, name_ref="bs=1", name_cand="bs=4") == []


def test_check_logprobs_close_near_tie_is_a_warning() -> None:
    cand = _run([(" Paris", -0.1, {" Paris": -0.1, " Lyon": -3.0}),
                 (".", -0.7, {".": -0.7, ",": -0.8}),
                 (" It", -0.5, {" It": -0.5})])
    found = check_logprobs_close(REF, cand, name_ref="bs=1", name_cand="bs=4")
    assert [f.severity for f in found] == ["warning"]
    assert "position 1" in found[0].message
    assert "near-tie" in found[0].message


def test_check_logprobs_close_outside_top_k_is_an_error() -> None:
    cand = _run([(" Paris", -0.1, {" Paris": -0.1}), ("!", -0.05, {"!": -0.05, "?": -4.0})])
    found = check_logprobs_close(REF, cand, name_ref="bs=1", name_cand="bs=3-padded-to-4")
    assert [f.severity for f in found] == ["error"]
    msg = found[0].message
    assert "bs=3-padded-to-4's '!' is not in bs=1's top-3" in msg
    assert "bs=1's ',' is not in" in msg
    assert [t.position for t in found[0].tokens] == [1, 1]


def test_check_logprobs_close_after_divergence_stops() -> None:
    # Divergence inside top-k at 1, then garbage: the rule stops at the first divergence.
    cand = _run([(" Paris", -0.1, {" Paris": -0.1}), (".", -0.7, {".": -0.7, ",": -0.8}), ("!!", -0.1, {})])
    assert [f.severity for f in check_logprobs_close(REF, cand)] == ["warning"]


def test_check_logprobs_close_lengths_and_failures() -> None:
    shorter = _run([(" Paris", -0.1, {" Paris": -0.1})])
    assert check_logprobs_close(REF, shorter)[0].severity == "warning"
    failed = completion(status=400, error=VLLM_NAN_400)
    assert check_logprobs_close(REF, failed)[0].severity == "error"
    no_top = _run([(" Paris", -0.1, {}), ("!", -0.1, {})])
    assert "no top-k" in check_logprobs_close(REF, no_top)[0].message


def test_exact_equality_and_determinism() -> None:
    assert exact_equal_findings(REF, REF, compare_logprobs=True) == []
    cand = _run([(" Paris", -0.1, {}), (".", -0.7, {".": -0.7, ",": -0.8}), (" It", -0.5, {})])
    assert "differ at position 1" in exact_equal_findings(REF, cand)[0].message
    shifted = _run([(" Paris", -0.1, {}), (",", -0.61, {}), (" the", -0.2, {})])
    assert exact_equal_findings(REF, shifted) == []
    assert "logprob at position 1" in exact_equal_findings(REF, shifted, compare_logprobs=True)[0].message
    near_tie = _run([(" Paris", -0.1, {" Paris": -0.1}), (".", -0.7, {".": -0.7, ",": -0.8})])
    assert [f.severity for f in determinism_findings(REF, near_tie)] == ["warning"]
    assert [f.severity for f in determinism_findings(REF, near_tie, exact=True)] == ["error"]
    assert determinism_findings(REF, near_tie)[0].oracle == "determinism"


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


# --------------------------------------------------------------------------------------------------
# orchestrators, over a mocked OpenAI-compatible server
# --------------------------------------------------------------------------------------------------

class FakeServer:
    """Answers /v1/completions and /v1/chat/completions like vLLM, from a prompt -> behaviour table."""

    def __init__(self, *, nan_prompts: tuple[str, ...] = (), answer: str = "The capital of France is Paris.",
                 corrupted_after: float = 0.0, garbage: bool = False, flip_concurrent: bool = False) -> None:
        self.nan_prompts = nan_prompts
        self.answer = answer
        self.corrupted = 0.0
        self.corrupted_after = corrupted_after
        self.garbage = garbage
        self.flip_concurrent = flip_concurrent
        self.requests: list[dict[str, Any]] = []

    def pieces(self, prompt: str, n: int) -> list[str]:
        if self.garbage:
            return ([" piece", ",", " piece", ".", " piece", " in"] * 100)[:n]
        if "capital" in prompt:
            words = self.answer.split(" ")
            return ([words[0]] + [" " + w for w in words[1:]])[:n]
        words = HEALTHY_PARAGRAPH.split(" ")
        start = sum(map(ord, prompt)) % 50
        return [" " + w for w in words[start:start + n]]

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            value = self.corrupted
            self.corrupted = self.corrupted_after
            return httpx.Response(200, text=f'vllm:corrupted_requests_total{{engine="0"}} {value}\n')
        body = json.loads(request.content)
        self.requests.append(body)
        chat = "messages" in body
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        if prompt in self.nan_prompts:
            if not body.get("logprobs"):  # vLLM: without logprobs, a 200 whose tokens decode to ""
                empty = {"message": {"role": "assistant", "content": ""}} if chat else {"text": ""}
                return httpx.Response(200, json={"choices": [{**empty, "finish_reason": "length"}],
                                                 "usage": {"prompt_tokens": 5,
                                                           "completion_tokens": body["max_tokens"]}})
            return httpx.Response(400, text=VLLM_NAN_400)
        pieces = self.pieces(prompt, body["max_tokens"])
        if self.flip_concurrent and len(self.requests) > len(DEFAULT_BATCH_PROMPTS) and len(pieces) > 2:
            pieces[2] = " zebra"
        lps = [-0.3 - (i % 3) * 0.1 for i in range(len(pieces))]
        if chat:
            content = [{"token": p, "logprob": lp, "top_logprobs": [{"token": p, "logprob": lp},
                                                                    {"token": " the", "logprob": lp - 2}]}
                       for p, lp in zip(pieces, lps, strict=True)]
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": "".join(pieces)},
                                      "logprobs": {"content": content}, "finish_reason": "length"}
        else:
            choice = {"text": "".join(pieces), "finish_reason": "length",
                      "logprobs": {"tokens": pieces, "token_logprobs": lps,
                                   "top_logprobs": [{p: lp, " the": lp - 2} for p, lp in zip(pieces, lps,
                                                                                               strict=True)]}}
        return httpx.Response(200, json={"choices": [choice], "usage": {"prompt_tokens": 5,
                                                                        "completion_tokens": len(pieces)}})


def client_for(server: FakeServer) -> LLMClient:
    client = LLMClient("http://fake", "m")
    client._http = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(server.handle))
    return client


def test_run_nan_check_healthy_and_every_request_asks_for_logprobs() -> None:
    server = FakeServer()
    report = run_nan_check(client_for(server), "default")
    assert report.ok, report.message("default")
    assert len(report.completions) == 5  # four prompts and the one-token request
    assert all(r.get("logprobs") for r in server.requests)
    assert all(r["temperature"] == 0.0 for r in server.requests)
    assert server.requests[-1]["max_tokens"] == 1


def test_run_nan_check_catches_400_metrics_and_log() -> None:
    server = FakeServer(nan_prompts=("The three primary colors are",), corrupted_after=2.0)
    report = run_nan_check(client_for(server), "default[eager=off]",
                           read_log=lambda: ["Detected errors during sampling! NaN in the logits."],
                           log_patterns=adapter_named("sglang").nan_log_patterns,
                           nan_counters=adapter_named("vllm").nan_counters)
    assert not report.ok
    message = report.message("default[eager=off]", full=True)  # all four channels, not the first three
    assert "nan-check FAILED on server default[eager=off]" in message
    assert "HTTP 400" in message
    assert "rose by 2" in message
    assert "sglang log reports NaN" in message


def test_run_nan_check_resends_a_nan_400_without_logprobs_once() -> None:
    server = FakeServer(nan_prompts=tuple(p.text for p in DEFAULT_NAN_PROMPTS))
    report = run_nan_check(client_for(server), "nan")
    assert not report.ok
    without = [r for r in server.requests if not r.get("logprobs")]
    assert len(without) == 1  # one follow-up, after the first 400 only
    message = report.message("nan")
    # The follow-up's evidence is the second thing shown; the repeated 400s are folded into one entry.
    assert message.count("HTTP 400 whose body reports NaN/inf") == 1
    assert "(the same in 4 more: nan-check[the-capital-of-france-is]" in message
    assert ("without logprobs the same request answers HTTP 200, and 32 tokens were generated but the text "
            "has only 0 character(s)") in message
    assert message.index("HTTP 400") < message.index("without logprobs")


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


def test_run_differential_agrees_and_catches_a_divergence_and_a_broken_reference() -> None:
    reference, same = FakeServer(), FakeServer()
    report = run_differential(client_for(reference), client_for(same), name_ref="eager", name_cand="graphs")
    assert report.ok, report.message()
    assert len(report.completions) == len(DEFAULT_DIFFERENTIAL_PROMPTS)
    assert all(r.get("logprobs") for r in reference.requests + same.requests)
    assert report.check.startswith("differential[graphs vs reference eager; 9 greedy prompts, 32 tokens")

    garbage = FakeServer(garbage=True)
    report = run_differential(client_for(FakeServer()), client_for(garbage), name_ref="healthy",
                              name_cand="scrambled", concurrent=True)
    assert not report.ok
    message = report.message(limit=2)
    assert "candidate all 9 at once" in message
    assert "[differential] error in differential[chat-capital]: scrambled vs healthy: diverge at position 0" in message
    assert "scrambled's ' piece' is not in healthy's top-2" in message

    one = client_for(FakeServer(flip_concurrent=True))  # batch 9 against batch 1 on one server
    report = run_differential(one, one, name_ref="x", name_cand="x", concurrent=True)
    assert report.server_id == "x" and not report.ok
    assert "x (all 9 at once) vs x (one at a time): diverge at position 2" in report.message()
    assert "offending tokens: x (one at a time)'s first, then x (all 9 at once)'s" in report.message()

    broken = FakeServer(nan_prompts=(DEFAULT_BATCH_PROMPTS[0].text,))
    report = run_differential(client_for(broken), client_for(FakeServer()), name_ref="ref", name_cand="cand",
                              exact=True)
    assert not report.ok
    assert "reference ref: HTTP 400 whose body reports NaN/inf" in report.message()
    assert "cannot compare cand vs ref" in report.message()


def test_run_known_answers() -> None:
    assert run_known_answers(client_for(FakeServer()), DEFAULT_KNOWN_ANSWERS[:1], "default").ok
    report = run_known_answers(client_for(FakeServer(answer="The capital of France is Lyon.")),
                               DEFAULT_KNOWN_ANSWERS[:1], "default")
    assert not report.ok
    assert "expected one of ['paris']" in report.message("default")


def test_run_long_decode() -> None:
    healthy = run_long_decode(client_for(FakeServer()), "default", max_tokens=200)
    assert healthy.ok, healthy.message("default")
    assert not healthy.warnings
    broken = run_long_decode(client_for(FakeServer(garbage=True)), "scrambled", max_tokens=200)
    assert not broken.ok
    assert "coherence" in broken.message("scrambled")
    short = run_long_decode(client_for(FakeServer()), "default", max_tokens=600)
    assert short.ok
    assert any("stopped after" in f.message for f in short.warnings)


def test_run_long_decode_transport_failure_stops() -> None:
    client = client_for(FakeServer())

    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client._http = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(boom))
    report = run_long_decode(client, "default")
    assert [f.oracle for f in report.findings] == ["transport"]
    assert "still alive" in report.findings[0].message


def test_run_batch_case_against_reference() -> None:
    server = FakeServer()
    client = client_for(server)
    reference = run_batch_reference(client, "default")
    assert reference.ok
    assert len(reference.completions) == len(DEFAULT_BATCH_PROMPTS)
    case = BatchCase(10, "padded", 16, 16)
    report = run_batch_case(client, case, reference.completions, "default")
    assert report.ok, report.message("default")
    assert len(report.completions) == 10
    assert report.check == "batch[bs=10-padded-to-16]"
    assert all(r.get("logprobs") == 5 for r in server.requests)


def test_run_batch_case_flags_divergence_and_nan() -> None:
    server = FakeServer()
    client = client_for(server)
    reference = run_batch_reference(client, "default").completions
    server.flip_concurrent = True
    server.nan_prompts = (DEFAULT_BATCH_PROMPTS[1].text,)
    report = run_batch_case(client, BatchCase(3, "padded", 4, 8), reference, "default")
    message = report.message("default[cuda_graph=on(1,2,4,8)]", limit=10)
    assert not report.ok
    assert "bs=3-padded-to-4 request 2/3" in message
    assert "HTTP 400" in message
    assert "' zebra' is not in bs=1 reference's top-2" in message


def test_run_batch_case_without_reference_compares_duplicates() -> None:
    prompts = (ProbePrompt("The capital of France is"),)
    report = run_batch_case(client_for(FakeServer()), BatchCase(2, "captured", 2, 2), None, "x",
                            prompts=prompts)
    assert report.ok
    assert len(report.completions) == 2


def test_run_determinism_and_compare_runs() -> None:
    client = client_for(FakeServer())
    report = run_determinism(client, "default", exact=True)
    assert report.ok
    assert len(report.completions) == 2
    a = run_batch_reference(client, "eager").completions
    b = run_batch_reference(client, "graphs").completions
    assert compare_runs(a, b, name_ref="eager", name_cand="graphs").ok
    assert not compare_runs(a, b[:-1], name_ref="eager", name_cand="graphs").ok


def test_request_error_is_reported_not_raised() -> None:
    class Dead:
        def chat(self, *a: Any, **k: Any) -> Completion:
            raise RequestError("POST http://x/v1/chat/completions failed: ConnectError")

        complete = chat

        def metrics_text(self) -> str | None:
            return None

    report = run_nan_check(Dead(), "default")  # type: ignore[arg-type]
    assert not report.ok
    assert "ConnectError" in report.message("default")


def test_special_tokens_decoding_to_nothing_are_a_nan_symptom() -> None:
    # Finite logprobs, but every token is a special token that the detokenizer drops from the text.
    c = completion("", [tok("<|endoftext|>", -0.01) for _ in range(24)])
    found = errors(nan_evidence(c), "nan")
    assert len(found) == 1
    assert "24 tokens were generated but the text has only 0 character(s)" in found[0].message


def test_report_message_uses_the_recorded_server_id() -> None:
    report = run_known_answers(client_for(FakeServer(answer="The capital of France is Lyon.")),
                               DEFAULT_KNOWN_ANSWERS[:1], "smollm2[eager=on]")
    assert report.server_id == "smollm2[eager=on]"
    message = report.message()
    assert message.startswith("known-answers FAILED on server smollm2[eager=on]: 1 error(s)")
    assert "sent: prompt=[{'role': 'user', 'content': 'What is the capital of France?" in message
    assert "got 'The capital of France is Lyon.'; no expected answer is begun in it" in message
