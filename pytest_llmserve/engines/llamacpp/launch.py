"""llama.cpp: ``llama-server`` with flags from the server configuration, and facts read back.

The binary (first match wins):
  1. ``argv`` of the server's configuration, if given: used as the command prefix, e.g.
     ``argv = ["/opt/llama.cpp/build/bin/llama-server"]`` (the plugin appends every flag);
  2. ``$LLAMA_SERVER`` (a path);
  3. ``llama-server`` on ``PATH``;
  4. the CPU build made by ``scripts/build_llamacpp_cpu.sh`` under
     ``$PYTEST_LLMSERVE_CACHE/llama.cpp-<version>/build-cpu/bin/llama-server``.

Logical options → flags (llama.cpp as vendored in llama-cpp-python 0.3.36, commit 0c1e570):
  model                      -m PATH (a GGUF file)
  host / port                --host / --port
  seed                       --seed N (always passed; /props reports it back)
  parallel                   -np N (server slots = concurrent sequences); else max_batch_size;
                             unset: the engine's default (auto: 4 slots, unified KV)
  context_size               -c N (the whole KV pool, shared by the slots)
  gpu_layers                 -ngl N
  flash_attention            -fa on | off (unset: the engine's "auto", resolved at load and logged)
  cuda_graph.enabled=false   env GGML_CUDA_DISABLE_GRAPHS=1 (ggml-cuda reads it once; no flag exists)
  cuda_graph.enabled=true    nothing (graphs are on in CUDA builds with USE_GRAPHS); refused if the
                             environment already disables them
  tp = 1 (gpu = true)        --split-mode none (one GPU: the first visible)
  tp = N > 1                 --split-mode layer --tensor-split 1,...,1 (layers spread over exactly N GPUs)
  served_model_name          --alias NAME
  api_key                    env LLAMA_API_KEY (llama-server reads it; a command-line key shows in ps)
  always                     --metrics (the /metrics counters), -lv 4 (the facts: CUDA archs,
                             USE_GRAPHS, offloaded layers, slots, KV size, GPU names are logged at
                             "trace" level 4; at the default level 3 the log says nothing about CUDA)

Verbosity comes first in argv: llama-server applies flags in order, and ``-ngl`` already starts the
CUDA backend, whose device lines (``ggml_cuda_init: found 1 CUDA devices``) are lost if the threshold
is still the default 3 at that moment. ``args = ["-lv", "5"]`` replaces the default 4 (its value is
also put first; the copy in args is left as given). At 5 ggml-cuda logs
``CUDA graph warmup complete`` when it first captures a graph, which makes the cuda_graph check
provable both ways (see :mod:`pytest_llmserve.engines.llamacpp.facts`); it also logs a few lines per decoded
token, which costs throughput, so it is not the default.

Options llama.cpp has no equivalent for (attention backends, CUDA-graph batch sizes, eager,
mem_fraction, deterministic) are refused with a message that says what to use instead.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_llmserve.config import ServerSpec, cache_dir
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan
from pytest_llmserve.engines.llamacpp.facts import check_llamacpp_execution, parse_llamacpp
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.evidence.pages import read_page
from pytest_llmserve.verdicts.execution import CheckResult

__all__ = [
    "BINARY_ENV",
    "DEFAULT_VERBOSITY",
    "GRAPHS_ENV",
    "LLAMACPP_VERSION",
    "LlamaCppAdapter",
    "cpu_build_binary",
    "find_llama_server",
]

#: The llama.cpp the scripts build: the copy vendored in llama-cpp-python of this version.
LLAMACPP_VERSION = "0.3.36"
LLAMACPP_COMMIT = "0c1e570"
BINARY_ENV = "LLAMA_SERVER"
GRAPHS_ENV = "GGML_CUDA_DISABLE_GRAPHS"
DEFAULT_VERBOSITY = 4

_VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity")
_DRAFT_FLAGS = (
    "-md",
    "--model-draft",
    "--spec-draft-model",
    "-hfd",
    "-hfrd",
    "--hf-repo-draft",
    "--spec-draft-hf",
)
# Flags the plugin sets from logical options: the same flag in ``args`` would silently win or clash.
_OWNED = {
    "-m": "model",
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "-s": "seed",
    "--seed": "seed",
    "-np": "parallel",
    "--parallel": "parallel",
    "-c": "context_size",
    "--ctx-size": "context_size",
    "-ngl": "gpu_layers",
    "--gpu-layers": "gpu_layers",
    "--n-gpu-layers": "gpu_layers",
    "-fa": "flash_attention",
    "--flash-attn": "flash_attention",
    "-sm": "tp",
    "--split-mode": "tp",
    "-ts": "tp",
    "--tensor-split": "tp",
    "-a": "served_model_name",
    "--alias": "served_model_name",
    "--api-key": "api_key",
}


def cpu_build_binary() -> Path:
    """Where ``scripts/build_llamacpp_cpu.sh`` puts its llama-server."""
    return cache_dir() / f"llama.cpp-{LLAMACPP_VERSION}" / "build-cpu" / "bin" / "llama-server"


def find_llama_server(spec: ServerSpec | None = None, env: dict[str, str] | None = None) -> list[str] | None:
    """The command prefix that starts llama-server (see the module docstring), or None."""
    if spec is not None and spec.argv:
        return list(spec.argv)
    environ = os.environ if env is None else env
    explicit = environ.get(BINARY_ENV)
    if explicit:
        return [explicit]
    found = shutil.which("llama-server")
    if found:
        return [found]
    built = cpu_build_binary()
    if built.is_file() and os.access(built, os.X_OK):
        return [str(built)]
    return None


def _flag_of(arg: str) -> str:
    return arg.split("=", 1)[0]


def _user_verbosity(args: tuple[str, ...]) -> str | None:
    """The last ``-lv N`` / ``--verbosity=N`` value in ``args``, if any."""
    found: str | None = None
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in _VERBOSITY_FLAGS:
            if eq:
                found = value
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


@dataclass
class _Plan:
    """The command line being built and the notes that say where each part came from."""

    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, args: list[str], note: str | None = None) -> None:
        self.argv += args
        if note is not None:
            self.notes.append(note)


def _command(spec: ServerSpec, where: str) -> list[str]:
    command = find_llama_server(spec)
    if command is None:
        raise ConfigError(
            f"{where} engine = 'llamacpp': no llama-server found (looked at argv, ${BINARY_ENV}, PATH, "
            f"{cpu_build_binary()}). Build one with scripts/build_llamacpp_cpu.sh (CPU) or "
            "scripts/gpu/run_gpu_suite.sh (CUDA), or set argv = ['/path/to/llama-server']"
        )
    return command


def _refuse_owned_flags(spec: ServerSpec, user_flags: set[str], where: str) -> None:
    """Flags in ``args`` that the plugin sets from an option (the same flag twice would silently win or clash)."""
    clashes = sorted(f for f in user_flags if f in _OWNED)
    if clashes:
        raise ConfigError(
            f"{where} args {list(spec.args)!r} set {', '.join(clashes)}, which the plugin sets from "
            f"{', '.join(sorted({_OWNED[f] for f in clashes}))}; set the option, not the flag"
        )


def _verbosity(args: tuple[str, ...], notes: list[str]) -> str:
    """The -lv the server starts with: the user's, else :data:`DEFAULT_VERBOSITY` (put first either way)."""
    verbosity = _user_verbosity(args)
    if verbosity is None:
        notes.append(f"-lv {DEFAULT_VERBOSITY} added: CUDA archs, USE_GRAPHS, offloaded layers, slots and KV size "
                     "are logged at trace level")
        return str(DEFAULT_VERBOSITY)
    notes.append(f"-lv {verbosity} from args, also put first (CUDA starts while flags are parsed)")
    return verbosity


