"""What llama-server says it did: facts from its log, ``/metrics``, ``/props`` and ``/slots``.

Formats are those of the llama.cpp vendored in llama-cpp-python 0.3.36 (commit 0c1e570), read from its
source (``common/log.cpp``, ``common/common.cpp``, ``src/llama-*.cpp``, ``ggml/src/ggml-cuda/ggml-cuda.cu``,
``tools/server/*.cpp``) and checked against a real CPU build's log (``tests/data/logs/``).

Where each fact comes from, and at which ``-lv`` verbosity it is printed:

===========================  ======================================================================  ===
fact                         line (after the ``M.SS.mmm.uuu L`` prefix)                              lv
===========================  ======================================================================  ===
version / build_info         ``cmn  common_param: build 1 (0c1e570) with GNU 12.2.0 for Linux x86_64``  4
verbosity                    ``cmn  common_param: verbosity = 4 (adjust with the `-lv N` CLI arg)``    3
backends, CUDA archs,        ``system_info: n_threads = 16 / 16 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 |  4
USE_GRAPHS (compile time)    PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | ...``
GPUs                         ``ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143771 MiB):`` and     4
                             ``  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: ...``
devices the model uses       ``llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) ...``  4
offloaded layers             ``load_tensors: offloaded 31/31 layers to GPU`` (CUDA builds only; a CPU    4
                             build prints ``warning: no usable GPU found, --gpu-layers option will be
                             ignored`` to stderr whatever the verbosity)
flash attention              ``llama_context: flash_attn = enabled|disabled|auto``; for ``auto`` also    4
                             ``resolve_fused_ops: Flash Attention enabled`` (or ``... not supported,
                             set to disabled``)
n_ctx, slots                 ``llama_context: n_ctx = 4096``; ``srv  load_model: initializing,         4/3
                             n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'``
KV cache                     ``llama_kv_cache: size = 90.00 MiB (4096 cells, 30 layers, 4/4 seqs), ...`` 4
graph use (run time)         ``ggml_backend_cuda_graph_compute: CUDA graph warmup complete``           5
===========================  ======================================================================  ===

CUDA graphs are switched off by the environment (``GGML_CUDA_DISABLE_GRAPHS``), which no line reports.
So the cuda_graph check is provable only where the engine leaves evidence: ``USE_GRAPHS`` missing
(or no CUDA backend) proves "off"; a ``CUDA graph warmup complete`` line proves "on"; and at ``-lv 5``
(where that line would be printed, and the per-token debug lines prove that decode ran and debug
output reached the log) its absence proves "off". Anything else is "unverifiable", never "pass".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, TypedDict, TypeGuard

from pytest_llmserve.evidence.facts import LineRule, ServerFacts, apply_line_rules, split_lines
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.verdicts.execution import (
    CheckResult,
    Status,
    check_config_is_execution,
    check_reported,
    evidence_lines,
)

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec

__all__ = [
    "CudaDevice",
    "LlamaCppFacts",
    "check_llamacpp_execution",
    "merge_llamacpp_metrics",
    "parse_llamacpp",
    "parse_llamacpp_log",
    "parse_llamacpp_props",
]

MAX_EVENT_LINES = 200
#: Decoded tokens (per-token debug lines or the metrics counter) needed before "no graph line" counts.
MIN_DECODE_TOKENS_FOR_ABSENCE = 8


class CudaDevice(TypedDict):
    """One CUDA device as ggml_cuda_init lists it."""

    index: int
    name: str
    compute_capability: str  # "9.0"
    vmm: bool  # virtual memory management
    vram_mib: int | None


@dataclass
class LlamaCppFacts(ServerFacts):
    """:class:`ServerFacts` plus what only llama.cpp reports. ``None`` = not reported."""

    build_info: str | None = None  # "b1-0c1e570" (the /props spelling)
    verbosity: int | None = None  # the -lv threshold the server ran with
    backends: tuple[str, ...] | None = None  # backend registries with features, e.g. ("CUDA", "CPU")
    cuda_archs: tuple[str, ...] | None = None  # ("900",): compiled architectures
    cuda_graphs_compiled: bool | None = None  # USE_GRAPHS = 1 among the CUDA features
    graph_warmups: int = 0  # "CUDA graph warmup complete" (debug): a graph was captured and launched
    graph_reuses: int = 0  # "CUDA Graph id N reused" (debug)
    debug_lines: int = 0  # lines at level D: debug output reaches the log
    library_debug_lines: int = 0  # of those, from libllama/ggml (the channel graph lines would use)
    debug_decode_tokens: int = 0  # per-token "n_gen = ..." debug lines: decode ran
    flash_attention_type: str | None = None  # what the context was created with: enabled / disabled / auto
    flash_attention: bool | None = None  # effective, after "auto" was resolved or a forced switch
    offloaded_layers: int | None = None
    total_layers: int | None = None
    gpu_offload_supported: bool | None = None  # False: a CPU build ignored -ngl
    gpus: list[CudaDevice] = field(default_factory=list)  # ggml_cuda_init's devices
    devices_used: tuple[str, ...] | None = None  # "CUDA0", "CUDA1": devices the model was loaded on
    model_buffers: dict[str, float] = field(default_factory=dict)  # buffer name -> MiB of weights
    n_ctx: int | None = None  # the whole context (KV pool)
    n_ctx_slot: int | None = None  # context of one slot
    n_parallel: int | None = None  # slots
    kv_unified: bool | None = None
    kv_cache_mib: float | None = None
    model_path: str | None = None
    tokens_predicted: float | None = None  # llamacpp:tokens_predicted_total
    n_decode: float | None = None  # llamacpp:n_decode_total


# --------------------------------------------------------------------------- the log

# "0.01.234.567 I " (minutes.seconds.ms.us since start, level) before every message once common_init ran.
_PREFIX = re.compile(r"^\s*(?:(\d+)\.(\d\d)\.(\d{3})\.(\d{3})\s+)?(?:([IWED])\s)?")
_BUILD = re.compile(r"\bbuild (\d+) \(([0-9a-fA-F]+|unknown)\) with (.+?) for (.+?)(?: \(debug\))?\s*$")
_VERBOSITY = re.compile(r"\bverbosity = (\d+) \(adjust with")
_SYSTEM_INFO = re.compile(r"system_info: n_threads = \d+.*?\| (.*)$")
_CUDA_FOUND = re.compile(r"ggml_cuda_init: found (\d+) CUDA devices(?: \(Total VRAM: (\d+) MiB\))?")
_CUDA_DEVICE = re.compile(
    r"^\s*Device (\d+): (.+?), compute capability (\d+)\.(\d+), VMM: (\w+)(?:, VRAM: (\d+) MiB)?"
)
_USING_DEVICE = re.compile(r"using device (\S+) \((.*?)\) \((.*?)\) - (\d+) MiB free")
_OFFLOADED = re.compile(r"offloaded (-?\d+)/(\d+) layers to GPU")
_NO_GPU = re.compile(r"no usable GPU found, --gpu-layers option will be ignored")
_MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")
_CTX_FIELD = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max|flash_attn|kv_unified)\s+= (\S+)")
_FA_RESOLVED = re.compile(r"Flash Attention (enabled|not supported, set to disabled)")
_FA_FORCED_ON = re.compile(r"enabling flash_attn since it is required")
_FA_FORCED_OFF = re.compile(r"flash_attn is not compatible with .*forcing off|disabling flash attention")
_KV_SIZE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\)"
)
_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'")
_MODEL_PATH = re.compile(r"loading model '([^']+)'")
_READY = re.compile(r"(?:^|\s)(?:main|srv\s+\S+): (?:server is listening on|listening on|model loaded)")
_GRAPH_WARMUP = re.compile(r"CUDA graph warmup complete")
_GRAPH_REUSED = re.compile(r"CUDA Graph id \d+ reused")
_DEBUG_TOKEN = re.compile(r"\| n_gen = (\d+), n_remaining = ")
# libllama/ggml debug lines (the server's own start with "srv ", "slot ", "que ", "res ", "cmn ").
# libllama logs "set_embeddings: value = 0" (debug) at every decode call.
_LIBRARY_DEBUG = re.compile(
    r"^(?:llama_|graph_reserve|create_tensor|load_tensors|ggml_|sched_|set_embeddings|set_adapters_lora"
    r"|adapters_lora_are_same)"
)
_SPEC_ON = re.compile(r"loading draft model|speculative decoding context initialized")
_SPEC_OFF = re.compile(r"no implementations specified for speculative decoding")
# Lines that end a boot or a request badly. ("E" level lines are errors too.)
_ERRORS = re.compile(
    r"GGML_ASSERT|CUDA error|out of memory|failed to load model|error loading model|exiting due to"
    r"|Segmentation fault|terminate called|GGML_ABORT|error: "
)
_NAN_WORD = re.compile(r"(?<![\w.])nan(?![\w])", re.IGNORECASE)


def _strip_prefix(line: str) -> tuple[float | None, str | None, str]:
    match = _PREFIX.match(line)
    if not match or not match.group(0):
        return None, None, line
    ts = None
    if match.group(1) is not None:
        ts = (
            int(match.group(1)) * 60
            + int(match.group(2))
            + int(match.group(3)) / 1e3
            + int(match.group(4)) / 1e6
        )
    return ts, match.group(5), line[match.end() :]


def _system_info(facts: LlamaCppFacts, line: str, tail: str) -> None:
    backends: list[str] = []
    features: dict[str, dict[str, str]] = {}
    current: str | None = None
    for token in (t.strip() for t in tail.split("|")):
        if not token:
            continue
        if " : " in token:
            current, _, token = token.partition(" : ")
            current = current.strip()
            backends.append(current)
            features[current] = {}
        key, eq, value = token.partition(" = ")
        if current is not None and eq:
            features[current][key.strip()] = value.strip()
    facts.record("backends", tuple(backends), line)
    cuda = features.get("CUDA")
    if cuda is None:
        # No CUDA backend in this build: CUDA graphs cannot run.
        facts.record("cuda_graphs_compiled", False, line)
        return
    archs = cuda.get("ARCHS")
    if archs:
        facts.record("cuda_archs", tuple(a for a in re.split(r"[,\s]+", archs) if a), line)
    facts.record("cuda_graphs_compiled", cuda.get("USE_GRAPHS") == "1", line)


def _bool(text: str) -> bool | None:
    low = text.strip().strip("'\"").lower()
    if low in ("true", "1", "yes", "enabled", "on"):
        return True
    if low in ("false", "0", "no", "disabled", "off"):
        return False
    return None


@dataclass
class _LlamaCppLog:
    """What reading a llama-server log has found so far, beyond the facts, and the line being read: its
    rules match the message (``line``, after the time and level prefix) and keep the whole line (``raw``) as
    evidence."""

    facts: LlamaCppFacts
    raw: str = ""
    line: str = ""
    level: str | None = None
    ts: float | None = None  # the current line's seconds since start
    first_ts: float | None = None
    devices_used: list[str] = field(default_factory=list)

    def read(self, raw: str) -> None:
        self.raw = raw
        self.ts, self.level, self.line = _strip_prefix(raw)
        if self.ts is not None and self.first_ts is None:
            self.first_ts = self.ts

    def count_debug(self) -> bool:
        """Count a debug line (a per-token one, a library one); True for a per-token line."""
        facts, line, raw = self.facts, self.line, self.raw
        if self.level != "D":
            return False
        facts.debug_lines += 1
        if _DEBUG_TOKEN.search(line):
            facts.debug_decode_tokens += 1
            if facts.debug_decode_tokens <= 2:
                facts.add_evidence("debug_decode_tokens", raw)
            return True
        if _LIBRARY_DEBUG.match(line):
            facts.library_debug_lines += 1
            if facts.library_debug_lines <= 1:
                facts.add_evidence("library_debug_lines", raw)
        return False


def _on_graph_warmup(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    r.facts.graph_warmups += 1
    r.facts.cuda_graph_enabled = True
    if r.facts.graph_warmups <= 3:
        r.facts.add_evidence("cuda_graph_enabled", r.raw)


def _on_graph_reused(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    r.facts.graph_reuses += 1
    r.facts.cuda_graph_enabled = True
    if r.facts.graph_reuses <= 2:
        r.facts.add_evidence("cuda_graph_enabled", r.raw)


#: ggml-cuda's graph lines (debug): read before anything else, at any level.
_GRAPH_RULES: tuple[LineRule[_LlamaCppLog], ...] = (
    (_GRAPH_WARMUP, _on_graph_warmup),
    (_GRAPH_REUSED, _on_graph_reused),
)


def _on_build(r: _LlamaCppLog, line: str, m: re.Match[str]) -> bool:
    if r.facts.build_info is not None:  # the first build line is the server's
        return False
    build = f"b{m.group(1)}-{m.group(2)}"
    r.facts.record_many(r.raw, build_info=build, version=build)
    return True


def _on_cuda_device(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    r.facts.gpus.append(
        {
            "index": int(m.group(1)),
            "name": m.group(2),
            "compute_capability": f"{m.group(3)}.{m.group(4)}",
            "vmm": m.group(5) == "yes",
            "vram_mib": int(m.group(6)) if m.group(6) else None,
        }
    )
    r.facts.add_evidence("gpus", r.raw)


def _on_using_device(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    if m.group(1) not in r.devices_used:
        r.devices_used.append(m.group(1))
    r.facts.record("devices_used", tuple(r.devices_used), r.raw)


def _on_model_buffer(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    r.facts.model_buffers[m.group(1)] = float(m.group(2))
    r.facts.add_evidence("model_buffers", r.raw)


def _on_context_field(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    key, value = m.group(1), m.group(2)
    if key == "n_ctx":
        r.facts.record("n_ctx", int(value), r.raw)
    elif key == "flash_attn":
        r.facts.record("flash_attention_type", value, r.raw)
        if value in ("enabled", "disabled"):
            r.facts.record("flash_attention", value == "enabled", r.raw)
    elif key == "kv_unified":
        r.facts.record("kv_unified", _bool(value), r.raw)


def _on_kv_size(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    # "(2048 cells, 30 layers, 2/2 seqs)": cells per stream; one stream per sequence unless
    # the KV cache is unified (then "4/1 seqs").
    r.facts.record_many(r.raw, kv_cache_mib=float(m.group(1)),
                        kv_cache_tokens=int(m.group(2)) * max(1, int(m.group(5))))


def _on_model_path(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    if r.facts.model_path is None:
        r.facts.record("model_path", m.group(1), r.raw)


def _on_speculative_off(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    if r.facts.speculative is None:
        r.facts.record("speculative", False, r.raw)


def _on_ready(r: _LlamaCppLog, line: str, m: re.Match[str]) -> None:
    if not r.facts.ready:
        r.facts.record("ready", True, r.raw)
        if r.ts is not None and r.first_ts is not None:
            r.facts.startup_s = round(r.ts - r.first_ts, 3)


#: The (non-debug) lines of a llama-server log and what each proves; the first rule a line matches (and whose
#: handler takes it) reads it.
_LLAMACPP_RULES: tuple[LineRule[_LlamaCppLog], ...] = (
    (_BUILD, _on_build),
    (_VERBOSITY, lambda r, line, m: r.facts.record("verbosity", int(m.group(1)), r.raw)),
    (_SYSTEM_INFO, lambda r, line, m: _system_info(r.facts, r.raw, m.group(1))),
    (_CUDA_FOUND, lambda r, line, m: r.facts.add_evidence("gpus", r.raw)),
    (_CUDA_DEVICE, _on_cuda_device),
    (_USING_DEVICE, _on_using_device),
    (_OFFLOADED, lambda r, line, m: r.facts.record_many(
        r.raw, offloaded_layers=int(m.group(1)), total_layers=int(m.group(2)), gpu_offload_supported=True)),
    (_NO_GPU, lambda r, line, m: r.facts.record_many(r.raw, gpu_offload_supported=False, offloaded_layers=0)),
    (_MODEL_BUFFER, _on_model_buffer),
    (_CTX_FIELD, _on_context_field),
    (_FA_RESOLVED, lambda r, line, m: r.facts.record("flash_attention", m.group(1) == "enabled", r.raw)),
    (_FA_FORCED_ON, lambda r, line, m: r.facts.record("flash_attention", True, r.raw)),
    (_FA_FORCED_OFF, lambda r, line, m: r.facts.record("flash_attention", False, r.raw)),
    (_KV_SIZE, _on_kv_size),
    (_SLOTS, lambda r, line, m: r.facts.record_many(
        r.raw, n_parallel=int(m.group(1)), max_batch_size=int(m.group(1)), n_ctx_slot=int(m.group(2)),
        kv_unified=_bool(m.group(3)))),
    (_MODEL_PATH, _on_model_path),
    (_SPEC_ON, lambda r, line, m: r.facts.record("speculative", True, r.raw)),
    (_SPEC_OFF, _on_speculative_off),
    (_READY, _on_ready),
)


def parse_llamacpp_log(text: str) -> LlamaCppFacts:
    """Facts from a llama-server log (stdout and stderr together, as the plugin captures them)."""
    r = _LlamaCppLog(LlamaCppFacts(engine="llamacpp"))
    facts = r.facts
    for raw in split_lines(text):
        if raw.startswith("# llmserve launch "):
            continue  # the plugin's own header: the request, not what ran
        r.read(raw)
        is_token_line = r.count_debug()
        if apply_line_rules(r, r.line, _GRAPH_RULES):
            continue
        if not is_token_line:
            _scan_events(facts, raw, r.line, r.level)
        if is_token_line or r.level == "D":
            continue
        apply_line_rules(r, r.line, _LLAMACPP_RULES)
    if facts.devices_used is None and facts.model_buffers:
        # Older logs have no "using device" line: the devices holding weights say the same.
        gpu_buffers = tuple(n for n in facts.model_buffers if re.fullmatch(r"CUDA\d+", n))
        if gpu_buffers:
            facts.devices_used = gpu_buffers
            for line in facts.evidence.get("model_buffers", []):
                facts.add_evidence("devices_used", line)
    facts.compact_evidence()
    return facts


def _scan_events(facts: LlamaCppFacts, raw: str, line: str, level: str | None) -> None:
    if "system_info:" in line:
        return
    if _NAN_WORD.search(line) and len(facts.nan_events) < MAX_EVENT_LINES:
        facts.nan_events.append(raw.rstrip())
    if (level == "E" or _ERRORS.search(line)) and len(facts.errors) < MAX_EVENT_LINES:
        facts.errors.append(raw.rstrip())


# --------------------------------------------------------------------------- /metrics, /props, /slots


def merge_llamacpp_metrics(facts: LlamaCppFacts, metrics_text: str) -> LlamaCppFacts:
    """Counters from ``/metrics`` (needs ``--metrics``; the adapter passes it)."""
    metrics = parse_prometheus(metrics_text)

    def first(name: str) -> tuple[float, str] | None:
        for _labels, value in metrics.get(name, [])[:1]:
            return value, f"{name} {value:g}"
        return None

    if found := first("llamacpp:tokens_predicted_total"):
        facts.record("tokens_predicted", found[0], found[1])
    if found := first("llamacpp:n_decode_total"):
        facts.record("n_decode", found[0], found[1])
    if (found := first("llamacpp:spec_decode_num_drafts_total")) and found[0] > 0:
        facts.record("speculative", True, found[1])
    return facts


def parse_llamacpp_props(info: Mapping[str, object]) -> LlamaCppFacts:
    """Facts from ``GET /props`` (and ``GET /slots`` when the adapter added it under ``"slots"``)."""
    facts = LlamaCppFacts(engine="llamacpp")
    _props_server(facts, info)
    settings = info.get("default_generation_settings")
    if isinstance(settings, Mapping):
        _props_generation(facts, settings)
    slot_list = info.get("slots")
    if isinstance(slot_list, list) and slot_list:
        _slots(facts, slot_list)
    return facts


def _props_line(path: str, value: object) -> str:
    """The evidence line of a /props value."""
    return f"/props {path} = {value!r}"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _props_server(facts: LlamaCppFacts, info: Mapping[str, object]) -> None:
    """The build, the slots and the model file."""
    build = info.get("build_info")
    if isinstance(build, str) and build:
        facts.record_many(_props_line("build_info", build), build_info=build, version=build)
    slots = info.get("total_slots")
    if _is_int(slots):
        facts.record_many(_props_line("total_slots", slots), n_parallel=slots, max_batch_size=slots)
    path = info.get("model_path")
    if isinstance(path, str) and path:
        facts.record("model_path", path, _props_line("model_path", path))


def _props_generation(facts: LlamaCppFacts, settings: Mapping[str, object]) -> None:
    """``default_generation_settings``: a slot's context and the seed."""
    n_ctx = settings.get("n_ctx")
    if _is_int(n_ctx):
        facts.record("n_ctx_slot", n_ctx, _props_line("default_generation_settings.n_ctx", n_ctx))
    params = settings.get("params")
    seed = params.get("seed") if isinstance(params, Mapping) else None
    if _is_int(seed):
        facts.record("seed", seed, _props_line("default_generation_settings.params.seed", seed))


