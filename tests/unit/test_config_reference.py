"""``reference = "..."`` in a matrix table, and the per-server ``differential_max_logprob_delta``."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.config import config_from_table
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.context import server_args

SERVER: dict[str, Any] = {"engine": "sglang", "model": "/models/dsa-tiny"}
MATRIX: dict[str, Any] = {"nsa_decode_backend": ["flashmla_sparse", "flashmla_kv", "tilelang"],
                          "cuda_graph": [{"enabled": True, "batch_sizes": [1, 2, 4, 8]}, {"enabled": False}]}
DSA = {"servers": {"dsa": SERVER}, "matrix": {"dsa": MATRIX}}


def _with(reference: Any, **server: Any) -> dict[str, Any]:
    return {"servers": {"dsa": {**SERVER, **server}}, "matrix": {"dsa": {**MATRIX, "reference": reference}}}


def test_the_reference_is_one_of_the_ids_the_matrix_produces() -> None:
    cfg = config_from_table(_with("nsa_decode_backend=flashmla_sparse,cuda_graph=on(1,2,4,8)"), "pyproject.toml")
    assert len(cfg.expanded("dsa")) == 6  # "reference" is not an axis
    reference = cfg.reference_of("dsa")
    assert reference is not None
    assert reference.id == "dsa[nsa_decode_backend=flashmla_sparse,cuda_graph=on(1,2,4,8)]"
    assert reference in cfg.expanded("dsa")
    whole = config_from_table(_with(reference.id), "pyproject.toml")  # the whole id is accepted too
    assert whole.reference_of("dsa") == reference
    assert config_from_table(DSA, "pyproject.toml").reference_of("dsa") is None


def test_eager_matrix_ids_are_spelled_on_and_off() -> None:
    table = {"servers": {"cpu": {"engine": "vllm", "model": "m"}},
             "matrix": {"cpu": {"eager": [True, False], "reference": "eager=on"}}}
    cfg = config_from_table(table, "llmserve.toml")
    assert [s.id for s in cfg.expanded("cpu")] == ["cpu[eager=on]", "cpu[eager=off]"]
    reference = cfg.reference_of("cpu")
    assert reference is not None and reference.eager is True


@pytest.mark.parametrize("reference", ["nsa_decode_backend=flashmla_sparse", "eager=true",
                                       "cuda_graph=on(1,2,4,8),nsa_decode_backend=flashmla_sparse", 3, ""])
def test_a_reference_naming_no_combination_lists_the_valid_ids(reference: Any) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_table(_with(reference), "pyproject.toml")
    message = str(info.value)
    assert message.startswith(f"pyproject.toml: [tool.llmserve.matrix.dsa] reference = {reference!r}")
    assert "'nsa_decode_backend=flashmla_sparse,cuda_graph=on(1,2,4,8)'" in message
    assert "'nsa_decode_backend=tilelang,cuda_graph=off'" in message


def test_differential_tolerance_is_a_positive_number_and_not_a_server_argument() -> None:
    cfg = config_from_table(_with("nsa_decode_backend=tilelang,cuda_graph=off", differential_max_logprob_delta=0.1),
                            "pyproject.toml")
    spec = cfg.expanded("dsa")[0]
    assert spec.differential_max_logprob_delta == 0.1
    # A check's tolerance, not how the server runs: baselines stay comparable across it.
    assert "differential_max_logprob_delta" not in server_args(spec)
    with pytest.raises(ConfigError, match=r"differential_max_logprob_delta = -1: must be a number > 0"):
        config_from_table(_with("nsa_decode_backend=tilelang,cuda_graph=off", differential_max_logprob_delta=-1),
                          "pyproject.toml")
