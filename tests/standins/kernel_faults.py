"""Stand-in: a greedy model whose numerics break in one chosen way, for the stand-in half of the fault catalogue
(tests/power/catalogue.py ``STANDIN_FAULTS``, run by tests/power/test_standin_faults.py).

Answers are greedy, with a logprob and a top-5 at every position, the same for a prompt on every launch: a seeded
pseudo-vocabulary in which each position's choice depends on the prompt and on the tokens before it, as a real
model's does. At every position the five listed tokens sit at fixed distances below the choice: a near runner-up
0.03 nats down, then 1, 2.5 and 4 nats down, so "the reference's 5th choice, 4 nats down" exists everywhere. The
rest of the vocabulary holds the remaining probability, so each list sums to less than 1 as a softmax's does.

``--fault`` picks what breaks; each mode's line says what real fault it stands for and why no engine on this machine
produces it on demand:

* ``none``: healthy.
* ``first-token-flip``: a decode kernel off by 4 nats on one token. At position 1 (the first decode step; position
  0 comes from prefill) the healthy 5th choice's logit is 4.02 nats higher, so it is chosen, just above the healthy
  choice, which stays in this side's top-5: each side's token is in the other's top-5, so vLLM's
  ``check_logprobs_close`` passes it, while the healthy side puts the flipped token 4 nats below its choice. No CPU
  engine runs a decode kernel that can be broken at one position on purpose.
* ``batch-only-nan``: NaN only when several sequences share a batch (graph padding, FP8 scales over a batch): an
  answer whose request overlapped in time with another carries a null logprob for every token, chosen and listed
  (how SGLang serializes NaN); a request alone is clean. vLLM on CPU has no CUDA graphs and no batch-dependent NaN.
* ``batch-drift``: batch-dependent numerics: a batched answer has the same tokens, every logprob (chosen and
  listed) 0.5 nats lower. vLLM on CPU gives the same numbers batched or not; a drift of a chosen size cannot be
  provoked.
* ``drops-logprobs``: an engine or proxy that drops the logprobs it was asked for: none ever come back. vLLM
  always returns the logprobs it is asked for.
* ``rerun-flip``: nondeterministic greedy decode (a race in a kernel, uninitialised memory): from the second answer
  to the same prompt on, position 5 swaps the choice with the healthy 3rd choice (1 nat down), so a rerun differs.
  vLLM on CPU is deterministic at temperature 0.

Which requests were batched is decided by time, as an engine's scheduler does: in the two batch modes every
completion request is held for :data:`BATCH_WINDOW_S` and is batched when any other completion request was in flight
at any moment of its life. Requests sent one after another never overlap (the next is sent after this one's answer,
and a request leaves the in-flight set before its answer is written), whatever the host's speed.

Also serves ``/v1/models`` (the model name an attached server is reached by) and ``/health``; streamed requests
get greedy_logprobs.py's plain token stream (readiness, load).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import _http

FAULTS = ("none", "first-token-flip", "batch-only-nan", "batch-drift", "drops-logprobs", "rerun-flip")
BATCH_FAULTS = ("batch-only-nan", "batch-drift")

WORDS = (" the", " sea", " light", " keeper", " stone", " wind", " boat", " night", " bird", " road", " map",
         " door", " rain", " hill", " song", " fire", " salt", " glass", " bell", " field", " river", " cloud",
         " iron", " bread", " horse", " lamp", " snow", " tower", " shell", " rope", " moss", " gate")

#: The five listed tokens' logits relative to the choice: a near runner-up, then 1, 2.5 and 4 nats down.
TOP5_OFFSETS = (0.0, -0.03, -1.0, -2.5, -4.0)
#: The choice's logprob cycles through these (the rest of the vocabulary takes what the five leave): the five
#: listed probabilities then sum to 0.90, 0.81 and 0.73, below 1 as a softmax's top-k must.
CHOICE_LOGPROBS = (-1.0, -1.1, -1.2)
#: first-token-flip: the healthy 5th choice's logit ends this far above the healthy choice.
FLIP_MARGIN = 0.02
FLIP_POSITION = 1
RERUN_FLIP_POSITION = 5
BATCH_DRIFT_NATS = 0.5

#: How long a completion request is held in the batch modes, so that requests sent together overlap. The plugin's
#: concurrent batch (``LLMClient.complete_concurrently``) submits its 4 requests from 4 threads at once; they reach
#: this server within milliseconds, and a host busy enough to delay a thread by a scheduler slice or a GIL switch
#: (tens of ms) is still far inside 0.2 s. The batch is seen as one as soon as any two of its requests arrive within
#: the window, so a miss needs its arrivals spread over more than 3 windows (0.6 s). A slow host only makes
#: requests pile up more. The price is the window on every request of a batch-mode server (a few seconds per run).
BATCH_WINDOW_S = 0.2


@dataclass(frozen=True, slots=True)
class Step:
    """One position's distribution: the five listed tokens with their logits (best first) and the partition
    function over the whole pseudo-vocabulary, so ``logit - log(partition)`` is a logprob."""

    logits: tuple[tuple[str, float], ...]
    partition: float

    @property
    def chosen(self) -> str:
        return self.logits[0][0]

    def ranked(self, rank: int) -> str:
        """The token in place ``rank`` (0: the choice)."""
        return self.logits[rank][0]

    def logprob(self, token: str) -> float:
        return dict(self.logits)[token] - math.log(self.partition)

    def top(self) -> dict[str, float]:
        return {token: logit - math.log(self.partition) for token, logit in self.logits}

    def with_logit(self, token: str, logit: float) -> Step:
        """This step with ``token``'s logit moved (a kernel off on one token): the partition follows, the list
        is ranked again."""
        old = dict(self.logits)[token]
        moved = sorted(((t, logit if t == token else v) for t, v in self.logits), key=lambda kv: -kv[1])
        return Step(tuple(moved), self.partition - math.exp(old) + math.exp(logit))

    def swapped(self, a: str, b: str) -> Step:
        """This step with the logits of ``a`` and ``b`` exchanged (a race that mixes up two values)."""
        values = dict(self.logits)
        moved = sorted(((t, values[b] if t == a else values[a] if t == b else v) for t, v in self.logits),
                       key=lambda kv: -kv[1])
        return Step(tuple(moved), self.partition)


def healthy_step(context: str) -> Step:
    """The healthy distribution after ``context`` (the prompt and the tokens chosen so far)."""
    seed = zlib.crc32(context.encode())
    tokens = random.Random(seed).sample(WORDS, len(TOP5_OFFSETS))
    choice_logprob = CHOICE_LOGPROBS[seed % len(CHOICE_LOGPROBS)]
    return Step(tuple(zip(tokens, TOP5_OFFSETS, strict=True)), math.exp(-choice_logprob))


@dataclass(frozen=True, slots=True)
class Position:
    """What one answer position says: the chosen token, its logprob and the listed ones (None: NaN)."""

    token: str
    logprob: float | None
    top: dict[str, float | None]


def decode(prompt_key: str, n: int, fault: str, *, batched: bool = False, rerun: bool = False) -> list[Position]:
    """The greedy answer of ``n`` tokens to the prompt ``prompt_key`` under ``fault``. ``batched``: the request
    shared a batch; ``rerun``: the same prompt was answered before."""
    out: list[Position] = []
    text = ""
    for i in range(n):
        step = healthy_step(f"{prompt_key}\x00{text}")
        if fault == "first-token-flip" and i == FLIP_POSITION:
            step = step.with_logit(step.ranked(4), step.logits[0][1] + FLIP_MARGIN)
        elif fault == "rerun-flip" and rerun and i == RERUN_FLIP_POSITION:
            step = step.swapped(step.ranked(0), step.ranked(2))
        token = step.chosen
        text += token
        lp: float | None = step.logprob(token)
        top: dict[str, float | None] = dict(step.top())
        if batched and fault == "batch-drift":
            lp = step.logprob(token) - BATCH_DRIFT_NATS
            top = {t: v - BATCH_DRIFT_NATS for t, v in step.top().items()}
        elif batched and fault == "batch-only-nan":
            lp, top = None, dict.fromkeys(top)
        out.append(Position(token, lp, top))
    return out


@dataclass(eq=False)
class InFlight:
    """One completion request while it is in the server."""

    batched: bool = False


@dataclass
class ServerState:
    fault: str
    in_flight: set[InFlight] = field(default_factory=set)
    answered: Counter[str] = field(default_factory=Counter)  # answers given per prompt (rerun-flip)

    async def admit(self) -> InFlight:
        """Hold the request for the batch window (batch modes only); batched when another request was in flight
        at any moment of its life. It leaves the in-flight set before its answer is written."""
        request = InFlight()
        if self.fault not in BATCH_FAULTS:
            return request
        if self.in_flight:
            request.batched = True
            for other in self.in_flight:
                other.batched = True
        self.in_flight.add(request)
        try:
            await asyncio.sleep(BATCH_WINDOW_S)
        finally:
            self.in_flight.discard(request)
        return request


def _requested_top(body: dict[str, Any], chat: bool) -> int | None:
    """How many listed alternatives the request asks for (None: no logprobs asked for)."""
    if chat:
        return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
    value = body.get("logprobs")
    return None if value is None or value is False else int(value)


def _choice(pieces: list[Position], top_n: int | None, chat: bool) -> dict[str, Any]:
    text = "".join(p.token for p in pieces)
    logprobs: dict[str, Any] | None = None

    def listed(p: Position) -> list[tuple[str, float | None]]:
        return list(p.top.items())[:min(top_n or 0, len(p.top))]

    if top_n is not None and chat:
        logprobs = {"content": [{"token": p.token, "logprob": p.logprob,
                                 "top_logprobs": [{"token": t, "logprob": v} for t, v in listed(p)]}
                                for p in pieces]}
    elif top_n is not None:
        logprobs = {"tokens": [p.token for p in pieces], "token_logprobs": [p.logprob for p in pieces],
                    "top_logprobs": [dict(listed(p)) for p in pieces]}
    if chat:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": "length"}
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length"}


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--fault", choices=FAULTS, default="none")


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)
    state = ServerState(ns.fault)

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            _http.respond(writer, 200, b"")
        elif path == "/v1/models":
            _http.respond(writer, 200, {"object": "list", "data": [{"id": ns.model, "object": "model"}]})
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            chat = path.endswith("chat/completions")
            n = int(body.get("max_tokens") or 16)
            if body.get("stream"):
                await _http.stream_completion(writer, ns.model, n)
                return True
            prompt = str(body["messages"][-1]["content"]) if chat else str(body.get("prompt"))
            key = ("chat:" if chat else "text:") + prompt
            request = await state.admit()
            rerun = state.answered[key] > 0
            state.answered[key] += 1
            pieces = decode(key, n, ns.fault, batched=request.batched, rerun=rerun)
            top_n = None if ns.fault == "drops-logprobs" else _requested_top(body, chat)
            _http.respond(writer, 200, {"id": "cmpl-standin", "object": "text_completion", "model": ns.model,
                                        "choices": [_choice(pieces, top_n, chat)],
                                        "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                                  "total_tokens": 5 + n}})
        else:
            _http.respond(writer, 404, {"error": f"no route {path}"})
        return True

    return _http.run(ns, handler)


if __name__ == "__main__":
    sys.exit(main())
