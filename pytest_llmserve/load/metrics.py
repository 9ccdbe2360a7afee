"""Per-request records -> the figures of a run, and whether the run is a measurement at all.

Each figure's definition is written once, in :mod:`pytest_llmserve.metrics`; this module computes them
from the :class:`RequestRecord` of every timed request. Latency summaries pool every sample of every
request (and of every client process), never averaging per-request or per-process figures.

A run is **invalid** (``RunResult.valid`` false, ``RunResult.metrics`` empty, the figures kept only in
``RunResult.diagnostics``) when a request failed, when a request's ``usage.completion_tokens`` differs
from ``output_len`` or is missing, when the client's content-chunk count differs from the server's
token count, when a TPOT is negative (or zero for half the requests or more), when a request of n >= 2
tokens arrived as one chunk (empty ITL: the stream was buffered), or when the server's own token
counter disagrees.

Each reason is an :class:`InvalidReason`: its text for people, and what code acts on, classified here where the
check is made: its :class:`Blame` (the server's output was wrong, or the measurement is an artefact of the machine)
and whether only the per-token timing figures are touched (``timing_only``: chunks merged or buffered, so TTFT,
TPOT and ITL are not measured, while the tokens counted from the server's usage over the round's duration are).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_llmserve import metrics as vocabulary
from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.evidence.completion import Completion, TokenLogprob
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.json_encoding import to_plain
from pytest_llmserve.load.contention import HostContention
from pytest_llmserve.load.prompts import WorkloadPrompt
from pytest_llmserve.verdicts.coherence import CoherenceThresholds, coherence_findings
from pytest_llmserve.verdicts.stats import Summary, summarize

__all__ = ["Blame", "InvalidReason", "InvalidRunError", "RequestRecord", "RunResult", "compute_metrics",
           "cross_check", "evaluate", "invalid_reasons", "latency_samples", "server_counter_throughput",
           "summarize_ms"]


class Blame(enum.Enum):
    """Who an invalid round's reason points at."""

    #: The server answered wrongly (failed requests, wrong lengths, tokens without text, NaN or collapse in a
    #: sampled answer): a build that answers so is bad, and the round is never run again.
    SERVER = "server output"
    #: The round is not a number, but nothing says the server's output was wrong (chunks merged or buffered on a
    #: starved client, other traffic on the server, a busy host): run again, never blamed on the server.
    MACHINE = "measurement artefact"


class InvalidReason(str):
    """Why a round is not a number: the text people read (it is a ``str``), and, for code, its :class:`Blame` and
    whether only the per-token timing figures are touched (``timing_only``). Classified where the check is made;
    nothing downstream reads the words."""

    blame: Blame
    timing_only: bool

    def __new__(cls, text: str, blame: Blame, *, timing_only: bool = False) -> InvalidReason:
        reason = super().__new__(cls, text)
        reason.blame = blame
        reason.timing_only = timing_only
        return reason

    def __reduce__(self) -> tuple[Callable[[str, str, bool], InvalidReason], tuple[str, str, bool]]:
        # pickled with its classification (across client processes)
        return (_reason, (str(self), self.blame.value, self.timing_only))

    @property
    def server_fault(self) -> bool:
        return self.blame is Blame.SERVER


def _reason(text: str, blame: str, timing_only: bool) -> InvalidReason:
    return InvalidReason(text, Blame(blame), timing_only=timing_only)


def server_fault(reasons: Sequence[InvalidReason]) -> bool:
    """Whether any reason says the server's output was wrong."""
    return any(reason.blame is Blame.SERVER for reason in reasons)


def only_artefacts(reasons: Sequence[InvalidReason]) -> bool:
    """Whether a round is invalid only for measurement artefacts: there is a reason, and none blames the server."""
    return bool(reasons) and not server_fault(reasons)


def timing_only(reasons: Sequence[InvalidReason]) -> bool:
    """Whether a round is invalid only for artefacts of chunk timing: its throughputs and counts still stand."""
    return only_artefacts(reasons) and all(reason.timing_only for reason in reasons)


