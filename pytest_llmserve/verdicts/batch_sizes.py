"""The batch sizes that exercise every CUDA-graph path of a server: each captured size, padded sizes in the
gaps, the size above the largest capture, capped to a budget (:func:`coverage_plan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

_T = TypeVar("_T")

BatchKind = Literal["captured", "padded", "above-max", "no-graph"]

# Sizes sent when the server captured no graphs (or none are known): small batches, including 3,
# which broke FP8 MLA decode in vLLM #57017.
NO_GRAPH_SIZES = (1, 2, 3, 4, 8)
# At most this many batch cases per server unless the caller says otherwise. The engines' default
# capture lists have 35-70 sizes (vLLM: 1, 2, 4, 8, then every 8 up to 512); sending all of them, each
# with a padded neighbour, would cost thousands of requests per configuration.
DEFAULT_COVERAGE_CAP = 24


@dataclass(frozen=True, slots=True)
class BatchCase:
    """One batch size to send as concurrent greedy requests, and how the graph runner should treat it."""

    size: int
    kind: BatchKind
    padded_to: int | None = None  # the captured size it runs as (itself when captured); None above max
    graph_max: int | None = None  # largest captured size, for the above-max id

    @property
    def id(self) -> str:
        if self.kind == "padded":
            return f"bs={self.size}-padded-to-{self.padded_to}"
        if self.kind == "above-max":
            return f"bs={self.size}-above-max-{self.graph_max}"
        if self.kind == "no-graph":
            return f"bs={self.size}-no-graph"
        return f"bs={self.size}"


def _clean_sizes(sizes: Sequence[int] | None) -> list[int]:
    if not sizes:
        return []
    bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ValueError(f"batch sizes must be positive integers, got {bad!r}")
    return sorted(set(sizes))


def _plan_limit(max_extra: int, cap: int | None) -> int:
    """The most cases a plan holds (``cap``, default :data:`DEFAULT_COVERAGE_CAP`), the arguments checked."""
    if max_extra < 0:
        raise ValueError(f"max_extra = {max_extra}: must be >= 0")
    limit = DEFAULT_COVERAGE_CAP if cap is None else cap
    if limit < 1:
        raise ValueError(f"cap = {cap}: must be >= 1")
    return limit


def _no_graph_plan(server_max_batch: int | None, limit: int) -> list[BatchCase]:
    """No sizes known: :data:`NO_GRAPH_SIZES` the server can batch (batch 1 at least)."""
    cases = [BatchCase(s, "no-graph") for s in NO_GRAPH_SIZES]
    if server_max_batch is not None:
        cases = [c for c in cases if c.size <= server_max_batch] or [BatchCase(1, "no-graph")]
    return cases[:limit]


def _padded_cases(sizes: list[int], max_extra: int, top: int) -> list[BatchCase]:
    """``max_extra`` padded sizes in each gap below or between captured sizes."""
    padded: list[BatchCase] = []
    for lower, upper in zip([0, *sizes[:-1]], sizes, strict=True):
        gap = list(range(lower + 1, upper))
        if lower == 0:
            gap = gap[:1]  # below the smallest captured size: batch 1 is the interesting one
        for s in _pick_in_gap(gap, max_extra):
            padded.append(BatchCase(s, "padded", upper, top))
    return padded


def _fitting(cases: list[BatchCase], server_max_batch: int | None) -> list[BatchCase]:
    """The cases the server can batch at once (all of them when its limit is not known)."""
    return cases if server_max_batch is None else [c for c in cases if c.size <= server_max_batch]


def coverage_plan(captured: Sequence[int] | None, configured: Sequence[int] | None = None, max_extra: int = 1,
                  cap: int | None = None, *, server_max_batch: int | None = None) -> list[BatchCase]:
    """The batch sizes that exercise every CUDA-graph path, in ascending order.

    ``captured`` (what the engine reports it captured) wins over ``configured`` (what was asked for).
    For each captured size there is one case; in each gap below or between captured sizes,
    ``max_extra`` padded sizes (first the one just above the lower size, which pads the most, then
    the one just below the upper size, then midpoints); and the largest size + 1, which runs without
    a graph. ``server_max_batch`` (max running requests) drops sizes the server cannot batch at once.

    The total is capped (``cap``, default :data:`DEFAULT_COVERAGE_CAP`): the smallest and largest
    captured sizes, above-max and the padded sizes are kept first; captured sizes in the middle are
    thinned evenly, then padded ones if still needed. With no sizes known: 1, 2, 3, 4, 8 as ``no-graph``.
    """
    limit = _plan_limit(max_extra, cap)
    sizes = _clean_sizes(captured) or _clean_sizes(configured)
    if not sizes:
        return _no_graph_plan(server_max_batch, limit)
    top = sizes[-1]
    captured_cases = _fitting([BatchCase(s, "captured", s, top) for s in sizes], server_max_batch)
    padded = _fitting(_padded_cases(sizes, max_extra, top), server_max_batch)
    above = _fitting([BatchCase(top + 1, "above-max", None, top)], server_max_batch)
    return sorted(_cap_cases(captured_cases, padded, above, limit), key=lambda c: (c.size, c.kind))


def _pick_in_gap(gap: list[int], count: int) -> list[int]:
    if not gap or count == 0:
        return []
    picks = [gap[0]]  # pads the most (e.g. 9 -> 16)
    if count > 1 and gap[-1] not in picks:
        picks.append(gap[-1])  # pads one slot
    remaining = [s for s in gap if s not in picks]
    extra = count - len(picks)
    if extra > 0 and remaining:
        picks.extend(_spread(remaining, extra))
    return sorted(picks)


def _spread(items: Sequence[_T], count: int) -> list[_T]:
    """``count`` items evenly spread over ``items`` (both ends included when count >= 2)."""
    if count >= len(items):
        return list(items)
    if count <= 0:
        return []
    if count == 1:
        return [items[len(items) // 2]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def _cap_cases(captured: list[BatchCase], padded: list[BatchCase], above: list[BatchCase],
               limit: int) -> list[BatchCase]:
    total = len(captured) + len(padded) + len(above)
    if total <= limit:
        return captured + padded + above
    ends = [captured[0], captured[-1]] if len(captured) >= 2 else captured[:]
    keep: list[BatchCase] = above[:limit] + ends[:max(0, limit - len(above))]
    room = limit - len(keep)
    middle = captured[1:-1] if len(captured) >= 2 else []
    if room >= len(padded):
        keep += padded
        keep += _spread(middle, limit - len(keep))
    else:
        keep += _spread(padded, room)
    return keep
