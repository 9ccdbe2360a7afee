"""What a server says it did: facts parsed from its own log, ``/metrics`` and ``/server_info``.

The point of this module is "config is execution": a flag on the command line is a request, and
engines silently downgrade requests (vLLM's CUDA-graph mode, SGLang's attention backends that
switch graphs off, capture lists filtered by max running requests...). So every fact here comes
from what the engine printed *after* resolving its configuration, and every fact carries the exact
lines that prove it (:attr:`ServerFacts.evidence`). A fact the server did not report stays
``None`` and any check on it is "unverifiable", never "pass".

Formats handled are those quoted in ``reference/vllm.md`` and ``reference/sglang.md``
(vLLM V1 2025-2026 incl. the CPU build, SGLang 0.5.9 / 0.5.15 / 0.5.23).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pytest_llmserve.evidence.prometheus import MetricSamples
from pytest_llmserve.evidence.prometheus import metric_line as _metric_line

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec

__all__ = [
    "CheckResult",
    "DecodeBatch",
    "MetricSamples",
    "ServerFacts",
    "check_config_is_execution",
    "fill_missing",
    "merge_metrics_into_facts",
    "normalize_backend",
    "parse_sglang_log",
    "parse_sglang_server_info",
    "parse_vllm_log",
    "split_lines",
]


# At most this many evidence lines are kept per fact (first and last half): a decode line every
# 40 iterations for an hour would otherwise make reports unreadable.
MAX_EVIDENCE_LINES = 10


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One SGLang ``Decode batch`` log line."""

    running_reqs: int | None
    tokens: int | None
    graph: bool | None  # "cuda graph: True/False" (or cpu/npu/musa graph)
    gen_throughput: float | None  # token/s as the server computed it
    accept_len: float | None = None  # speculative decoding only


