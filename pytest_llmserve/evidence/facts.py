"""What a server says it did: the facts model every engine parser fills, and the generic log scanning.

The point is "config is execution": a flag on the command line is a request, and engines silently
downgrade requests (vLLM's CUDA-graph mode, SGLang's attention backends that switch graphs off, capture
lists filtered by max running requests...). So every fact comes from what the engine printed *after*
resolving its configuration, and every fact carries the exact lines that prove it
(:attr:`ServerFacts.evidence`). A fact the server did not report stays ``None`` and any check on it is
"unverifiable", never "pass". Each engine's own parser lives in its folder (``engines/<engine>/facts.py``);
this module holds only what they share.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

__all__ = [
    "DecodeBatch",
    "LineRule",
    "NanLogPattern",
    "ServerFacts",
    "TimedReading",
    "as_bool",
    "as_float",
    "apply_line_rules",
    "as_int",
    "fill_missing",
    "focus_line",
    "int_list",
    "literal",
    "normalize_backend",
    "parse_kwargs_repr",
    "read_timed_log",
    "record_ready",
    "scan_events",
    "split_lines",
    "split_top_level",
]


#: A log line that reports NaN: (engine, pattern, what it means). Engines declare theirs; the oracles scan for them.
NanLogPattern = tuple[str, "re.Pattern[str]", str]

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
    # DSA (DeepSeek Sparse Attention): a prefill whose KV length is at most this takes a dense attention kernel,
    # not the sparse one (SGLang's threshold; 0 = every prefill is sparse). Below index_topk tokens the indexer
    # keeps every token anyway, so only longer requests show whether selection works.
    dsa_dense_threshold: int | None = None
    # DSA: the index_topk the server runs with (tokens each query attends to), as the server reported it: its
    # own line, else the model-config override args it was given (the model's config.json is not the server's word).
    dsa_index_topk: int | None = None
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
    # Graph use per batch size (running requests of a decode step, or unpadded tokens of a vLLM step):
    # {size: {"on": steps on a graph, "off": steps without}}, from per-step evidence only.
    graph_use_by_size: dict[int, dict[str, int]] = field(default_factory=dict)
    graph_passes: dict[str, float] = field(default_factory=dict)  # raw counter/table value by the engine's mode
    graph_passes_on: float = 0.0  # forward passes that replayed a graph (the engine's parser says which modes)
    graph_passes_off: float = 0.0
    # Why graph use cannot be proven on this engine, when it reported none (the engine's parser sets it).
    graph_use_hint: str | None = None
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

    def record(self, name: str, value: object, line: str | None) -> None:
        """Set fact ``name`` and remember the line that proves it (the only way parsers set facts)."""
        setattr(self, name, value)
        if line is not None:
            self.add_evidence(name, line)

    def record_many(self, line: str | None, **values: object) -> None:
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

    def count_graph_use(self, size: int, on_graph: bool, steps: int = 1) -> None:
        """Record ``steps`` forward steps of ``size`` that ran on a graph (or not)."""
        entry = self.graph_use_by_size.setdefault(size, {"on": 0, "off": 0})
        entry["on" if on_graph else "off"] += steps

    @property
    def decode_graph_passes(self) -> float:
        """Forward passes that replayed a graph, from counters (SGLang's) or per-step tables (vLLM's)."""
        return self.graph_passes_on

    @property
    def decode_graph_reported(self) -> bool:
        """Whether the engine said anything at all about graph use in decode."""
        return bool(self.decode_batches_on_graph or self.decode_batches_off_graph or self.graph_passes
                    or self.graph_use_by_size)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able data for reports and baselines."""
        out: dict[str, object] = {}
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
                value = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                         for k, v in value.items()}
            elif isinstance(value, list):
                value = list(value)
            out[f.name] = value
        return out


# --------------------------------------------------------------------------- shared helpers

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def focus_line(line: str, needles: Iterable[str], width: int = 400) -> str:
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


Reading = TypeVar("Reading")
#: One row of an engine's log parser: a line ``pattern`` and the ``handler`` that records what a line it
#: matches proves, given the parser's reading so far (its facts and what later lines need), the line and the
#: match. A handler returns False to hand the line on to the next rule (its pattern matched, but the line is
#: not one it reads); anything else ends the line's reading.
LineRule = tuple["re.Pattern[str]", Callable[[Reading, str, "re.Match[str]"], "bool | None"]]


def apply_line_rules(reading: Reading, line: str, rules: Sequence[LineRule[Reading]]) -> bool:
    """Give ``line`` to the first rule, in table order, whose pattern it matches and whose handler takes it;
    True when one took it."""
    for pattern, handler in rules:
        if (match := pattern.search(line)) and handler(reading, line, match) is not False:
            return True
    return False


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


def literal(raw: str | None) -> object:
    """``ast.literal_eval`` of a repr, or the raw text when it is not a literal (``<Enum.X: 1>``)."""
    if raw is None:
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return raw


def as_int(value: object) -> int | None:
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


def as_float(value: object) -> float | None:
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


def as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() in ("True", "False"):
        return value.strip() == "True"
    return None


def int_list(text: str) -> tuple[int, ...]:
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


def scan_events(facts: ServerFacts, line: str) -> None:
    if _CONFIG_LINE.search(line):
        return
    if _NAN_WORD.search(line) and len(facts.nan_events) < MAX_EVENT_LINES:
        facts.nan_events.append(line.rstrip())
    if (_LEVEL_ERROR.search(line) or _ERROR_PHRASES.search(line)) and len(facts.errors) < MAX_EVENT_LINES:
        facts.errors.append(line.rstrip())


class TimedReading(Protocol):
    """A log parser's reading that knows each line's time (vLLM's and SGLang's logs stamp their lines)."""

    @property
    def facts(self) -> ServerFacts: ...

    def note_time(self, line: str) -> None: ...


TimedReadingT = TypeVar("TimedReadingT", bound=TimedReading)


def read_timed_log(reading: TimedReadingT, text: str, rules: Sequence[LineRule[TimedReadingT]]) -> None:
    """Every line of ``text`` through ``reading``: its time first, then the events any engine's log shows
    (:func:`scan_events`), then the engine's own table of ``rules``."""
    for line in split_lines(text):
        reading.note_time(line)
        scan_events(reading.facts, line)
        apply_line_rules(reading, line, rules)


def record_ready(facts: ServerFacts, ready_line: str, first: datetime | None, ready: datetime | None) -> None:
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
            "graph_passes_on",
            "graph_passes_off",
            "graph_use_by_size",
            "graph_captures",
        ):
            continue
        if getattr(facts, f.name) is None and getattr(other, f.name) is not None:
            setattr(facts, f.name, getattr(other, f.name))
            for line in other.evidence.get(f.name, []):
                facts.add_evidence(f.name, line)
    if not facts.graph_passes and other.graph_passes:
        facts.graph_passes = dict(other.graph_passes)
        facts.graph_passes_on, facts.graph_passes_off = other.graph_passes_on, other.graph_passes_off
        for line in other.evidence.get("graph_passes", []):
            facts.add_evidence("graph_passes", line)
    return facts
