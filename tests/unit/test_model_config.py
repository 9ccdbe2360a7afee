"""A DSA model's index_topk from its config.json, with the engine's override args applied: the value as served and
where it came from; a model that is not a local folder or not a DSA model has none; a config.json, an override
or a topk that cannot be what the server runs with is a ConfigError naming the file or the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.model_config import IndexTopk, dsa_index_topk

OVERRIDE_1024 = '{"index_topk": 1024}'


def model_dir(tmp_path: Path, config: Any) -> Path:
    """A model folder whose config.json holds ``config`` (a string is written as it is)."""
    path = tmp_path / "model"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def spec_for(model: Path | str, *args: str) -> ServerSpec:
    return ServerSpec(name="glm5", engine="sglang", model=str(model), source="llmserve.toml", args=args)


def test_config_with_index_topk_is_a_dsa_model_and_without_it_not(tmp_path: Path) -> None:
    dsa = model_dir(tmp_path / "dsa", {"architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048})
    plain = model_dir(tmp_path / "plain", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30})
    found = dsa_index_topk(spec_for(dsa))
    assert found == IndexTopk(2048, f"{dsa / 'config.json'} index_topk=2048")
    assert found.largest == 2048
    assert dsa_index_topk(spec_for(plain)) is None
    # An override cannot make a model that has no indexer a DSA model.
    assert dsa_index_topk(spec_for(plain, "--json-model-override-args", OVERRIDE_1024)) is None


@pytest.mark.parametrize("args", [
    ("--json-model-override-args", OVERRIDE_1024),
    (f"--json-model-override-args={OVERRIDE_1024}",),
    ("--hf-overrides", OVERRIDE_1024),
    (f"--hf-overrides={OVERRIDE_1024}",),
], ids=["sglang-separate", "sglang-equals", "vllm-separate", "vllm-equals"])
def test_the_override_args_set_the_served_topk_in_either_flag_form(tmp_path: Path, args: tuple[str, ...]) -> None:
    model = model_dir(tmp_path, {"index_topk": 2048})
    flag = args[0].split("=")[0]
    found = dsa_index_topk(spec_for(model, "--tp", "8", *args, "--page-size", "64"))
    assert found == IndexTopk(1024, f"{model / 'config.json'} index_topk=2048, overridden by {flag} index_topk=1024",
                              configured=2048)
    assert found is not None and found.largest == 2048  # a probe must exceed both ways of serving the weights


def test_an_override_without_index_topk_leaves_the_config_value(tmp_path: Path) -> None:
    model = model_dir(tmp_path, {"index_topk": 2048})
    found = dsa_index_topk(spec_for(model, "--json-model-override-args", '{"max_position_embeddings": 4096}'))
    assert found == IndexTopk(2048, f"{model / 'config.json'} index_topk=2048")


def test_the_last_override_flag_wins_as_in_the_engines_argument_parser(tmp_path: Path) -> None:
    model = model_dir(tmp_path, {"index_topk": 2048})
    found = dsa_index_topk(spec_for(model, "--json-model-override-args", OVERRIDE_1024,
                                    "--json-model-override-args", '{"index_topk": 512}'))
    assert found is not None and found.value == 512


def test_a_model_that_is_not_a_local_folder_with_a_config_has_none(tmp_path: Path) -> None:
    assert dsa_index_topk(spec_for("deepseek-ai/DeepSeek-V3.2")) is None  # a hub id
    assert dsa_index_topk(spec_for(tmp_path / "absent")) is None
    (tmp_path / "empty").mkdir()
    assert dsa_index_topk(spec_for(tmp_path / "empty")) is None
    assert dsa_index_topk(ServerSpec(name="no-model", engine="sglang")) is None


@pytest.mark.parametrize("config", ['{"index_topk": 2048,', "[2048]"], ids=["not-json", "not-an-object"])
def test_a_bad_config_json_is_an_error_naming_the_file(tmp_path: Path, config: str) -> None:
    model = model_dir(tmp_path, config)
    with pytest.raises(ConfigError, match=str(model / "config.json")):
        dsa_index_topk(spec_for(model))


@pytest.mark.parametrize("args", [
    ("--json-model-override-args", "{'index_topk': 1024}"),  # Python's quotes, not JSON's
    ("--json-model-override-args=index_topk=1024",),
    ("--hf-overrides", "[1024]"),  # JSON, but not an object
], ids=["python-quotes", "not-json-equals", "not-an-object"])
def test_a_bad_override_is_an_error_naming_the_flag_and_its_value(tmp_path: Path, args: tuple[str, ...]) -> None:
    model = model_dir(tmp_path, {"index_topk": 2048})
    flag, _, inline = args[0].partition("=")
    value = args[1] if len(args) > 1 else inline
    with pytest.raises(ConfigError) as raised:
        dsa_index_topk(spec_for(model, *args))
    assert f"server glm5 (llmserve.toml) args: {flag} {value!r}" in str(raised.value)


@pytest.mark.parametrize("topk", [0, -1, 2048.0, "2048", True, None])
def test_an_index_topk_that_is_not_a_positive_integer_is_an_error(tmp_path: Path, topk: Any) -> None:
    in_config = model_dir(tmp_path / "config", {"index_topk": topk})
    with pytest.raises(ConfigError, match=f"{in_config / 'config.json'}: index_topk = {topk!r}: must be a positive"):
        dsa_index_topk(spec_for(in_config))
    in_override = model_dir(tmp_path / "override", {"index_topk": 2048})
    override = json.dumps({"index_topk": topk})
    with pytest.raises(ConfigError, match=r"server glm5 \(llmserve.toml\) --hf-overrides: index_topk = "
                                          f"{topk!r}: must be a positive"):
        dsa_index_topk(spec_for(in_override, "--hf-overrides", override))
    # ... beside the passing case: the same folder and flag with a positive topk.
    assert dsa_index_topk(spec_for(in_override, "--hf-overrides", '{"index_topk": 1}')) is not None
