"""Configuration loading: defaults, validation messages that name key, value and file, matrix ids."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_llmserve.config import (
    CudaGraphSpec,
    ServerSpec,
    config_from_table,
    load_config,
)
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.redaction import redact_argv


def _default() -> ServerSpec:
    return ServerSpec(name="default", engine="vllm", model="/m")


def test_no_configuration_gives_the_embedded_default(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, _default)
    assert [s.name for s in cfg.servers] == ["default"]
    assert cfg.default_server == "default"
    assert "saturated" in cfg.workloads and cfg.workloads["saturated"].num_prompts == 64


def test_pyproject_servers_and_workloads(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.llmserve.servers.a]\nengine = "sglang"\nmodel = "/models/x"\ntp = 8\n'
        'args = ["--mem-fraction-static", "0.92"]\nenv = { A = "1" }\nstartup_timeout_s = 1800\n'
        '[tool.llmserve.workloads.saturated]\nnum_prompts = 8\nrequest_rate = "inf"\n'
        '[tool.llmserve.workloads.slow]\nrequest_rate = 2\nmax_concurrency = 4\n')
    cfg = load_config(tmp_path, _default)
    spec = cfg.server("a")
    assert (spec.engine, spec.tp, spec.args, spec.env_dict, spec.startup_timeout_s) == (
        "sglang", 8, ("--mem-fraction-static", "0.92"), {"A": "1"}, 1800.0)
    assert cfg.workloads["saturated"].num_prompts == 8 and cfg.workloads["saturated"].input_len == 256
    assert math.isinf(cfg.workloads["saturated"].request_rate)
    assert cfg.workloads["slow"].request_rate == 2.0 and cfg.workloads["slow"].max_concurrency == 4


def test_llmserve_toml_wins_over_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.llmserve.servers.p]\nmodel = "/p"\n')
    (tmp_path / "llmserve.toml").write_text('[servers.t]\nmodel = "/t"\n')
    cfg = load_config(tmp_path, _default)
    assert [s.name for s in cfg.servers] == ["t"]
    assert cfg.source.endswith("llmserve.toml")


@pytest.mark.parametrize(("body", "expected"), [
    ('[tool.llmserve.servers.a]\nmodel = "/m"\nstartup_timout_s = 5\n', "unknown key 'startup_timout_s' = 5"),
    ('[tool.llmserve.servers.a]\nmodel = "/m"\nstartup_timeout_s = -1\n', "startup_timeout_s = -1"),
    ('[tool.llmserve.servers.a]\nmodel = "/m"\nengine = "tgi"\n', "engine = 'tgi'"),
    ('[tool.llmserve.servers.a]\nmodel = "/m"\ntp = "8"\n', "tp = '8'"),
    ('[tool.llmserve.servers.a]\nengine = "external"\n', "needs url"),
    ('[tool.llmserve.servers.a]\nmodel = "/m"\ncuda_graph = { enabled = true, batch_sizes = [0] }\n',
     "batch_sizes = [0]"),
    ('[tool.llmserve]\nservrs = 1\n', "unknown key [tool.llmserve] 'servrs'"),
    ('[tool.llmserve.workloads.w]\nrequest_rate = "fast"\n', "request_rate = 'fast'"),
    ('[tool.llmserve.matrix.nope]\neager = [true]\n', "names no configured server 'nope'"),
    ('[tool.llmserve.servers.a]\nmodel = "/m"\n[tool.llmserve.matrix.a]\neager = true\n', "eager = True"),
])
def test_bad_values_name_key_value_and_file(tmp_path: Path, body: str, expected: str) -> None:
    (tmp_path / "pyproject.toml").write_text(body)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, _default)
    message = str(info.value)
    assert expected in message
    assert str(tmp_path / "pyproject.toml") in message


def test_matrix_expands_with_readable_stable_ids() -> None:
    table = {"servers": {"m": {"engine": "vllm", "model": "/m"}},
             "matrix": {"m": {"attention_backend": ["FLASH_ATTN", "TRITON_ATTN"],
                              "cuda_graph": [{"enabled": False}, {"enabled": True, "batch_sizes": [4, 1, 2]}]}}}
    cfg = config_from_table(table, "x.toml")
    ids = [s.id for s in cfg.expanded("m")]
    assert ids == [
        "m[attention_backend=FLASH_ATTN,cuda_graph=off]",
        "m[attention_backend=FLASH_ATTN,cuda_graph=on(1,2,4)]",
        "m[attention_backend=TRITON_ATTN,cuda_graph=off]",
        "m[attention_backend=TRITON_ATTN,cuda_graph=on(1,2,4)]",
    ]
    spec = cfg.expanded("m")[1]
    assert spec.cuda_graph == CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4))
    assert [s.id for s in cfg.all_specs()] == ids


def test_a_matrix_varying_env_or_args_names_each_combination_with_its_secrets_masked() -> None:
    """``env`` and ``args`` vary like any other key: each combination's id reads its values (an env's pairs
    once crashed the id with a raw TypeError; env sorted by name as parsed), and a secret is masked there as in
    every other record."""
    table = {"servers": {"m": {"engine": "vllm", "model": "/m"}},
             "matrix": {"m": {"env": [{"VLLM_X": "1", "HF_TOKEN": "hf_abc"}, {"VLLM_X": "2"}],
                              "args": [["--seed", "1"], ["--api-key", "sk-456"]]}}}
    specs = config_from_table(table, "x.toml").expanded("m")
    assert [s.id for s in specs] == [
        "m[env=HF_TOKEN=*** VLLM_X=1,args=--seed 1]",
        "m[env=HF_TOKEN=*** VLLM_X=1,args=--api-key ***]",
        "m[env=VLLM_X=2,args=--seed 1]",
        "m[env=VLLM_X=2,args=--api-key ***]",
    ]
    assert specs[1].env_dict["HF_TOKEN"] == "hf_abc" and specs[1].args[-1] == "sk-456"  # launched as given


def test_secrets_are_redacted_from_public_views() -> None:
    spec = ServerSpec(name="a", model="/m", api_key="sk-123", env=(("HF_TOKEN", "hf_abc"), ("X", "1")),
                      args=("--api-key", "sk-456", "--hf-token=hf_x", "--seed", "1"))
    public = spec.public_dict()
    text = repr(public)
    assert "sk-123" not in text and "hf_abc" not in text and "sk-456" not in text and "hf_x" not in text
    assert public["env"] == {"HF_TOKEN": "***", "X": "1"}
    assert redact_argv(["--api-key", "k", "--port", "1"]) == ["--api-key", "***", "--port", "1"]
