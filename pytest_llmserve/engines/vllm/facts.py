"""What a vLLM server says it did: facts from its own log (V1, 0.2x-0.3x incl. the CPU build) and /metrics.

Every fact keeps the lines that prove it; a fact the server did not report stays None."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_llmserve.engines.log_reading import StampedLog, on_ready, record_read
from pytest_llmserve.evidence.facts import (
    LineRule,
    NanLogPattern,
    ServerFacts,
    as_bool,
    as_float,
    as_int,
    int_list,
    literal,
    normalize_backend,
    parse_kwargs_repr,
    read_timed_log,
)
from pytest_llmserve.evidence.prometheus import MetricSamples, metric_line

# NaN as vLLM reports it: (engine, pattern, meaning) lines and the Prometheus counter of NaN requests.
NAN_LOG_PATTERNS: tuple[NanLogPattern, ...] = (
    ("vllm", re.compile(r"Corrupted:\s*([1-9][\d,]*)\s*reqs"),
     "vLLM counted requests with NaN in the logits (VLLM_COMPUTE_NANS_IN_LOGITS=1)"),
    ("vllm", re.compile(re.escape("Out of range float values are not JSON compliant")),
     "a response held NaN/inf and could not be serialized (vLLM answers HTTP 400)"),
)
NAN_COUNTERS = ("vllm:corrupted_requests",)  # "Requests with NaNs in logits"

_VLLM_TS = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d\d-\d\d \d\d:\d\d:\d\d)\b")
_VLLM_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v?([^)]*)\) with config: (.*)$")
_VLLM_BANNER_VERSION = re.compile(r"(?:vLLM API server version|[█▀▄]\s+version)\s+(\d+\.\d+\S*)\s*$")
_VLLM_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_VLLM_DOWNGRADE = re.compile(r"CUDAGraphMode\.(\w+) is not supported with .*?; setting cudagraph_mode=(\w+)")
_VLLM_SET_MODE = re.compile(r"[Ss]etting cudagraph_mode to (\w+)")
# 0.20: "... disabling torch.compile and CUDAGraphs"
# 0.32: "... disabling torch.compile, CUDAGraphs, and JIT kernel warmup"
_VLLM_EAGER_WARN = re.compile(r"Enforce eager set, disabling torch\.compile")
_VLLM_EAGER_NO_GRAPH = re.compile(r"Cudagraph is disabled under eager mode")
# 0.2x: "Capturing CUDA graphs (decode, FULL)"; 0.26 (V2 model runner): "Capturing CUDA graphs (PIECEWISE)".
_VLLM_CAPTURE = re.compile(r"Capturing CUDA graphs \((?:([^()]*?), )?(\w+)\)\s*:?.*?(\d+)/(\d+)")
_VLLM_CAPTURE_DONE = re.compile(r"Graph capturing finished in [\d.]+ secs?")
_VLLM_KV = re.compile(r"\b(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
_VLLM_BACKEND_FORCED = re.compile(
    r"Using (?:AttentionBackendEnum\.|_Backend\.)?([A-Z][A-Z0-9_]*) backend\.(?:\s|$)"
)
_VLLM_BACKEND_AUTO = re.compile(
    r"Using (?:AttentionBackendEnum\.)?(\w+) attention backend out of potential backends"
)
_VLLM_BACKEND_LAYOUT = re.compile(r"Using \w+ KV cache layout for (?:AttentionBackendEnum\.)?(\w+) backend")
_VLLM_BACKEND_OLD = re.compile(
    r"Using (Flash Attention|FlashInfer|XFormers|Torch SDPA|ROCmFlashAttention) backend\."
)
_VLLM_NOT_ATTENTION = frozenset({"NCCL", "GLOO", "MP", "RAY", "UNI", "EXTERNAL_LAUNCHER"})
_VLLM_GPU_UTIL = re.compile(r"current --gpu-memory-utilization=([\d.]+)")
_VLLM_READY = re.compile(r"Starting vLLM (?:API )?server|Application startup complete")
_VLLM_SPEC_METRICS = re.compile(r"SpecDecoding metrics:")
# --cudagraph-metrics: "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |" rows, logged
# every VLLM_LOG_STATS_INTERVAL (10 s) while requests run; a process prefix may stand before each row.
_VLLM_CG_STATS_ROW = re.compile(
    r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(NONE|PIECEWISE|FULL)\s*\|\s*(\d+)\s*\|?\s*$"
)
_COMPILATION_LEVELS = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}


def _vllm_mode(compilation_config: str) -> str | None:
    match = re.search(
        r"['\"]mode['\"]\s*:\s*(?:<CompilationMode\.(\w+):\s*\d+>|(\d+)|['\"](\w+)['\"]|None)",
        compilation_config,
    )
    if match:
        if match.group(1) or match.group(3):
            return (match.group(1) or match.group(3)).upper()
        if match.group(2):
            return _COMPILATION_LEVELS.get(int(match.group(2)), match.group(2))
        return None
    # vLLM before the `mode` rename: 'level': 0..3 (NO_COMPILATION, DYNAMO_AS_IS, DYNAMO_ONCE, PIECEWISE)
    level = re.search(r"['\"]level['\"]\s*:\s*(?:<CompilationLevel\.\w+:\s*)?(\d+)", compilation_config)
    if level:
        return _COMPILATION_LEVELS.get(int(level.group(1)), level.group(1))
    return None


def _vllm_cudagraph_mode(compilation_config: str) -> str | None:
    match = re.search(
        r"['\"]cudagraph_mode['\"]\s*:\s*(?:<CUDAGraphMode\.(\w+):[^>]*>|['\"](\w+)['\"]|None)",
        compilation_config,
    )
    if match and (match.group(1) or match.group(2)):
        return (match.group(1) or match.group(2)).upper()
    return None


def _vllm_capture_sizes(compilation_config: str) -> tuple[int, ...] | None:
    match = re.search(r"['\"]cudagraph_capture_sizes['\"]\s*:\s*(\[[\d,\s]*\]|None)", compilation_config)
    if not match or match.group(1) == "None":
        return None
    return tuple(sorted(set(int_list(match.group(1)))))


def _vllm_config_line(r: _VLLMLog, line: str, version: str, body: str) -> None:
    facts = r.facts
    if version and facts.version is None:
        facts.record("version", version.strip(), line)
    config = parse_kwargs_repr(body)
    spec = config.get("speculative_config")
    if spec is not None:
        if spec == "None":
            facts.record("speculative", False, line)
            facts.speculative_detail = None
        else:
            facts.record("speculative", True, line)
            facts.record("speculative_detail", spec, line)
    record_read(facts, config, (("enforce_eager", "enforce_eager", as_bool), ("seed", "seed", as_int)), line)
    compilation = config.get("compilation_config")
    if compilation:
        mode = _vllm_mode(compilation)
        if mode:
            facts.record("compilation_mode", mode, line)
        graph_mode = _vllm_cudagraph_mode(compilation)
        if graph_mode:
            facts.record("cudagraph_mode", graph_mode, line)
        sizes = _vllm_capture_sizes(compilation)
        if sizes is not None:
            r.capture_sizes = (sizes, line)


def _vllm_non_default(facts: ServerFacts, line: str, raw: str) -> None:
    """The user's non-default args: requests, used only where nothing later reports the value."""
    data = literal(raw)
    values: dict[str, object] = data if isinstance(data, dict) else {}
    if not values:  # not a pure literal (an enum in it): pick the few scalars we need
        for key in ("gpu_memory_utilization", "max_num_seqs"):
            match = re.search(rf"'{key}': ([\d.]+)", raw)
            if match:
                values[key] = literal(match.group(1))
    record_read(facts, values, (("mem_fraction", "gpu_memory_utilization", as_float),
                                ("max_batch_size", "max_num_seqs", as_int)), line)