def _slots(facts: LlamaCppFacts, slot_list: list[object]) -> None:
    """``/slots``: whether they decode speculatively (when every slot says), and how many there are."""
    flags = [s.get("speculative") for s in slot_list if isinstance(s, Mapping)]
    if flags and all(isinstance(f, bool) for f in flags):
        facts.record("speculative", any(flags), f"/slots speculative = {flags!r}")
    if facts.n_parallel is None:
        facts.record("n_parallel", len(slot_list), f"/slots: {len(slot_list)} slots")


def _fill(facts: LlamaCppFacts, other: LlamaCppFacts) -> LlamaCppFacts:
    """Fill facts that ``facts`` lacks from ``other`` (scalars only), keeping ``other``'s evidence."""
    skip = {
        "engine",
        "evidence",
        "decode_batches",
        "nan_events",
        "errors",
        "gpus",
        "model_buffers",
        "graph_captures",
        "graph_passes",
    }
    for f in fields(LlamaCppFacts):
        if f.name in skip:
            continue
        mine, theirs = getattr(facts, f.name), getattr(other, f.name)
        if mine is None and theirs is not None:
            setattr(facts, f.name, theirs)
            for ev in other.evidence.get(f.name, []):
                facts.add_evidence(f.name, ev)
    return facts


def parse_llamacpp(
    log_text: str, metrics_text: str | None = None, server_info: Mapping[str, object] | None = None
) -> LlamaCppFacts:
    """Log facts, plus ``/metrics`` counters, plus gaps filled from ``/props`` and ``/slots``.

    The seed and the slots' speculative flag come only from /props and /slots; a log fact wins over
    the same fact from /props.
    """
    facts = parse_llamacpp_log(log_text)
    if metrics_text:
        merge_llamacpp_metrics(facts, metrics_text)
    if server_info:
        _fill(facts, parse_llamacpp_props(server_info))
    facts.compact_evidence()
    return facts


