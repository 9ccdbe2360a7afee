"""The benchmark context: its shape, the hardware read through the one GPU probe, portable paths, secrets."""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec, Workload
from pytest_llmserve.evidence.environment import build_context, find_secrets, hardware_context, probe_hardware

HW = {"cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}


def spec(**kw: Any) -> ServerSpec:
    base = ServerSpec(
        name="srv",
        engine="vllm",
        model="/models/smol",
        port=8123,
        cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4)),
        mem_fraction=0.9,
    )
    return replace(base, **kw)


def test_build_context_shape() -> None:
    c = build_context(
        spec(), Workload("smoke", num_prompts=16), engine_version="0.32.0", hardware=HW,
        plugin_version="0.1.0", python="CPython 3.11",
    )
    assert set(c) == {
        "engine",
        "engine_version",
        "model",
        "server_args",
        "hardware",
        "workload",
        "plugin_version",
        "python",
    }
    assert c["engine"] == "vllm"
    assert c["model"] == "/models/smol"
    assert c["engine_version"] == "0.32.0"
    for dropped in ("name", "source", "port", "variant", "engine", "model"):
        assert dropped not in c["server_args"]
    assert c["server_args"]["cuda_graph"] == {
        "enabled": True,
        "batch_sizes": [1, 2, 4],
        "max_batch_size": None,
    }
    assert c["workload"]["request_rate"] == "inf"  # JSON has no infinity
    assert c["hardware"] == HW
    json.dumps(c, allow_nan=False)


def test_paths_under_the_cache_are_portable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTEST_LLMSERVE_CACHE", str(tmp_path))
    c = build_context(spec(model=str(tmp_path / "models" / "smol")), Workload("smoke"), engine_version="1",
                      hardware=HW)
    assert c["model"] == "<cache>/models/smol"


def test_secrets_are_found_where_redaction_hides_them() -> None:
    c = build_context(spec(api_key="sk-SECRET"), Workload("smoke"), engine_version="1", hardware=HW)
    assert c["server_args"]["api_key"] == "***"
    assert find_secrets(c) == []
    assert find_secrets(dict(c, extra={"HF_TOKEN": "hf_x", "tokenizer": "gpt2"})) == ["extra.HF_TOKEN"]


FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, GPU-a, NVIDIA H200, 143771, 1, 143770, 570.86, 00000000:00:05.0"
                 echo "1, GPU-b, NVIDIA H200, 143771, 1, 143770, 570.86, 00000000:00:06.0" ;;
  --query-compute-apps=*) ;;
  *) echo "| NVIDIA-SMI 570.86   Driver Version: 570.86   CUDA Version: 12.8 |" ;;
esac
"""


def test_hardware_through_nvidia_smi_and_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys and values baselines were recorded with, read through server/gpu.py's nvidia-smi path."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Fake Xeon 9000\n")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(FAKE_SMI)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: nvidia-smi answers
    monkeypatch.setenv("PATH", str(fake.parent))
    hw = probe_hardware(cpuinfo=cpuinfo)
    assert list(hw) == ["cpu_model", "cpu_count", "gpu_name", "gpu_count", "driver", "cuda"]  # stored order
    assert hw["cpu_model"] == "Fake Xeon 9000"
    assert hw["cpu_count"] >= 1
    assert (hw["gpu_name"], hw["gpu_count"], hw["driver"], hw["cuda"]) == ("NVIDIA H200", 2, "570.86", "12.8")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    none = probe_hardware(cpuinfo=cpuinfo)
    assert (none["gpu_name"], none["gpu_count"], none["driver"], none["cuda"]) == (None, 0, None, None)


def test_host_hardware_is_probed_once_and_handed_out_as_copies() -> None:
    first = hardware_context()
    first["gpu_name"] = "changed by a caller"
    second = hardware_context()
    assert second is not first and second["gpu_name"] != "changed by a caller"
    assert set(second) == set(HW)
