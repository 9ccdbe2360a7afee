"""What every engine adapter provides: how to launch, how to tell it is ready, what it says it did."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.verdicts.execution import CheckResult, check_config_is_execution

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """The exact process to start (never through a shell) and how to reach it."""

    argv: list[str]
    env: dict[str, str]  # added to the inherited environment
    base_url: str
    model_name: str  # the name to put in request bodies
    health_path: str = "/health"
    generation_probe: bool = True  # readiness also needs one real generation
    notes: list[str] = field(default_factory=list)  # e.g. "--cuda-graph-bs mapped to --cuda-graph-bs-decode"


#: Prefixes of environment variables that the libraries under every engine read (CUDA, NCCL, OpenMP, MKL,
#: PyTorch, Triton, Hugging Face): a launched server inherits them from the shell, so they enter the baseline
#: context (:func:`pytest_llmserve.engines.engine_environment`) beside each engine's own.
GENERIC_ENV_PREFIXES: tuple[str, ...] = ("CUDA_", "NCCL_", "OMP_", "MKL_", "KMP_", "TORCH_", "PYTORCH_",
                                         "TORCHINDUCTOR_", "TRITON_", "HF_", "TRANSFORMERS_", "NVIDIA_")


class EngineAdapter(ABC):
    """One engine family. Adapters are stateless; version detection is cached per interpreter."""

    name: str = "base"
    #: Prefixes of the environment variables the engine itself reads (``VLLM_``), added to GENERIC_ENV_PREFIXES.
    env_prefixes: tuple[str, ...] = ()
    #: Prometheus counter of generated tokens, for the server-side throughput cross-check.
    generation_counter: str | None = None
    #: Prometheus counters of the requests the engine finished and of the prompt tokens its prefix cache served:
    #: the traffic a server saw before a benchmark, recorded in the benchmark's context (gates/context.server_state).
    request_counter: str | None = None
    prefix_cache_hit_counter: str | None = None
    #: Prometheus gauge of the requests the engine is running now, sampled during a benchmark round to
    #: prove nothing else reached the server (a round whose gauge exceeds its concurrency is invalid).
    running_requests_gauge: str | None = None
    #: True when the engine launches a process (False for ``external``).
    launches: bool = True
    #: Endpoint with the engine's resolved settings as JSON (SGLang ``/server_info``), if any.
    server_info_path: str | None = None
    #: Prefix of the engine's Prometheus metric names ("vllm:"), to recognise an attached server's engine.
    metrics_prefix: str | None = None
    #: Log lines (engine, pattern, meaning) and Prometheus counters by which the engine reports NaN.
    nan_log_patterns: tuple[tuple[str, re.Pattern[str], str], ...] = ()
    nan_counters: tuple[str, ...] = ()
    #: The highest port the server may be given (an engine that derives other ports from it needs headroom).
    highest_port: int = 65535
    #: A line only this engine writes, to recognise its log (``llmserve facts`` without ``--engine``).
    log_signature: re.Pattern[str] | None = None

    @abstractmethod
    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        """Map the spec's logical options to this engine's argv and environment."""

    def parse_facts(self, log_text: str, metrics_text: str | None = None,
                    server_info: Mapping[str, object] | None = None) -> ServerFacts:
        """What the server's own log and metrics say it did."""
        return ServerFacts(engine=self.name)

    def merge_metrics(self, facts: ServerFacts, metrics_text: str) -> None:
        """Add what the engine's ``/metrics`` page proves to ``facts`` (engines that have one override this)."""
        return None

    def check_execution(self, spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
        """Config-is-execution checks: each requested option against what the server reports."""
        return check_config_is_execution(spec, facts)

    def preflight_problems(self, spec: ServerSpec, gpus: Sequence[tuple[str, str | None]]) -> list[str]:
        """What stops this configuration before its boot, on the GPUs it will use (``(label, compute
        capability or None)`` each): a kernel built for other GPUs, a kernel library that is not installed. Each
        problem names the option, where it was set and why; [] when nothing does, or nothing can be known."""
        return []

    def deterministic_flag_on(self, spec: ServerSpec) -> bool:
        """True when the engine promises bit-exact greedy output across batch sizes."""
        return spec.deterministic
