"""Recorded reference answers: round trip, refused for another model or prompts, never overwritten."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmserve.config import CHECKPOINT_MARKER, ServerSpec
from pytest_llmserve.errors import ReferenceAnswersError
from pytest_llmserve.evidence.completion import TokenLogprob
from pytest_llmserve.store import reference_answers as store
from pytest_llmserve.verdicts.oracles import DEFAULT_DIFFERENTIAL_PROMPTS, ProbePrompt
from tests.unit.verdicts.test_oracles import _run, completion

PROMPTS = DEFAULT_DIFFERENTIAL_PROMPTS[:2]


def _model(tmp_path: Path, sha: str | None) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    if sha is not None:
        (model / CHECKPOINT_MARKER).write_text(json.dumps({store.SHA_KEY: sha, "kind": "dsa-tiny"}))
    return model


def _answers(spec: ServerSpec) -> store.ReferenceAnswers:
    identity = store.model_identity(spec)
    nan_token = _run([(" x", -0.5, {" x": -0.5, " y": -1.0})])
    nan_token.tokens.append(TokenLogprob(" z", math.nan, {" z": None}))
    return store.ReferenceAnswers(server=spec.name, combination=spec.id, model=identity["model"],
                                  model_sha256=identity[store.SHA_KEY], engine="sglang", engine_version="0.5.15",
                                  max_tokens=32, logprobs=5, prompts=PROMPTS,
                                  answers=(nan_token, completion(status=500, error="boom")))


def test_round_trip_keeps_tokens_top_k_and_non_finite_logprobs(tmp_path: Path) -> None:
    spec = ServerSpec(name="dsa", model=str(_model(tmp_path, "abc123")), variant=(("eager", "on"),))
    path = store.answers_file(tmp_path / "run", "dsa")
    assert path == tmp_path / "run" / "reference-answers" / "dsa.json"
    written = store.record(path, _answers(spec))
    assert written.path == path
    raw = json.loads(path.read_text())  # plain JSON: NaN kept as a string
    assert raw["answers"][0]["tokens"][1]["logprob"] == "nan" and raw["model_safetensors_sha256"] == "abc123"
    back = store.load(path)
    assert (back.combination, back.model_sha256, back.engine_version, back.prompts) == (
        "dsa[eager=on]", "abc123", "0.5.15", PROMPTS)
    assert back.answers[0].tokens[0] == TokenLogprob(" x", -0.5, {" x": -0.5, " y": -1.0})
    assert math.isnan(back.answers[0].tokens[1].logprob or 0.0)
    assert back.answers[1].status == 500 and back.answers[1].error == "boom"
    assert back.differences(spec, PROMPTS, 32, 5) == []


def test_never_overwritten(tmp_path: Path) -> None:
    spec = ServerSpec(name="dsa", model="org/model")
    path = store.answers_file(tmp_path, "dsa")
    store.record(path, _answers(spec))
    before = path.read_bytes()
    with pytest.raises(ReferenceAnswersError, match="recorded there already; not overwritten"):
        store.record(path, replace(_answers(spec), engine_version="other"))
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["dsa.json"]  # no temporary file left


def test_refused_for_another_model_or_other_prompts(tmp_path: Path) -> None:
    spec = ServerSpec(name="dsa", model=str(_model(tmp_path, "abc123")))
    recorded = store.record(store.answers_file(tmp_path, "dsa"), _answers(spec))
    moved = ServerSpec(name="dsa", model="/elsewhere/same-weights")
    other = tmp_path / "other"
    other.mkdir()
    (other / CHECKPOINT_MARKER).write_text(json.dumps({store.SHA_KEY: "abc123"}))
    # The same weights elsewhere (another machine) are the same model; other weights are not.
    assert recorded.differences(replace(moved, model=str(other)), PROMPTS, 32, 5) == []
    (other / CHECKPOINT_MARKER).write_text(json.dumps({store.SHA_KEY: "def456"}))
    assert recorded.differences(replace(moved, model=str(other)), PROMPTS, 32, 5) == [
        "model_safetensors_sha256: recorded 'abc123', this server's 'def456'"]
    assert recorded.differences(moved, PROMPTS, 32, 5) == [
        f"model: recorded {str(tmp_path / 'model')!r}, this server's '/elsewhere/same-weights'"]
    changed = (PROMPTS[0], ProbePrompt("Something else"))
    diffs = recorded.differences(spec, changed, 64, 3)
    assert diffs[0].startswith("prompts: 2 recorded, 2 sent here; they differ at #2 (recorded ")
    assert diffs[1:] == ["max_tokens: recorded 32, here 64", "logprobs (top-k): recorded 5, here 3"]


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ReferenceAnswersError, match=r"--opt = '.*missing.json': no such file"):
        store.load(tmp_path / "missing.json", "--opt")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something", "schema": 1}))
    with pytest.raises(ReferenceAnswersError, match="not a pytest-llmserve reference-answers file"):
        store.load(bad)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": store.KIND, "schema": 1, "server": "x"}))
    with pytest.raises(ReferenceAnswersError, match="missing or malformed field"):
        store.load(broken)


def test_given_file_or_folder(tmp_path: Path) -> None:
    path = store.answers_file(tmp_path, "dsa")
    store.record(path, _answers(ServerSpec(name="dsa", model="m")))
    assert store.given_file(tmp_path, "dsa") == path  # the run's report directory
    assert store.given_file(path.parent, "dsa") == path  # its reference-answers folder
    assert store.given_file(path, "anything") == path  # a file is taken as it is
