"""``random_weights`` (declared per server, or recognised from the tiny-checkpoint builder's marker file) and
the one answer to "is this server's model untrained?" (:func:`pytest_llmserve.config.untrained_reason`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmserve.config import CHECKPOINT_MARKER, ServerSpec, config_from_table, untrained_reason
from pytest_llmserve.errors import ConfigError


def _spec(table: dict[str, object], source: str = "/proj/llmserve.toml") -> ServerSpec:
    return config_from_table({"servers": {"tiny": {"engine": "sglang", "model": "/m", **table}}}, source).servers[0]


def _model(tmp_path: Path, marker: object) -> Path:
    folder = tmp_path / "tiny-dsa"
    folder.mkdir()
    (folder / CHECKPOINT_MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    return folder


def test_declared_random_weights_names_the_file() -> None:
    assert _spec({}).random_weights is None and untrained_reason(_spec({})) is None
    assert untrained_reason(_spec({"random_weights": False})) is None
    reason = untrained_reason(_spec({"random_weights": True}))
    assert reason == "random_weights = true declared in /proj/llmserve.toml for server 'tiny'"


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_a_bad_value_is_refused_naming_file_key_and_value(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        _spec({"random_weights": value})
    assert str(err.value) == (f"/proj/llmserve.toml: [tool.llmserve.servers.tiny] random_weights = {value!r}: "
                              "must be true or false")


def test_the_builders_marker_is_recognised_and_an_explicit_false_wins(tmp_path: Path) -> None:
    folder = _model(tmp_path, {"random_weights": True, "architecture": "DeepseekV32ForCausalLM"})
    reason = untrained_reason(_spec({"model": str(folder)}))
    assert reason == f"marker file {folder / CHECKPOINT_MARKER} says random_weights = true"
    assert untrained_reason(_spec({"model": str(folder), "random_weights": False})) is None
    # Relative to the configuration file's folder, as a user writes it beside the project.
    relative = _spec({"model": "tiny-dsa"}, source=str(tmp_path / "llmserve.toml"))
    assert untrained_reason(relative) == reason


def test_a_trained_models_marker_or_none_at_all_is_trained(tmp_path: Path) -> None:
    assert untrained_reason(_spec({"model": str(_model(tmp_path, {"random_weights": False}))})) is None
    assert untrained_reason(_spec({"model": "HuggingFaceTB/SmolLM2-135M-Instruct"})) is None
    attached = config_from_table({"servers": {"r": {"engine": "vllm", "url": "http://node:8000"}}}, "x").servers[0]
    assert untrained_reason(attached) is None


@pytest.mark.parametrize(("marker", "said"), [("{not json", "is not readable JSON"),
                                              ({"random_weights": "true"}, "\"random_weights\" = 'true'")])
def test_a_broken_marker_is_an_error_naming_the_file(tmp_path: Path, marker: object, said: str) -> None:
    folder = _model(tmp_path, marker)
    with pytest.raises(ConfigError) as err:
        untrained_reason(_spec({"model": str(folder)}))
    assert str(err.value).startswith(str(folder / CHECKPOINT_MARKER)) and said in str(err.value)


def test_random_weights_stays_out_of_a_baselines_server_args() -> None:
    from pytest_llmserve.evidence.environment import server_args

    assert "random_weights" not in server_args(_spec({"random_weights": True}))
