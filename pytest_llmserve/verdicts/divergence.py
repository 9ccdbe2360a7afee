"""A differential's per-request table: where the two sides first chose different tokens, whether each
side's token is in the other's top-k, and the largest |Δlogprob| before it (:class:`DivergenceRow`), and
the request that argues most against agreement (:func:`worst_row`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.verdicts.oracles import first_difference, max_logprob_delta


@dataclass(frozen=True, slots=True)
class DivergenceRow:
    """One request of a differential, as its table shows it: where the two sides first chose different
    tokens (None: identical over the tokens both have), whether each side's token there is in the other's
    top-k, and the largest |Δlogprob| of the chosen tokens before it."""

    probe: str
    tokens: int  # tokens compared (the shorter side's count)
    first_divergence: int | None
    ref_token: str | None = None
    cand_token: str | None = None
    cand_in_ref_top: bool | None = None  # None: no divergence, or no top-k to judge it
    ref_in_cand_top: bool | None = None
    top_k: int = 0
    max_delta: float = 0.0
    max_delta_position: int | None = None
    problem: str | None = None  # a side that failed or sent no logprobs: nothing to compare

    @property
    def divergence(self) -> str:
        if self.problem:
            return self.problem
        if self.first_divergence is None:
            return "identical"
        return f"token {self.first_divergence}: {self.ref_token!r} vs {self.cand_token!r}"

    def summary(self) -> str:
        """The row in words, for a failure's first line."""
        return (f"{self.probe}: {self.divergence}; candidate's token in the reference's top-k: "
                f"{_yes_no(self.cand_in_ref_top)}, reference's in the candidate's: {_yes_no(self.ref_in_cand_top)}; "
                f"max |Δlogprob| before it {self.max_delta:.3f}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["divergence"] = self.divergence
        return out


def divergence_row(ref: Completion, cand: Completion, probe: str) -> DivergenceRow:
    """The table row of one request answered by both sides."""
    if not ref.ok or not cand.ok:
        side = "reference" if not ref.ok else "candidate"
        return DivergenceRow(probe, 0, None, problem=f"{side} failed (HTTP {(ref if not ref.ok else cand).status})")
    if not ref.tokens or not cand.tokens:
        return DivergenceRow(probe, 0, None, problem="no logprobs")
    tokens = min(len(ref.tokens), len(cand.tokens))
    delta, at = max_logprob_delta(ref, cand)
    i = first_difference(ref.tokens, cand.tokens)
    if i is None:
        return DivergenceRow(probe, tokens, None, max_delta=delta, max_delta_position=at)
    r, c = ref.tokens[i], cand.tokens[i]
    judged = bool(r.top) and bool(c.top)
    return DivergenceRow(probe, tokens, i, r.token, c.token,
                         cand_in_ref_top=(c.token in r.top) if judged else None,
                         ref_in_cand_top=(r.token in c.top) if judged else None,
                         top_k=min(len(r.top), len(c.top)), max_delta=delta, max_delta_position=at)


def divergence_rows(reference: Sequence[Completion], candidate: Sequence[Completion],
                    probes: Sequence[str]) -> list[DivergenceRow]:
    return [divergence_row(r, c, probe) for r, c, probe in zip(reference, candidate, probes, strict=False)]


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def divergence_table(rows: Sequence[DivergenceRow], *, name_ref: str = "reference",
                     name_cand: str = "candidate", max_delta: float | None = None) -> str:
    """The per-request table of a differential (plain text, one request a line)."""
    bound = f" (tolerance {max_delta:g})" if max_delta is not None else ""
    head = ["request", f"first divergence ({name_ref} vs {name_cand})", "cand in ref top-k",
            "ref in cand top-k", f"max |Δlogprob| before{bound}"]
    body = [[row.probe, row.divergence, _yes_no(row.cand_in_ref_top), _yes_no(row.ref_in_cand_top),
             f"{row.max_delta:.3f}" + (f" @{row.max_delta_position}" if row.max_delta_position is not None else "")]
            for row in rows]
    widths = [max(len(line[j]) for line in [head, *body]) for j in range(len(head))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in [head, *body])


def worst_row(rows: Sequence[DivergenceRow], max_delta: float | None = None) -> DivergenceRow | None:
    """The request that argues most against agreement: a failed side, then a token outside the other's
    top-k, then |Δlogprob| over ``max_delta``, then the earliest divergence, then the largest |Δlogprob|."""
    def badness(row: DivergenceRow) -> tuple[int, int, int, float, int]:
        outside = row.cand_in_ref_top is False or row.ref_in_cand_top is False
        over = max_delta is not None and row.max_delta > max_delta
        first = row.first_divergence if row.first_divergence is not None else row.tokens + 1
        return (row.problem is not None, outside, over, row.max_delta, -first)

    return max(rows, key=badness) if rows else None
