"""Characterization of a round's validity and notes (load/metrics.py), pinned before invalid_reasons and evaluate were
split into one check per reason (issue 36): the exact words, their order, each reason's blame and timing_only, and
the notes and the server-counter line, on rounds that trip every check at once and on a few ordinary ones."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.load.metrics import InvalidReason, RequestRecord, evaluate, invalid_reasons
from pytest_llmserve.load.prompts import WorkloadPrompt

WL = Workload("w", num_prompts=8, output_len=4, input_len=10)


def rec(index: int, ttft: float, gaps: list[float], *, n: int | None = None, start: float = 10.0,
        end: float | None = None, chunks: int | None = None, empty: int = 0, prompt_tokens: int = 10,
        error: str | None = None, text: str | None = None, bad_logprobs: int | None = None) -> RequestRecord:
    """A record whose chunks come at start+ttft, then after each gap."""
    e2e = ttft + sum(gaps)
    return RequestRecord(index=index, start=start, end=start + e2e + 0.001 if end is None else end, ttft=ttft,
                         e2e=e2e, itl=list(gaps), output_tokens=len(gaps) + 1 if n is None else n,
                         prompt_tokens=prompt_tokens, chunks=len(gaps) + 1 if chunks is None else chunks,
                         empty_chunks=empty, error=error, finish_reason="length", text=text,
                         token_texts=None if text is None else list(text), bad_logprobs=bad_logprobs)


def every_fault() -> list[RequestRecord]:
    """A round that trips every check of invalid_reasons (but the duration's) at once."""
    no_usage = rec(11, 0.5, [0.1] * 3)
    no_usage.output_tokens = None
    negative = rec(15, 0.5, [0.1] * 3)
    negative.e2e = 0.4  # the last chunk stamped before the first
    return [
        rec(10, 0.5, [0.1] * 3, error="HTTP 500: boom"),
        no_usage,
        rec(12, 0.5, [0.1, 0.1]),  # 3 tokens, not output_len
        rec(13, 0.5, [0.1], n=4),  # 2 chunks for 4 tokens
        rec(14, 0.5, [], n=4, chunks=4),  # 4 tokens, one read: empty ITL
        negative,
        rec(16, 0.5, [0.1] * 3, empty=4),  # tokens without text
        rec(0, 0.5, [0.1] * 3, text="\ufffd" * 40, bad_logprobs=2),  # a sampled answer: garbage, NaN logprobs
        *[rec(20 + i, 0.5, [0.0] * 3) for i in range(8)],  # TPOT = 0 for half of them and more
    ]


def classified(reasons: Sequence[InvalidReason]) -> list[tuple[str, str, bool]]:
    return [(str(r), r.blame.name, r.timing_only) for r in reasons]


GARBAGE = "'" + "\ufffd" * 40 + "'"
EVERY_FAULT = [
    ("1 of 16 requests failed (requests are never retried): request 10: HTTP 500: boom", "SERVER", False),
    ("1 of 1 warm-up requests failed: ", "SERVER", False),
    ("1 requests got no usage.completion_tokens from the server (stream_options.include_usage not honoured?): output "
     "tokens cannot be counted", "MACHINE", False),
    ("1 requests produced a number of tokens other than output_len=4 (ignore_eos not honoured, or the server stopped "
     "early): request 12: 3 tokens, finish_reason=length", "SERVER", False),
    ("1 requests: the client counted a different number of content chunks than the server's usage.completion_tokens "
     "(multi-token chunks from speculative decoding need allow_multi_token_chunks=True): request 13: 2 chunks vs 4 "
     "tokens", "MACHINE", True),
    ("1 requests of >= 2 tokens arrived as a single chunk (empty ITL): the stream was buffered (by a proxy, or the "
     "server did not stream)", "MACHINE", True),
    ("1 requests have a negative TPOT (last chunk before the first): request 15: -0.033333333333333326 s", "MACHINE",
     True),
    ("9 of 15 requests have TPOT = 0 (all chunks in one read): the stream was buffered (by a proxy, or the server did "
     "not stream): request 14; request 20; request 21; ... (6 more)", "MACHINE", True),
    ("1 of 15 requests generated tokens but no text (every content chunk empty: NaN logits decode to an empty special "
     "token; see the correctness checks): request 16: 4 tokens, 0 characters", "SERVER", False),
    ("sampled request 0: 2 null or non-finite logprob(s) in the stream", "SERVER", False),
    ("sampled request 0: decode collapse: 100.0% of the characters are U+FFFD (limit 1.0%): the detokenizer got "
     "invalid byte sequences; text " + GARBAGE, "SERVER", False),
    ("sampled request 0: decode collapse: only 0.0% of the characters are printable ASCII (floor 85%; set "
     "min_ascii_ratio=None for non-English probes); text " + GARBAGE, "SERVER", False),
]


def test_every_reason_in_its_order_with_its_classification() -> None:
    warm = [rec(-1, 0.5, [0.1] * 3, error="")]  # failed (an error, not None) with an empty message
    assert classified(invalid_reasons(every_fault(), WL, warmup=warm)) == EVERY_FAULT


def test_an_untrained_model_keeps_the_logprob_finding_and_drops_the_collapse() -> None:
    reasons = classified(invalid_reasons(every_fault(), WL, untrained="random weights"))
    assert reasons == [r for r in EVERY_FAULT if "warm-up" not in r[0] and "decode collapse" not in r[0]]


def test_multi_token_chunks_allowed_and_the_duration_and_emptiness_reasons() -> None:
    reasons = classified(invalid_reasons(every_fault(), WL, allow_multi_token_chunks=True))
    assert [r[0][:30] for r in reasons] == [r[0][:30] for r in EVERY_FAULT if "warm-up" not in r[0]
                                            and "content chunks" not in r[0]]
    instant = [rec(0, 0.5, [0.1] * 3, end=10.0), rec(1, 0.5, [0.1] * 3, start=10.0, end=10.0)]
    assert classified(invalid_reasons(instant, WL)) == [("duration 0.0 s is not positive", "MACHINE", False)]
    assert classified(invalid_reasons([], WL)) == [("no timed requests were sent", "MACHINE", False)]


@pytest.mark.parametrize(("case", "expected"), [
    ("quiet", (True, [], None, None, None)),
    ("exact-but-counted-otherwise", (
        True,
        ["server counted prompt lengths [11] for input_len=10 (special tokens such as BOS added by the server?)",
         "the load generator used 363% of a core per client process: the figures may be limited by the client "
         "(use more client processes)",
         "server counter 'vllm:generation_tokens' unavailable: not cross-checked"],
        "server counter 'vllm:generation_tokens' unavailable: not cross-checked", None, 3.633060853769298)),
    ("approximate-token-ids-disagree", (
        False,
        ["prompts are approximate (10 words, no tokenizer given): input lengths in tokens are not controlled",
         "some prompts were sent as token ids (text could not be made exactly input_len tokens)"],
        "client 14.5 tok/s vs server counter 72.7 tok/s: -80.0% (DISAGREE, bound ±3%)", 72.66121707538595, None)),
    ("merged-zero-empty-untrained", (
        True,
        ["sampled answers not judged for decode collapse (not applicable: random weights)",
         "1 request(s) streamed one content chunk fewer than their tokens (two tokens in one chunk): their ITL has "
         "one gap fewer",
         "1 request(s) had TPOT = 0 (all chunks of the request in one read: the server or the client was starved); "
         "counted, since fewer than half were",
         "36% of ITL gaps are 0 (chunks read together): the client fell behind the stream, or the server sends "
         "several chunks per step",
         "20% of content chunks had empty text (special tokens after EOS under ignore_eos, or NaN logits: see the "
         "correctness checks)"],
        "client 16.0 tok/s vs server counter 16.0 tok/s: +0.0% (agree, bound ±3%)", 15.984015984015993, None)),
])
def test_evaluate_notes_and_the_server_counter(case: str, expected: tuple[object, ...]) -> None:
    healthy = [rec(i, 0.5, [0.1] * 3, start=10.0 + i * 0.1) for i in range(4)]
    exact = [WorkloadPrompt("a b", 10, True)] * 4
    kwargs: dict[str, object] = {}
    records = healthy
    if case == "exact-but-counted-otherwise":
        records = [rec(i, 0.5, [0.1] * 3, start=10.0 + i * 0.1, prompt_tokens=11) for i in range(4)]
        kwargs = {"prompts": exact, "client_cpu_s": 4.0, "server_counter": "vllm:generation_tokens"}
    elif case == "approximate-token-ids-disagree":
        kwargs = {"prompts": [WorkloadPrompt("a b", 10, False), WorkloadPrompt((1, 2), 10, True)],
                  "server_counter": "vllm:generation_tokens", "server_tokens": 80.0}
    elif case == "merged-zero-empty-untrained":
        records = [rec(0, 0.5, [0.1, 0.1], n=4, start=10.0), rec(1, 0.5, [0.0] * 3, start=10.1, empty=3),
                   rec(2, 0.5, [0.1] * 3, start=10.2), rec(3, 0.5, [0.1, 0.0, 0.1], start=10.3)]
        kwargs = {"server_counter": "vllm:generation_tokens", "server_tokens": 16.0, "untrained": "random weights"}
    res = evaluate(list(reversed(records)), WL, transport="lean", **kwargs)  # type: ignore[arg-type]
    valid, notes, check, server_tps, cpu_fraction = expected
    assert (res.valid, res.notes, res.server_check) == (valid, notes, check)
    assert res.server_output_throughput == (None if server_tps is None else pytest.approx(server_tps))
    assert res.client_cpu_fraction == (None if cpu_fraction is None else pytest.approx(cpu_fraction))
    assert [r.start for r in res.per_request] == sorted(r.start for r in records)
    if not valid:
        assert classified(res.invalid_reasons)[-1] == (
            "client 14.5 tok/s vs server counter 72.7 tok/s: -80.0% (DISAGREE, bound ±3%) (other traffic on the "
            "server, or a token-counting bug)", "MACHINE", False)


def test_a_cpu_share_that_is_not_a_number_makes_no_note() -> None:
    healthy = [rec(i, 0.5, [0.1] * 3, start=10.0 + i * 0.1) for i in range(4)]
    res = evaluate(healthy, WL, transport="lean", client_cpu_s=float("nan"))
    assert res.notes == [] and res.client_cpu_fraction != res.client_cpu_fraction  # NaN
