"""The oracles' probes sent to a server (gates/oracle_runs.py), over a mocked OpenAI-compatible server:
what each run sends, and the findings its verdicts make of the answers. ``FakeServer`` and ``client_for``
are shared with the other gates tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from pytest_llmserve.engines import adapter_named
from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.gates.oracle_runs import (
    run_batch_case,
    run_batch_reference,
    run_determinism,
    run_differential,
    run_known_answers,
    run_long_decode,
    run_nan_check,
)
from pytest_llmserve.verdicts.batch_sizes import BatchCase
from pytest_llmserve.verdicts.differential import compare_runs
from pytest_llmserve.verdicts.oracles import (
    DEFAULT_BATCH_PROMPTS,
    DEFAULT_DIFFERENTIAL_PROMPTS,
    DEFAULT_KNOWN_ANSWERS,
    DEFAULT_NAN_PROMPTS,
    ProbePrompt,
)
from tests.unit.verdicts.test_oracles import HEALTHY_PARAGRAPH, VLLM_NAN_400


class FakeServer:
    """Answers /v1/completions and /v1/chat/completions like vLLM, from a prompt -> behaviour table."""

    def __init__(self, *, nan_prompts: tuple[str, ...] = (), answer: str = "The capital of France is Paris.",
                 corrupted_after: float = 0.0, garbage: bool = False, flip_concurrent: bool = False,
                 stop_after: int | None = None, count_prompt: Callable[[str], int] | None = None,
                 diverge_on: Callable[[str], bool] | None = None) -> None:
        self.nan_prompts = nan_prompts
        # usage.prompt_tokens of a prompt (None: 5, whatever was sent), and the prompts whose answers this server
        # gets wrong from the third token on (a fault that shows on some prompts only)
        self.count_prompt = count_prompt
        self.diverge_on = diverge_on
        self.answer = answer
        self.corrupted = 0.0
        self.corrupted_after = corrupted_after
        self.garbage = garbage
        self.flip_concurrent = flip_concurrent
        self.stop_after = stop_after  # every answer stops (finish_reason "stop") after this many tokens
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
        finish = "length"
        if self.stop_after is not None and len(pieces) > self.stop_after:
            pieces, finish = pieces[:self.stop_after], "stop"
        if self.flip_concurrent and len(self.requests) > len(DEFAULT_BATCH_PROMPTS) and len(pieces) > 2:
            pieces[2] = " zebra"
        if self.diverge_on is not None and self.diverge_on(prompt) and len(pieces) > 2:
            pieces[2:] = [" zebra"] * (len(pieces) - 2)
        lps = [-0.3 - (i % 3) * 0.1 for i in range(len(pieces))]
        if chat:
            content = [{"token": p, "logprob": lp, "top_logprobs": [{"token": p, "logprob": lp},
                                                                    {"token": " the", "logprob": lp - 2}]}
                       for p, lp in zip(pieces, lps, strict=True)]
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": "".join(pieces)},
                                      "logprobs": {"content": content}, "finish_reason": finish}
        else:
            choice = {"text": "".join(pieces), "finish_reason": finish,
                      "logprobs": {"tokens": pieces, "token_logprobs": lps,
                                   "top_logprobs": [{p: lp, " the": lp - 2} for p, lp in zip(pieces, lps,
                                                                                               strict=True)]}}
        counted = self.count_prompt(prompt) if self.count_prompt is not None else 5
        return httpx.Response(200, json={"choices": [choice], "usage": {"prompt_tokens": counted,
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
    assert "scrambled's ' piece' is not in healthy's top-k (at least 2.000 nats below healthy's choice)" in message

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
    capped = run_long_decode(client_for(FakeServer()), "default", max_tokens=600)  # finish_reason "length"
    assert capped.ok
    assert any("ran to the engine's length cap after 246 of 600" in f.message for f in capped.warnings)
    # A wrong EOS id: every answer stops after 5 tokens. Truncation is an error, not coverage to note.
    truncated = run_long_decode(client_for(FakeServer(stop_after=5)), "wrong-eos", max_tokens=200)
    assert not truncated.ok
    assert "the decode stopped after 5 of 200 tokens (finish_reason='stop')" in truncated.message("wrong-eos")


def test_truncation_fails_the_differential_and_the_batch_cases() -> None:
    reference = client_for(FakeServer())
    report = run_differential(reference, client_for(FakeServer(stop_after=5)), name_ref="healthy",
                              name_cand="wrong-eos")
    assert not report.ok
    assert "identical for 5 token(s), then wrong-eos stopped (finish_reason='stop') while healthy ran to length " \
           "(32 tokens): truncated" in report.message(full=True)
    # batch 3 on a server whose batched answers stop early, against its healthy batch-1 answers
    server = FakeServer()
    client = client_for(server)
    ref = run_batch_reference(client, "default").completions
    server.stop_after = 4
    case = run_batch_case(client, BatchCase(3, "padded", 4, 8), ref, "default")
    assert not case.ok
    assert "then bs=3-padded-to-4 #1 stopped" in case.message(full=True)


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
    assert "' zebra' is not in bs=1 reference's top-k" in message


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


def test_report_message_uses_the_recorded_server_id() -> None:
    report = run_known_answers(client_for(FakeServer(answer="The capital of France is Lyon.")),
                               DEFAULT_KNOWN_ANSWERS[:1], "smollm2[eager=on]")
    assert report.server_id == "smollm2[eager=on]"
    message = report.message()
    assert message.startswith("known-answers FAILED on server smollm2[eager=on]: 1 error(s)")
    assert "sent: prompt=[{'role': 'user', 'content': 'What is the capital of France?" in message
    assert "got 'The capital of France is Lyon.'; no expected answer is begun in it" in message
