"""``llmserve facts LOG``: what a server's own log (and /metrics, /server_info) proves it ran.

For users debugging "what ran": the same parsers the execution checks use, printed with the lines that
prove each fact. The engine is recognised from the log unless ``--engine`` names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmserve.engine_registry import ADAPTERS
from pytest_llmserve.json_encoding import dumps

if TYPE_CHECKING:
    from pytest_llmserve.engines.base import EngineAdapter
    from pytest_llmserve.evidence.facts import ServerFacts

#: What the command shows, in this order: (label, ServerFacts field).
SHOWN = (
    ("engine version", "version"),
    ("attention backend", "attention_backend"),
    ("prefill attention backend", "prefill_attention_backend"),
    ("decode attention backend", "decode_attention_backend"),
    ("NSA/DSA prefill backend", "nsa_prefill_backend"),
    ("NSA/DSA decode backend", "nsa_decode_backend"),
    ("compilation mode", "compilation_mode"),
    ("graph mode", "cudagraph_mode"),
    ("graphs captured", "cuda_graph_enabled"),
    ("captured batch sizes", "captured_batch_sizes"),
    ("graph use per batch size", "graph_use_by_size"),
    ("graph passes (counter)", "graph_passes"),
    ("KV cache tokens", "kv_cache_tokens"),
    ("speculative decoding", "speculative"),
    ("speculative detail", "speculative_detail"),
    ("memory fraction", "mem_fraction"),
    ("max running requests", "max_batch_size"),
    ("seed", "seed"),
    ("enforce eager", "enforce_eager"),
    ("deterministic", "deterministic"),
    ("startup (s)", "startup_s"),
)


# Bookkeeping fields, not facts of their own (evidence, raw event lists, counters already shown per size).
_NOT_SHOWN = frozenset({"engine", "evidence", "nan_events", "errors", "decode_batches", "decode_batches_on_graph",
                        "decode_batches_off_graph", "graph_passes_on", "graph_passes_off", "graph_use_hint",
                        "graph_captures", "ready"})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("facts", help="print what a server log (and /metrics, /server_info) proves it ran")
    p.add_argument("log", type=Path, help="the server's log file (stdout and stderr)")
    p.add_argument("--engine", help="vllm, sglang or llamacpp (default: recognised from the log)")
    p.add_argument("--metrics", type=Path, help="a saved /metrics page of the same server")
    p.add_argument("--server-info", type=Path, help="a saved /server_info (SGLang) or /props (llama.cpp) JSON")
    p.add_argument("--json", action="store_true", help="print the facts and their evidence as JSON")
    p.set_defaults(func=run)


def _read(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SystemExit(f"llmserve facts: cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None


def _value(value: object) -> str:
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        return ", ".join(f"{k}: {v.get('on', 0)} on graph / {v.get('off', 0)} off" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]" if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


class _Refused(Exception):
    """Input the command cannot read facts from: its message goes to stderr, the command exits with 2."""


def run(args: argparse.Namespace) -> int:
    log = _read(args.log, "log")
    assert log is not None
    metrics = _read(args.metrics, "metrics file")
    try:
        info = _server_info(args)
        adapter = _adapter(args, log)
    except _Refused as refused:
        print(f"llmserve facts: {refused}", file=sys.stderr)
        return 2
    facts = adapter.parse_facts(log, metrics, info)
    if args.json:
        print(dumps(facts.to_dict(), indent=2))
        return 0
    print(f"{args.log}: {adapter.name} server log" + ("" if args.engine else " (engine recognised from the log)"))
    _print_facts(facts)
    return 0


def _server_info(args: argparse.Namespace) -> Any:
    """The saved /server_info or /props as parsed JSON (None when not given)."""
    info_text = _read(args.server_info, "server info file")
    if info_text is None:
        return None
    try:
        return json.loads(info_text)
    except json.JSONDecodeError as exc:
        raise _Refused(f"{args.server_info} is not JSON ({exc})") from None


def _adapter(args: argparse.Namespace, log: str) -> EngineAdapter:
    """The engine named by --engine, else the one whose log this is."""
    # lazy: the engines' adapters and parsers (15 ms), which the other commands do not need
    from pytest_llmserve.engines import adapter_for_log, adapter_named

    if args.engine:
        if args.engine not in ADAPTERS or args.engine in ("external", "command"):
            raise _Refused(f"--engine {args.engine!r} is not an engine with a log parser (vllm, sglang, llamacpp)")
        return adapter_named(args.engine)
    found = adapter_for_log(log)
    if found is None:
        raise _Refused(f"{args.log} does not look like a vLLM, SGLang or llama.cpp log; name the engine with --engine")
    return found


def _print_facts(facts: ServerFacts) -> None:
    """Each fact (those of :data:`SHOWN` first, then the engine's own) with up to three lines that prove it, then
    the engine's hint and the NaN and error lines."""
    # lazy: with the engines' parsers (see _adapter)
    from pytest_llmserve.evidence.facts import focus_line

    shown = list(SHOWN) + [(f.name.replace("_", " "), f.name) for f in fields(facts) if f.name not in _NOT_SHOWN
                           and f.name not in {name for _, name in SHOWN}]
    for label, name in shown:
        value = getattr(facts, name, None)
        if value is None or value == {}:
            print(f"  {label:<27} not reported")
            continue
        print(f"  {label:<27} {_value(value)}")
        for line in facts.evidence.get(name, [])[:3]:
            print(f"      | {focus_line(line, (name, *name.split('_')), width=200)}")
    if facts.graph_use_hint:
        print(f"  note: {facts.graph_use_hint}")
    if facts.nan_events:
        print(f"  NaN lines: {len(facts.nan_events)}, first: {facts.nan_events[0][:200]}")
    if facts.errors:
        print(f"  error lines: {len(facts.errors)}, first: {facts.errors[0][:200]}")