# --------------------------------------------------------------------------- config is execution


def _decoded_tokens(facts: LlamaCppFacts) -> int:
    return max(facts.debug_decode_tokens, int(facts.tokens_predicted or 0))


def _check_graphs(spec: ServerSpec, facts: LlamaCppFacts) -> list[CheckResult]:
    assert spec.cuda_graph is not None
    on = spec.cuda_graph.enabled
    requested = "cuda graphs on" if on else "cuda graphs off (GGML_CUDA_DISABLE_GRAPHS=1)"
    used = facts.graph_warmups + facts.graph_reuses
    compile_ev = evidence_lines(facts, "cuda_graphs_compiled")
    use_ev = evidence_lines(facts, "cuda_graph_enabled")
    debug_ev = evidence_lines(facts, "verbosity", "debug_decode_tokens", "library_debug_lines")
    decoded = _decoded_tokens(facts)
    # Absence of the graph debug line proves "no graph" only where it would have been printed.
    absence_proven = (
        facts.library_debug_lines > 0
        and facts.debug_decode_tokens >= MIN_DECODE_TOKENS_FOR_ABSENCE
        and (facts.verbosity is None or facts.verbosity >= 5)
    )
    out: list[CheckResult] = []
    if on:
        compiled = facts.cuda_graphs_compiled
        out.append(check_reported(
            "cuda_graph.compiled", requested,
            None if compiled is None
            else "CUDA backend built with USE_GRAPHS" if compiled
            else "no CUDA backend in this build" if facts.backends is not None and "CUDA" not in facts.backends
            else "CUDA backend built without USE_GRAPHS",
            compile_ev, passed=bool(compiled), unreported_note="system_info is logged at -lv 4"))
    status: Status
    if used:
        status = "pass" if on else "fail"
        observed = (
            f"graphs used: {facts.graph_warmups} warm-up(s) completed, {facts.graph_reuses} reuse line(s)"
        )
        out.append(CheckResult("cuda_graph.used_in_decode", status, requested, observed, use_ev))
    elif facts.cuda_graphs_compiled is False:
        out.append(
            CheckResult(
                "cuda_graph.used_in_decode",
                "fail" if on else "pass",
                requested,
                "impossible: graphs not compiled in",
                compile_ev,
            )
        )
    elif absence_proven:
        out.append(
            CheckResult(
                "cuda_graph.used_in_decode",
                "fail" if on else "pass",
                requested,
                f"no graph captured in {facts.debug_decode_tokens} decoded tokens at debug verbosity",
                debug_ev,
                note="ggml-cuda logs 'CUDA graph warmup complete' (debug) when it first launches a graph",
            )
        )
    else:
        note = (
            "graphs switched off by GGML_CUDA_DISABLE_GRAPHS leave no log line; "
            if not on
            else "graph use is logged only at debug verbosity; "
        )
        note += (
            "run with args = ['-lv', '5'] to make it provable"
            if (facts.verbosity or 0) < 5
            else f"decode too short to tell ({decoded} tokens)"
        )
        out.append(
            CheckResult(
                "cuda_graph.used_in_decode",
                "unverifiable",
                requested,
                "not reported",
                debug_ev + compile_ev,
                note=note,
            )
        )
    return out


