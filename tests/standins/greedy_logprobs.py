"""Stand-in: greedy answers with logprobs and top-k alternatives, the same for a prompt on every launch.

For the reference differential (``test_matches_reference``): a matrix over ``args`` launches this server with
``--skew none`` (the reference), ``--skew near-tie`` (at token 6 it takes the runner-up, 0.05 nats below on both
sides, with logprobs 0.02 off before it: a healthy kernel difference; past the differential's first 4 tokens, where
a near-tie in every answer would be a pattern, not chance) or ``--skew broken`` (from
token 1 a token outside the reference's top-k: a broken kernel). No CPU engine can be made to break one
configuration's numerics on purpose, which is why this is a stand-in.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import zlib
from typing import Any

import _http

WORDS = [" the", " sea", " light", " keeper", " stone", " wind", " boat", " night", " bird", " road", " map",
         " door", " rain", " hill", " song", " fire", " salt", " glass", " bell", " field"]


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--skew", choices=["none", "near-tie", "broken"], default="none")


def answer(prompt: str, n: int, skew: str) -> list[tuple[str, float, dict[str, float]]]:
    seed = zlib.crc32(prompt.encode())
    out = []
    for i in range(n):
        first, second = WORDS[(seed + i) % len(WORDS)], WORDS[(seed + i + 7) % len(WORDS)]
        lp = -1.0 - 0.1 * (i % 3)
        top = {first: lp, second: lp - 0.05, " and": lp - 2.0}
        if skew == "near-tie" and i < 6:
            lp = top[first] = lp + 0.02
        elif skew == "near-tie" and i == 6:
            first, lp, top = second, lp - 0.04, {second: lp - 0.04, first: lp - 0.05, " and": lp - 2.0}
        elif skew == "broken" and i >= 1:
            first, lp, top = " zzz", -0.1, {" zzz": -0.1, " qqq": -3.0}
        out.append((first, lp, top))
    return out


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            _http.respond(writer, 200, b"")
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            chat = path.endswith("chat/completions")
            prompt = body["messages"][-1]["content"] if chat else str(body.get("prompt"))
            n = int(body.get("max_tokens") or 16)
            if body.get("stream"):
                await _http.stream_completion(writer, ns.model, n)
                return True
            pieces = answer(prompt, n, ns.skew)
            text = "".join(t for t, _, _ in pieces)
            if chat:
                content = [{"token": t, "logprob": lp, "top_logprobs": [{"token": k, "logprob": v} for k, v in top.items()]}
                           for t, lp, top in pieces]
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                          "logprobs": {"content": content}, "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length",
                          "logprobs": {"tokens": [t for t, _, _ in pieces],
                                       "token_logprobs": [lp for _, lp, _ in pieces],
                                       "top_logprobs": [top for _, _, top in pieces]}}
            _http.respond(writer, 200, {"id": "cmpl-standin", "object": "text_completion", "model": ns.model,
                                        "choices": [choice],
                                        "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
        else:
            _http.respond(writer, 404, {"error": f"no route {path}"})
        return True

    return _http.run(ns, handler)


if __name__ == "__main__":
    sys.exit(main())
