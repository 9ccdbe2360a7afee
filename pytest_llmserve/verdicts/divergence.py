"""A differential's per-request table: one :class:`~pytest_llmserve.verdicts.differential.PairComparison` a line
(tokens compared, where the two sides first chose different tokens, the near-tie gap there, the largest |Δlogprob|
and top-k distance before it), and the request that argues most against agreement (:func:`worst_row`)."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.verdicts.differential import DEFAULT_TOLERANCE, DifferentialTolerance, PairComparison, compare_pair


def divergence_rows(reference: Sequence[Completion], candidate: Sequence[Completion],
                    probes: Sequence[str]) -> list[PairComparison]:
    return [compare_pair(r, c, probe) for r, c, probe in zip(reference, candidate, probes, strict=False)]


def _compared(row: PairComparison) -> str:
    """"32" when both answers had as many tokens as were compared, else "5 of 32" (the longer answer's count)."""
    longest = max(row.ref_tokens, row.cand_tokens)
    return str(row.tokens_compared) if row.tokens_compared >= longest else f"{row.tokens_compared} of {longest}"


def divergence_table(rows: Sequence[PairComparison], *, name_ref: str = "reference", name_cand: str = "candidate",
                     tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> str:
    """The per-request table of a differential (plain text, one request a line), its tolerances in the head."""
    head = ["request", "tokens compared", f"first divergence ({name_ref} vs {name_cand})",
            f"near-tie gap (<= {tolerance.near_tie_gap:g})", f"max |Δlogprob| (<= {tolerance.max_logprob_delta:g})",
            f"max top-k distance (<= {tolerance.max_topk_distance:g})"]
    body = [[row.probe, _compared(row), row.divergence, row.widest_gap,
             f"{row.max_delta:.3f}" + (f" @{row.max_delta_position}" if row.max_delta_position is not None else ""),
             f"{row.max_distance:.3f}"
             + (f" @{row.max_distance_position}" if row.max_distance_position is not None else "")]
            for row in rows]
    widths = [max(len(line[j]) for line in [head, *body]) for j in range(len(head))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in [head, *body])


def worst_row(rows: Sequence[PairComparison],
              tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> PairComparison | None:
    """The request that argues most against agreement: a side that failed, then a divergence that is not a
    near-tie, then a truncation, then |Δlogprob| or top-k distance over the tolerance, then the earliest divergence,
    then the largest |Δlogprob|."""
    def badness(row: PairComparison) -> tuple[bool, bool, bool, bool, float, int]:
        wide = row.first_divergence is not None and row.near_tie(tolerance) is not True
        truncated = row.truncation is not None and row.truncation.fraction < tolerance.min_length_fraction
        over = row.max_delta > tolerance.max_logprob_delta or row.max_distance > tolerance.max_topk_distance
        first = row.first_divergence if row.first_divergence is not None else row.tokens_compared + 1
        return (row.problem is not None, wide, truncated, over, row.max_delta, -first)

    return max(rows, key=badness) if rows else None