def _check_flash_attention(want: bool, facts: LlamaCppFacts) -> CheckResult:
    requested = "on" if want else "off"
    reported = facts.flash_attention
    observed = None if reported is None else "on" if reported else "off"
    if observed is not None and facts.flash_attention_type == "auto":
        observed += " (auto, resolved at load)"
    return check_reported("flash_attention", requested, observed,
                          evidence_lines(facts, "flash_attention_type", "flash_attention"), passed=reported == want,
                          unreported_note="llama_context logs flash_attn at -lv 4")


def _check_gpu_layers(want: int, facts: LlamaCppFacts) -> CheckResult:
    evidence = evidence_lines(facts, "offloaded_layers", "gpu_offload_supported")
    if facts.offloaded_layers is None:
        return check_reported("gpu_layers", str(want), None, evidence,
                              unreported_note="load_tensors logs 'offloaded N/M layers to GPU' at -lv 4")
    if facts.gpu_offload_supported is False:
        return check_reported("gpu_layers", str(want), "0 (this build has no GPU offload)", evidence, passed=want == 0)
    total = facts.total_layers
    expected = min(want, total) if total is not None else want
    observed = f"{facts.offloaded_layers}/{total}" if total is not None else str(facts.offloaded_layers)
    return check_reported("gpu_layers", f"{want} (expect {expected} offloaded)", observed, evidence,
                          passed=facts.offloaded_layers == expected)