def _vllm_graph_stats_row(facts: ServerFacts, line: str, unpadded: int, mode: str, count: int) -> None:
    """One --cudagraph-metrics row: ``count`` steps of ``unpadded`` tokens ran in runtime ``mode``.

    A pure decode step has one token per request, so ``unpadded`` is its batch size. Under
    FULL_DECODE_ONLY mixed prefill steps legitimately run without a graph (NONE) and the table does not
    say which steps were prefill: those NONE rows are kept as raw counts but not charged to any size.
    """
    facts.graph_passes[mode] = facts.graph_passes.get(mode, 0.0) + count
    facts.add_evidence("graph_passes", line)
    on_graph = mode != "NONE"
    if on_graph:
        facts.graph_passes_on += count
    else:
        facts.graph_passes_off += count
    if on_graph or facts.cudagraph_mode != "FULL_DECODE_ONLY":
        facts.count_graph_use(unpadded, on_graph, count)
        facts.add_evidence("graph_use_by_size", line)


@dataclass
class _VLLMLog(StampedLog):
    """What reading a vLLM log has found so far, beyond the facts: what only the whole log decides."""

    stamp = _VLLM_TS
    stamp_prefix = "2000-"  # vLLM stamps no year; 2000 is a leap year, so 02-29 reads too

    capture_sizes: tuple[tuple[int, ...], str] | None = None  # (the config line's capture sizes, the line)
    v2_model_runner: bool = False  # "Using V2 Model Runner": no per-step graph use is logged
    captures: dict[str, tuple[int, str]] = field(default_factory=dict)  # "decode, FULL" -> (done, last line)
    capture_done_line: str | None = None
    backend_lines: list[tuple[str, str]] = field(default_factory=list)  # (backend, line)
    in_cg_stats: bool = False  # a --cudagraph-metrics table has begun


