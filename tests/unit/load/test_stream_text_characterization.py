"""Characterization of decode_stream_text (load/transport.py), pinned before it was split into its steps (issue 36):
the text, the per-chunk pieces and the count of bad logprobs of streams that hold every kind of line a server (or a
broken one) sends."""

from __future__ import annotations

import json

import pytest

from pytest_llmserve.load.transport import decode_stream_text


def data(event: object) -> bytes:
    return b"data: " + json.dumps(event).encode()


def choice(**fields: object) -> bytes:
    return data({"choices": [fields]})


EVERY_KIND = [
    b": keep-alive comment",
    b"data: {not json",
    data([1, 2]),  # an event that is not an object
    data({"x": 1}),  # no choices
    data({"choices": []}),
    data({"choices": [1]}),  # a choice that is not an object
    choice(text="Hello", logprobs={"token_logprobs": [-0.5]}),
    choice(text=" wor", logprobs={"token_logprobs": [None, float("nan")]}),  # NaN is written as the NaN token
    choice(delta={"content": "ld"}),  # chat
    choice(delta={"role": "assistant"}),  # chat, no content: an empty piece
    choice(delta="not an object"),
    choice(text="", logprobs={"token_logprobs": [True, "x", float("-inf"), 0]}),
    choice(text=7),  # not text: an empty piece
    choice(text="!", finish_reason="length"),  # a last piece with its finish reason
    choice(text="", finish_reason="stop", logprobs={"token_logprobs": [None]}),  # a finish marker: skipped
    choice(text="?", logprobs={"token_logprobs": None}),
    choice(text=".", logprobs={"content": []}),  # chat-style logprobs: not counted
    b"data: [DONE]",
]


@pytest.mark.parametrize(("lines", "separator", "expected"), [
    (EVERY_KIND, b"\n\n", ("Hello world!?.", ["Hello", " wor", "ld", "", "", "", "", "!", "?", "."], 4)),
    (EVERY_KIND, b"\r\n", ("Hello world!?.", ["Hello", " wor", "ld", "", "", "", "", "!", "?", "."], 4)),
    ([choice(text="a"), choice(delta={"content": "b"})], b"\n", ("ab", ["a", "b"], None)),
    ([choice(text="a", logprobs={"token_logprobs": []})], b"\n", ("a", ["a"], 0)),
    ([], b"\n", ("", [], None)),
])
def test_text_pieces_and_bad_logprobs(lines: list[bytes], separator: bytes,
                                      expected: tuple[str, list[str], int | None]) -> None:
    assert decode_stream_text(separator.join(lines)) == expected
