"""Stand-in: an OpenAI-compatible server that answers like a model with random weights.

Every answer is a deterministic function of the prompt and the seed (greedy answers repeat exactly, batched
or not), made of word-like tokens with logprobs near -8: on a trained model's coherence oracles that is
"the model is guessing", which is what a random-weight checkpoint says. ``--first-bad`` makes the first
non-streamed completion with logprobs break an invariant (usage.completion_tokens one above max_tokens) and every later
one healthy: a failure that a replay of the same request does not reproduce. A real engine cannot be made
to do that on demand. Serves /health, /metrics, /v1/models, /v1/completions and /v1/chat/completions
(streamed or not), honouring max_tokens and stop sequences.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from typing import Any

import _http

SYLLABLES = ("zq", "vlar", "ost", "mek", "thu", "pra", "ind", "olv", "sek", "rua", "bix", "nom")


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--first-bad", action="store_true", help="the first non-streamed completion is broken")


def tokens_for(prompt: str, seed: Any, n: int) -> list[tuple[str, float]]:
    out = []
    for i in range(n):
        digest = hashlib.sha256(f"{prompt}|{seed}|{i}".encode()).digest()
        out.append((" " + SYLLABLES[digest[0] % len(SYLLABLES)] + SYLLABLES[digest[1] % len(SYLLABLES)],
                    -7.5 - digest[2] / 255))
    return out


def generate(body: dict[str, Any], prompt: str) -> tuple[list[tuple[str, float]], str, str]:
    """(tokens, text, finish_reason), the text cut before the first stop sequence."""
    n = int(body.get("max_tokens") or 16)
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    toks: list[tuple[str, float]] = []
    text = ""
    for tok in tokens_for(prompt, body.get("seed"), n):
        joined = text + tok[0]
        hits = [joined.find(s) for s in stops if s and s in joined]
        if hits:
            return toks, joined[:min(hits)], "stop"
        toks.append(tok)
        text = joined
    return toks, text, "length"


def logprobs(toks: list[tuple[str, float]], chat: bool) -> dict[str, Any]:
    if chat:
        return {"content": [{"token": t, "logprob": lp, "top_logprobs": [{"token": t, "logprob": lp}]}
                            for t, lp in toks]}
    return {"tokens": [t for t, _ in toks], "token_logprobs": [lp for _, lp in toks],
            "top_logprobs": [{t: lp} for t, lp in toks]}


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)
    state = {"plain": 0}

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            _http.respond(writer, 200, b"")
            return True
        if path == "/metrics":
            _http.respond(writer, 200, b"# no counters\n")
            return True
        if path == "/v1/models":
            _http.respond(writer, 200, {"object": "list", "data": [{"id": ns.model, "object": "model"}]})
            return True
        chat = path == "/v1/chat/completions"
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            _http.respond(writer, 404, {"error": f"no route {path}"})
            return True
        prompt = body["messages"][-1]["content"] if chat else str(body.get("prompt"))
        toks, text, finish = generate(body, prompt)
        usage = {"prompt_tokens": max(1, len(prompt.split())), "completion_tokens": len(toks)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        want_lp = bool(body.get("logprobs"))
        if not body.get("stream"):
            if not chat and want_lp:  # the plugin's readiness probe asks for no logprobs: not counted
                state["plain"] += 1
                if ns.first_bad and state["plain"] == 1:
                    print("injected: usage one above max_tokens in the first non-streamed answer", flush=True)
                    usage = dict(usage, completion_tokens=int(body.get("max_tokens") or 16) + 1)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                                      "logprobs": logprobs(toks, chat) if want_lp else None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            _http.respond(writer, 200, {"id": "x", "object": "text_completion", "model": ns.model,
                                        "choices": [choice], "usage": usage})
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        # The text split as the tokens made it; a stop sequence may have cut it inside a token.
        pieces, pos = [], 0
        for tok, _ in toks:
            pieces.append(text[pos:pos + len(tok)])
            pos += len(tok)
        if pos < len(text):
            pieces = pieces[:-1] + [(pieces[-1] if pieces else "") + text[pos:]]
        for i, piece in enumerate(pieces or [""]):
            last = i == max(len(pieces), 1) - 1
            lp = logprobs([toks[i]], False) if want_lp and i < len(toks) else None
            choice = {"index": 0, "text": piece, "finish_reason": finish if last else None, "logprobs": lp}
            writer.write(_chunk({"id": "x", "object": "text_completion", "model": ns.model, "choices": [choice]}))
        writer.write(_chunk({"id": "x", "object": "text_completion", "model": ns.model, "choices": [],
                             "usage": usage}))
        writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
        return True

    return _http.run(ns, handler)


def _chunk(obj: Any) -> bytes:
    event = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return b"%x\r\n" % len(event) + event + b"\r\n"


if __name__ == "__main__":
    sys.exit(main())