def _slots(spec: ServerSpec, plan: _Plan, where: str) -> None:
    """``parallel`` or ``max_batch_size`` -> ``-np`` (both mean the server's slots)."""
    if spec.parallel is not None and spec.max_batch_size is not None and spec.parallel != spec.max_batch_size:
        raise ConfigError(
            f"{where} parallel = {spec.parallel} and max_batch_size = {spec.max_batch_size} "
            "disagree: both mean llama-server's slots (-np); set one"
        )
    option, slots = ("parallel", spec.parallel) if spec.parallel is not None else ("max_batch_size",
                                                                                   spec.max_batch_size)
    if slots is not None:
        plan.add(["-np", str(slots)], f"{option}={slots} -> -np {slots}")


def _context_size(spec: ServerSpec, plan: _Plan, where: str) -> None:
    if spec.context_size is not None:
        plan.add(["-c", str(spec.context_size)],
                 f"context_size={spec.context_size} -> -c {spec.context_size} (KV pool shared by the slots)")


def _gpu_layers(spec: ServerSpec, plan: _Plan, where: str) -> None:
    if spec.gpu_layers is not None:
        plan.add(["-ngl", str(spec.gpu_layers)], f"gpu_layers={spec.gpu_layers} -> -ngl {spec.gpu_layers}")


