"""What one request sent and what came back, as plain records: :class:`Completion` and its tokens
(:class:`TokenLogprob`). The correctness client (:mod:`pytest_llmserve.evidence.client`) fills them; the
oracles (:mod:`pytest_llmserve.verdicts`) judge them without importing the client."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    """One generated token, its logprob (None when the server sent null) and the top alternatives."""

    token: str
    logprob: float | None
    top: dict[str, float | None] = field(default_factory=dict)


@dataclass(slots=True)
class Completion:
    """What one request sent and what came back."""

    request: dict[str, object]
    status: int
    text: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: object = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    raw: dict[str, object] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def logprobs(self) -> list[float | None]:
        return [t.logprob for t in self.tokens]

    def describe(self, limit: int = 12) -> str:
        """A short, human-readable account of the request and the first tokens that came back."""
        prompt = self.request.get("prompt", self.request.get("messages"))
        lines = [f"sent: prompt={short_repr(prompt)} max_tokens={self.request.get('max_tokens')} "
                 f"temperature={self.request.get('temperature')}"]
        if not self.ok:
            lines.append(f"got: HTTP {self.status}: {short_repr(self.error, 300)}")
            return "\n".join(lines)
        lines.append(f"got: finish_reason={self.finish_reason} completion_tokens={self.completion_tokens} "
                     f"text={short_repr(self.text, 200)}")
        if self.tokens:
            shown = ", ".join(f"{t.token!r}:{_fmt_lp(t.logprob)}" for t in self.tokens[:limit])
            lines.append(f"first tokens (token:logprob): {shown}")
        return "\n".join(lines)


def _fmt_lp(value: float | None) -> str:
    if value is None:
        return "null"
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def short_repr(value: object, limit: int = 120) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages that quote what was sent or received."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
