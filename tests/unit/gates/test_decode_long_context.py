"""A DSA model's long-context probes in DecodeCheck: on by default where the model's config.json has index_topk,
recorded and replayed by the matrix reference, mixed into the batch cases; a fault that changes only the selection
fails on them and passes on the short prompts; a probe the server counted short of index_topk is unverifiable,
never a pass."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.gates.decode import DecodeCheck, ReferencePlan, _batch_pool, long_context_probes
from pytest_llmserve.store import reference_answers as store
from pytest_llmserve.verdicts.batch_sizes import BatchCase
from pytest_llmserve.verdicts.long_context import long_context_prompts
from pytest_llmserve.verdicts.oracles import DEFAULT_BATCH_PROMPTS, DEFAULT_DIFFERENTIAL_PROMPTS
from tests.unit.gates.test_decode import Failed, FakeHandle
from tests.unit.gates.test_decode_records import Skipped, finish
from tests.unit.gates.test_oracle_runs import FakeServer

TOPK = 64  # small, so the probes stay small: 80, 128 and 256 tokens


def model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "model"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def dsa_spec(tmp_path: Path, backend: str = "flashmla_sparse", **changes: Any) -> ServerSpec:
    spec = ServerSpec(name="dsa", engine="sglang", model=str(model_dir(tmp_path, {"index_topk": TOPK})),
                      attention_backend="dsa", variant=(("nsa_decode_backend", backend),))
    return replace(spec, **changes)


def counted(prompt: str) -> int:
    """Tokens as SmolLM2 counts the probes' text (8 a sentence of 7 words), at least 5."""
    return max(5, len(prompt.split()) * 8 // 7)


def is_long(prompt: str) -> bool:
    return "lives near the" in prompt


def _check(spec: ServerSpec, server: FakeServer, plan: ReferencePlan | None, records: list[dict[str, Any]]
           ) -> DecodeCheck:
    return DecodeCheck(FakeHandle(spec, server), records=records, reference_plan=plan)


def test_a_dsa_model_gets_the_probes_and_another_model_none(tmp_path: Path) -> None:
    spec = dsa_spec(tmp_path)
    assert long_context_probes((spec, None)) == long_context_prompts(TOPK)
    assert [p.name for p in long_context_prompts(TOPK)] == ["long-80", "long-128", "long-256"]
    plain = replace(spec, model=str(model_dir(tmp_path / "x", {"num_hidden_layers": 4})))
    asked: list[int] = []

    def facts() -> Any:  # never read: the model's own config is here and has no index_topk
        asked.append(1)
        return None

    assert long_context_probes((plain, facts)) == ()
    assert asked == []
    assert long_context_probes((replace(spec, long_context_probes=False), None)) == ()
    # Both sides of a comparison must select: the larger index_topk decides.
    bigger = replace(spec, model=str(model_dir(tmp_path / "y", {"index_topk": 2048})))
    assert long_context_probes((spec, None), (bigger, None)) == long_context_prompts(2048)


def test_probes_asked_for_without_an_index_topk_fail_naming_the_option(tmp_path: Path) -> None:
    spec = replace(dsa_spec(tmp_path), model=str(model_dir(tmp_path, {})), long_context_probes=True)
    records: list[dict[str, Any]] = []
    with pytest.raises(Failed, match="long_context_probes = true for dsa\\[nsa_decode_backend=flashmla_sparse\\], "
                                     "but no index_topk is known"):
        _check(spec, FakeServer(count_prompt=counted), ReferencePlan(spec, tmp_path), records).matches_reference()


def test_the_reference_records_the_probes_and_a_healthy_replay_shows_selection(tmp_path: Path) -> None:
    ref = dsa_spec(tmp_path)
    plan = ReferencePlan(ref, tmp_path / "run")
    records: list[dict[str, Any]] = []
    _check(ref, FakeServer(count_prompt=counted), plan, records).matches_reference()
    saved = store.load(store.answers_file(tmp_path / "run", "dsa"))
    assert [p.name for p in saved.prompts[len(DEFAULT_DIFFERENTIAL_PROMPTS):]] == ["long-80", "long-128", "long-256"]
    assert all(p.min_context_tokens == TOPK + TOPK // 8 for p in saved.prompts[-3:])

    candidate = dsa_spec(tmp_path, "flashmla_kv")
    served = FakeServer(count_prompt=counted)
    _check(candidate, served, plan, records).matches_reference()
    assert len(served.requests) == 12
    assert [r["verdict"] for r in records[-2:]] == ["pass", "pass"]
    assert records[-1]["check"] == "reference differential (sparse selection)"
    assert "long-256: 268 tokens of context, reached sparse selection (needs more than 72)" in records[-1]["detail"]


def test_a_fault_in_selection_fails_on_the_long_probes_and_only_there(tmp_path: Path) -> None:
    """What a smaller index_topk on the same weights does: the short prompts keep every token either way and agree;
    the long ones select differently and diverge."""
    ref = dsa_spec(tmp_path)
    plan = ReferencePlan(ref, tmp_path / "run")
    records: list[dict[str, Any]] = []
    _check(ref, FakeServer(count_prompt=counted), plan, records).matches_reference()
    with pytest.raises(Failed):
        _check(dsa_spec(tmp_path, "topk-fault"), FakeServer(count_prompt=counted, diverge_on=is_long), plan,
               records).matches_reference()
    errors = [f for f in records[-1]["findings"] if f["severity"] == "error"]
    assert sorted({f["probe"] for f in errors}) == ["differential[long-128]", "differential[long-256]",
                                                    "differential[long-80]"]


def test_a_probe_counted_short_of_index_topk_is_unverifiable_not_a_pass(tmp_path: Path) -> None:
    """A server whose tokenizer counts fewer tokens (or that truncated the prompt): the answers agree, but they say
    nothing about selection."""
    ref = dsa_spec(tmp_path)
    plan = ReferencePlan(ref, tmp_path / "run")
    records: list[dict[str, Any]] = []
    _check(ref, FakeServer(), plan, records).matches_reference()  # prompt_tokens 5 for every prompt
    check = _check(dsa_spec(tmp_path, "flashmla_kv"), FakeServer(), plan, records)
    check.matches_reference()
    assert records[-2]["verdict"] == "pass" and records[-1]["verdict"] == "unverifiable"
    with pytest.raises(Skipped, match=r"unverifiable: 3 of 3 long-context probes did not reach sparse selection, so "
                                      r"reference differential says nothing about the token selection there"):
        finish(check)


def test_the_batch_pool_mixes_the_probes_into_every_batch_of_two_or_more() -> None:
    long = long_context_prompts(TOPK)
    pool = _batch_pool(long)
    assert len(pool) == len(DEFAULT_BATCH_PROMPTS) + 3
    assert [p.name for p in pool if p.min_context_tokens] == ["long-80", "long-128", "long-256"]
    assert pool[0] == long[0] and pool[3] == long[1] and pool[6] == long[2]
    assert _batch_pool(()) == DEFAULT_BATCH_PROMPTS


def test_the_batch_cases_send_the_probes_and_show_their_reach(tmp_path: Path) -> None:
    spec = dsa_spec(tmp_path)
    records: list[dict[str, Any]] = []
    server = FakeServer(count_prompt=counted)
    _check(spec, server, None, records).batch_case(BatchCase(4, "no-graph"))
    assert sum(is_long(r["prompt"]) for r in server.requests if "prompt" in r) == 3 + 2  # the bs=1 pool + the batch
    assert [r["verdict"] for r in records[-2:]] == ["pass", "pass"]
    assert records[-1]["check"] == "batch[bs=4-no-graph] (sparse selection)"
