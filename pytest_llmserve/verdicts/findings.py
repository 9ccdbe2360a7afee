"""What every correctness oracle reports: a :class:`Finding` with its evidence (the offending tokens at their
positions, what was sent and what came back), and :class:`OracleReport`, one check's findings on one server.

A failure message says what was sent, what came back (the first offending tokens with their positions
and logprobs) and on which server configuration (the server id passed in), so it can be acted on from
a CI log alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from pytest_llmserve.evidence.completion import Completion, TokenLogprob

Severity = Literal["error", "warning"]

# The default failure message is short enough to read in a CI log: the first findings, each cut to a few
# screen lines; ``-vv`` and the results file hold all of them in full.
BRIEF_FINDINGS = 3
BRIEF_TOKENS = 3
BRIEF_MESSAGE_CHARS = 320
BRIEF_CONTEXT_CHARS = 160


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut_middle(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters in its middle: a finding states what is wrong first and
    often says how to read its evidence last (e.g. which side's tokens come first)."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 5] + " ... " + text[-tail:]


@dataclass(frozen=True, slots=True)
class TokenAt:
    """One generated token at its position, with its logprob and top alternatives, as evidence."""

    position: int
    token: str
    logprob: float | None
    top: tuple[tuple[str, float | None], ...] = ()

    @classmethod
    def of(cls, position: int, tok: TokenLogprob, top_n: int = 3) -> TokenAt:
        ranked = sorted(tok.top.items(), key=lambda kv: most_likely_first(kv[1]))[:top_n]
        return cls(position, tok.token, tok.logprob, tuple(ranked))

    def render(self) -> str:
        text = f"#{self.position} {self.token!r} {format_logprob(self.logprob)}"
        if self.top:
            text += " [top: " + ", ".join(f"{t!r} {format_logprob(v)}" for t, v in self.top) + "]"
        return text


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of evidence that something is wrong (``error``) or worth a look (``warning``)."""

    oracle: str  # nan | logprobs | transport | coherence | known-answer | determinism | differential
    severity: Severity
    message: str
    tokens: tuple[TokenAt, ...] = ()  # the first offending tokens, with positions and logprobs
    request: str = ""  # Completion.describe(): what was sent and what came back
    probe: str = ""  # which probe or request, e.g. "long-decode[story]" or "bs=3-padded-to-4 #2/3"

    def render(self, *, brief: bool = False) -> str:
        """The finding with its evidence. ``brief``: the message and each line of context cut to one
        screen line, the first :data:`BRIEF_TOKENS` offending tokens (the default failure message);
        otherwise everything (``-vv``, and the results' full evidence)."""
        head = f"[{self.oracle}] {self.severity}" + (f" in {self.probe}" if self.probe else "")
        lines = [f"{head}: {_cut_middle(self.message, BRIEF_MESSAGE_CHARS) if brief else self.message}"]
        context = self.request.splitlines()
        if brief:
            # What was sent and what came back; the first tokens are repeated by the offending tokens.
            context = [_cut(line, BRIEF_CONTEXT_CHARS) for line in context
                       if not (self.tokens and line.startswith("first tokens"))]
        lines.extend("    " + line for line in context)
        tokens = self.tokens[:BRIEF_TOKENS] if brief else self.tokens
        if tokens:
            lines.append("    offending tokens (#position token logprob [top alternatives]):")
            lines.extend("      " + _cut(t.render(), BRIEF_CONTEXT_CHARS) if brief else "      " + t.render()
                         for t in tokens)
            if len(tokens) < len(self.tokens):
                lines.append(f"      ... {len(self.tokens) - len(tokens)} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class OracleReport:
    """The findings of one check on one server, and the completions it looked at."""

    check: str
    findings: list[Finding] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    server_id: str = ""  # the server configuration the responses came from

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def add(self, findings: Iterable[Finding]) -> OracleReport:
        self.findings.extend(findings)
        return self

    def merge(self, other: OracleReport) -> OracleReport:
        self.findings.extend(other.findings)
        self.completions.extend(other.completions)
        return self

    def message(self, server_id: str | None = None, limit: int | None = BRIEF_FINDINGS, *,
                full: bool = False) -> str:
        """A failure message: the server configuration (``server_id``, else the one the report
        recorded), then the first ``limit`` distinct errors and warnings, each with what was sent,
        what came back and the offending tokens, and a count of the rest. Concise by default (each
        finding's context cut to a few lines); ``full`` shows every finding with all its evidence."""
        server_id = server_id or self.server_id or "<unnamed server>"
        errors, warnings = self.errors, self.warnings
        verdict = "FAILED" if errors else "passed"
        lines = [f"{self.check} {verdict} on server {server_id}: {len(errors)} error(s), "
                 f"{len(warnings)} warning(s) over {len(self.completions)} response(s)"]
        # The same finding in several requests (e.g. HTTP 400 on every one) is shown once, with the
        # other probes named, so distinct evidence is not pushed out of the first ``limit``.
        groups: dict[tuple[str, str, str], list[Finding]] = {}
        for f in errors + warnings:
            groups.setdefault((f.oracle, f.severity, f.message), []).append(f)
        every = list(groups.values())
        shown = every if full or limit is None else every[:limit]
        for group in shown:
            lines.append(group[0].render(brief=not full))
            if len(group) > 1:
                others = ", ".join(f.probe or "?" for f in group[1:6]) + (", ..." if len(group) > 6 else "")
                lines.append(f"    (the same in {len(group) - 1} more: {others})")
        hidden = sum(len(g) for g in every[len(shown):])
        if hidden:
            lines.append(f"... and {hidden} more finding(s) (all of them, in full: -vv, or this check's row "
                         "in results.json)")
        return "\n".join(lines)

    def first_finding(self) -> str | None:
        """The first error (else warning) on one line: oracle, probe and message."""
        ranked = self.errors or self.warnings
        if not ranked:
            return None
        first = ranked[0]
        return f"[{first.oracle}]" + (f" {first.probe}" if first.probe else "") + f": {first.message}"


def format_logprob(value: float | None) -> str:
    if value is None:
        return "null"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if abs(value) >= 1e4 else f"{value:.3f}"


def most_likely_first(value: float | None) -> float:
    return -value if value is not None and math.isfinite(value) else math.inf


def make_finding(oracle: str, severity: Severity, message: str, c: Completion | None = None,
                 tokens: Iterable[TokenAt] = (), probe: str = "") -> Finding:
    return Finding(oracle, severity, message, tuple(tokens), c.describe() if c is not None else "", probe)

