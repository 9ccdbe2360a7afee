"""DecodeCheck.matches_reference: the reference records, the other combinations replay and compare."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.gates.decode import REFERENCE_MAX_TOKENS, DecodeCheck, ReferencePlan
from pytest_llmserve.store import reference_answers as store
from tests.unit.gates.test_decode import Failed, FakeHandle
from tests.unit.gates.test_decode_records import Skipped, finish
from tests.unit.gates.test_oracle_runs import FakeServer

REF = ServerSpec(name="dsa", model="/models/dsa-tiny", variant=(("nsa_decode_backend", "flashmla_sparse"),))
KV = replace(REF, variant=(("nsa_decode_backend", "flashmla_kv"),))
BROKEN = replace(REF, variant=(("nsa_decode_backend", "broken"),))




def _check(spec: ServerSpec, server: FakeServer, plan: ReferencePlan | None, records: list[dict[str, Any]],
           reference_server: Any = None) -> DecodeCheck:
    return DecodeCheck(FakeHandle(spec, server), records=records, reference_plan=plan,
                       reference_server=reference_server)


def test_reference_records_then_a_healthy_combination_passes_and_a_broken_one_fails(tmp_path: Path) -> None:
    plan = ReferencePlan(REF, tmp_path)
    records: list[dict[str, Any]] = []
    _check(REF, FakeServer(), plan, records).matches_reference()
    path = store.answers_file(tmp_path, "dsa")
    saved = json.loads(path.read_text())
    assert saved["combination"] == REF.id and saved["max_tokens"] == REFERENCE_MAX_TOKENS
    assert saved["model"] == "/models/dsa-tiny" and saved["engine"] == "vllm" and saved["recorded_at"]
    assert len(saved["answers"]) == 9 and all(a["tokens"] for a in saved["answers"])
    assert records[-1]["verdict"] == "pass" and records[-1]["detail"].startswith(f"recorded: {REF.id} on vllm")

    served = FakeServer()
    _check(KV, served, plan, records).matches_reference()
    assert len(served.requests) == 9 and all(r["logprobs"] and r["max_tokens"] == 32 for r in served.requests)
    assert records[-1]["verdict"] == "pass"
    table = records[-1]["detail"].splitlines()
    assert table[0].startswith(f"{KV.id} vs {REF.id} on vllm, recorded ")
    assert len(table) == 2 + 9 and all("identical" in line for line in table[2:])

    with pytest.raises(Failed) as info:
        _check(BROKEN, FakeServer(garbage=True), plan, records).matches_reference()
    message = str(info.value)
    first = message.splitlines()[0]
    assert first.startswith(f"{BROKEN.id} disagrees with reference {REF.id}: worst request differential[")
    assert "token 0:" in first and "(1 token(s) compared)" in first
    assert "near-tie gap: reference >= 2.000 (not in top-k), candidate >= 2.000 (not in top-k)" in first
    assert "near-tie gap (<= 0.5)" in message and "tokens compared" in message
    assert records[-1]["verdict"] == "fail" and records[-1]["first_finding"] == first
    assert path.read_text() == json.dumps(saved, indent=1)  # the recording is untouched


def test_a_combination_before_its_reference_boots_it_and_records_once(tmp_path: Path) -> None:
    booted: list[Any] = []
    reference_handle = FakeHandle(REF, FakeServer())

    def reference_server(ref: ServerSpec) -> Any:
        booted.append(ref)
        return reference_handle

    plan = ReferencePlan(REF, tmp_path)
    records: list[dict[str, Any]] = []
    _check(KV, FakeServer(), plan, records, reference_server).matches_reference()
    assert booted == [REF] and records[-1]["verdict"] == "pass"
    assert store.load(store.answers_file(tmp_path, "dsa")).combination == REF.id
    # The reference's own test then reports that recording (whichever process made it: under xdist a combination
    # on another worker may run first), without recording or booting again.
    _check(REF, FakeServer(), plan, records, reference_server).matches_reference()
    assert booted == [REF] and records[-1]["detail"].startswith(f"recorded: {REF.id} on vllm")


def test_a_given_recording_is_refused_for_another_model_with_the_fields(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    _check(REF, FakeServer(), ReferencePlan(REF, tmp_path / "earlier"), records).matches_reference()
    given = store.answers_file(tmp_path / "earlier", "dsa")
    plan = ReferencePlan(REF, tmp_path / "now", given=given.parent.parent)
    _check(KV, FakeServer(), plan, records).matches_reference()  # replayed from the earlier run
    assert records[-1]["verdict"] == "pass"
    assert not store.answers_file(tmp_path / "now", "dsa").exists()  # nothing recorded: the given one is used
    other = replace(KV, model="/models/other")
    with pytest.raises(Failed, match=r"were recorded for something else; refused: model: recorded "
                                     r"'/models/dsa-tiny', this server's '/models/other'"):
        _check(other, FakeServer(), plan, records).matches_reference()


def test_no_declared_reference_is_a_skip_with_the_key_to_set(tmp_path: Path) -> None:
    check = _check(KV, FakeServer(), None, [])
    check.matches_reference()
    with pytest.raises(Skipped, match=r"no reference combination declared for server 'dsa' \(reference = "
                                      r"\"<combination id>\" in \[tool.llmserve.matrix.dsa\]\)"):
        finish(check)