def _on_capture(r: _VLLMLog, line: str, m: re.Match[str]) -> None:
    key = f"{m.group(1).strip()}, {m.group(2)}" if m.group(1) else m.group(2)
    done = int(m.group(3))
    if key not in r.captures or done >= r.captures[key][0]:
        r.captures[key] = (done, line)


def _on_backend(r: _VLLMLog, line: str, m: re.Match[str]) -> bool:
    """An attention backend line; False for the same words about a communication backend (NCCL...)."""
    if m.group(1) in _VLLM_NOT_ATTENTION:
        return False
    r.backend_lines.append((m.group(1), line))
    return True


def _on_graph_stats_row(r: _VLLMLog, line: str, m: re.Match[str]) -> bool:
    if not r.in_cg_stats:
        return False
    _vllm_graph_stats_row(r.facts, line, int(m.group(1)), m.group(4), int(m.group(5)))
    return True


def _on_v2_model_runner(r: _VLLMLog, line: str, m: re.Match[str]) -> None:
    r.v2_model_runner = True


def _on_capture_done(r: _VLLMLog, line: str, m: re.Match[str]) -> None:
    r.capture_done_line = line


def _on_graph_stats_table(r: _VLLMLog, line: str, m: re.Match[str]) -> None:
    r.in_cg_stats = True


#: The lines of a vLLM log and what each proves; the first rule a line matches (and whose handler takes it)
#: reads it.
_VLLM_RULES: tuple[LineRule[_VLLMLog], ...] = (
    (_VLLM_CONFIG, lambda r, line, m: _vllm_config_line(r, line, m.group(1), m.group(2))),
    # The banner is printed first, by the API server: what the user launched.
    (_VLLM_BANNER_VERSION, lambda r, line, m: r.facts.record("version", m.group(1), line)),
    (_VLLM_NON_DEFAULT, lambda r, line, m: _vllm_non_default(r.facts, line, m.group(1))),
    (_VLLM_EAGER_WARN, lambda r, line, m: r.facts.record_many(
        line, enforce_eager=True, compilation_mode="NONE", cudagraph_mode="NONE")),
    (_VLLM_EAGER_NO_GRAPH, lambda r, line, m: r.facts.record("cudagraph_mode", "NONE", line)),
    # Downgrades come after the config line: the last word on the mode is the effective one.
    (_VLLM_DOWNGRADE, lambda r, line, m: r.facts.record("cudagraph_mode", m.group(2).upper(), line)),
    (_VLLM_SET_MODE, lambda r, line, m: r.facts.record("cudagraph_mode", m.group(1).upper(), line)),
    (_VLLM_CAPTURE, _on_capture),
    (re.compile(re.escape("Using V2 Model Runner")), _on_v2_model_runner),
    (_VLLM_CAPTURE_DONE, _on_capture_done),
    (_VLLM_KV, lambda r, line, m: r.facts.record("kv_cache_tokens", int(m.group(1).replace(",", "")), line)),
    (_VLLM_GPU_UTIL, lambda r, line, m: r.facts.record("mem_fraction", float(m.group(1)), line)),
    (_VLLM_BACKEND_AUTO, _on_backend),
    (_VLLM_BACKEND_LAYOUT, _on_backend),
    (_VLLM_BACKEND_FORCED, _on_backend),
    (_VLLM_BACKEND_OLD, _on_backend),
    (_VLLM_SPEC_METRICS, lambda r, line, m: r.facts.record("speculative", True, line)),
    (re.compile(re.escape("CUDAGraph Stats")), _on_graph_stats_table),
    (_VLLM_CG_STATS_ROW, _on_graph_stats_row),
    (_VLLM_READY, on_ready),
)


