"""``llmserve facts LOG``: what a real server log proves, with the proving lines; bad input named, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmserve.cli.main import main

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def test_sglang_log_with_metrics_and_server_info(capsys: pytest.CaptureFixture[str]) -> None:
    stem = LOGS / "real_sglang_0.5.15_h200_cuda_graph"
    assert main(["facts", f"{stem}.log", "--metrics", f"{stem}.metrics.txt",
                 "--server-info", f"{stem}.server_info.json"]) == 0
    out = capsys.readouterr().out
    assert "sglang server log (engine recognised from the log)" in out
    assert "captured batch sizes        [1, 2, 4, 8]" in out
    assert "graph use per batch size    10: 0 on graph / 1 off" in out
    assert "decode_cuda_graph=25, decode_none=32" in out
    assert "| [2026-12-01 20:55:29] Capture target decode CUDA graph begin. backend=full" in out
    assert "memory fraction             0.5" in out


def test_vllm_log_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts", str(LOGS / "real_vllm_gpu_0.26.0_h200_full_and_piecewise.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "vllm" and data["version"] == "0.26.0"
    assert data["cudagraph_mode"] == "FULL_AND_PIECEWISE" and data["captured_batch_sizes"] == [1, 2, 4, 8]
    assert data["evidence"]["kv_cache_tokens"]


def test_bad_input_is_named_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as missing:
        main(["facts", str(tmp_path / "nope.log")])
    assert "cannot read log" in str(missing.value) and "nope.log" in str(missing.value)
    plain = tmp_path / "plain.log"
    plain.write_text("hello\n")
    assert main(["facts", str(plain)]) == 2
    assert "does not look like a vLLM, SGLang or llama.cpp log" in capsys.readouterr().err
    assert main(["facts", str(plain), "--engine", "external"]) == 2
    assert "--engine 'external' is not an engine with a log parser" in capsys.readouterr().err