def _check_int(
    name: str,
    want: int,
    got: int | None,
    facts: LlamaCppFacts,
    fact: str,
    *,
    at_least: bool = False,
    note: str = "",
) -> CheckResult:
    ok = got is not None and (got >= want if at_least else got == want)
    return check_reported(name, str(want), None if got is None else str(got), evidence_lines(facts, fact), passed=ok,
                          note=note if got != want else "", unreported_note=note)


def _check_devices(spec: ServerSpec, facts: LlamaCppFacts) -> CheckResult:
    want = max(1, spec.tp)
    used = facts.devices_used
    gpus = None if used is None else [d for d in used if not d.upper().startswith("CPU")]
    return check_reported("tp.devices", f"{want} GPU(s)", None if gpus is None else ", ".join(gpus) or "none",
                          evidence_lines(facts, "devices_used"), passed=gpus is not None and len(gpus) == want,
                          unreported_note="llama_model_load_from_file_impl logs 'using device CUDAn' at -lv 4")


def check_llamacpp_execution(spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
    """Each requested option against what llama-server reported; unreported means "unverifiable".

    The generic checks (speculative, seed, max_batch_size) come from
    :func:`pytest_llmserve.verdicts.execution.check_config_is_execution`; CUDA graphs, flash attention, GPU
    layers, context, slots and devices are checked here, each ending in the same requested-vs-reported verdict
    (:func:`~pytest_llmserve.verdicts.execution.check_reported`) where the option is one fact compared.
    """
    lfacts = facts if isinstance(facts, LlamaCppFacts) else _promote(facts)
    results = check_config_is_execution(replace(spec, cuda_graph=None), lfacts)
    if spec.cuda_graph is not None:
        results.extend(_check_graphs(spec, lfacts))
    if spec.flash_attention is not None:
        results.append(_check_flash_attention(spec.flash_attention, lfacts))
    if spec.gpu_layers is not None:
        results.append(_check_gpu_layers(spec.gpu_layers, lfacts))
    if spec.context_size is not None:
        results.append(_check_int("context_size", spec.context_size, lfacts.n_ctx, lfacts, "n_ctx", at_least=True,
                                  note="llama.cpp pads each slot's context to a multiple of 256"))
    if spec.parallel is not None:
        results.append(_check_int("parallel", spec.parallel, lfacts.n_parallel, lfacts, "n_parallel"))
    if spec.gpu or spec.tp > 1:
        results.append(_check_devices(spec, lfacts))
    return results


def _promote(facts: ServerFacts) -> LlamaCppFacts:
    out = LlamaCppFacts(engine=facts.engine)
    for f in fields(ServerFacts):
        setattr(out, f.name, getattr(facts, f.name))
    return out
