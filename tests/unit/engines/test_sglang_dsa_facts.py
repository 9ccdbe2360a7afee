"""A DSA server's dense-attention threshold and index_topk from SGLang's log and /server_info: the two threshold
lines of server_args.py (0.5.15, 0.5.23), and index_topk from ``json_model_override_args`` where no log line said it.

The lines are verbatim from the recorded H200 logs in tests/data/logs, read from the files, except where a test
says it builds one."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.engines.sglang.facts import parse_sglang_log, parse_sglang_server_info

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
DSA_LOG = "real_sglang_0.5.15_h200_dsa_flashmla_kv_graphs_suite.log"
NO_OVERRIDE = "json_model_override_args='{}'"


def recorded_line(name: str, needle: str) -> str:
    """The one line of recorded log ``name`` that holds ``needle``."""
    lines = [line for line in (LOGS / name).read_text(encoding="utf-8").splitlines() if needle in line]
    assert len(lines) == 1, f"{name}: {len(lines)} lines hold {needle!r}"
    return lines[0]


MANUAL_LINE = recorded_line(DSA_LOG, "Dense attention kv len threshold is manually set to")
SERVER_ARGS_LINE = recorded_line(DSA_LOG, "server_args=ServerArgs(")
# No recorded log has this form (every recorded run set SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD): built from
# server_args.py's format string "Set dense attention kv len threshold to model index_topk={N} for DeepSeek with
# DSA." with the real models' 2048, and the recorded log's timestamp.
TOPK_LINE = "[2026-12-02 14:21:09] Set dense attention kv len threshold to model index_topk=2048 for DeepSeek with DSA."


def with_override(override: str) -> str:
    """The recorded server_args line, as a server given ``--json-model-override-args OVERRIDE`` would print it."""
    assert SERVER_ARGS_LINE.count(NO_OVERRIDE) == 1
    return SERVER_ARGS_LINE.replace(NO_OVERRIDE, f"json_model_override_args={override!r}")


def test_the_recorded_manual_threshold_line_gives_the_threshold_and_no_topk() -> None:
    """The whole recorded log: SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0 (every prefill sparse); the line
    does not say the topk and the override args are '{}', so index_topk is unreported."""
    facts = parse_sglang_log((LOGS / DSA_LOG).read_text(encoding="utf-8"))
    assert (facts.dsa_dense_threshold, facts.dsa_index_topk) == (0, None)
    assert facts.evidence["dsa_dense_threshold"] == [MANUAL_LINE]
    assert "dsa_index_topk" not in facts.evidence
    assert MANUAL_LINE not in facts.errors  # its "Caution: ... performance regression" is no error


def test_a_log_without_a_threshold_line_reports_none() -> None:
    facts = parse_sglang_log((LOGS / "real_sglang_0.5.15_h200_cuda_graph.log").read_text(encoding="utf-8"))
    assert (facts.dsa_dense_threshold, facts.dsa_index_topk) == (None, None)


def test_the_default_threshold_line_gives_the_threshold_and_the_topk() -> None:
    facts = parse_sglang_log("\n".join([TOPK_LINE, SERVER_ARGS_LINE]))
    assert (facts.dsa_dense_threshold, facts.dsa_index_topk) == (2048, 2048)
    assert facts.evidence["dsa_dense_threshold"] == facts.evidence["dsa_index_topk"] == [TOPK_LINE]


@pytest.mark.parametrize("threshold_line", [MANUAL_LINE, None], ids=["manual-threshold", "no-threshold-line"])
def test_an_override_in_server_args_gives_the_topk_where_no_line_said_it(threshold_line: str | None) -> None:
    line = with_override('{"index_topk": 1024}')
    facts = parse_sglang_log("\n".join(x for x in (threshold_line, line) if x))
    assert facts.dsa_index_topk == 1024
    assert facts.evidence["dsa_index_topk"] == [line]
    assert facts.dsa_dense_threshold == (0 if threshold_line else None)
    assert facts.nsa_decode_backend == "flashmla_kv"  # the rest of the line still read


@pytest.mark.parametrize("order", ["line-first", "args-first"])
def test_the_servers_topk_line_wins_over_the_override_args(order: str) -> None:
    """The server computed its line from the config it loaded; the args are what it was asked to apply."""
    args = with_override('{"index_topk": 1024}')
    facts = parse_sglang_log("\n".join([TOPK_LINE, args] if order == "line-first" else [args, TOPK_LINE]))
    assert facts.dsa_index_topk == 2048
    assert facts.evidence["dsa_index_topk"] == [TOPK_LINE]


@pytest.mark.parametrize("override", ['{"index_topk": 1024', "index_topk=1024", '["index_topk", 1024]',
                                      '{"index_topk": "1024"}', '{"index_topk": true}', '{"max_position_embeddings": 4096}'],
                         ids=["unterminated", "not-json", "not-an-object", "topk-a-string", "topk-a-bool", "no-topk"])
def test_an_override_without_an_integer_topk_reports_none_and_does_not_raise(override: str) -> None:
    """Malformed JSON is ignored: the server refuses it at boot, so no server ran with it."""
    facts = parse_sglang_log("\n".join([MANUAL_LINE, with_override(override)]))
    assert facts.dsa_index_topk is None and "dsa_index_topk" not in facts.evidence
    assert (facts.dsa_dense_threshold, facts.nsa_decode_backend) == (0, "flashmla_kv")


def test_the_0523_dict_form_server_args_carry_the_override_too() -> None:
    line = "[2026-12-02 14:21:12] server_args={'model_path': '/m', 'json_model_override_args': '{\"index_topk\": 512}'}"
    facts = parse_sglang_log(line)
    assert facts.dsa_index_topk == 512 and facts.evidence["dsa_index_topk"] == [line]


def recorded_info(**changes: Any) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(
        (LOGS / "real_sglang_0.5.15_h200_cuda_graph.server_info.json").read_text(encoding="utf-8"))
    info.update(changes)
    return info


def test_server_info_override_gives_the_topk_and_a_malformed_one_none() -> None:
    assert recorded_info()["json_model_override_args"] == "{}"
    assert parse_sglang_server_info(recorded_info()).dsa_index_topk is None
    facts = parse_sglang_server_info(recorded_info(json_model_override_args='{"index_topk": 1024}'))
    assert facts.dsa_index_topk == 1024
    assert facts.evidence["dsa_index_topk"] == ["/server_info json_model_override_args='{\"index_topk\": 1024}'"]
    malformed = parse_sglang_server_info(recorded_info(json_model_override_args='{"index_topk": 1024'))
    assert malformed.dsa_index_topk is None and malformed.version == "0.5.15"


def test_the_recorded_long_context_run_shows_the_sparse_path_its_backends_and_a_prefill_past_index_topk() -> None:
    """The reference combination of the 2026-12-06 H200 run (dsa_suite.sh l1): the threshold forced to 0 (every
    prefill on the sparse kernel), the backend per phase, the decode graphs, and a prefill of the long-context
    probe longer than the checkpoint's index_topk (2048): the indexer had to choose."""
    text = (LOGS / "real_sglang_0.5.15_h200_dsa_long_context_excerpt.log").read_text(encoding="utf-8")
    facts = parse_sglang_log(text)
    assert facts.dsa_dense_threshold == 0
    assert (facts.nsa_prefill_backend, facts.nsa_decode_backend) == ("flashmla_sparse", "flashmla_sparse")
    assert facts.captured_batch_sizes == (1, 2, 4, 8)
    new_tokens = [int(m) for m in re.findall(r"Prefill batch, #new-seq: \d+, #new-token: (\d+)", text)]
    assert max(new_tokens) > 2048, new_tokens