@dataclass
class ServerFacts:
    """What the server reported about its own execution. ``None`` = not reported."""

    engine: str
    version: str | None = None
    attention_backend: str | None = None  # effective, normalized lower-case ("flash_attn", "cpu_attn", "fa3")
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    nsa_prefill_backend: str | None = None
    nsa_decode_backend: str | None = None
    compilation_mode: str | None = None  # vLLM CompilationMode name: NONE, DYNAMO_TRACE_ONCE, VLLM_COMPILE
    cudagraph_mode: str | None = (
        None  # vLLM mode after downgrades; SGLang decode graph backend ("full", "disabled")
    )
    cuda_graph_enabled: bool | None = None
    captured_batch_sizes: tuple[int, ...] | None = None  # decode graphs actually captured; () = none
    graph_captures: dict[str, int] = field(default_factory=dict)  # vLLM "decode, FULL" -> graphs captured
    decode_batches_on_graph: int = 0
    decode_batches_off_graph: int = 0
    decode_batches: list[DecodeBatch] = field(default_factory=list)
    graph_passes: dict[str, float] = field(default_factory=dict)  # sglang:cuda_graph_passes_total by mode
    kv_cache_tokens: int | None = None
    speculative: bool | None = None
    speculative_detail: str | None = None
    mem_fraction: float | None = None
    max_batch_size: int | None = None  # effective max running requests / max_num_seqs
    seed: int | None = None
    enforce_eager: bool | None = None
    deterministic: bool | None = None
    startup_s: float | None = None
    ready: bool | None = None  # the server logged its "ready" line
    nan_events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    evidence: dict[str, list[str]] = field(default_factory=dict)

    def record(self, name: str, value: Any, line: str | None) -> None:
        """Set fact ``name`` and remember the line that proves it (the only way parsers set facts)."""
        setattr(self, name, value)
        if line is not None:
            self.add_evidence(name, line)

    def record_many(self, line: str | None, **values: Any) -> None:
        """Several facts proven by one line."""
        for name, value in values.items():
            self.record(name, value, line)

    def add_evidence(self, name: str, line: str) -> None:
        lines = self.evidence.setdefault(name, [])
        line = line.rstrip()
        if line not in lines:
            lines.append(line)

    def compact_evidence(self, limit: int = MAX_EVIDENCE_LINES) -> None:
        """Keep the first and last lines of long evidence lists, saying how many were left out."""
        for name, lines in self.evidence.items():
            if len(lines) > limit:
                head, tail = lines[: limit // 2], lines[-(limit - limit // 2) :]
                self.evidence[name] = [*head, f"... ({len(lines) - limit} more lines) ...", *tail]

    @property
    def decode_graph_passes(self) -> float:
        """Decode forward passes that replayed a graph, from metrics (SGLang counter, vLLM table)."""
        return sum(v for k, v in self.graph_passes.items() if k in _GRAPH_PASS_MODES)

    @property
    def decode_graph_reported(self) -> bool:
        """Whether the engine said anything at all about graph use in decode."""
        return bool(self.decode_batches_on_graph or self.decode_batches_off_graph or self.graph_passes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data for reports and baselines."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "decode_batches":
                value = [
                    {
                        "running_reqs": b.running_reqs,
                        "tokens": b.tokens,
                        "graph": b.graph,
                        "gen_throughput": b.gen_throughput,
                        "accept_len": b.accept_len,
                    }
                    for b in value
                ]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, dict):
                value = {k: (list(v) if isinstance(v, list) else v) for k, v in value.items()}
            elif isinstance(value, list):
                value = list(value)
            out[f.name] = value
        return out


# SGLang counter label for a decode pass on a graph; vLLM cudagraph runtime modes (--cudagraph-metrics).
_GRAPH_PASS_MODES = frozenset({"decode_cuda_graph", "FULL", "PIECEWISE"})

# --------------------------------------------------------------------------- shared helpers

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def split_lines(text: str) -> list[str]:
    """Lines of a server log: ``\\r`` (tqdm redraws) counts as a line break, ANSI colours removed."""
    text = _ANSI.sub("", text)
    return [line for line in re.split(r"\r\n|\r|\n", text) if line.strip()]


_BACKEND_ALIASES = {
    # vLLM V0/old CPU log names -> the V1 enum names users pass on the command line.
    "flash_attention": "flash_attn",
    "flashattention": "flash_attn",
    "flash_attention_backend": "flash_attn",
    "torch_sdpa": "torch_sdpa",
    "xformers": "xformers",
}


def normalize_backend(name: str | None) -> str | None:
    """``AttentionBackendEnum.FLASH_ATTN`` / ``'FLASH_ATTN'`` / ``Flash Attention`` -> ``flash_attn``."""
    if name is None:
        return None
    value = name.strip().strip("'\"").strip()
    for prefix in ("AttentionBackendEnum.", "_Backend.", "Backend."):
        if value.startswith(prefix):
            value = value[len(prefix) :]
    value = re.sub(r"[\s\-]+", "_", value).lower()
    if value in ("", "none"):
        return None
    return _BACKEND_ALIASES.get(value, value)


def split_top_level(text: str) -> list[str]:
    """Split ``a=1, b=[1, 2], c=Foo(x=1, y='a,b')`` on commas outside brackets and quotes."""
    parts: list[str] = []
    depth = 0
    angle = 0  # `<CompilationMode.NONE: 0>` reprs; a lone '<' in prose must not swallow the rest
    quote: str | None = None
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "<" and i + 1 < len(text) and text[i + 1].isalpha():
            angle += 1
        elif ch == ">" and angle:
            angle -= 1
        elif ch == "," and depth == 0 and angle == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def parse_kwargs_repr(text: str) -> dict[str, str]:
    """``key=value, ...`` (a dataclass repr's inside) -> {key: raw value text}."""
    out: dict[str, str] = {}
    for part in split_top_level(text):
        key, eq, value = part.partition("=")
        key = key.strip()
        if eq and key.isidentifier():
            out[key] = value.strip()
    return out


def literal(raw: str | None) -> Any:
    """``ast.literal_eval`` of a repr, or the raw text when it is not a literal (``<Enum.X: 1>``)."""
    if raw is None:
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return raw


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().replace(",", "")
        if re.fullmatch(r"-?\d+", text):
            return int(text)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() in ("True", "False"):
        return value.strip() == "True"
    return None


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


# "nan" as a word: catches "NaN in the logits", "NaN detected", "NaN happened", "...compliant: nan",
# but not identifiers such as enable_nan_detection / nan_asserts / SANITIZE_NAN_LOGITS.
_NAN_WORD = re.compile(r"(?<![\w.])nan(?![\w])", re.IGNORECASE)

_ERROR_PHRASES = re.compile(
    r"Traceback \(most recent call last\)"
    r"|^\s*(?:[\w.]+\.)?\w*(?:Error|Exception): "
    r"|EngineDeadError|Engine core initialization failed|WorkerProc hit an exception"
    r"|No available memory for the cache blocks|out of memory|OutOfMemoryError"
    r"|Scheduler hit an exception|TokenizerManager hit an exception|DetokenizerManager hit an exception"
    r"|DataParallelController hit an exception|Capture cuda graph failed|Not enough memory\."
    r"|Initialization failed|Unsupported architecture|Received sigquit from a child"
    r"|scheduler is dead|watchdog timeout|Health check failed|Server exited unexpectedly",
)
_LEVEL_ERROR = re.compile(r"(?:^|[\s\]])(?:ERROR|CRITICAL)[\s:]")
# Lines that hold the whole configuration: their words ("nan_asserts", "Error" in a field value)
# are configuration, not events.
_CONFIG_LINE = re.compile(r"server_args=ServerArgs\(|LLM engine \(v?[^)]*\) with config:|non-default args:")

MAX_EVENT_LINES = 200


def _scan_events(facts: ServerFacts, line: str) -> None:
    if _CONFIG_LINE.search(line):
        return
    if _NAN_WORD.search(line) and len(facts.nan_events) < MAX_EVENT_LINES:
        facts.nan_events.append(line.rstrip())
    if (_LEVEL_ERROR.search(line) or _ERROR_PHRASES.search(line)) and len(facts.errors) < MAX_EVENT_LINES:
        facts.errors.append(line.rstrip())


def _record_ready(facts: ServerFacts, ready_line: str, first: datetime | None, ready: datetime | None) -> None:
    facts.record("ready", True, ready_line)
    startup = _startup_seconds(first, ready)
    if startup is not None:
        facts.record("startup_s", startup, ready_line)


def _startup_seconds(first: datetime | None, ready: datetime | None) -> float | None:
    if first is None or ready is None:
        return None
    delta = ready - first
    if delta < timedelta(0):  # vLLM timestamps have no year: a boot across New Year
        delta += timedelta(days=365)
    return delta.total_seconds()


# --------------------------------------------------------------------------- vLLM

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
_VLLM_CAPTURE = re.compile(r"Capturing CUDA graphs \(([^()]*?), (\w+)\)\s*:?.*?(\d+)/(\d+)")
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
_VLLM_CG_STATS_ROW = re.compile(
    r"^\s*\|?\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(NONE|PIECEWISE|FULL)\s*\|\s*(\d+)\s*\|?\s*$"
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
    return tuple(sorted(set(_int_list(match.group(1)))))


def _vllm_config_line(facts: ServerFacts, line: str, version: str, body: str, state: dict[str, Any]) -> None:
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
    eager = _as_bool(config.get("enforce_eager"))
    if eager is not None:
        facts.record("enforce_eager", eager, line)
    seed = _as_int(config.get("seed"))
    if seed is not None:
        facts.record("seed", seed, line)
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
            state["capture_sizes"] = sizes
            state["capture_sizes_line"] = line


def _vllm_non_default(facts: ServerFacts, line: str, raw: str) -> None:
    """The user's non-default args: requests, used only where nothing later reports the value."""
    data = literal(raw)
    values: dict[str, Any] = data if isinstance(data, dict) else {}
    if not values:  # not a pure literal (an enum in it): pick the few scalars we need
        for key in ("gpu_memory_utilization", "max_num_seqs"):
            match = re.search(rf"'{key}': ([\d.]+)", raw)
            if match:
                values[key] = literal(match.group(1))
    util = _as_float(values.get("gpu_memory_utilization"))
    if util is not None:
        facts.record("mem_fraction", util, line)
    max_seqs = _as_int(values.get("max_num_seqs"))
    if max_seqs is not None:
        facts.record("max_batch_size", max_seqs, line)


def parse_vllm_log(text: str) -> ServerFacts:
    """Facts from a vLLM (V1) server log: stdout and stderr together, as the server wrote them."""
    facts = ServerFacts(engine="vllm")
    state: dict[str, Any] = {}
    captures: dict[str, tuple[int, str]] = {}  # "decode, FULL" -> (graphs done, last progress line)
    capture_done_line: str | None = None
    first_ts: datetime | None = None
    ready_ts: datetime | None = None
    ready_line: str | None = None
    backend_lines: list[tuple[str, str]] = []
    in_cg_stats = False

    for line in split_lines(text):
        ts_match = _VLLM_TS.search(line)
        ts = None
        if ts_match:
            try:
                ts = datetime.strptime("2000-" + ts_match.group(1), "%Y-%m-%d %H:%M:%S")
            except ValueError:
                ts = None
            if ts is not None and first_ts is None:
                first_ts = ts
        _scan_events(facts, line)

        if m := _VLLM_CONFIG.search(line):
            _vllm_config_line(facts, line, m.group(1), m.group(2), state)
            continue
        if m := _VLLM_BANNER_VERSION.search(line):
            # The banner is printed first, by the API server: what the user launched.
            facts.record("version", m.group(1), line)
            continue
        if m := _VLLM_NON_DEFAULT.search(line):
            _vllm_non_default(facts, line, m.group(1))
            continue
        if _VLLM_EAGER_WARN.search(line):
            facts.record_many(line, enforce_eager=True, compilation_mode="NONE", cudagraph_mode="NONE")
            continue
        if _VLLM_EAGER_NO_GRAPH.search(line):
            facts.record("cudagraph_mode", "NONE", line)
            continue
        # Downgrades come after the config line: the last word on the mode is the effective one.
        if m := _VLLM_DOWNGRADE.search(line):
            facts.record("cudagraph_mode", m.group(2).upper(), line)
            continue
        if m := _VLLM_SET_MODE.search(line):
            facts.record("cudagraph_mode", m.group(1).upper(), line)
            continue
        if m := _VLLM_CAPTURE.search(line):
            key = f"{m.group(1).strip()}, {m.group(2)}"
            done = int(m.group(3))
            if key not in captures or done >= captures[key][0]:
                captures[key] = (done, line)
            continue
        if _VLLM_CAPTURE_DONE.search(line):
            capture_done_line = line
            continue
        if m := _VLLM_KV.search(line):
            facts.record("kv_cache_tokens", int(m.group(1).replace(",", "")), line)
            continue
        if m := _VLLM_GPU_UTIL.search(line):
            facts.record("mem_fraction", float(m.group(1)), line)
            continue
        for regex in (_VLLM_BACKEND_AUTO, _VLLM_BACKEND_LAYOUT, _VLLM_BACKEND_FORCED, _VLLM_BACKEND_OLD):
            if (m := regex.search(line)) and m.group(1) not in _VLLM_NOT_ATTENTION:
                backend_lines.append((m.group(1), line))
                break
        else:
            if _VLLM_SPEC_METRICS.search(line):
                facts.record("speculative", True, line)
            elif "CUDAGraph Stats" in line:
                in_cg_stats = True
            elif in_cg_stats and (m := _VLLM_CG_STATS_ROW.search(line)):
                mode = m.group(4)
                facts.graph_passes[mode] = facts.graph_passes.get(mode, 0.0) + float(m.group(5))
                facts.add_evidence("graph_passes", line)
            elif _VLLM_READY.search(line) and ready_line is None:
                ready_line = line
                ready_ts = ts

    if backend_lines:
        # The first backend line is the model's; a spec-decode drafter may log another one later.
        name = normalize_backend(backend_lines[0][0])
        facts.record("attention_backend", name, backend_lines[0][1])
        for other, other_line in backend_lines[1:]:
            if normalize_backend(other) == name:
                facts.add_evidence("attention_backend", other_line)

    if ready_line is not None:
        _record_ready(facts, ready_line, first_ts, ready_ts)

    _vllm_graph_facts(facts, state, captures, capture_done_line, ready_line)
    facts.compact_evidence()
    return facts


def _vllm_graph_facts(
    facts: ServerFacts,
    state: dict[str, Any],
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
        sizes = state.get("capture_sizes")
        if sizes:
            # The sizes come from the resolved config; the capture bars prove they were captured.
            facts.record("captured_batch_sizes", sizes, state["capture_sizes_line"])
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


# --------------------------------------------------------------------------- SGLang

_SGL_TS = re.compile(r"^\s*\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
_SGL_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)\)\s*$")
_SGL_DEFAULT_BACKEND = re.compile(r"Attention backend not specified\. Use (\w+) backend by default")
_SGL_GRAPH_DISABLED = re.compile(r"Cuda graph is disabled because .*")
_SGL_SET_DSA = re.compile(r"Set (?:NSA|DSA) backends for .*?: prefill=(\w+), decode=(\w+)")
_SGL_CAPTURE_BS_059 = re.compile(r"Capture cuda graph bs \[([\d,\s]*)\]")
_SGL_CAPTURE_END_059 = re.compile(r"Capture cuda graph end\.")
_SGL_CAPTURE_BAR_059 = re.compile(r"Capturing batches \(bs=(\d+)")
_SGL_CAPTURE_NEW = re.compile(r"Capture (target|draft) ([\w ]+?) CUDA graph (begin|end)\.(.*)$")
_SGL_CAPTURE_FAILED = re.compile(r"Capture cuda graph failed")
_SGL_DECODE = re.compile(r"Decode batch(?: \[\d+\])?,(.*)$")
_SGL_SCHED = re.compile(r"max_total_num_tokens=(\d+)")
_SGL_SCHED_RUNNING = re.compile(r"max_running_requests=(\d+)")
_SGL_KV_ALLOC = re.compile(r"(?:KV Cache is allocated|VA upper bound)\..*?#tokens: ([\d,]+)")
_SGL_READY = re.compile(r"The server is fired up and ready to roll!")


def _sgl_graph_backend_requested(args: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    """(graphs disabled?, decode graph backend) from the ServerArgs of any of the three versions."""
    backend = args.get("cuda_graph_backend_decode")
    config = args.get("cuda_graph_config")
    if backend is None and isinstance(config, dict):
        decode = config.get("decode")
        if isinstance(decode, dict):
            backend = decode.get("backend")
    elif backend is None and isinstance(config, str):
        match = re.search(r"decode\W+.*?backend\W+(\w+)", config)
        backend = match.group(1) if match else None
    backend_name = str(backend).lower() if isinstance(backend, str) else None
    disabled = (
        args.get("disable_cuda_graph") is True
        or args.get("disable_decode_cuda_graph") is True
        or backend_name == "disabled"
    )
    known = any(
        k in args
        for k in (
            "disable_cuda_graph",
            "disable_decode_cuda_graph",
            "cuda_graph_backend_decode",
            "cuda_graph_config",
        )
    )
    return (disabled if known else None), backend_name


def _sgl_server_args(facts: ServerFacts, line: str, body: str, state: dict[str, Any]) -> None:
    raw = parse_kwargs_repr(body)
    args = {key: literal(value) for key, value in raw.items()}
    state["server_args"] = args
    attention = args.get("attention_backend")
    if isinstance(attention, str):
        facts.record("attention_backend", normalize_backend(attention), line)
    # prefill/decode default to attention_backend when unset: record the effective one.
    for phase in ("prefill", "decode"):
        own = args.get(f"{phase}_attention_backend")
        value = own if isinstance(own, str) else attention if isinstance(attention, str) else None
        if value is not None:
            facts.record(f"{phase}_attention_backend", normalize_backend(value), line)
        # 0.5.15 renamed nsa_* to dsa_*; 0.5.23 only has dsa_*.
        dsa = args.get(f"dsa_{phase}_backend", args.get(f"nsa_{phase}_backend"))
        if isinstance(dsa, str):
            facts.record(f"nsa_{phase}_backend", normalize_backend(dsa), line)
    seed = _as_int(args.get("random_seed"))
    if seed is not None:
        facts.record("seed", seed, line)
    fraction = _as_float(args.get("mem_fraction_static"))
    if fraction is not None:
        facts.record("mem_fraction", fraction, line)
    running = _as_int(args.get("max_running_requests"))
    if running is not None and facts.max_batch_size is None:
        facts.record("max_batch_size", running, line)
    deterministic = _as_bool(args.get("enable_deterministic_inference"))
    if deterministic is not None:
        facts.record("deterministic", deterministic, line)
    if "speculative_algorithm" in args:
        algorithm = args.get("speculative_algorithm")
        if algorithm in (None, "None", ""):
            facts.record("speculative", False, line)
        else:
            facts.record("speculative", True, line)
            detail = [f"algorithm={algorithm}"]
            for key in (
                "speculative_draft_model_path",
                "speculative_num_steps",
                "speculative_eagle_topk",
                "speculative_num_draft_tokens",
            ):
                if args.get(key) is not None:
                    detail.append(f"{key.removeprefix('speculative_')}={args[key]}")
            facts.record("speculative_detail", ", ".join(detail), line)
    disabled, _ = _sgl_graph_backend_requested(args)
    if disabled:
        state["graph_disabled_line"] = line


def _sgl_decode_line(facts: ServerFacts, line: str, tail: str) -> None:
    def num(pattern: str) -> str | None:
        match = re.search(pattern, tail)
        return match.group(1) if match else None

    graph_text = num(r"\b(?:cuda|cpu|npu|musa) graph: (True|False)")
    graph = None if graph_text is None else graph_text == "True"
    running = num(r"#running-req: (\d+)")
    tokens = num(r"#token: (\d+)")
    throughput = num(r"gen throughput \(token/s\): ([\d.]+)")
    accept = num(r"accept len: ([\d.]+)")
    batch = DecodeBatch(
        running_reqs=int(running) if running else None,
        tokens=int(tokens) if tokens else None,
        graph=graph,
        gen_throughput=float(throughput) if throughput else None,
        accept_len=float(accept) if accept else None,
    )
    facts.decode_batches.append(batch)
    facts.add_evidence("decode_batches", line)
    if graph is True:
        facts.decode_batches_on_graph += 1
        facts.add_evidence("decode_batches_on_graph", line)
    elif graph is False:
        facts.decode_batches_off_graph += 1
        facts.add_evidence("decode_batches_off_graph", line)
    if accept is not None:
        # Acceptance lengths are only printed when speculative decoding actually runs.
        facts.record("speculative", True, line)


def parse_sglang_log(text: str) -> ServerFacts:
    """Facts from an SGLang server log (0.5.9, 0.5.15 and 0.5.23 formats)."""
    facts = ServerFacts(engine="sglang")
    state: dict[str, Any] = {}
    capture_sizes: tuple[int, ...] | None = None
    capture_lines: list[str] = []
    bar_sizes: set[int] = set()
    graph_backend: str | None = None
    capture_failed = False
    disabled_lines: list[str] = []
    first_ts: datetime | None = None
    ready_ts: datetime | None = None
    ready_line: str | None = None
    default_backend: tuple[str, str] | None = None
    dsa_line: tuple[str, str, str] | None = None
    sched_running: tuple[int, str] | None = None

    for line in split_lines(text):
        ts = None
        if ts_match := _SGL_TS.search(line):
            try:
                ts = datetime.strptime(ts_match.group(1), "%Y-%m-%d %H:%M:%S")
            except ValueError:
                ts = None
            if ts is not None and first_ts is None:
                first_ts = ts
        _scan_events(facts, line)

        if m := _SGL_SERVER_ARGS.search(line):
            _sgl_server_args(facts, line, m.group(1), state)
            continue
        if m := _SGL_DECODE.search(line):
            _sgl_decode_line(facts, line, m.group(1))
            continue
        if m := _SGL_DEFAULT_BACKEND.search(line):
            default_backend = (m.group(1), line)
            continue
        if _SGL_GRAPH_DISABLED.search(line):
            disabled_lines.append(line)
            continue
        if m := _SGL_SET_DSA.search(line):
            dsa_line = (m.group(1), m.group(2), line)
            continue
        if m := _SGL_CAPTURE_BS_059.search(line):
            capture_sizes = _int_list(m.group(1))
            capture_lines.append(line)
            graph_backend = graph_backend or "full"  # 0.5.9 decode graphs are full graphs
            continue
        if _SGL_CAPTURE_END_059.search(line):
            capture_lines.append(line)
            graph_backend = graph_backend or "full"
            continue
        if m := _SGL_CAPTURE_BAR_059.search(line):
            bar_sizes.add(int(m.group(1)))
            continue
        if m := _SGL_CAPTURE_NEW.search(line):
            role, phase, tail = m.group(1), m.group(2).strip(), m.group(4)
            # Target decode (or target verify, with speculative decoding) graphs are the decode
            # batch-size graphs; prefill graphs are keyed by token count, draft graphs by the drafter.
            if role == "target" and phase in ("decode", "verify"):
                capture_lines.append(line)
                if bs := re.search(r"\bbs=\[([\d,\s]*)\]", tail):
                    capture_sizes = _int_list(bs.group(1))
                if backend := re.search(r"\bbackend=(\w+)", tail):
                    graph_backend = backend.group(1).lower()
            continue
        if _SGL_CAPTURE_FAILED.search(line):
            capture_failed = True
            continue
        if m := _SGL_SCHED.search(line):
            facts.record("kv_cache_tokens", int(m.group(1)), line)
            if running := _SGL_SCHED_RUNNING.search(line):
                sched_running = (int(running.group(1)), line)
            continue
        if m := _SGL_KV_ALLOC.search(line):
            if facts.kv_cache_tokens is None:
                facts.record("kv_cache_tokens", int(m.group(1).replace(",", "")), line)
            continue
        if _SGL_READY.search(line) and ready_line is None:
            ready_line = line
            ready_ts = ts

    if default_backend and facts.attention_backend is None:
        name = normalize_backend(default_backend[0])
        facts.record("attention_backend", name, default_backend[1])
        for phase in ("prefill", "decode"):
            if getattr(facts, f"{phase}_attention_backend") is None:
                facts.record(f"{phase}_attention_backend", name, default_backend[1])
    if dsa_line:
        for phase, value in (("prefill", dsa_line[0]), ("decode", dsa_line[1])):
            if getattr(facts, f"nsa_{phase}_backend") is None:
                facts.record(f"nsa_{phase}_backend", normalize_backend(value), dsa_line[2])
            elif getattr(facts, f"nsa_{phase}_backend") == normalize_backend(value):
                facts.add_evidence(f"nsa_{phase}_backend", dsa_line[2])
    if sched_running:
        # The scheduler's max_running_requests is the effective one (capped by the KV pool).
        facts.record("max_batch_size", sched_running[0], sched_running[1])
    if ready_line is not None:
        _record_ready(facts, ready_line, first_ts, ready_ts)

    # Graph facts: capture lines are execution; ServerArgs/"disabled because" lines are the reason.
    if capture_sizes is None and bar_sizes:
        capture_sizes = tuple(sorted(bar_sizes))
    captured = bool(capture_lines) and not capture_failed
    if captured:
        facts.record("cuda_graph_enabled", True, capture_lines[0])
        facts.record(
            "captured_batch_sizes", tuple(sorted(set(capture_sizes))) if capture_sizes else None, None
        )
        if capture_sizes:
            for line in capture_lines:
                facts.add_evidence("captured_batch_sizes", line)
        for line in capture_lines[1:]:
            facts.add_evidence("cuda_graph_enabled", line)
        if graph_backend:
            facts.record("cudagraph_mode", graph_backend, capture_lines[0])
    else:
        why = disabled_lines + ([state["graph_disabled_line"]] if "graph_disabled_line" in state else [])
        proof = why + ([ready_line] if ready_line else [])
        if why or ready_line is not None or capture_failed:
            # Booted (or failed capture) without any target decode capture line: no graphs.
            facts.record_many(None, cuda_graph_enabled=False, captured_batch_sizes=())
            for line in proof:
                facts.add_evidence("cuda_graph_enabled", line)
                facts.add_evidence("captured_batch_sizes", line)
            if why:
                facts.record("cudagraph_mode", "disabled", why[0])
    facts.compact_evidence()
    return facts


def parse_sglang_server_info(info: Mapping[str, Any]) -> ServerFacts:
    """Facts from SGLang's ``/server_info`` JSON (resolved server args + scheduler info + version)."""
    facts = ServerFacts(engine="sglang")

    def src(key: str, value: Any) -> str:
        return f"/server_info {key}={value!r}"

    version = info.get("version")
    if isinstance(version, str):
        facts.record("version", version, src("version", version))
    attention = info.get("attention_backend")
    if isinstance(attention, str):
        facts.record("attention_backend", normalize_backend(attention), src("attention_backend", attention))
    for phase in ("prefill", "decode"):
        key = f"{phase}_attention_backend"
        own = info.get(key)
        if isinstance(own, str):
            facts.record(key, normalize_backend(own), src(key, own))
        elif isinstance(attention, str):
            facts.record(key, normalize_backend(attention), src("attention_backend", attention))
        for dsa_key in (f"dsa_{phase}_backend", f"nsa_{phase}_backend"):
            value = info.get(dsa_key)
            if isinstance(value, str):
                facts.record(f"nsa_{phase}_backend", normalize_backend(value), src(dsa_key, value))
                break
    seed = _as_int(info.get("random_seed"))
    if seed is not None:
        facts.record("seed", seed, src("random_seed", seed))
    fraction = _as_float(info.get("mem_fraction_static"))
    if fraction is not None:
        facts.record("mem_fraction", fraction, src("mem_fraction_static", fraction))
    tokens = _as_int(info.get("max_total_num_tokens"))
    if tokens is not None:
        facts.record("kv_cache_tokens", tokens, src("max_total_num_tokens", tokens))
    states = info.get("internal_states")
    state0: Mapping[str, Any] = (
        states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    )
    running = _as_int(state0.get("effective_max_running_requests_per_dp"))
    if running is not None:
        facts.record(
            "max_batch_size",
            running,
            src("internal_states[0].effective_max_running_requests_per_dp", running),
        )
    else:
        running = _as_int(info.get("max_running_requests"))
        if running is not None:
            facts.record("max_batch_size", running, src("max_running_requests", running))
    deterministic = _as_bool(info.get("enable_deterministic_inference"))
    if deterministic is not None:
        facts.record("deterministic", deterministic, src("enable_deterministic_inference", deterministic))
    if "speculative_algorithm" in info:
        algorithm = info.get("speculative_algorithm")
        facts.record("speculative", algorithm not in (None, ""), src("speculative_algorithm", algorithm))
        if algorithm:
            facts.record(
                "speculative_detail", f"algorithm={algorithm}", src("speculative_algorithm", algorithm)
            )
    startup = _as_float(info.get("startup_time"))
    if startup is not None:
        facts.record("startup_s", startup, src("startup_time", startup))
    disabled, backend = _sgl_graph_backend_requested(info)
    memory = state0.get("memory_usage")
    graph_gb = _as_float(memory.get("graph")) if isinstance(memory, Mapping) else None
    if graph_gb is not None and graph_gb > 0:
        # Memory held by captured graphs is a trace of execution, unlike the disable flags.
        facts.record("cuda_graph_enabled", True, src("internal_states[0].memory_usage.graph", graph_gb))
    elif disabled is not None:
        facts.record(
            "cuda_graph_enabled",
            not disabled,
            src("disable_cuda_graph / cuda_graph_backend_decode", "disabled" if disabled else backend),
        )
    if disabled:
        facts.record("cudagraph_mode", "disabled", src("cuda_graph_backend_decode", "disabled"))
    elif backend:
        facts.record("cudagraph_mode", backend, src("cuda_graph_backend_decode", backend))
    return facts


# --------------------------------------------------------------------------- metrics

def merge_metrics_into_facts(facts: ServerFacts, metrics: MetricSamples, engine: str) -> ServerFacts:
    """Add what ``/metrics`` proves to ``facts`` (in place; also returned). Log facts win on conflicts
    except for graph pass counters, which only metrics have."""
    if engine == "sglang":
        _merge_sglang_metrics(facts, metrics)
    elif engine == "vllm":
        _merge_vllm_metrics(facts, metrics)
    facts.compact_evidence()
    return facts


def _merge_sglang_metrics(facts: ServerFacts, metrics: MetricSamples) -> None:
    # One series per scheduler: TP ranks run the same batches (take the max), DP ranks run
    # different ones (add them up).
    per_mode: dict[str, dict[str, tuple[float, str]]] = {}
    for labels, value in metrics.get("sglang:cuda_graph_passes_total", []):
        mode = labels.get("mode", "")
        dp = labels.get("dp_rank", "")
        line = _metric_line("sglang:cuda_graph_passes_total", labels, value)
        current = per_mode.setdefault(mode, {}).get(dp)
        if current is None or value > current[0]:
            per_mode[mode][dp] = (value, line)
    for mode, by_dp in per_mode.items():
        facts.graph_passes[mode] = sum(v for v, _ in by_dp.values())
        for _, line in by_dp.values():
            facts.add_evidence("graph_passes", line)
    if facts.kv_cache_tokens is None:
        for labels, value in metrics.get("sglang:max_total_num_tokens", [])[:1]:
            facts.record(
                "kv_cache_tokens", int(value), _metric_line("sglang:max_total_num_tokens", labels, value)
            )
    if facts.startup_s is None:
        for labels, value in metrics.get("sglang:engine_startup_time", [])[:1]:
            facts.record("startup_s", value, _metric_line("sglang:engine_startup_time", labels, value))


def _merge_vllm_metrics(facts: ServerFacts, metrics: MetricSamples) -> None:
    for labels, value in metrics.get("vllm:cache_config_info", [])[:1]:
        line = _metric_line("vllm:cache_config_info", labels, value)
        util = _as_float(labels.get("gpu_memory_utilization"))
        if facts.mem_fraction is None and util is not None:
            facts.record("mem_fraction", util, line)
        blocks = _as_int(labels.get("num_gpu_blocks"))
        block_size = _as_int(labels.get("block_size"))
        if facts.kv_cache_tokens is None and blocks and block_size:
            facts.record("kv_cache_tokens", blocks * block_size, line)
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"):
        for labels, value in metrics.get(name, []):
            if value > 0:  # drafts counted: speculative decoding ran
                facts.record("speculative", True, _metric_line(name, labels, value))


def fill_missing(facts: ServerFacts, other: ServerFacts) -> ServerFacts:
    """Fill facts that ``facts`` lacks from ``other`` (e.g. log facts + /server_info), in place."""
    for f in fields(ServerFacts):
        if f.name in (
            "engine",
            "evidence",
            "decode_batches",
            "nan_events",
            "errors",
            "decode_batches_on_graph",
            "decode_batches_off_graph",
            "graph_passes",
            "graph_captures",
        ):
            continue
        if getattr(facts, f.name) is None and getattr(other, f.name) is not None:
            setattr(facts, f.name, getattr(other, f.name))
            for line in other.evidence.get(f.name, []):
                facts.add_evidence(f.name, line)
    for key, value in other.graph_passes.items():
        facts.graph_passes.setdefault(key, value)
    return facts


# --------------------------------------------------------------------------- checks

Status = Literal["pass", "fail", "unverifiable"]


@dataclass
class CheckResult:
    """One config-is-execution check: what was requested, what the server says, and the proof."""

    name: str
    status: Status
    requested: str
    observed: str
    evidence: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    @property
    def message(self) -> str:
        head = f"{self.name}: {self.status.upper()}: requested {self.requested}; observed {self.observed}"
        if self.note:
            head += f" ({self.note})"
        if not self.evidence:
            return head + "\n  evidence: none (the server's log/metrics did not report this)"
        return head + "\n  evidence:\n" + "\n".join(f"    | {line}" for line in self.evidence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "requested": self.requested,
            "observed": self.observed,
            "evidence": list(self.evidence),
            "note": self.note,
        }


def _focus(line: str, needles: Iterable[str], width: int = 400) -> str:
    """A long line (the whole config on one line) cut down to the part that proves the fact."""
    if len(line) <= width:
        return line
    for needle in needles:
        at = line.find(needle)
        if at >= 0:
            start = max(0, at - width // 4)
            end = min(len(line), at + (3 * width) // 4)
            return ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")
    return line[: width // 2] + " … " + line[-width // 2 :]


def _evidence(facts: ServerFacts, *names: str, needles: Iterable[str] = ()) -> list[str]:
    needles = tuple(needles)
    out: list[str] = []
    for name in names:
        for line in facts.evidence.get(name, []):
            short = _focus(line, needles)
            if short not in out:
                out.append(short)
    return out


def _sizes(sizes: Iterable[int] | None) -> str:
    if sizes is None:
        return "not reported"
    values = list(sizes)
    return "[" + ", ".join(str(s) for s in values) + "]" if values else "none"


def _compare(
    name: str,
    requested: str | None,
    observed: str | None,
    facts: ServerFacts,
    fact: str,
    needles: Iterable[str],
) -> CheckResult | None:
    if requested is None:
        return None
    want = normalize_backend(requested)
    evidence = _evidence(facts, fact, needles=needles)
    if observed is None:
        return CheckResult(name, "unverifiable", str(want), "not reported", evidence)
    return CheckResult(name, "pass" if observed == want else "fail", str(want), observed, evidence)


def check_config_is_execution(spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
    """Each logical option the spec requests against what the server reported.

    A check is emitted only for options the spec sets (``speculative`` and ``seed`` are always set:
    ``None`` means "must be off" and the seed is always passed explicitly). A fact the server did not
    report makes the check "unverifiable", never "pass".
    """
    results: list[CheckResult | None] = [
        _compare(
            "attention_backend",
            spec.attention_backend,
            facts.attention_backend,
            facts,
            "attention_backend",
            ("attention_backend", "backend"),
        ),
        _compare(
            "prefill_attention_backend",
            spec.prefill_attention_backend,
            facts.prefill_attention_backend,
            facts,
            "prefill_attention_backend",
            ("prefill_attention_backend", "attention_backend"),
        ),
        _compare(
            "decode_attention_backend",
            spec.decode_attention_backend,
            facts.decode_attention_backend,
            facts,
            "decode_attention_backend",
            ("decode_attention_backend", "attention_backend"),
        ),
        _compare(
            "nsa_prefill_backend",
            spec.nsa_prefill_backend,
            facts.nsa_prefill_backend,
            facts,
            "nsa_prefill_backend",
            ("dsa_prefill_backend", "nsa_prefill_backend", "prefill="),
        ),
        _compare(
            "nsa_decode_backend",
            spec.nsa_decode_backend,
            facts.nsa_decode_backend,
            facts,
            "nsa_decode_backend",
            ("dsa_decode_backend", "nsa_decode_backend", "decode="),
        ),
    ]
    if spec.cuda_graph is not None:
        results.extend(_check_cuda_graph(spec, facts))
    results.append(_check_speculative(spec, facts))
    if spec.eager is not None:
        results.append(_check_eager(spec.eager, facts))
    if spec.mem_fraction is not None:
        results.append(
            _check_number(
                "mem_fraction",
                spec.mem_fraction,
                facts.mem_fraction,
                facts,
                ("mem_fraction_static", "gpu_memory_utilization", "gpu-memory-utilization"),
            )
        )
    if spec.max_batch_size is not None:
        results.append(
            _check_number(
                "max_batch_size",
                spec.max_batch_size,
                facts.max_batch_size,
                facts,
                ("max_running_requests", "max_num_seqs"),
            )
        )
    results.append(_check_number("seed", spec.seed, facts.seed, facts, ("random_seed", "seed=")))
    if spec.deterministic:
        evidence = _evidence(facts, "deterministic", needles=("enable_deterministic_inference",))
        if facts.deterministic is None:
            results.append(CheckResult("deterministic", "unverifiable", "on", "not reported", evidence))
        else:
            results.append(
                CheckResult(
                    "deterministic",
                    "pass" if facts.deterministic else "fail",
                    "on",
                    "on" if facts.deterministic else "off",
                    evidence,
                )
            )
    return [r for r in results if r is not None]


def _check_number(
    name: str, requested: float, observed: float | None, facts: ServerFacts, needles: Iterable[str]
) -> CheckResult:
    evidence = _evidence(facts, name, needles=needles)
    if observed is None:
        return CheckResult(name, "unverifiable", f"{requested:g}", "not reported", evidence)
    same = abs(float(observed) - float(requested)) <= 1e-6 * max(1.0, abs(float(requested)))
    return CheckResult(name, "pass" if same else "fail", f"{requested:g}", f"{observed:g}", evidence)


# Most specific first: the window shown from a one-line config is centred on the first needle found.
_GRAPH_NEEDLES = (
    "Capture",
    "Capturing",
    "disable_cuda_graph",
    "cuda_graph_backend_decode",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "Cuda graph is disabled",
    "cuda_graph",
)


def _check_cuda_graph(spec: ServerSpec, facts: ServerFacts) -> list[CheckResult]:
    assert spec.cuda_graph is not None
    graph = spec.cuda_graph
    out: list[CheckResult] = []
    captured = facts.captured_batch_sizes
    capture_evidence = _evidence(
        facts, "captured_batch_sizes", "cuda_graph_enabled", "graph_captures", needles=_GRAPH_NEEDLES
    )
    if graph.enabled:
        requested = (
            f"cuda graphs on, batch sizes {_sizes(graph.batch_sizes)}"
            if graph.batch_sizes
            else (
                f"cuda graphs on, max batch size {graph.max_batch_size}"
                if graph.max_batch_size
                else "cuda graphs on"
            )
        )
        if captured is None:
            status: Status = "unverifiable"
            if facts.cuda_graph_enabled is False:
                status = "fail"
            elif facts.cuda_graph_enabled and not (graph.batch_sizes or graph.max_batch_size):
                status = "pass"  # capture proven; no particular sizes were asked for
            observed = {
                None: "capture not reported",
                True: "graphs captured (sizes not reported)",
                False: "no graphs",
            }[facts.cuda_graph_enabled]
            out.append(CheckResult("cuda_graph.captured", status, requested, observed, capture_evidence))
        elif not captured:
            out.append(
                CheckResult(
                    "cuda_graph.captured",
                    "fail",
                    requested,
                    "no graphs captured",
                    capture_evidence,
                    note=f"cudagraph_mode={facts.cudagraph_mode}" if facts.cudagraph_mode else "",
                )
            )
        else:
            missing = sorted(set(graph.batch_sizes or ()) - set(captured))
            note = ""
            status = "pass"
            if missing:
                status = "fail"
                note = f"missing sizes {_sizes(missing)}"
            elif graph.max_batch_size and max(captured) != graph.max_batch_size:
                status = "fail"
                note = (
                    f"largest captured size {max(captured)} != requested max {graph.max_batch_size}"
                    " (capture lists are cut to the max running requests)"
                )
            out.append(
                CheckResult(
                    "cuda_graph.captured",
                    status,
                    requested,
                    f"captured {_sizes(captured)}",
                    capture_evidence,
                    note=note,
                )
            )
        out.append(_check_graph_used(facts, requested))
    else:
        requested = "cuda graphs off"
        if captured is None:
            status = "fail" if facts.cuda_graph_enabled else "unverifiable"
            observed = "graphs captured" if facts.cuda_graph_enabled else "capture not reported"
            out.append(CheckResult("cuda_graph.captured", status, requested, observed, capture_evidence))
        else:
            out.append(
                CheckResult(
                    "cuda_graph.captured",
                    "fail" if captured else "pass",
                    requested,
                    f"captured {_sizes(captured)}" if captured else "no graphs captured",
                    capture_evidence,
                )
            )
        if facts.decode_graph_reported:
            on = facts.decode_batches_on_graph + facts.decode_graph_passes
            out.append(
                CheckResult(
                    "cuda_graph.used_in_decode",
                    "fail" if on else "pass",
                    requested,
                    _graph_use(facts),
                    _evidence(
                        facts,
                        "decode_batches_on_graph",
                        "graph_passes",
                        "decode_batches_off_graph",
                        needles=("graph:",),
                    ),
                )
            )
    return out


def _graph_use(facts: ServerFacts) -> str:
    parts = []
    if facts.decode_batches_on_graph or facts.decode_batches_off_graph:
        parts.append(
            f"{facts.decode_batches_on_graph} decode batch lines on graph, "
            f"{facts.decode_batches_off_graph} off graph"
        )
    if facts.graph_passes:
        parts.append("graph passes " + ", ".join(f"{k}={v:g}" for k, v in sorted(facts.graph_passes.items())))
    return "; ".join(parts) or "not reported"


def _check_graph_used(facts: ServerFacts, requested: str) -> CheckResult:
    evidence = _evidence(
        facts, "decode_batches_on_graph", "graph_passes", "decode_batches_off_graph", needles=("graph:",)
    )
    if not facts.decode_graph_reported:
        return CheckResult(
            "cuda_graph.used_in_decode",
            "unverifiable",
            requested,
            "not reported",
            evidence,
            note="the engine logs no per-batch graph use and exposes no graph pass counter"
            if facts.engine == "vllm"
            else "no 'Decode batch' lines and no sglang:cuda_graph_passes_total (enable metrics, "
            "decode > --decode-log-interval steps)",
        )
    on = facts.decode_batches_on_graph + facts.decode_graph_passes
    return CheckResult(
        "cuda_graph.used_in_decode", "pass" if on > 0 else "fail", requested, _graph_use(facts), evidence
    )


def _check_speculative(spec: ServerSpec, facts: ServerFacts) -> CheckResult:
    requested = spec.speculative or "off"
    evidence = _evidence(
        facts,
        "speculative",
        "speculative_detail",
        needles=("speculative_config", "speculative_algorithm", "accept len", "SpecDecoding"),
    )
    if facts.speculative is None:
        return CheckResult("speculative", "unverifiable", requested, "not reported", evidence)
    observed = (
        ("on" + (f" ({facts.speculative_detail})" if facts.speculative_detail else ""))
        if (facts.speculative)
        else "off"
    )
    wanted = spec.speculative is not None
    return CheckResult(
        "speculative", "pass" if facts.speculative == wanted else "fail", requested, observed, evidence
    )


def _check_eager(eager: bool, facts: ServerFacts) -> CheckResult:
    requested = "eager (no torch.compile, no graphs)" if eager else "compiled (not eager)"
    evidence = _evidence(
        facts,
        "compilation_mode",
        "enforce_eager",
        "cudagraph_mode",
        needles=("'mode'", "enforce_eager", "cudagraph_mode", "Enforce eager"),
    )
    mode = facts.compilation_mode
    if mode is None:
        if facts.enforce_eager is None:
            return CheckResult("eager", "unverifiable", requested, "not reported", evidence)
        ok = facts.enforce_eager == eager
        return CheckResult(
            "eager", "pass" if ok else "fail", requested, f"enforce_eager={facts.enforce_eager}", evidence
        )
    observed = f"compilation mode {mode}, cudagraph mode {facts.cudagraph_mode or 'not reported'}"
    if eager:
        ok = mode == "NONE" and facts.cudagraph_mode in (None, "NONE")
    else:
        ok = mode != "NONE"
    return CheckResult("eager", "pass" if ok else "fail", requested, observed, evidence)
