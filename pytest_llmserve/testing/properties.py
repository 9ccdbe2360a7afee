"""Property checks over the OpenAI-compatible API: the invariants one request must keep, whatever it asks.

Each check takes an :class:`~pytest_llmserve.evidence.client.LLMClient` and one :class:`ApiExample` (prompt,
``max_tokens``, stop sequences, temperature / top_p / seed), sends it, and returns an
:class:`~pytest_llmserve.verdicts.findings.OracleReport` whose findings say what broke. The invariants:

* no error: HTTP 200, a finish reason of ``stop`` or ``length``, a complete stream ending in ``[DONE]``;
* no NaN: no HTTP 400/500 about NaN/inf, no non-finite, null or sentinel logprob (logprobs are requested
  on every request, streamed or not);
* ``max_tokens`` respected: ``usage.completion_tokens <= max_tokens``, ``finish_reason == "length"`` only
  at exactly ``max_tokens``;
* stop sequences respected: no stop string in the returned text, and a reported ``stop_reason`` string
  is one of those sent;
* usage consistent with the output: one logprob entry per counted completion token (in the stream: one
  per streamed token), exactly one usage chunk when ``stream_options.include_usage`` is set, and the
  same prompt/completion counts streamed and not;
* streamed equals non-streamed when the request is reproducible (temperature 0, or a seed the engine
  honours): same text, same tokens, same finish reason (a seeded sampled request whose non-streamed answer
  itself changes when sent again gives a warning: the engine ignores the seed, which
  :func:`check_seeded_repeatable` reports);
* seeded sampling is repeatable: the same seeded request twice gives the same tokens.

No pytest import here: :func:`api_examples` and :func:`seeded_examples` build Hypothesis strategies
(imported lazily) for the built-in suite's property tests, and for users' own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import LLMClient, StreamedCompletion
from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.verdicts.findings import Finding, OracleReport, TokenAt
from pytest_llmserve.verdicts.oracles import response_findings

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

ORACLE = "property"


# --------------------------------------------------------------------------------------------------
# one example
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ApiExample:
    """One /v1/completions request: what a property test sends."""

    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int = 1

    @property
    def reproducible(self) -> bool:
        """Greedy, or seeded: two identical requests must give identical output."""
        return self.temperature == 0 or self.seed is not None

    def describe(self) -> str:
        parts = [f"prompt={_short(self.prompt)}", f"max_tokens={self.max_tokens}"]
        if self.stop:
            parts.append(f"stop={list(self.stop)!r}")
        parts.append(f"temperature={self.temperature:g}")
        if self.top_p != 1.0:
            parts.append(f"top_p={self.top_p:g}")
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return " ".join(parts)

    def send(self, client: LLMClient) -> Completion:
        """The non-streamed request (raises :class:`RequestError` on a transport failure)."""
        extra: dict[str, Any] = {} if self.top_p == 1.0 else {"top_p": self.top_p}  # **kwargs for the body
        return client.complete(self.prompt, self.max_tokens, temperature=self.temperature,
                               logprobs=self.logprobs, seed=self.seed, stop=list(self.stop) or None, **extra)

    def stream(self, client: LLMClient) -> StreamedCompletion:
        """The same request, streamed with ``stream_options.include_usage``."""
        body: dict[str, object] = {"model": client.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                                   "temperature": self.temperature, "logprobs": self.logprobs}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.top_p != 1.0:
            body["top_p"] = self.top_p
        return stream_completion(client, body)


def _short(value: object, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------
# streaming
# --------------------------------------------------------------------------------------------------

def stream_completion(client: LLMClient, body: dict[str, object],
                      timeout_s: float | None = None) -> StreamedCompletion:
    """POST ``body`` to /v1/completions streamed, joined into one :class:`StreamedCompletion` (the
    client's :meth:`~pytest_llmserve.evidence.client.LLMClient.stream`: counted as request time, and
    answered from the client's requests sent ahead when it has them)."""
    return client.stream(body, timeout_s)


# --------------------------------------------------------------------------------------------------
# invariants of one response
# --------------------------------------------------------------------------------------------------

def _finding(message: str, c: Completion | None, probe: str, tokens: Sequence[TokenAt] = ()) -> Finding:
    return Finding(ORACLE, "error", message, tuple(tokens), c.describe() if c is not None else "", probe)


def output_findings(c: Completion, ex: ApiExample, *, probe: str = "") -> list[Finding]:
    """``max_tokens``, stop sequences and usage counts of one successful response."""
    if not c.ok:
        return []  # reported by response_findings
    out: list[Finding] = []
    n = c.completion_tokens
    if n is None:
        out.append(_finding("the response has no usage.completion_tokens", c, probe))
    else:
        if n > ex.max_tokens:
            out.append(_finding(f"usage.completion_tokens = {n} exceeds max_tokens = {ex.max_tokens}", c,
                                probe))
        if c.finish_reason == "length" and n != ex.max_tokens:
            out.append(_finding(f"finish_reason 'length' after {n} tokens, but max_tokens = {ex.max_tokens}",
                                c, probe))
        if c.tokens and len(c.tokens) != n:  # none at all: transport_findings fails them for missing logprobs
            last = max(0, len(c.tokens) - 3)
            out.append(_finding(f"usage counts {n} completion tokens but {len(c.tokens)} came back with "
                                "logprobs (one entry per generated token expected)", c, probe,
                                [TokenAt.of(i, t) for i, t in enumerate(c.tokens[last:], last)]))
    if c.prompt_tokens is None or c.prompt_tokens < 1:
        out.append(_finding(f"usage.prompt_tokens = {c.prompt_tokens!r} for a non-empty prompt", c, probe))
    for stop in ex.stop:
        at = c.text.find(stop)
        if at >= 0:
            out.append(_finding(f"the text contains the stop sequence {stop!r} at character {at}: "
                                f"{_short(c.text[max(0, at - 40):at + 40])}", c, probe))
    if isinstance(c.matched_stop, str) and c.matched_stop not in ex.stop:
        out.append(_finding(f"stop_reason {c.matched_stop!r} is not one of the stop sequences sent "
                            f"{list(ex.stop)!r}", c, probe))
    return out


def stream_findings(s: StreamedCompletion, *, probe: str = "") -> list[Finding]:
    """How the stream itself behaved: [DONE], one usage chunk, one finish reason."""
    c = s.completion
    if not c.ok:
        return []
    out: list[Finding] = []
    if not s.done:
        out.append(_finding(f"the stream ended without 'data: [DONE]' after {s.chunks} chunks", c, probe))
    if s.usage_chunks != 1:
        out.append(_finding(f"{s.usage_chunks} chunks carried usage (stream_options.include_usage asks for "
                            "exactly one, the last)", c, probe))
    if len(s.finish_reasons) != 1:
        out.append(_finding(f"the stream reported {len(s.finish_reasons)} finish reasons "
                            f"{s.finish_reasons!r} (exactly one expected)", c, probe))
    return out


def _first_token_difference(a: Sequence[TokenLogprob], b: Sequence[TokenLogprob]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.token != y.token:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement_findings(a: Completion, b: Completion, *, name_a: str, name_b: str, why: str,
                       probe: str = "") -> list[Finding]:
    """Two answers to the same reproducible request must be identical (tokens, text, finish, usage)."""
    if not a.ok or not b.ok:
        return []
    out: list[Finding] = []
    i = _first_token_difference(a.tokens, b.tokens) if a.tokens and b.tokens else None
    if i is not None:
        evidence = [TokenAt.of(i, t.tokens[i]) for t in (a, b) if i < len(t.tokens)]
        out.append(_finding(f"{name_b} differs from {name_a} at token {i} ({why}): "
                            f"{name_a} {_tok(a, i)} vs {name_b} {_tok(b, i)}; texts {_short(a.text)} vs "
                            f"{_short(b.text)}", b, probe, evidence))
    elif a.text != b.text:
        at = next((k for k, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y),
                  min(len(a.text), len(b.text)))
        out.append(_finding(f"same tokens but the text of {name_b} differs from {name_a} at character {at} "
                            f"({why}): {_short(a.text[at:at + 60])} vs {_short(b.text[at:at + 60])}", b,
                            probe))
    if (a.finish_reason, a.completion_tokens, a.prompt_tokens) != (b.finish_reason, b.completion_tokens,
                                                                   b.prompt_tokens):
        out.append(_finding(f"{name_a} finished {a.finish_reason!r} with usage prompt={a.prompt_tokens} "
                            f"completion={a.completion_tokens}, {name_b} {b.finish_reason!r} with prompt="
                            f"{b.prompt_tokens} completion={b.completion_tokens} ({why})", b, probe))
    return out


def _tok(c: Completion, i: int) -> str:
    if i >= len(c.tokens):
        return f"<end after {len(c.tokens)} tokens>"
    t = c.tokens[i]
    if t.logprob is None or not math.isfinite(t.logprob):
        return repr(t.token)
    return f"{t.token!r} ({t.logprob:.3f})"


# --------------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------------

def _transport(exc: RequestError, probe: str) -> Finding:
    return Finding("transport", "error", f"request raised {exc} (is the server still alive? see its log)",
                   probe=probe)


def check_api_example(client: LLMClient, ex: ApiExample, server_id: str = "") -> OracleReport:
    """Send ``ex`` non-streamed and streamed; check each response's invariants and, when the request
    is reproducible, that both give the same output."""
    report = OracleReport(f"api-properties[{ex.describe()}]", server_id=server_id)
    try:
        plain = ex.send(client)
    except RequestError as exc:
        return report.add([_transport(exc, "non-streamed")])
    report.completions.append(plain)
    report.add(response_findings(plain, probe="non-streamed", text_symptoms=False))
    report.add(output_findings(plain, ex, probe="non-streamed"))
    try:
        streamed = ex.stream(client)
    except RequestError as exc:
        return report.add([_transport(exc, "streamed")])
    report.completions.append(streamed.completion)
    report.add(response_findings(streamed.completion, probe="streamed", text_symptoms=False))
    report.add(output_findings(streamed.completion, ex, probe="streamed"))
    report.add(stream_findings(streamed, probe="streamed"))
    if ex.reproducible:
        why = "temperature 0" if ex.temperature == 0 else f"seed {ex.seed}"
        differ = agreement_findings(plain, streamed.completion, name_a="non-streamed", name_b="streamed",
                                    why=why, probe="streamed vs non-streamed")
        if differ and ex.temperature != 0:
            differ = _unless_seed_ignored(client, ex, plain, differ, report)
        report.add(differ)
    return report


def _unless_seed_ignored(client: LLMClient, ex: ApiExample, plain: Completion, differ: list[Finding],
                         report: OracleReport) -> list[Finding]:
    """A seeded sampled request's stream differs from its non-streamed answer: that is a streaming fault
    only if the engine reproduces the request at all. The non-streamed request is sent once more; when it
    too differs, the engine does not honour ``seed`` for this request (a deviation that
    :func:`check_seeded_repeatable` reports), and the difference is a warning here, not an error."""
    try:
        again = ex.send(client)
    except RequestError as exc:
        return [*differ, _transport(exc, "non-streamed, sent again")]
    report.completions.append(again)
    if not agreement_findings(plain, again, name_a="non-streamed", name_b="non-streamed again",
                              why=f"seed {ex.seed}"):
        return differ
    note = ("the engine does not reproduce this seeded request (sent twice non-streamed: different answers), "
            "so streamed vs non-streamed cannot be compared; seeded repeatability is reported by "
            "check_seeded_repeatable: ")
    return [replace(f, severity="warning", message=note + f.message) for f in differ]


def check_seeded_repeatable(client: LLMClient, ex: ApiExample, server_id: str = "") -> OracleReport:
    """The same seeded (sampled) request twice: the tokens must be the same."""
    if ex.seed is None:
        raise ValueError("check_seeded_repeatable needs an example with a seed")
    report = OracleReport(f"seeded-sampling[{ex.describe()}]", server_id=server_id)
    try:
        first = ex.send(client)
        second = ex.send(client)
    except RequestError as exc:
        return report.add([_transport(exc, "seeded")])
    report.completions.extend([first, second])
    for label, c in (("run 1", first), ("run 2", second)):
        report.add(response_findings(c, probe=label, text_symptoms=False))
        report.add(output_findings(c, ex, probe=label))
    report.add(agreement_findings(first, second, name_a="run 1", name_b="run 2", why=f"seed {ex.seed}",
                                  probe="run 2 vs run 1"))
    return report


# --------------------------------------------------------------------------------------------------
# Hypothesis strategies (hypothesis is imported lazily)
# --------------------------------------------------------------------------------------------------

# Natural prompts keep some examples on the model's home ground; words and raw Unicode explore the rest.
SEED_PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "Q: What is two plus two?\nA:",
    "Translate to French: good morning",
    "The weather today is",
    "<html><body>",
)
WORDS = ("the", "cat", "river", "quantum", "blue", "seven", "and", "is", "of", "Paris", "running", "why",
         "data", "42", "hello", "world", "ice", "über", "naïve", "東京", "😀", "-", "?", "\n")
# Stop strings that occur often in English output, so stops really trigger.
COMMON_STOPS = (".", ",", "\n", " the", "e", " a", "!", "?", " and", ":")


def prompt_texts() -> SearchStrategy[str]:
    """Prompt texts: a few natural prompts, runs of words, and raw Unicode (no control characters or
    surrogates), 1-120 characters."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis import strategies as st

    letters = st.characters(categories=("L", "M", "N", "P", "S", "Zs"))
    raw = st.text(alphabet=letters, min_size=1, max_size=120)
    words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=20).map(" ".join)
    return st.one_of(st.sampled_from(SEED_PROMPTS), words, raw)


def stop_sequences() -> SearchStrategy[tuple[str, ...]]:
    """Zero to three distinct stop strings, common ones and short random ones."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis import strategies as st

    short = st.text(alphabet=st.characters(categories=("L", "N", "P", "Zs")), min_size=1, max_size=4)
    return st.lists(st.one_of(st.sampled_from(COMMON_STOPS), short), max_size=3, unique=True).map(tuple)


def api_examples(max_tokens: tuple[int, int] = (1, 32)) -> SearchStrategy[ApiExample]:
    """Requests over the API's sampling surface: prompt, ``max_tokens``, stop sequences, greedy or sampled
    temperature, ``top_p``, with or without a seed."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis import strategies as st

    temperature = st.one_of(st.just(0.0), st.floats(0.1, 1.5).map(lambda t: round(t, 2)))
    top_p = st.one_of(st.just(1.0), st.floats(0.1, 1.0).map(lambda p: round(p, 2)))
    seed = st.one_of(st.none(), st.integers(0, 2**31 - 1))
    return st.builds(ApiExample, prompt=prompt_texts(), max_tokens=st.integers(*max_tokens),
                     stop=stop_sequences(), temperature=temperature, top_p=top_p, seed=seed)


def seeded_examples(max_tokens: tuple[int, int] = (4, 32)) -> SearchStrategy[ApiExample]:
    """Sampled (temperature > 0), seeded requests, for :func:`check_seeded_repeatable`."""
    # lazy: hypothesis takes ~155 ms to import (-X importtime); only the API property checks need it
    from hypothesis import strategies as st

    return st.builds(ApiExample, prompt=prompt_texts(), max_tokens=st.integers(*max_tokens),
                     stop=st.just(()), temperature=st.floats(0.3, 1.5).map(lambda t: round(t, 2)),
                     top_p=st.one_of(st.just(1.0), st.floats(0.5, 1.0).map(lambda p: round(p, 2))),
                     seed=st.integers(0, 2**31 - 1))


__all__ = [
    "ApiExample", "StreamedCompletion", "agreement_findings", "api_examples", "check_api_example",
    "check_seeded_repeatable", "output_findings", "prompt_texts", "seeded_examples", "stop_sequences",
    "stream_completion", "stream_findings",
]
