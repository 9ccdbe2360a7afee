"""The oracles' probes sent to a server: each ``run_*`` sends its greedy requests through the
:class:`~pytest_llmserve.evidence.client.LLMClient` it is given and returns an
:class:`~pytest_llmserve.verdicts.findings.OracleReport`. The decisions over what comes back stay in
:mod:`pytest_llmserve.verdicts` (oracles, coherence); a transport failure ends a check with a finding that
says so, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.evidence.facts import NanLogPattern
from pytest_llmserve.verdicts.batch_sizes import BatchCase
from pytest_llmserve.verdicts.coherence import BATCH_THRESHOLDS, CoherenceThresholds, coherence_findings
from pytest_llmserve.verdicts.differential import (
    DEFAULT_TOLERANCE,
    DifferentialTolerance,
    PairComparison,
    compare_pair,
    compare_runs,
    determinism_findings,
    early_divergence_findings,
    exact_equal_findings,
    pair_findings,
)
from pytest_llmserve.verdicts.findings import Finding, OracleReport, make_finding
from pytest_llmserve.verdicts.oracles import (
    DEFAULT_BATCH_PROMPTS,
    DEFAULT_DETERMINISM_PROMPT,
    DEFAULT_DIFFERENTIAL_PROMPTS,
    DEFAULT_KNOWN_ANSWERS,
    DEFAULT_LOGPROBS,
    DEFAULT_LONG_DECODE_PROMPTS,
    DEFAULT_NAN_PROMPTS,
    KnownAnswer,
    ProbePrompt,
    batch_prompts,
    is_nan_http_error,
    known_answer_findings,
    nan_evidence,
    nan_in_log,
    nan_in_metrics,
    response_findings,
    transport_findings,
)

_P = TypeVar("_P", bound="ProbePrompt | KnownAnswer")


def _send(client: LLMClient, prompt: ProbePrompt | KnownAnswer, max_tokens: int,
          logprobs: int | None) -> Completion:
    text = prompt.text if isinstance(prompt, ProbePrompt) else prompt.prompt
    if prompt.chat:
        return client.chat(text, max_tokens, temperature=0.0, logprobs=logprobs)
    return client.complete(text, max_tokens, temperature=0.0, logprobs=logprobs)


def _transport_failure(exc: RequestError, probe: str) -> Finding:
    return Finding("transport", "error", f"request raised {exc} (is the server still alive? see its log); "
                   "the remaining requests of this check were not sent", probe=probe)


def run_nan_check(client: LLMClient, server_id: str, *, prompts: Sequence[ProbePrompt] = DEFAULT_NAN_PROMPTS,
                  max_tokens: int = 32, logprobs: int = DEFAULT_LOGPROBS,
                  read_log: Callable[[], Iterable[str]] | None = None,
                  log_patterns: Sequence[NanLogPattern] = (), nan_counters: Sequence[str] = (),
                  metrics_before: str | None = None) -> OracleReport:
    """Greedy requests with logprobs on each prompt, a one-token request, and the engine's own
    NaN counters (/metrics before and after) and log lines (``read_log``: the lines written since the
    check began, e.g. from the server's log file). ``metrics_before``: /metrics as it was before the
    check's requests, when they were sent ahead (else read now)."""
    report = OracleReport("nan-check", server_id=server_id)
    before = metrics_before if metrics_before is not None else client.metrics_text()
    followed_up = False
    try:
        for prompt in prompts:
            c = _send(client, prompt, max_tokens, logprobs)
            report.completions.append(c)
            report.add(response_findings(c, probe=f"nan-check[{prompt.label}]"))
            if not followed_up and is_nan_http_error(c):
                # The 400 hides the tokens; the same request without logprobs shows what users get.
                followed_up = True
                label = f"nan-check[{prompt.label}]"
                report.add(_without_logprobs(client, prompt, max_tokens, label, report))
        # A one-token decode takes paths a longer one does not (SGLang's kit checks it for graph bugs).
        one = _send(client, prompts[0], 1, logprobs) if prompts else None
    except RequestError as exc:
        report.add([_transport_failure(exc, "nan-check")])
        one = None
    if one is not None:
        report.completions.append(one)
        report.add(response_findings(one, probe="nan-check[max_tokens=1]"))
        if one.ok and not one.tokens and not one.text:
            report.add([make_finding("transport", "error", "a max_tokens=1 request returned no token", one,
                                     probe="nan-check[max_tokens=1]")])
    after = client.metrics_text()
    if after is not None:
        report.add(nan_in_metrics(after, before, nan_counters))
    if read_log is not None:
        report.add(nan_in_log(read_log(), log_patterns))
    return report


def _without_logprobs(client: LLMClient, prompt: ProbePrompt, max_tokens: int, label: str,
                      report: OracleReport) -> list[Finding]:
    """Resend a request whose logprobs could not be serialized, without logprobs, as further evidence."""
    probe = f"{label} resent without logprobs"
    c = _send(client, prompt, max_tokens, None)
    report.completions.append(c)
    if not c.ok:
        return nan_evidence(c, probe=probe) or transport_findings(c, probe=probe)
    found = nan_evidence(c, probe=probe)
    if found:
        return [replace(f, message="without logprobs the same request answers HTTP 200, and " + f.message)
                for f in found]
    return [make_finding("nan", "warning", "without logprobs the same request answers HTTP 200 with "
                         "normal-looking text: the non-finite values may be confined to logprobs (e.g. -inf/NaN "
                         "among the top-k alternatives) or appear later in the decode", c, probe=probe)]


def _send_each(report: OracleReport, client: LLMClient, items: Sequence[_P], label: Callable[[_P], str],
               max_tokens: Callable[[_P], int], logprobs: int | None,
               judge: Callable[[_P, Completion, str], list[Finding]]) -> OracleReport:
    """The sequential shape of the oracles: send each item greedily (batch 1), keep the answer, add its NaN
    and transport findings and what ``judge`` finds; a transport failure ends the check with what it has."""
    for item in items:
        probe = label(item)
        try:
            c = _send(client, item, max_tokens(item), logprobs)
        except RequestError as exc:
            report.add([_transport_failure(exc, probe)])
            break
        report.completions.append(c)
        report.add(response_findings(c, probe=probe))
        report.add(judge(item, c, probe))
    return report


def run_known_answers(client: LLMClient, probes: Sequence[KnownAnswer] = DEFAULT_KNOWN_ANSWERS,
                      server_id: str = "", *, logprobs: int = DEFAULT_LOGPROBS) -> OracleReport:
    """Each probe's greedy answer must contain one of its expected words (and carry no NaN)."""
    return _send_each(OracleReport("known-answers", server_id=server_id), client, probes,
                      lambda p: f"known-answer[{p.label}]", lambda p: p.max_tokens, logprobs,
                      lambda p, c, _probe: known_answer_findings(p, c) if c.ok else [])


#: A long decode of a trained model that stops before this fraction of its ``max_tokens`` fails coherence: its
#: prompts ask for a story and a detailed description, which SmolLM2-135M-Instruct runs to length (256 tokens,
#: measured on vLLM CPU, 2026-12-05); an answer cut off by a wrong EOS id or a stop-string bug does not.
LONG_DECODE_MIN_FRACTION = 0.5


def run_long_decode(client: LLMClient, server_id: str = "", max_tokens: int = 256,
                    thresholds: CoherenceThresholds | None = None, *,
                    prompts: Sequence[ProbePrompt] = DEFAULT_LONG_DECODE_PROMPTS,
                    logprobs: int = DEFAULT_LOGPROBS) -> OracleReport:
    """Long greedy decodes (bugs often show only after ~100 tokens) checked for NaN, collapse, and an answer that
    stops early (a truncated long decode covers nothing of what it exists for)."""
    def judge(_prompt: ProbePrompt, c: Completion, probe: str) -> list[Finding]:
        found = coherence_findings(c, thresholds, probe=probe)
        n = c.completion_tokens if c.completion_tokens is not None else len(c.tokens)
        if c.ok and n < max_tokens * LONG_DECODE_MIN_FRACTION:
            if c.finish_reason == "length":  # the engine's cap (max_model_len), not a stop the model chose
                found.append(make_finding("coherence", "warning", f"the decode ran to the engine's length cap "
                                          f"after {n} of {max_tokens} tokens: long-decode coverage is short", c,
                                          probe=probe))
            else:
                found.append(make_finding("coherence", "error", f"the decode stopped after {n} of {max_tokens} "
                                          f"tokens (finish_reason={c.finish_reason!r}): a long decode that stops "
                                          f"before {LONG_DECODE_MIN_FRACTION:.0%} of its tokens is truncated (a wrong "
                                          "EOS id, a stop-string or chat-template bug)", c, probe=probe))
        return found

    return _send_each(OracleReport("long-decode", server_id=server_id), client, prompts,
                      lambda p: f"long-decode[{p.label}]", lambda _p: max_tokens, logprobs, judge)


def run_batch_reference(client: LLMClient, server_id: str = "", *, max_tokens: int = 32,
                        prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS,
                        logprobs: int = DEFAULT_LOGPROBS,
                        thresholds: CoherenceThresholds | None = None,
                        judge_coherence: bool = True) -> OracleReport:
    """One request at a time (batch 1) for every prompt of the pool. ``report.completions`` is the
    reference that :func:`run_batch_case` compares with (from this server, or from an eager one).
    ``judge_coherence``: also judge each answer's coherence (False on an untrained model, where it means
    nothing); NaN and transport findings are always made."""
    def judge(_p: ProbePrompt, c: Completion, probe: str) -> list[Finding]:
        return coherence_findings(c, thresholds or BATCH_THRESHOLDS, probe=probe) if judge_coherence else []

    return _send_each(OracleReport("batch-reference", server_id=server_id), client, prompts,
                      lambda p: f"bs=1-reference[{p.label}]", lambda _p: max_tokens, logprobs, judge)


def run_batch_case(client: LLMClient, case: BatchCase, reference: Sequence[Completion | None] | None,
                   server_id: str = "", max_tokens: int = 32, *,
                   prompts: Sequence[ProbePrompt] = DEFAULT_BATCH_PROMPTS, logprobs: int = DEFAULT_LOGPROBS,
                   thresholds: CoherenceThresholds | None = None, name_ref: str = "bs=1 reference",
                   exact: bool = False, judge_coherence: bool = True,
                   tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> OracleReport:
    """Send ``case.size`` greedy requests at once, so the server decodes them as one batch, and check
    every output: NaN evidence, coherence (unless ``judge_coherence`` is False: an untrained model), and
    agreement with the reference of the same prompt (``reference[i]`` answers ``prompts[i]``; see
    :func:`run_batch_reference`; None, or missing: that answer was broken, and the impossible comparison
    is an error) by the differential rule under ``tolerance`` (|Δlogprob|, top-k distance, near-ties by their
    size, truncation, early divergences over the batch), or exact equality when ``exact`` (deterministic mode).
    Identical prompts inside the batch are also compared with each other. Chat prompts are sent as raw
    text here."""
    report = OracleReport(f"batch[{case.id}]", server_id=server_id)
    batch = batch_prompts(case.size, prompts)
    try:
        outputs = client.complete_concurrently([p.text for p in batch], max_tokens, temperature=0.0,
                                               logprobs=logprobs)
    except RequestError as exc:
        report.add([_transport_failure(exc, case.id)])
        return report
    report.completions.extend(outputs)
    against_reference: list[PairComparison] = []

    def compare(ref: Completion, c: Completion, name: str, name_cand: str, label: str) -> PairComparison | None:
        if exact:
            report.add(exact_equal_findings(ref, c, name_ref=name, name_cand=name_cand, probe=label))
            return None
        cmp = compare_pair(ref, c, label)
        report.add(pair_findings(cmp, ref, c, tolerance=tolerance, name_ref=name, name_cand=name_cand, probe=label))
        return cmp

    first_of: dict[str, int] = {}
    for i, (prompt, c) in enumerate(zip(batch, outputs, strict=True)):
        label = f"{case.id} request {i + 1}/{case.size} [{prompt.label}]"
        numeric = response_findings(c, probe=label)
        report.add(numeric)
        if judge_coherence:
            report.add(coherence_findings(c, thresholds or BATCH_THRESHOLDS, probe=label))
        if any(f.severity == "error" for f in numeric):
            continue  # nothing sensible to compare
        pool_index = i % len(prompts)
        if reference is not None:
            ref = reference[pool_index] if pool_index < len(reference) else None
            if ref is not None and ref.ok:
                cmp = compare(ref, c, name_ref, f"{case.id} #{i + 1}", label)
                if cmp is not None:
                    against_reference.append(cmp)
            else:
                report.add([make_finding("differential", "error", f"no comparison with the {name_ref}: its answer "
                                         "to this prompt failed or carries NaN evidence (see its findings)", c,
                                         probe=label)])
        j = first_of.setdefault(prompt.text, i)
        if j != i and outputs[j].ok:
            compare(outputs[j], c, f"{case.id} #{j + 1}", f"{case.id} #{i + 1}", label)
    report.add(early_divergence_findings(against_reference, tolerance, who=f"{case.id} vs {name_ref}"))
    return report


def run_determinism(client: LLMClient, server_id: str = "", *,
                    prompt: ProbePrompt = DEFAULT_DETERMINISM_PROMPT, max_tokens: int = 64, exact: bool = False,
                    logprobs: int = DEFAULT_LOGPROBS,
                    tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> OracleReport:
    """The same greedy request twice, one after the other: compared by the differential rule (a flip only as a
    near-tie on both sides; |Δlogprob| and top-k distance bounded), or exactly in deterministic mode."""
    report = OracleReport("determinism", server_id=server_id)
    label = f"determinism[{prompt.label}]"
    try:
        a = _send(client, prompt, max_tokens, logprobs)
        b = _send(client, prompt, max_tokens, logprobs)
    except RequestError as exc:
        return report.add([_transport_failure(exc, label)])
    report.completions.extend([a, b])
    report.add(response_findings(a, probe=label + " run 1"))
    report.add(response_findings(b, probe=label + " run 2"))
    if a.ok and b.ok:
        report.add(determinism_findings(a, b, exact=exact, tolerance=tolerance, probe=label))
    return report


def send_prompts(client: LLMClient, prompts: Sequence[ProbePrompt], max_tokens: int, *,
                 logprobs: int | None = DEFAULT_LOGPROBS, concurrent: bool = False) -> list[Completion]:
    """Greedy requests for ``prompts``, one after the other (batch 1), or all at once when ``concurrent``
    (so the server decodes them as one batch). Raises :class:`RequestError` on a transport failure."""
    if not concurrent or len(prompts) < 2:
        return [_send(client, p, max_tokens, logprobs) for p in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(_send, client, p, max_tokens, logprobs) for p in prompts]
        return [f.result() for f in futures]


def run_differential(reference: LLMClient | Sequence[Completion], candidate: LLMClient, *, name_ref: str,
                     name_cand: str, prompts: Sequence[ProbePrompt] = DEFAULT_DIFFERENTIAL_PROMPTS,
                     max_tokens: int = 32, logprobs: int = DEFAULT_LOGPROBS, exact: bool = False,
                     concurrent: bool = False,
                     tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> OracleReport:
    """The same greedy prompts on a reference configuration and on the candidate, compared answer by answer.

    ``reference``: a client of the reference server, which runs one request at a time (batch 1), or its
    answers to ``prompts`` recorded earlier (a matrix reference's recording). The candidate runs one at a
    time too, or all prompts at once when ``concurrent`` (batch N against the batch-1 reference). Both sides'
    responses are also checked for NaN and transport failures: a broken reference is reported as such, not as
    a divergence. Exact equality when ``exact`` (deterministic mode on both servers), else the differential rule
    under ``tolerance`` (:mod:`pytest_llmserve.verdicts.differential`).
    """
    mode = f"all {len(prompts)} at once" if concurrent else "one at a time"
    report = OracleReport(f"differential[{name_cand} vs reference {name_ref}; {len(prompts)} greedy prompts, "
                          f"{max_tokens} tokens, candidate {mode}]", server_id=name_cand)
    if name_ref == name_cand:  # one server against itself (batch N against batch 1): tell the sides apart
        name_ref, name_cand = f"{name_ref} (one at a time)", f"{name_cand} ({mode})"
    labels = [f"differential[{p.label}]" for p in prompts]
    if isinstance(reference, Sequence):
        ref = list(reference)
    else:
        try:
            ref = send_prompts(reference, prompts, max_tokens, logprobs=logprobs)
        except RequestError as exc:
            return report.add([_transport_failure(exc, f"reference {name_ref}")])
    for label, c in zip(labels, ref, strict=True):
        report.add(replace(f, message=f"reference {name_ref}: {f.message}")
                   for f in response_findings(c, probe=label))
    try:
        cand = send_prompts(candidate, prompts, max_tokens, logprobs=logprobs, concurrent=concurrent)
    except RequestError as exc:
        return report.add([_transport_failure(exc, f"candidate {name_cand}")])
    for label, c in zip(labels, cand, strict=True):
        report.add(response_findings(c, probe=label))
    compared = compare_runs(ref, cand, name_ref=name_ref, name_cand=name_cand, exact=exact, probes=labels,
                            tolerance=tolerance)
    report.findings.extend(compared.findings)
    report.completions.extend(cand)
    return report