class InvalidRunError(LLMServeError):
    """A figure was asked of a run whose measurement is invalid; the message lists the reasons."""


@dataclass(slots=True)
class RequestRecord:
    """One request. ``start``/``end`` are wall-clock seconds (time.time() scale, derived from perf_counter
    so they are as precise as it), so records from several processes share one clock; ``ttft``, ``e2e``
    and ``itl`` are perf_counter differences in seconds."""

    index: int
    start: float
    end: float
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens
    chunks: int = 0  # content chunks (events with a choice) the client saw
    empty_chunks: int = 0  # of which with empty text
    error: str | None = None
    finish_reason: str | None = None
    process: int = 0
    # Only for the few sampled requests of a round (load.transport.TEXT_SAMPLES): the generated text, each
    # content chunk's text, and the count of null/non-finite logprobs (None: no logprobs were returned).
    text: str | None = None
    token_texts: list[str] | None = None
    bad_logprobs: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """(e2e − ttft) / (n − 1) with n = usage.completion_tokens; None when undefined."""
        n = self.output_tokens
        if self.error is not None or self.ttft is None or self.e2e is None or n is None or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RequestRecord:
        return RequestRecord(**data)


def summarize_ms(values_s: Sequence[float]) -> Summary:
    """Summary in ms of latencies given in seconds; :meth:`Summary.undefined` when there are none."""
    if not values_s:
        return Summary.undefined()
    return summarize([v * 1000.0 for v in values_s])


