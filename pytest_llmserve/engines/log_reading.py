"""What the engines' parsers share beyond :mod:`pytest_llmserve.evidence.facts`: the reading of a log whose lines
carry a timestamp (vLLM's, SGLang's) up to its ready line, and facts read from a table of values (a ServerArgs or
config line, ``/server_info``) row by row."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from pytest_llmserve.evidence.facts import ServerFacts, record_ready

__all__ = ["FactRow", "StampedLog", "on_ready", "record_read"]

#: One fact read from a table of values: (the fact, the value's key, the reader that makes the fact of it or None,
#: e.g. :func:`~pytest_llmserve.evidence.facts.as_int`).
FactRow = tuple[str, str, Callable[[object], object]]


def record_read(facts: ServerFacts, values: Mapping[str, object], rows: Iterable[FactRow],
                line: str | Callable[[str, object], str]) -> None:
    """Record each row's fact that its reader makes of ``values[key]``; a value it cannot read is not reported.
    ``line`` is the evidence: the line the values came from, or the line of one value (its key and the fact)."""
    for fact, key, read in rows:
        value = read(values.get(key))
        if value is not None:
            facts.record(fact, value, line if isinstance(line, str) else line(key, value))


@dataclass
class StampedLog:
    """A log reading whose lines carry a timestamp (:data:`stamp`, read with :data:`stamp_format` after
    :data:`stamp_prefix`): each line's time, the first, and the ready line's, for the start-up time."""

    stamp: ClassVar[re.Pattern[str]]
    stamp_format: ClassVar[str] = "%Y-%m-%d %H:%M:%S"
    stamp_prefix: ClassVar[str] = ""  # what the stamp leaves out (vLLM's has no year)

    facts: ServerFacts
    line_ts: datetime | None = None  # the current line's timestamp
    first_ts: datetime | None = None
    ready_ts: datetime | None = None
    ready_line: str | None = None

    def note_time(self, line: str) -> None:
        self.line_ts = None
        if found := self.stamp.search(line):
            try:
                self.line_ts = datetime.strptime(self.stamp_prefix + found.group(1), self.stamp_format)
            except ValueError:
                self.line_ts = None
            if self.line_ts is not None and self.first_ts is None:
                self.first_ts = self.line_ts

    def record_ready(self) -> None:
        """The server said it is ready, and the start-up time from the first line to that one (when both carry
        a time)."""
        if self.ready_line is not None:
            record_ready(self.facts, self.ready_line, self.first_ts, self.ready_ts)


def on_ready(r: StampedLog, line: str, m: re.Match[str]) -> None:
    """A ready line: the first one counts."""
    if r.ready_line is None:
        r.ready_line, r.ready_ts = line, r.line_ts