def _flash_attention(spec: ServerSpec, plan: _Plan, where: str) -> None:
    if spec.flash_attention is not None:
        value = "on" if spec.flash_attention else "off"
        plan.add(["-fa", value], f"flash_attention={spec.flash_attention} -> -fa {value}")


def _split(spec: ServerSpec, plan: _Plan, where: str) -> None:
    """``tp`` > 1: layers spread over that many GPUs; one GPU: no split at all."""
    if spec.tp > 1:
        ones = ",".join("1" for _ in range(spec.tp))
        plan.add(["--split-mode", "layer", "--tensor-split", ones],
                 f"tp={spec.tp} -> --split-mode layer --tensor-split {ones} "
                 "(llama.cpp spreads layers over the GPUs; this is pipelining, not tensor parallelism)")
    elif spec.gpu:
        plan.add(["--split-mode", "none"], "tp=1, gpu=true -> --split-mode none (the first visible GPU only)")


#: The logical options mapped to flags, in the order their flags follow the seed.
_OPTION_FLAGS: tuple[Callable[[ServerSpec, _Plan, str], None], ...] = (
    _slots, _context_size, _gpu_layers, _flash_attention, _split)


def _environment(spec: ServerSpec, notes: list[str], where: str) -> dict[str, str]:
    """The server's environment: the spec's, the API key (never on the command line) and the graphs' switch."""
    env = dict(spec.env)
    if spec.api_key:
        env["LLAMA_API_KEY"] = spec.api_key
    graph = spec.cuda_graph
    if graph is not None and not graph.enabled:
        env[GRAPHS_ENV] = "1"
        notes.append(
            f"cuda_graph=off -> env {GRAPHS_ENV}=1 (no log line confirms it at -lv 4: "
            "the execution check says unverifiable unless -lv 5 shows no graph use)"
        )
    elif graph is not None:
        _refuse_graphs_disabled_by_environment(env, where)
        notes.append("cuda_graph=on -> nothing to pass (CUDA builds with USE_GRAPHS capture graphs by default)")
    return env


def _refuse_graphs_disabled_by_environment(env: Mapping[str, str], where: str) -> None:
    inherited = env.get(GRAPHS_ENV, os.environ.get(GRAPHS_ENV))
    if inherited is not None:
        origin = "in env" if GRAPHS_ENV in env else "in this run's environment"
        raise ConfigError(
            f"{where} cuda_graph = on, but {GRAPHS_ENV}={inherited!r} is set "
            f"({origin}); ggml-cuda turns "
            "graphs off whenever the variable exists, whatever its value: unset it"
        )


