"""Every recorded log in tests/data/logs, parsed by its engine's log parser (and every recorded SGLang
/server_info, by its parser), gives the facts of
tests/data/logs/facts-snapshot.json: a regression guard for rewrites of the parsers (the snapshot was taken
from the parsers as they were before they became tables of line patterns, issue 20).

Long values are kept as digests (a string over 200 characters, a list over 40 items) so the snapshot stays
small; a mismatch names the log and the fact. Regenerate it only when a parser is meant to change what it
finds: ``python tests/unit/engines/test_facts_snapshot.py``, and review the diff.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.engines.llamacpp.facts import parse_llamacpp_log
from pytest_llmserve.engines.sglang.facts import parse_sglang_log, parse_sglang_server_info
from pytest_llmserve.engines.vllm.facts import parse_vllm_log
from pytest_llmserve.evidence.facts import ServerFacts

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
SNAPSHOT = LOGS / "facts-snapshot.json"
PARSERS: dict[str, Callable[[str], ServerFacts]] = {
    "vllm": parse_vllm_log, "sglang": parse_sglang_log, "llamacpp": parse_llamacpp_log}
LONG_STRING = 200
LONG_LIST = 40


def engine_of(path: Path) -> str:
    """The engine named in a log's file name (each recorded log names exactly one)."""
    named = [engine for engine in PARSERS if engine in path.name]
    assert len(named) == 1, f"{path.name}: names {named or 'no engine'}; it should name exactly one of {list(PARSERS)}"
    return named[0]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _compact(value: Any) -> Any:
    """``value`` as JSON data, long strings and lists replaced by their length and digest."""
    if isinstance(value, dict):
        return {str(key): _compact(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_compact(item) for item in value]
        return {"items": len(items), "sha256": _digest(items)} if len(items) > LONG_LIST else items
    if isinstance(value, str) and len(value) > LONG_STRING:
        return {"chars": len(value), "head": value[:60], "sha256": _digest(value)}
    return value


def parsed_facts(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    facts = parse_sglang_server_info(json.loads(text)) if path.name.endswith(".server_info.json") else \
        PARSERS[engine_of(path)](text)
    return {"type": type(facts).__name__, **_compact(dataclasses.asdict(facts))}


def recorded_logs() -> list[Path]:
    return sorted([*LOGS.glob("*.log"), *LOGS.glob("*sglang*.server_info.json")])


def snapshot_now() -> dict[str, Any]:
    return {path.name: parsed_facts(path) for path in recorded_logs()}


def test_the_snapshot_covers_every_recorded_log() -> None:
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert sorted(expected) == [path.name for path in recorded_logs()]


@pytest.mark.parametrize("path", recorded_logs(), ids=lambda p: p.name)
def test_each_log_parses_to_its_snapshot(path: Path) -> None:
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))[path.name]
    # A JSON round trip turns tuples into lists, as the snapshot file did.
    got = json.loads(json.dumps(parsed_facts(path), sort_keys=True))
    differing = sorted(key for key in expected.keys() | got.keys() if expected.get(key) != got.get(key))
    assert not differing, "; ".join(f"{key}: snapshot {expected.get(key)!r}, now {got.get(key)!r}"
                                    for key in differing)


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(snapshot_now(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