def latency_samples(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Samples in seconds per latency metric, from successful requests, pooled over all of them."""
    ok = [r for r in records if r.ok]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    return {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": tpots,
        "itl": [gap for r in ok for gap in r.itl],
        "e2e": [r.e2e for r in ok if r.e2e is not None],
    }


def compute_metrics(records: Sequence[RequestRecord]) -> tuple[dict[str, float], dict[str, Summary]]:
    """The figures of a set of timed records (whatever their validity): flat metrics and summaries."""
    ok = [r for r in records if r.ok]
    metrics: dict[str, float] = {"completed": float(len(ok)), "failed": float(len(records) - len(ok))}
    if records:
        first = min(r.start for r in records)
        last = max(r.end for r in records)
        duration = last - first
    else:
        duration = 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    metrics["duration_s"] = duration
    metrics["total_output_tokens"] = float(out_tokens)
    metrics["total_input_tokens"] = float(in_tokens)
    metrics["client_chunks"] = float(sum(r.chunks for r in ok))
    metrics["empty_chunks"] = float(sum(r.empty_chunks for r in ok))
    if duration > 0:
        metrics["output_throughput"] = out_tokens / duration
        metrics["input_throughput"] = in_tokens / duration
        metrics["total_token_throughput"] = (in_tokens + out_tokens) / duration
        metrics["request_throughput"] = len(ok) / duration
        metrics["mean_concurrency"] = math.fsum(r.end - r.start for r in records) / duration
    summaries = {name: summarize_ms(vals) for name, vals in latency_samples(records).items()}
    for name, s in summaries.items():
        for stat, value in (("mean", s.mean), ("median", s.median), ("p90", s.p90), ("p99", s.p99),
                            ("std", s.stdev)):
            metrics[vocabulary.latency_metric(stat, name)] = value
    return metrics, summaries


def _examples(items: Sequence[str], limit: int = 3) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; ... ({len(items) - limit} more)" if len(items) > limit else "")


@dataclass(frozen=True, slots=True)
class _Round:
    """What a round's validity checks read: its timed records, those that succeeded, its warm-up and workload."""

    records: Sequence[RequestRecord]
    ok: list[RequestRecord]
    warmup: Sequence[RequestRecord]
    workload: Workload
    allow_multi_token_chunks: bool


def _failed_requests(run: _Round) -> InvalidReason | None:
    failed = [r for r in run.records if not r.ok]
    if not failed:
        return None
    return InvalidReason(f"{len(failed)} of {len(run.records)} requests failed (requests are never retried): "
                         + _examples([f"request {r.index}: {r.error}" for r in failed], 2), Blame.SERVER)


def _failed_warmup(run: _Round) -> InvalidReason | None:
    warm_failed = [r for r in run.warmup if not r.ok]
    if not warm_failed:
        return None
    return InvalidReason(f"{len(warm_failed)} of {len(run.warmup)} warm-up requests failed: {warm_failed[0].error}",
                         Blame.SERVER)


def _missing_usage(run: _Round) -> InvalidReason | None:
    no_usage = [r for r in run.ok if r.output_tokens is None]
    if not no_usage:
        return None
    return InvalidReason(f"{len(no_usage)} requests got no usage.completion_tokens from the server "
                         "(stream_options.include_usage not honoured?): output tokens cannot be counted", Blame.MACHINE)


def _wrong_length(run: _Round) -> InvalidReason | None:
    output_len = run.workload.output_len
    wrong_len = [r for r in run.ok if r.output_tokens is not None and r.output_tokens != output_len]
    if not wrong_len:
        return None
    return InvalidReason(
        f"{len(wrong_len)} requests produced a number of tokens other than output_len={output_len} "
        "(ignore_eos not honoured, or the server stopped early): "
        + _examples([f"request {r.index}: {r.output_tokens} tokens, finish_reason={r.finish_reason}"
                     for r in wrong_len]), Blame.SERVER)


def _chunks_match(r: RequestRecord, allow_multi_token_chunks: bool) -> bool:
    """The client's content chunks against the server's token count. One chunk short is accepted (evaluate notes
    it): vLLM 0.26 on the H200 streamed 127 content chunks for 128 tokens in every request, two tokens in one
    delta; the figures count tokens from usage, not chunks."""
    if r.output_tokens is None or r.chunks in (r.output_tokens, r.output_tokens - 1):
        return True
    return allow_multi_token_chunks and 0 < r.chunks < r.output_tokens


def _chunk_mismatch(run: _Round) -> InvalidReason | None:
    mismatch = [r for r in run.ok if not _chunks_match(r, run.allow_multi_token_chunks)]
    if not mismatch:
        return None
    return InvalidReason(
        f"{len(mismatch)} requests: the client counted a different number of content chunks than the server's "
        "usage.completion_tokens (multi-token chunks from speculative decoding need "
        "allow_multi_token_chunks=True): "
        + _examples([f"request {r.index}: {r.chunks} chunks vs {r.output_tokens} tokens" for r in mismatch]),
        Blame.MACHINE, timing_only=True)


def _single_chunk(run: _Round) -> InvalidReason | None:
    single = [r for r in run.ok if (r.output_tokens or 0) >= 2 and not r.itl]
    if not single:
        return None
    return InvalidReason(f"{len(single)} requests of >= 2 tokens arrived as a single chunk (empty ITL): "
                         "the stream was buffered (by a proxy, or the server did not stream)",
                         Blame.MACHINE, timing_only=True)


def _negative_tpot(run: _Round) -> InvalidReason | None:
    negative = [r for r in run.ok if (t := r.tpot) is not None and t < 0]
    if not negative:
        return None
    return InvalidReason(f"{len(negative)} requests have a negative TPOT (last chunk before the first): "
                         + _examples([f"request {r.index}: {r.tpot!r} s" for r in negative]),
                         Blame.MACHINE, timing_only=True)


def _zero_tpot(run: _Round) -> InvalidReason | None:
    # A zero TPOT means every chunk of that request came in one read. On a starved 2-core machine a
    # few requests can be delivered that way; when half or more are, the stream was not streamed.
    zero = [r for r in run.ok if r.tpot == 0]
    if not zero or 2 * len(zero) < len(run.ok):
        return None
    return InvalidReason(f"{len(zero)} of {len(run.ok)} requests have TPOT = 0 (all chunks in one read): "
                         "the stream was buffered (by a proxy, or the server did not stream): "
                         + _examples([f"request {r.index}" for r in zero]),
                         Blame.MACHINE, timing_only=True)


def _textless(run: _Round) -> InvalidReason | None:
    # Tokens without text: NaN logits decode to a special token (empty text) at every step, and the
    # server still answers 200 with the requested number of tokens; such a round measures nothing.
    textless = [r for r in run.ok if (r.output_tokens or 0) >= 2 and r.chunks > 0 and r.empty_chunks >= r.chunks]
    if not textless:
        return None
    return InvalidReason(
        f"{len(textless)} of {len(run.ok)} requests generated tokens but no text (every content chunk empty: NaN "
        "logits decode to an empty special token; see the correctness checks): "
        + _examples([f"request {r.index}: {r.output_tokens} tokens, 0 characters" for r in textless]),
        Blame.SERVER)


def _non_positive_duration(records: Sequence[RequestRecord]) -> InvalidReason | None:
    starts = min(r.start for r in records)
    ends = max(r.end for r in records)
    if ends - starts > 0:
        return None
    return InvalidReason(f"duration {ends - starts!r} s is not positive", Blame.MACHINE)


# The checks of a round's records, in the order their reasons are listed.
_RECORD_CHECKS: tuple[Callable[[_Round], InvalidReason | None], ...] = (
    _failed_requests, _failed_warmup, _missing_usage, _wrong_length, _chunk_mismatch, _single_chunk, _negative_tpot,
    _zero_tpot, _textless)


def invalid_reasons(records: Sequence[RequestRecord], workload: Workload, *,
                    warmup: Sequence[RequestRecord] = (),
                    allow_multi_token_chunks: bool = False,
                    untrained: str | None = None) -> list[InvalidReason]:
    """Why these records cannot give a valid measurement (empty list = valid). ``untrained``: why the model
    is untrained, if it is: its sampled answers' collapse is then not judged (see :func:`sample_findings`)."""
    if not records:
        return [InvalidReason("no timed requests were sent", Blame.MACHINE)]
    run = _Round(records, [r for r in records if r.ok], warmup, workload, allow_multi_token_chunks)
    reasons = [reason for check in _RECORD_CHECKS if (reason := check(run)) is not None]
    sampled = sample_findings(run.ok, judge_text=untrained is None)
    reasons += [InvalidReason(finding, Blame.SERVER) for finding in sampled]
    duration = _non_positive_duration(records)
    return reasons if duration is None else [*reasons, duration]


def sample_findings(records: Sequence[RequestRecord], *, judge_text: bool = True) -> list[str]:
    """What is wrong with the text of the sampled requests (those that kept it): non-finite logprobs where
    the server returned logprobs, and decode collapse by the coherence oracle
    (:func:`pytest_llmserve.verdicts.coherence.coherence_findings`, with :func:`_sample_thresholds`) unless
    ``judge_text`` is False (an untrained model: any text is what random weights say)."""
    out: list[str] = []
    for r in records:
        if r.text is None:
            continue
        if r.bad_logprobs:
            out.append(f"sampled request {r.index}: {r.bad_logprobs} null or non-finite logprob(s) in the stream")
        if not r.text.strip() or not judge_text:
            continue  # the empty-text check above reports it once, with the others
        tokens = [TokenLogprob(piece, None) for piece in r.token_texts or []]
        sample = Completion(request={"prompt": f"benchmark request {r.index}"}, status=200, text=r.text,
                            tokens=tokens, completion_tokens=r.output_tokens)
        for finding in coherence_findings(sample, _sample_thresholds()):
            out.append(f"sampled request {r.index}: decode collapse: {finding.message}")
    return out


def _sample_thresholds() -> CoherenceThresholds:
    # The workload's prompts are seeded word lists, and a healthy small model's greedy continuation of one loops:
    # on the real engines, " to the day of the day ..." (vLLM CPU eager), " is" 26 times of 32 (vLLM CPU compiled),
    # " morning no morning no ..." over 256 tokens (vLLM 0.26 GPU). Repetition is therefore no sign of a broken
    # round here; only output that is not text is (replacement characters, unprintable bytes). Collapse is the
    # correctness suite's to judge (decode_check.coherent(), on prompts made for it).
    return CoherenceThresholds(max_compression_ratio=1e9, max_top_ngram_ratio=1.0, max_top_token_ratio=1.0,
                               max_token_run=10**9, min_distinct_tokens=1, min_distinct_ratio=0.0)


@dataclass(slots=True)
class RunResult:
    """One run of a workload. ``metrics``/``summaries`` are empty when the run is invalid; the figures it
    did produce are in ``diagnostics`` (for the report, never for a gate)."""

    workload: Workload
    transport: str
    per_request: list[RequestRecord]
    metrics: dict[str, float]
    summaries: dict[str, Summary]
    valid: bool
    invalid_reasons: list[InvalidReason]
    started_at: float  # wall clock of the first timed request's start
    ended_at: float  # wall clock of the last timed request's end
    warmup: list[RequestRecord] = field(default_factory=list)
    diagnostics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    prompts_exact: bool = True
    processes: int = 1
    server_counter: str | None = None
    server_output_throughput: float | None = None
    server_check: str | None = None
    client_cpu_fraction: float | None = None  # client CPU seconds / duration, per client process
    client_cpu_s: float | None = None  # the load generator's CPU seconds in the timed phase, all processes
    event_loop: str = "asyncio"  # the client's event loop: "asyncio" or "uvloop" (see event_loop_name)
    # What other processes took of the host during the timed phase (load/contention.py); None: not sampled.
    host_contention: HostContention | None = None

    @property
    def client_cpu_ms_per_request(self) -> float | None:
        """The load generator's own CPU cost per timed request (ms; all client processes together)."""
        if self.client_cpu_s is None or not self.per_request:
            return None
        return self.client_cpu_s * 1000.0 / len(self.per_request)

    def metric(self, name: str) -> float:
        """A figure of a valid run; raises :class:`InvalidRunError` (with the reasons) otherwise."""
        if not self.valid:
            raise InvalidRunError(f"workload {self.workload.name!r}: the run is invalid, {name} is not a "
                                  "measurement: " + " | ".join(self.invalid_reasons))
        try:
            return self.metrics[name]
        except KeyError:
            raise KeyError(f"unknown metric {name!r} (known: {', '.join(sorted(self.metrics))})") from None

    def to_dict(self, per_request: bool = True) -> dict[str, Any]:
        wl = self.workload.to_dict()
        out: dict[str, Any] = {
            "workload": wl, "transport": self.transport, "valid": self.valid,
            "invalid_reasons": list(self.invalid_reasons), "metrics": to_plain(self.metrics),
            "summaries": {k: to_plain(v) for k, v in self.summaries.items()},
            "diagnostics": to_plain(self.diagnostics), "started_at": self.started_at,
            "ended_at": self.ended_at,
            "notes": list(self.notes), "prompts_exact": self.prompts_exact, "processes": self.processes,
            "server_counter": self.server_counter, "server_output_throughput": self.server_output_throughput,
            "server_check": self.server_check, "client_cpu_fraction": self.client_cpu_fraction,
            "event_loop": self.event_loop,
            "client_cpu_s": self.client_cpu_s, "client_cpu_ms_per_request": self.client_cpu_ms_per_request,
            "metric_definitions": vocabulary.definitions(),
            "host_contention": self.host_contention.to_dict() if self.host_contention is not None else None,
        }
        if per_request:
            out["per_request"] = [r.to_dict() for r in self.per_request]
            out["warmup"] = [r.to_dict() for r in self.warmup]
        return out


@dataclass(frozen=True, slots=True)
class _RunView:
    """What the notes on a run read: its records in start order, those that succeeded, the workload, the prompts
    (and whether all were measured exact), the client's CPU share and why the model is untrained, if it is."""

    records: list[RequestRecord]
    ok: list[RequestRecord]
    workload: Workload
    prompts: Sequence[WorkloadPrompt]
    exact: bool
    cpu_fraction: float | None
    untrained: str | None


def _untrained_note(run: _RunView) -> str | None:
    if run.untrained is None:
        return None
    return f"sampled answers not judged for decode collapse (not applicable: {run.untrained})"


def _one_chunk_short_note(run: _RunView) -> str | None:
    one_short = [r for r in run.ok if r.output_tokens and r.chunks == r.output_tokens - 1]
    if not one_short:
        return None
    return (f"{len(one_short)} request(s) streamed one content chunk fewer than their tokens (two tokens in "
            "one chunk): their ITL has one gap fewer")


def _zero_tpot_note(run: _RunView) -> str | None:
    zero_tpot = [r for r in run.ok if r.tpot == 0]
    if not zero_tpot:
        return None
    return (f"{len(zero_tpot)} request(s) had TPOT = 0 (all chunks of the request in one read: "
            "the server or the client was starved); counted, since fewer than half were")


def _approximate_prompts_note(run: _RunView) -> str | None:
    if not run.prompts or run.exact:
        return None
    return (f"prompts are approximate ({run.workload.input_len} words, no tokenizer given): input "
            "lengths in tokens are not controlled")


def _token_id_prompts_note(run: _RunView) -> str | None:
    if not any(p.is_token_ids for p in run.prompts):
        return None
    return "some prompts were sent as token ids (text could not be made exactly input_len tokens)"


def _prompt_length_note(run: _RunView) -> str | None:
    input_len = run.workload.input_len
    prompt_counts = sorted({r.prompt_tokens for r in run.ok if r.prompt_tokens is not None})
    if not run.exact or not prompt_counts or prompt_counts == [input_len]:
        return None
    return (f"server counted prompt lengths {prompt_counts[:5]} for input_len={input_len} "
            "(special tokens such as BOS added by the server?)")


def _client_bound_note(run: _RunView) -> str | None:
    if run.cpu_fraction is None or not run.cpu_fraction > 0.9:
        return None
    return (f"the load generator used {run.cpu_fraction:.0%} of a core per client process: the figures "
            "may be limited by the client (use more client processes)")


def _zero_gaps_note(run: _RunView) -> str | None:
    gaps = [g for r in run.ok for g in r.itl]
    zero = sum(1 for g in gaps if g == 0.0)
    if not gaps or zero / len(gaps) <= 0.2:
        return None
    return (f"{zero / len(gaps):.0%} of ITL gaps are 0 (chunks read together): the client fell "
            "behind the stream, or the server sends several chunks per step")


def _empty_chunks_note(run: _RunView) -> str | None:
    empty = sum(r.empty_chunks for r in run.ok)
    chunks = sum(r.chunks for r in run.ok)
    if not chunks or empty / chunks <= 0.1:
        return None
    return (f"{empty / chunks:.0%} of content chunks had empty text (special tokens after EOS under "
            "ignore_eos, or NaN logits: see the correctness checks)")


# What a reader of a run's figures should know about how they were measured, in the order the notes are listed.
_RUN_NOTES: tuple[Callable[[_RunView], str | None], ...] = (
    _untrained_note, _one_chunk_short_note, _zero_tpot_note, _approximate_prompts_note, _token_id_prompts_note,
    _prompt_length_note, _client_bound_note, _zero_gaps_note, _empty_chunks_note)


@dataclass(frozen=True, slots=True)
class _CounterCheck:
    """The client's throughput against the server's own token counter: the server's figure (None: not
    cross-checked), what the check says (``RunResult.server_check``), and the note or the reason it makes."""

    server_tps: float | None
    line: str | None
    note: str | None = None
    reason: InvalidReason | None = None


def _counter_check(server_counter: str | None, server_tokens: float | None, duration: float, client_tps: float,
                   bound: float) -> _CounterCheck:
    if server_counter is None:
        return _CounterCheck(None, None)
    if server_tokens is None or duration <= 0:
        line = f"server counter {server_counter!r} unavailable: not cross-checked"
        return _CounterCheck(None, line, note=line)
    server_tps = server_tokens / duration
    ok, line = cross_check(client_tps, server_tps, bound)
    if ok:
        return _CounterCheck(server_tps, line)
    return _CounterCheck(server_tps, line, reason=InvalidReason(
        line + " (other traffic on the server, or a token-counting bug)", Blame.MACHINE))


def _cpu_fraction(client_cpu_s: float | None, duration: float, processes: int) -> float | None:
    """The load generator's CPU seconds per second of the round, per client process (None: not measured)."""
    return client_cpu_s / duration / processes if client_cpu_s is not None and duration > 0 else None


def evaluate(records: Sequence[RequestRecord], workload: Workload, *, transport: str,
             warmup: Sequence[RequestRecord] = (), prompts: Sequence[WorkloadPrompt] = (),
             allow_multi_token_chunks: bool = False, processes: int = 1,
             server_counter: str | None = None, server_tokens: float | None = None,
             cross_check_bound: float = 0.03, client_cpu_s: float | None = None,
             untrained: str | None = None) -> RunResult:
    """Build the :class:`RunResult` of timed records: figures, validity, notes. ``untrained``: why the model
    is untrained (its sampled answers' collapse is not applicable; failed requests, lengths, NaN still count)."""
    recs = sorted(records, key=lambda r: (r.start, r.index))
    metrics, summaries = compute_metrics(recs)
    reasons = invalid_reasons(recs, workload, warmup=warmup,
                              allow_multi_token_chunks=allow_multi_token_chunks, untrained=untrained)
    duration = metrics.get("duration_s", 0.0)
    cpu_fraction = _cpu_fraction(client_cpu_s, duration, processes)
    exact = all(p.exact for p in prompts) if prompts else False
    run = _RunView(recs, [r for r in recs if r.ok], workload, prompts, exact, cpu_fraction, untrained)
    notes = [note for describe in _RUN_NOTES if (note := describe(run)) is not None]
    counter = _counter_check(server_counter, server_tokens, duration, metrics.get("output_throughput", 0.0),
                             cross_check_bound)
    notes += [counter.note] if counter.note is not None else []
    reasons += [counter.reason] if counter.reason is not None else []
    valid = not reasons
    return RunResult(
        workload=workload, transport=transport, per_request=recs, metrics=metrics if valid else {},
        summaries=summaries if valid else {}, valid=valid, invalid_reasons=reasons,
        started_at=recs[0].start if recs else math.nan, ended_at=max((r.end for r in recs), default=math.nan),
        warmup=list(warmup), diagnostics={} if valid else metrics, notes=notes,
        prompts_exact=exact, processes=processes, server_counter=server_counter,
        server_output_throughput=counter.server_tps, server_check=counter.line, client_cpu_fraction=cpu_fraction,
        client_cpu_s=client_cpu_s)


def server_counter_throughput(metrics_before: str, metrics_after: str, counter: str,
                              duration_s: float) -> float | None:
    """(counter after − counter before) / duration_s from two /metrics scrapes; None when the counter is
    absent from either scrape, went down (the server restarted) or the duration is not positive."""
    before = counter_total(metrics_before, counter)
    after = counter_total(metrics_after, counter)
    if before is None or after is None or duration_s <= 0 or after < before:
        return None
    return (after - before) / duration_s


def cross_check(client_tps: float, server_tps: float | None, bound: float = 0.03) -> tuple[bool, str]:
    """Does the client's throughput agree with the server's own counter within ``bound`` (relative)?"""
    if server_tps is None:
        return True, "server counter unavailable: not cross-checked"
    if server_tps <= 0:
        ok = client_tps <= 0
        return ok, f"client {client_tps:.1f} tok/s vs server counter {server_tps:.1f} tok/s"
    diff = (client_tps - server_tps) / server_tps
    ok = abs(diff) <= bound
    verdict = "agree" if ok else "DISAGREE"
    return ok, (f"client {client_tps:.1f} tok/s vs server counter {server_tps:.1f} tok/s: {diff:+.1%} "
                f"({verdict}, bound ±{bound:.0%})")