class LlamaCppAdapter(EngineAdapter):
    """``llama-server`` (llama.cpp's OpenAI-compatible server)."""

    name = "llamacpp"
    env_prefixes = ("LLAMA_", "GGML_")
    generation_counter = "llamacpp:tokens_predicted_total"
    running_requests_gauge = "llamacpp:requests_processing"
    metrics_prefix = "llamacpp:"
    log_signature = re.compile(r"llama_model_load|main: server is listening|build: \d+ \(\w+\)")

    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        where = f"{spec.source}: [tool.llmserve.servers.{spec.name}]"
        if not spec.model:
            raise ConfigError(f"{where} engine = 'llamacpp' needs model = '/path/to/model.gguf'")
        self._refuse_unmapped(spec, where)
        command = _command(spec, where)
        user_flags = {_flag_of(a) for a in spec.args if a.startswith("-")}
        _refuse_owned_flags(spec, user_flags, where)
        plan = _Plan(notes=[f"binary: {command[0]}"])
        verbosity = _verbosity(spec.args, plan.notes)
        plan.add([*command, "-lv", verbosity, "-m", spec.model, "--host", host, "--port", str(port),
                  "--seed", str(spec.seed)], f"seed={spec.seed} -> --seed {spec.seed}")
        for option in _OPTION_FLAGS:
            option(spec, plan, where)
        if spec.served_model_name:
            plan.add(["--alias", spec.served_model_name])
        if "--metrics" not in user_flags:
            plan.add(["--metrics"], "--metrics added: llamacpp:tokens_predicted_total and friends for the cross-checks")
        plan.add(list(spec.args), f"args passed through verbatim: {' '.join(spec.args)}" if spec.args else None)
        url_host = "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)
        return LaunchPlan(
            argv=plan.argv,
            env=_environment(spec, plan.notes, where),
            base_url=f"http://{url_host}:{port}",
            model_name=spec.served_model_name or Path(spec.model).name,
            health_path="/health",  # 503 "Loading model" until the model is loaded
            generation_probe=True,
            notes=plan.notes,
        )

    @staticmethod
    def _refuse_unmapped(spec: ServerSpec, where: str) -> None:
        for option in (
            "attention_backend",
            "prefill_attention_backend",
            "decode_attention_backend",
            "nsa_prefill_backend",
            "nsa_decode_backend",
        ):
            if getattr(spec, option) is not None:
                raise ConfigError(
                    f"{where} {option} = {getattr(spec, option)!r}: llama.cpp has no attention "
                    "backend choice; use flash_attention = true/false"
                )
        graph = spec.cuda_graph
        if graph is not None and graph.enabled and (graph.batch_sizes or graph.max_batch_size):
            raise ConfigError(
                f"{where} cuda_graph = {graph.label}: llama.cpp captures graphs on the fly for "
                "each graph shape and has no capture sizes; use cuda_graph = true or false"
            )
        if spec.eager is not None:
            raise ConfigError(
                f"{where} eager = {spec.eager}: llama.cpp has no eager/compiled switch; "
                "use cuda_graph = false for no CUDA graphs"
            )
        if spec.mem_fraction is not None:
            raise ConfigError(
                f"{where} mem_fraction = {spec.mem_fraction}: llama.cpp allocates what the model, "
                "context_size and parallel need; it has no memory fraction"
            )
        if spec.deterministic:
            raise ConfigError(
                f"{where} deterministic = true: llama.cpp has no batch-invariant mode, so greedy "
                "output may differ across batch sizes; leave it false"
            )
        draft_in_args = any(_flag_of(a) in _DRAFT_FLAGS for a in spec.args)
        if spec.speculative is not None and not draft_in_args:
            raise ConfigError(
                f"{where} speculative = {spec.speculative!r}: llama.cpp needs a draft model; pass it "
                "in args (['-md', '/path/draft.gguf'])"
            )
        if spec.speculative is None and draft_in_args:
            raise ConfigError(
                f"{where} args load a draft model but speculative is unset; set speculative = "
                "'draft' so the execution check expects speculative decoding"
            )

    def fetch_server_info(
        self, base_url: str, api_key: str | None = None, timeout_s: float = 10.0
    ) -> dict[str, object] | None:
        """``GET /props`` with ``GET /slots`` added under ``"slots"``; None when /props does not answer."""
        info = read_page(base_url, "/props", api_key, timeout_s).json()
        if not isinstance(info, dict):
            return None
        slots = read_page(base_url, "/slots", api_key, timeout_s).json()
        if isinstance(slots, list):
            info["slots"] = slots
        return info

    def parse_facts(
        self, log_text: str, metrics_text: str | None = None, server_info: Mapping[str, object] | None = None
    ) -> ServerFacts:
        """Log facts, plus /metrics counters, plus gaps filled from /props and /slots."""
        return parse_llamacpp(log_text, metrics_text, server_info)

    def check_execution(self, spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
        return check_llamacpp_execution(spec, facts)

    def deterministic_flag_on(self, spec: ServerSpec) -> bool:
        return False  # no batch-invariant mode (deterministic = true is refused above)
