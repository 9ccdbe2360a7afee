"""What the benchmark gate's unit tests share: a one-server configuration and a stand-in for what the gate reads
of a running server (no process, no log, no /tokenize), for gates driven by a stand-in round runner."""

from __future__ import annotations

from typing import Any

from pytest_llmserve.config import ServerSpec, config_from_table

CFG = config_from_table({"servers": {"cpu": {"engine": "vllm", "model": "/models/m"}},
                         "workloads": {"tiny": {"num_prompts": 8, "input_len": 32, "output_len": 32}}},
                        "llmserve.toml")
SPEC = CFG.expanded("cpu")[0]
TEST_ID = "tests/test_perf.py::test_throughput[cpu]"


class StandinClient:
    def tokenize(self, text: str) -> None:
        return None  # no /tokenize: the prompts are approximate, as on a server without one

    def get(self, path: str) -> Any:
        raise OSError("no server behind this stand-in")


class StandinServer:
    """What the gate reads of a running server, without one."""

    spec: ServerSpec = SPEC
    spec_for_checks: ServerSpec | None = None

    def client(self) -> StandinClient:
        return StandinClient()

    def facts(self) -> Any:
        raise OSError("no log behind this stand-in")
