"""What the benchmark gate's unit tests share: a one-server configuration and a stand-in for what the gate reads
of a running server (no process, no log, no /tokenize), for gates driven by a stand-in round runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pytest_llmserve.bench_face import BenchFace
from pytest_llmserve.config import ServerSpec, config_from_table
from pytest_llmserve.gates.bench import BenchGate, GateRun
from pytest_llmserve.load.contention import HostContention
from pytest_llmserve.load.metrics import Blame, InvalidReason
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.settings import BenchSpec

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

    def page(self, path: str) -> Any:
        raise OSError("no server behind this stand-in")


class StandinServer:
    """What the gate reads of a running server, without one."""

    spec: ServerSpec = SPEC
    spec_for_checks: ServerSpec | None = None

    def client(self) -> StandinClient:
        return StandinClient()

    def facts(self) -> Any:
        raise OSError("no log behind this stand-in")

    def describe(self) -> str:
        return f"stand-in server {self.spec.id} (no process)"


@dataclass
class StandinResult:
    """The part of a RunResult a round's judgement reads (gates/rounds.judge_round): valid when it has no reasons;
    an invalid one keeps its figures in ``diagnostics``, as a real one does."""

    metrics: dict[str, float]
    host_contention: HostContention | None = None
    invalid_reasons: list[InvalidReason] = field(default_factory=list)
    diagnostics: dict[str, float] = field(default_factory=dict)
    server_check: Any = None

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons

    @classmethod
    def invalid(cls, figures: dict[str, float], *reasons: InvalidReason,
                host: HostContention | None = None) -> StandinResult:
        return cls({}, host, list(reasons), diagnostics=dict(figures))


# Reasons as load/metrics.invalid_reasons classifies them: artefacts of a starved machine (chunk timing only, or the
# whole round), and a fault of the server's output.
TIMING_ARTEFACT = InvalidReason("8 of 8 requests have TPOT = 0 (all chunks in one read): the stream was buffered",
                                Blame.MACHINE, timing_only=True)
CONTAMINATED = InvalidReason("contaminated: 12 running requests during a round of concurrency 8", Blame.MACHINE)
DISAGREES = InvalidReason("client 90.0 tok/s vs server counter 100.0 tok/s: -10.0% (DISAGREE, bound ±3%) (other "
                          "traffic on the server, or a token-counting bug)", Blame.MACHINE)
FAULT = InvalidReason("8 of 8 requests generated tokens but no text (every content chunk empty)", Blame.SERVER)
FAILED_REQUESTS = InvalidReason("2 of 8 requests failed", Blame.SERVER)


def stand_in_gate(tmp_path: Path, measure: Any, *, options: BenchSpec, save: bool = False, clock: Any = None,
                  allow_host_change: bool = False, inconclusive: str = "warn",
                  key_test: str = "tests/test_perf.py::test_throughput",
                  server: Any = None) -> tuple[BenchFace, list[BenchOutcome], list[str]]:
    """A benchmark gate on a stand-in server whose rounds ``measure`` makes, behind the pytest face that ``llm_bench``
    is: the outcomes recorded go to the first list, the progress said to the second; a failure or a skip raises
    ``pytest.fail.Exception`` / ``pytest.skip.Exception``."""
    recorded: list[BenchOutcome] = []
    said: list[str] = []
    run = GateRun(cfg=CFG, store_dir=tmp_path / "baselines", results_dir=tmp_path / "results", save=save,
                  allow_host_change=allow_host_change, inconclusive=inconclusive)
    gate = BenchGate(server=cast(RunningServer, server or StandinServer()), options=options, run=run, test_id=TEST_ID, key_test=key_test,
                     measure=measure, **({"clock": clock} if clock is not None else {}))
    return BenchFace(gate, record=recorded.append, say=said.append), recorded, said
