"""What an SGLang server says it did: facts from its own log (0.5.9, 0.5.15, 0.5.23), /metrics and /server_info.

Every fact keeps the lines that prove it; a fact the server did not report stays None."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_llmserve.engines.log_reading import FactRow, StampedLog, on_ready, record_read
from pytest_llmserve.evidence.facts import (
    DecodeBatch,
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
    split_top_level,
)
from pytest_llmserve.evidence.prometheus import MetricSamples, metric_line

# NaN as SGLang reports it in its log: (engine, pattern, meaning).
NAN_LOG_PATTERNS: tuple[NanLogPattern, ...] = (
    ("sglang", re.compile(r"Detected errors during sampling! NaN in the logits"),
     "SGLang --enable-nan-detection saw NaN in the logits (0.5.9)"),
    ("sglang", re.compile(r"NaN detected in \S"),
     "SGLANG_SANITIZE_NAN_LOGITS replaced NaN logits before sampling (the output is garbage)"),
    ("sglang", re.compile(r"NaN detected!"),
     "SGLang's NaN assert fired (SGLANG_ENABLE_NAN_LOGITS_CHECK / SGLANG_ENABLE_ASYNC_ASSERT)"),
    ("sglang", re.compile(re.escape("NaN happened")),
     "SGLang finished a request because the sampled token id was out of range (NaN logits)"),
)

_SGL_TS = re.compile(r"^\s*\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
# 0.5.9 / 0.5.15: server_args=ServerArgs(model_path='...', ...); 0.5.23: server_args={'model_path': '...', ...}.
_SGL_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)\)\s*$")
_SGL_SERVER_ARGS_DICT = re.compile(r"server_args=\{(.*)\}\s*$")
_SGL_DEFAULT_BACKEND = re.compile(r"Attention backend not specified\. Use (\w+) backend by default")
# "Cuda graph is disabled because ..." (0.5.9) / "CUDA graph is disabled because ..." (later).
_SGL_GRAPH_DISABLED = re.compile(r"cuda graph is disabled because .*", re.IGNORECASE)
_SGL_SET_DSA = re.compile(r"Set (?:NSA|DSA) backends for .*?: prefill=(\w+), decode=(\w+)")
# The device word is cuda, cpu or npu (musa in 0.5.23): every graph runner logs the same shape.
_SGL_CAPTURE_BS_059 = re.compile(r"Capture (?:cuda|cpu|npu|musa) graph bs \[([\d,\s]*)\]", re.IGNORECASE)
_SGL_CAPTURE_END_059 = re.compile(r"Capture (?:cuda|cpu|npu|musa) graph end\.", re.IGNORECASE)
_SGL_CAPTURE_BAR_059 = re.compile(r"Capturing batches \(bs=(\d+)")
_SGL_CAPTURE_NEW = re.compile(r"Capture (target|draft) ([\w ]+?) (?:CUDA|CPU|NPU|MUSA) graph (begin|end)\.(.*)$")
_SGL_CAPTURE_FAILED = re.compile(r"Capture (?:cuda|cpu|npu|musa) graph failed", re.IGNORECASE)
_SGL_DECODE = re.compile(r"Decode batch(?: \[\d+\])?,(.*)$")
_SGL_SCHED = re.compile(r"max_total_num_tokens=(\d+)")
_SGL_SCHED_RUNNING = re.compile(r"max_running_requests=(\d+)")
_SGL_KV_ALLOC = re.compile(r"(?:KV Cache is allocated|VA upper bound)\..*?#tokens: ([\d,]+)")
_SGL_READY = re.compile(r"The server is fired up and ready to roll!")
# A DSA model's dense-attention threshold, one of two lines at boot (0.5.15, 0.5.23): set by
# SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD, or else the model's index_topk.
_SGL_DSA_DENSE_MANUAL = re.compile(r"Dense attention kv len threshold is manually set to (-?\d+) for DSA\.")
_SGL_DSA_DENSE_TOPK = re.compile(
    r"Set dense attention kv len threshold to model index_topk=(\d+) for DeepSeek with DSA\.")


def _sgl_graph_backend_requested(args: Mapping[str, object]) -> tuple[bool | None, str | None]:
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


def _dict_repr_items(body: str) -> dict[str, object]:
    """``'a': 1, 'b': [1, 2], 'c': <Enum.X: 1>`` (a dict repr's inside) -> {key: value or raw text}."""
    out: dict[str, object] = {}
    for part in split_top_level(body):
        key, colon, value = part.partition(":")
        key = key.strip().strip("'\"")
        if colon and key.isidentifier():
            out[key] = literal(value.strip())
    return out


def _sgl_server_args(r: _SGLangLog, line: str, body: str, *, dict_form: bool = False) -> None:
    """The ``server_args=`` line: the backends, resources and speculative decoding it set; whether it turned
    graphs off and the index_topk its override args give, which the end of the log decides on."""
    facts = r.facts
    if dict_form:
        args = _dict_repr_items(body)
    else:
        args = {key: literal(value) for key, value in parse_kwargs_repr(body).items()}
    _server_args_backends(facts, args, line)
    record_read(facts, args, (("seed", "random_seed", as_int), ("mem_fraction", "mem_fraction_static", as_float)), line)
    if facts.max_batch_size is None:
        record_read(facts, args, (("max_batch_size", "max_running_requests", as_int),), line)
    record_read(facts, args, (("deterministic", "enable_deterministic_inference", as_bool),), line)
    if "speculative_algorithm" in args:
        _server_args_speculative(facts, args, line)
    disabled, _ = _sgl_graph_backend_requested(args)
    if disabled:
        r.graph_disabled_line = line
    override_topk = _override_index_topk(args.get("json_model_override_args"))
    if override_topk is not None:
        r.override_topk = (override_topk, line)  # used at the end, where no log line said the topk


def _server_args_backends(facts: ServerFacts, args: Mapping[str, object], line: str) -> None:
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


_SPECULATIVE_DETAIL_KEYS = ("speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
                            "speculative_num_draft_tokens")


def _server_args_speculative(facts: ServerFacts, args: Mapping[str, object], line: str) -> None:
    algorithm = args.get("speculative_algorithm")
    if algorithm in (None, "None", ""):
        facts.record("speculative", False, line)
        return
    facts.record("speculative", True, line)
    detail = [f"algorithm={algorithm}"]
    for key in _SPECULATIVE_DETAIL_KEYS:
        if args.get(key) is not None:
            detail.append(f"{key.removeprefix('speculative_')}={args[key]}")
    facts.record("speculative_detail", ", ".join(detail), line)


def _override_index_topk(value: object) -> int | None:
    """The integer ``index_topk`` of a ``json_model_override_args`` value (a JSON object as a string), else None.
    Malformed JSON is ignored, not an error: the server refuses it at boot, so it never ran with it."""
    if not isinstance(value, str):
        return None
    try:
        overrides = json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        return None
    topk = overrides.get("index_topk") if isinstance(overrides, dict) else None
    return topk if isinstance(topk, int) and not isinstance(topk, bool) else None


def _sgl_decode_line(facts: ServerFacts, line: str, tail: str) -> None:
    def num(pattern: str) -> str | None:
        match = re.search(pattern, tail)
        return match.group(1) if match else None

    graph_text = num(r"\b(?:cuda|cpu|npu|musa) graph: (True|False)")
    graph = None if graph_text is None else graph_text == "True"
    running = num(r"#running-req: (\d+)")
    tokens = num(r"#token: (\d+)") or num(r"#full token: (\d+)")  # hybrid SWA/Mamba models
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
    if graph is not None and batch.running_reqs is not None:
        facts.count_graph_use(batch.running_reqs, graph)
        facts.add_evidence("graph_use_by_size", line)
    if graph is True:
        facts.decode_batches_on_graph += 1
        facts.add_evidence("decode_batches_on_graph", line)
    elif graph is False:
        facts.decode_batches_off_graph += 1
        facts.add_evidence("decode_batches_off_graph", line)
    if accept is not None:
        # Acceptance lengths are only printed when speculative decoding actually runs.
        facts.record("speculative", True, line)


@dataclass
class _SGLangLog(StampedLog):
    """What reading an SGLang log has found so far, beyond the facts: what only the whole log decides."""

    stamp = _SGL_TS

    graph_disabled_line: str | None = None  # the ServerArgs line that turned decode graphs off
    override_topk: tuple[int, str] | None = None  # (index_topk of the ServerArgs' override args, line)
    capture_sizes: tuple[int, ...] | None = None
    capture_lines: list[str] = field(default_factory=list)
    bar_sizes: set[int] = field(default_factory=set)
    graph_backend: str | None = None
    capture_failed: bool = False
    disabled_lines: list[str] = field(default_factory=list)
    default_backend: tuple[str, str] | None = None  # (backend, line)
    dsa_line: tuple[str, str, str] | None = None  # (prefill, decode, line)
    sched_running: tuple[int, str] | None = None  # (max running requests, line)


def _on_capture_059(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.capture_sizes = int_list(m.group(1))
    r.capture_lines.append(line)
    r.graph_backend = r.graph_backend or "full"  # 0.5.9 decode graphs are full graphs


def _on_capture_end_059(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.capture_lines.append(line)
    r.graph_backend = r.graph_backend or "full"


def _on_capture_new(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    role, phase, tail = m.group(1), m.group(2).strip(), m.group(4)
    # Target decode (or target verify, with speculative decoding) graphs are the decode
    # batch-size graphs; prefill graphs are keyed by token count, draft graphs by the drafter.
    if role == "target" and phase in ("decode", "verify"):
        r.capture_lines.append(line)
        if bs := re.search(r"\bbs=\[([\d,\s]*)\]", tail):
            r.capture_sizes = int_list(bs.group(1))
        if backend := re.search(r"\bbackend=(\w+)", tail):
            r.graph_backend = backend.group(1).lower()


def _on_scheduler(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.facts.record("kv_cache_tokens", int(m.group(1)), line)
    if running := _SGL_SCHED_RUNNING.search(line):
        r.sched_running = (int(running.group(1)), line)


def _on_kv_allocated(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    if r.facts.kv_cache_tokens is None:  # the scheduler's line, when there is one, is the word on it
        r.facts.record("kv_cache_tokens", int(m.group(1).replace(",", "")), line)


def _on_default_backend(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.default_backend = (m.group(1), line)  # used at the end, where ServerArgs named no backend


def _on_dsa_backends(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.dsa_line = (m.group(1), m.group(2), line)  # used at the end, where ServerArgs named no DSA backend


def _on_capture_failed(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.capture_failed = True


def _on_dsa_dense_manual(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.facts.record("dsa_dense_threshold", int(m.group(1)), line)


def _on_dsa_dense_topk(r: _SGLangLog, line: str, m: re.Match[str]) -> None:
    r.facts.record_many(line, dsa_dense_threshold=int(m.group(1)), dsa_index_topk=int(m.group(1)))


#: The lines of an SGLang log and what each proves; the first rule a line matches reads it.
_SGL_RULES: tuple[LineRule[_SGLangLog], ...] = (
    (_SGL_SERVER_ARGS, lambda r, line, m: _sgl_server_args(r, line, m.group(1))),
    (_SGL_SERVER_ARGS_DICT,
     lambda r, line, m: _sgl_server_args(r, line, m.group(1), dict_form=True)),
    (_SGL_DECODE, lambda r, line, m: _sgl_decode_line(r.facts, line, m.group(1))),
    (_SGL_DEFAULT_BACKEND, _on_default_backend),
    (_SGL_GRAPH_DISABLED, lambda r, line, m: r.disabled_lines.append(line)),
    (_SGL_SET_DSA, _on_dsa_backends),
    (_SGL_DSA_DENSE_MANUAL, _on_dsa_dense_manual),
    (_SGL_DSA_DENSE_TOPK, _on_dsa_dense_topk),
    (_SGL_CAPTURE_BS_059, _on_capture_059),
    (_SGL_CAPTURE_END_059, _on_capture_end_059),
    (_SGL_CAPTURE_BAR_059, lambda r, line, m: r.bar_sizes.add(int(m.group(1)))),
    (_SGL_CAPTURE_NEW, _on_capture_new),
    (_SGL_CAPTURE_FAILED, _on_capture_failed),
    (_SGL_SCHED, _on_scheduler),
    (_SGL_KV_ALLOC, _on_kv_allocated),
    (_SGL_READY, on_ready),
)


def parse_sglang_log(text: str) -> ServerFacts:
    """Facts from an SGLang server log (0.5.9, 0.5.15 and 0.5.23 formats)."""
    r = _SGLangLog(ServerFacts(engine="sglang"))
    read_timed_log(r, text, _SGL_RULES)
    _sgl_backends(r)
    if r.facts.dsa_index_topk is None and r.override_topk is not None:
        # The "Set dense ... index_topk=N" line wins over the override args: it is the topk the server computed
        # from the config it loaded (overrides applied); the args are only what it was asked to apply.
        r.facts.record("dsa_index_topk", *r.override_topk)
    if r.sched_running:
        # The scheduler's max_running_requests is the effective one (capped by the KV pool).
        r.facts.record("max_batch_size", r.sched_running[0], r.sched_running[1])
    r.record_ready()
    _sgl_graph_facts(r)
    r.facts.compact_evidence()
    return r.facts


def _sgl_backends(r: _SGLangLog) -> None:
    """The default attention backend and the DSA backends, where ServerArgs did not name them."""
    facts = r.facts
    if r.default_backend and facts.attention_backend is None:
        name = normalize_backend(r.default_backend[0])
        facts.record("attention_backend", name, r.default_backend[1])
        for phase in ("prefill", "decode"):
            if getattr(facts, f"{phase}_attention_backend") is None:
                facts.record(f"{phase}_attention_backend", name, r.default_backend[1])
    if r.dsa_line:
        for phase, value in (("prefill", r.dsa_line[0]), ("decode", r.dsa_line[1])):
            if getattr(facts, f"nsa_{phase}_backend") is None:
                facts.record(f"nsa_{phase}_backend", normalize_backend(value), r.dsa_line[2])
            elif getattr(facts, f"nsa_{phase}_backend") == normalize_backend(value):
                facts.add_evidence(f"nsa_{phase}_backend", r.dsa_line[2])


def _sgl_graph_facts(r: _SGLangLog) -> None:
    """Graph facts: capture lines are execution; ServerArgs/"disabled because" lines are the reason."""
    facts, capture_sizes, capture_lines = r.facts, r.capture_sizes, r.capture_lines
    if capture_sizes is None and r.bar_sizes:
        capture_sizes = tuple(sorted(r.bar_sizes))
    captured = bool(capture_lines) and not r.capture_failed
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
        if r.graph_backend:
            facts.record("cudagraph_mode", r.graph_backend, capture_lines[0])
        return
    why = r.disabled_lines + ([r.graph_disabled_line] if r.graph_disabled_line is not None else [])
    proof = why + ([r.ready_line] if r.ready_line else [])
    if why or r.ready_line is not None or r.capture_failed:
        # Booted (or failed capture) without any target decode capture line: no graphs.
        facts.record_many(None, cuda_graph_enabled=False, captured_batch_sizes=())
        for line in proof:
            facts.add_evidence("cuda_graph_enabled", line)
            facts.add_evidence("captured_batch_sizes", line)
        if why:
            facts.record("cudagraph_mode", "disabled", why[0])


def _info_source(key: str, value: object) -> str:
    """The evidence line of a /server_info value."""
    return f"/server_info {key}={value!r}"


def _as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


#: /server_info keys that prove one fact each: (fact, key, reader); a value the reader cannot read is not reported.
_INFO_VERSION: tuple[FactRow, ...] = (("version", "version", _as_str),)
_INFO_RESOURCES: tuple[FactRow, ...] = (("seed", "random_seed", as_int),
                                        ("mem_fraction", "mem_fraction_static", as_float),
                                        ("kv_cache_tokens", "max_total_num_tokens", as_int))
_INFO_DETERMINISTIC: tuple[FactRow, ...] = (("deterministic", "enable_deterministic_inference", as_bool),)
_INFO_STARTUP: tuple[FactRow, ...] = (("startup_s", "startup_time", as_float),)


def _record_info_values(facts: ServerFacts, info: Mapping[str, object], rows: tuple[FactRow, ...]) -> None:
    record_read(facts, info, rows, _info_source)


def parse_sglang_server_info(info: Mapping[str, object]) -> ServerFacts:
    """Facts from SGLang's ``/server_info`` JSON (resolved server args + scheduler info + version)."""
    facts = ServerFacts(engine="sglang")
    _record_info_values(facts, info, _INFO_VERSION)
    _info_backends(facts, info)
    _record_info_values(facts, info, _INFO_RESOURCES)
    states = info.get("internal_states")
    state0: Mapping[str, object] = (
        states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    )
    running = as_int(state0.get("effective_max_running_requests_per_dp"))
    if running is not None:
        facts.record(
            "max_batch_size",
            running,
            _info_source("internal_states[0].effective_max_running_requests_per_dp", running),
        )
    else:
        _record_info_values(facts, info, (("max_batch_size", "max_running_requests", as_int),))
    _record_info_values(facts, info, _INFO_DETERMINISTIC)
    if "speculative_algorithm" in info:
        algorithm = info.get("speculative_algorithm")
        facts.record("speculative", algorithm not in (None, ""), _info_source("speculative_algorithm", algorithm))
        if algorithm:
            facts.record(
                "speculative_detail", f"algorithm={algorithm}", _info_source("speculative_algorithm", algorithm)
            )
    _record_info_values(facts, info, _INFO_STARTUP)
    _info_graphs(facts, info, state0)
    overrides = info.get("json_model_override_args")
    override_topk = _override_index_topk(overrides)
    if override_topk is not None:
        facts.record("dsa_index_topk", override_topk, _info_source("json_model_override_args", overrides))
    return facts


def _info_backends(facts: ServerFacts, info: Mapping[str, object]) -> None:
    """The attention backends: prefill and decode default to attention_backend; dsa_* (0.5.15) or nsa_*."""
    attention = info.get("attention_backend")
    if isinstance(attention, str):
        facts.record("attention_backend", normalize_backend(attention), _info_source("attention_backend", attention))
    for phase in ("prefill", "decode"):
        key = f"{phase}_attention_backend"
        own = info.get(key)
        if isinstance(own, str):
            facts.record(key, normalize_backend(own), _info_source(key, own))
        elif isinstance(attention, str):
            facts.record(key, normalize_backend(attention), _info_source("attention_backend", attention))
        for dsa_key in (f"dsa_{phase}_backend", f"nsa_{phase}_backend"):
            value = info.get(dsa_key)
            if isinstance(value, str):
                facts.record(f"nsa_{phase}_backend", normalize_backend(value), _info_source(dsa_key, value))
                break


def _info_graphs(facts: ServerFacts, info: Mapping[str, object], state0: Mapping[str, object]) -> None:
    """Graph facts: memory held by captured graphs, else the requested disable flags and decode backend."""
    disabled, backend = _sgl_graph_backend_requested(info)
    memory = state0.get("memory_usage")
    graph_memory = memory.get("graph") if isinstance(memory, Mapping) else None
    if isinstance(graph_memory, Mapping):  # 0.5.23: GB per phase, {"decode": ..., "prefill": ...}
        graph_memory = graph_memory.get("decode", sum(as_float(v) or 0.0 for v in graph_memory.values()))
    graph_gb = as_float(graph_memory)
    if graph_gb is not None and graph_gb > 0:
        # Memory held by captured graphs is a trace of execution, unlike the disable flags.
        facts.record("cuda_graph_enabled", True, _info_source("internal_states[0].memory_usage.graph", graph_gb))
    elif disabled is not None:
        facts.record(
            "cuda_graph_enabled",
            not disabled,
            _info_source("disable_cuda_graph / cuda_graph_backend_decode", "disabled" if disabled else backend),
        )
    if disabled:
        facts.record("cudagraph_mode", "disabled", _info_source("cuda_graph_backend_decode", "disabled"))
    elif backend:
        facts.record("cudagraph_mode", backend, _info_source("cuda_graph_backend_decode", backend))


def merge_sglang_metrics(facts: ServerFacts, metrics: MetricSamples) -> None:
    """What SGLang's /metrics proves: decode graph passes, and the KV pool and start-up time where the log did
    not say them."""
    _graph_passes(facts, metrics)
    if facts.kv_cache_tokens is None:
        for labels, value in metrics.get("sglang:max_total_num_tokens", [])[:1]:
            facts.record(
                "kv_cache_tokens", int(value), metric_line("sglang:max_total_num_tokens", labels, value)
            )
    if facts.startup_s is None:
        _startup_time(facts, metrics)


def _graph_passes(facts: ServerFacts, metrics: MetricSamples) -> None:
    """``sglang:cuda_graph_passes_total`` by mode. One series per scheduler: TP ranks run the same batches (take
    the max), DP ranks run different ones (add them up)."""
    per_mode: dict[str, dict[str, tuple[float, str]]] = {}
    for labels, value in metrics.get("sglang:cuda_graph_passes_total", []):
        by_dp = per_mode.setdefault(labels.get("mode", ""), {})
        dp = labels.get("dp_rank", "")
        if dp not in by_dp or value > by_dp[dp][0]:
            by_dp[dp] = (value, metric_line("sglang:cuda_graph_passes_total", labels, value))
    for mode, by_dp in per_mode.items():
        passes = sum(v for v, _ in by_dp.values())
        facts.graph_passes[mode] = passes
        for _, line in by_dp.values():
            facts.add_evidence("graph_passes", line)
        # Modes: decode_cuda_graph / decode_none (prefill_* are prefill graphs, not decode).
        if mode.startswith("decode") and mode.endswith("none"):
            facts.graph_passes_off += passes
        elif mode.startswith("decode"):
            facts.graph_passes_on += passes


def _startup_time(facts: ServerFacts, metrics: MetricSamples) -> None:
    """0.5.15: ``sglang:engine_startup_time``; 0.5.23: ``sglang:startup_time_seconds{phase=...}``, the whole start
    being the "total" phase, else the sum of the phases."""
    for labels, value in metrics.get("sglang:engine_startup_time", [])[:1]:
        facts.record("startup_s", value, metric_line("sglang:engine_startup_time", labels, value))
        return
    phases = metrics.get("sglang:startup_time_seconds", [])
    if not phases:
        return
    total = [(labels, value) for labels, value in phases if labels.get("phase") == "total"]
    chosen = total or phases
    facts.record("startup_s", total[0][1] if total else sum(value for _, value in phases),
                 metric_line("sglang:startup_time_seconds", chosen[0][0], chosen[0][1]))
    for labels, value in chosen[1:]:
        facts.add_evidence("startup_s", metric_line("sglang:startup_time_seconds", labels, value))
