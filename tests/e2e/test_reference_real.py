"""The matrix reference differential on the real vLLM CPU server: ``eager = [true, false]`` with
``reference = "eager=on"``; the eager server records its answers, the compiled one replays the prompts and is
compared with them (first divergence, top-k both ways, |Δlogprob| before it); both pass, one boot each, and
the recording is kept with the run's reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import boots_line, default_server_toml, expect_outcomes


def test_eager_is_the_reference_and_compiled_agrees_with_it(pytester: pytest.Pytester,
                                                            write_config: Callable[[str], Path]) -> None:
    write_config(default_server_toml("cpu", eager=None)
                 + '\n[matrix.cpu]\neager = [true, false]\nreference = "eager=on"\n')
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-suite", "-k", "matches_reference",
                                           "-rA", timeout=1200)
    out = result.stdout.str()
    expect_outcomes(result, passed=2)
    assert boots_line(out) == "server boots: 2 (cpu[eager=on], cpu[eager=off])", out[-3000:]
    run = (pytester.path / "llmserve-results" / "latest").resolve()
    rows = {row["server_id"]: row for row in json.loads((run / "results.json").read_text())["checks"]}
    assert str(rows["cpu[eager=on]"]["detail"]).startswith("recorded: cpu[eager=on] on vllm")
    table = str(rows["cpu[eager=off]"]["detail"])
    assert table.startswith("cpu[eager=off] vs cpu[eager=on] on vllm")
    print(table)  # the measured agreement, for the record (-s)
    saved = json.loads((run / "reference-answers" / "cpu.json").read_text())
    assert saved["combination"] == "cpu[eager=on]" and saved["engine"] == "vllm" and len(saved["answers"]) == 9
    # Greedy to at most 32 tokens: a chat answer may end at EOS sooner ("Paris."); each came back with logprobs.
    assert all(answer["status"] == 200 and 0 < len(answer["tokens"]) <= 32 for answer in saved["answers"])