def parse_vllm_log(text: str) -> ServerFacts:
    """Facts from a vLLM (V1) server log: stdout and stderr together, as the server wrote them."""
    r = _VLLMLog(ServerFacts(engine="vllm"))
    read_timed_log(r, text, _VLLM_RULES)
    facts = r.facts
    if r.backend_lines:
        # The first backend line is the model's; a spec-decode drafter may log another one later.
        name = normalize_backend(r.backend_lines[0][0])
        facts.record("attention_backend", name, r.backend_lines[0][1])
        for other, other_line in r.backend_lines[1:]:
            if normalize_backend(other) == name:
                facts.add_evidence("attention_backend", other_line)

    r.record_ready()

    _vllm_graph_facts(facts, r.capture_sizes, r.captures, r.capture_done_line, r.ready_line)
    if not facts.decode_graph_reported:
        facts.graph_use_hint = (
            "this vLLM uses its V2 model runner, which records no per-step graph use (its --cudagraph-metrics table is "
            "filled by the V1 runner only: VLLM_USE_V2_MODEL_RUNNER=0)" if r.v2_model_runner else
            "vLLM reports graph use per step only in its --cudagraph-metrics table (logged with the periodic stats "
            "while requests run); this log has none")
    facts.compact_evidence()
    return facts


def _vllm_graph_facts(
    facts: ServerFacts,
    capture_sizes: tuple[tuple[int, ...], str] | None,
    captures: dict[str, tuple[int, str]],
    capture_done_line: str | None,
    ready_line: str | None,
) -> None:
    for key, (done, line) in captures.items():
        facts.graph_captures[key] = done
        facts.add_evidence("graph_captures", line)
    captured_any = any(done > 0 for done, _ in captures.values()) or capture_done_line is not None
    if captured_any:
        lines = [line for _, line in captures.values()] + ([capture_done_line] if capture_done_line else [])
        facts.record("cuda_graph_enabled", True, lines[0])
        for line in lines[1:]:
            facts.add_evidence("cuda_graph_enabled", line)
        if capture_sizes is not None and capture_sizes[0]:
            # The sizes come from the resolved config; the capture bars prove they were captured.
            facts.record("captured_batch_sizes", *capture_sizes)
            for line in lines:
                facts.add_evidence("captured_batch_sizes", line)
        return
    if facts.cudagraph_mode == "NONE":
        facts.record("cuda_graph_enabled", False, None)
        facts.evidence["cuda_graph_enabled"] = list(facts.evidence.get("cudagraph_mode", []))
        facts.record("captured_batch_sizes", (), None)
        facts.evidence["captured_batch_sizes"] = list(facts.evidence.get("cudagraph_mode", []))
    elif ready_line is not None:
        # A graph mode was configured but the engine finished booting without a capture bar or
        # "Graph capturing finished": nothing was captured.
        facts.record_many(ready_line, cuda_graph_enabled=False, captured_batch_sizes=())


def merge_vllm_metrics(facts: ServerFacts, metrics: MetricSamples) -> None:
    for labels, value in metrics.get("vllm:cache_config_info", [])[:1]:
        line = metric_line("vllm:cache_config_info", labels, value)
        util = as_float(labels.get("gpu_memory_utilization"))
        if facts.mem_fraction is None and util is not None:
            facts.record("mem_fraction", util, line)
        blocks = as_int(labels.get("num_gpu_blocks"))
        block_size = as_int(labels.get("block_size"))
        if facts.kv_cache_tokens is None and blocks and block_size:
            facts.record("kv_cache_tokens", blocks * block_size, line)
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"):
        for labels, value in metrics.get(name, []):
            if value > 0:  # drafts counted: speculative decoding ran
                facts.record("speculative", True, metric_line(name, labels, value))
