"""``DecodeCheck``: the decode oracles bound to one running server, chainable from a test.

    decode_check.no_nan().coherent().cuda_graph_sizes_covered()

Each method runs one oracle (its probes sent by :mod:`pytest_llmserve.gates.oracle_runs`, the answers judged by
:mod:`pytest_llmserve.verdicts`) and calls ``fail`` with a message that says what was sent, what came back and
which server configuration it was: the first findings, each shortened, and a count of the rest (every finding in
full with ``verbose >= 2``, pytest's ``-vv``). A check that cannot apply, or whose evidence does not exist (an
*unverifiable* fact is never reported as a pass), does not stop the chain: it is kept, the next check runs, and
:meth:`DecodeCheck.finish` (called by the plugin when the test's body returns) calls ``skip`` with the kept
reasons, the most telling first, so one check's skip never hides the next one's verdict. Before any of these,
``record`` gets the oracle's verdict and its full evidence, which the plugin puts in the check's row of
results.json.

On an untrained model (:func:`pytest_llmserve.config.untrained`: random weights, declared, or marked by the
checkpoint builder with the weights' hash), the oracles that need a trained model (known answers, long-decode
coherence with its mean-logprob floor, the coherence of batch outputs and of their batch-1 reference) are *not
applicable*: recorded as such (with whether the configuration declared it or a checkpoint marker proved it) and
skipped with a reason starting "not applicable:", never passed, never failed. What compares the engine with
itself (batch N against batch 1, differentials, determinism) and NaN evidence run as on any model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_llmserve.config import LLMServeConfig, ServerSpec, Untrained, untrained
from pytest_llmserve.errors import ConfigError, LLMServeError, ReferenceAnswersError, RequestError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates import oracle_runs
from pytest_llmserve.gates.failed_checks import record_correctness_failure
from pytest_llmserve.gates.probes import AnswerBook, SentBatch, ServerProbes, plan
from pytest_llmserve.model_config import dsa_index_topk
from pytest_llmserve.report.checks import NOT_APPLICABLE, one_line
from pytest_llmserve.server.handle import engine_of
from pytest_llmserve.store import reference_answers as store
from pytest_llmserve.verdicts import oracles
from pytest_llmserve.verdicts.batch_sizes import BatchCase, coverage_plan
from pytest_llmserve.verdicts.coherence import CoherenceThresholds
from pytest_llmserve.verdicts.differential import DEFAULT_TOLERANCE, DifferentialTolerance
from pytest_llmserve.verdicts.divergence import divergence_rows, divergence_table, worst_row
from pytest_llmserve.verdicts.findings import Finding, OracleReport
from pytest_llmserve.verdicts.long_context import long_context_prompts, reach_of, unreached

if TYPE_CHECKING:
    from pytest_llmserve.server.pool import ServerPool
    from pytest_llmserve.settings import Settings

# An independent check's run: the oracle on a client, given the batch its answers came from (None: sent
# by the oracle itself, one at a time).
IndependentRun = Callable[[LLMClient, SentBatch | None], OracleReport]


def resolve_reference_spec(cfg: LLMServeConfig, reference: str | ServerSpec) -> ServerSpec:
    """The configuration a differential check compares against: a :class:`ServerSpec`, a spec id
    (``"name"`` or ``"name[key=value,...]"`` for a matrix combination), or a server name that expands to
    exactly one combination."""
    if isinstance(reference, ServerSpec):
        return reference
    specs = cfg.all_specs()
    for spec in specs:
        if spec.id == reference:
            return spec
    names = {s.name for s in cfg.servers}
    if reference in names:
        expanded = cfg.expanded(reference)
        if len(expanded) == 1:
            return expanded[0]
        raise ConfigError(f"reference {reference!r} has {len(expanded)} matrix combinations; name one of: "
                          + ", ".join(s.id for s in expanded))
    raise ConfigError(f"reference {reference!r} is not a configured server (configured: "
                      f"{', '.join(s.id for s in specs)}; from {cfg.source})")


OracleVerdict = Literal["pass", "fail", "unverifiable", "skipped", "not-applicable"]

#: Tokens of each differential prompt recorded on a matrix's reference and replayed on its other combinations:
#: one constant, since a recording is refused for another length (DSA's divergences came by token 6).
REFERENCE_MAX_TOKENS = 32


def index_topk_of(spec: ServerSpec, facts: Callable[[], Any] | None = None) -> int | None:
    """The index_topk a probe must exceed on a DSA server: the larger of its model's config.json and the override
    args passed to the engine (the configuration, so a recording and its replays agree without a running server,
    and a server given a smaller topk is probed as its reference is); where the model
    folder is not here (an attached server), what the server's log said (``facts``, read only then); None for a
    model without one."""
    found = dsa_index_topk(spec)
    if found is not None:
        return found.largest
    if facts is None or (spec.model and (Path(spec.model).expanduser() / "config.json").is_file()):
        return None  # the model's own config is here and has no index_topk: not a DSA model
    told = getattr(facts(), "dsa_index_topk", None)
    return told if isinstance(told, int) else None


def long_context_probes(*sides: tuple[ServerSpec, Callable[[], Any] | None]) -> tuple[oracles.ProbePrompt, ...]:
    """The long-context probes a DSA model's differential and batch cases add (:mod:`pytest_llmserve.verdicts.
    long_context`), for the largest index_topk of ``sides`` ((spec, its facts or None) pairs: both sides of a
    comparison must select); () where no side is a DSA model, or a side's configuration says
    ``long_context_probes = false``."""
    if any(spec.long_context_probes is False for spec, _facts in sides):
        return ()
    known = [k for k in (index_topk_of(spec, facts) for spec, facts in sides) if k is not None]
    if not known:
        wanted = [spec.id for spec, _facts in sides if spec.long_context_probes]
        if wanted:
            raise ConfigError(f"long_context_probes = true for {', '.join(wanted)}, but no index_topk is known: the "
                              "model folder's config.json has none (not a DSA model?) and the server's log did not "
                              "say it")
        return ()
    return long_context_prompts(max(known))


def _batch_pool(long: Sequence[oracles.ProbePrompt]) -> tuple[oracles.ProbePrompt, ...]:
    """The batch cases' prompt pool: the short prompts with the long-context probes spread through them (one
    first), so that every batch of two or more mixes a context past index_topk with short ones, as real traffic
    does, and a batch of 8 holds at most three of them (8,192 + 4,096 + 2,560 tokens for index_topk 2,048)."""
    if not long:
        return oracles.DEFAULT_BATCH_PROMPTS
    short = list(oracles.DEFAULT_BATCH_PROMPTS)
    step = max(1, len(short) // len(long))
    pool: list[oracles.ProbePrompt] = []
    for i, probe in enumerate(long):
        pool.append(probe)
        pool.extend(short[i * step:(i + 1) * step])
    pool.extend(short[len(long) * step:])
    return tuple(pool)


@dataclass(frozen=True, slots=True)
class ReferencePlan:
    """Where ``DecodeCheck.matches_reference`` finds (or records) the reference's answers.

    ``reference``: the combination the server's matrix declares as its reference; ``record_dir``: this run's
    directory, shared by its xdist workers (answers go to ``reference-answers/<server>.json`` there);
    ``given``: a recording of an earlier run (``--llmserve-reference-answers``: a file, or a directory of
    ``<server>.json``), used instead of recording; ``tolerance``: the differential rule's bounds (the server's
    ``differential_max_logprob_delta`` in place of the default |Δlogprob| bound)."""

    reference: ServerSpec
    record_dir: Path
    given: Path | None = None
    tolerance: DifferentialTolerance = DEFAULT_TOLERANCE


def reference_plan(cfg: LLMServeConfig, spec: ServerSpec, record_dir: Path,
                   given: Path | None = None) -> ReferencePlan | None:
    """The plan for ``spec``'s server; None when its matrix declares no reference."""
    reference = cfg.reference_of(spec.name)
    if reference is None:
        return None
    tolerance = DEFAULT_TOLERANCE
    if spec.differential_max_logprob_delta is not None:
        tolerance = replace(tolerance, max_logprob_delta=spec.differential_max_logprob_delta)
    return ReferencePlan(reference, record_dir, given, tolerance)


def oracle_record(check: str, verdict: OracleVerdict, *, first_finding: str | None = None,
                  findings: Sequence[Finding] = (), detail: str | None = None,
                  declared: bool | None = None) -> dict[str, Any]:
    """What one oracle run leaves for the reports (JSON-plain: it crosses xdist workers). ``declared``, for a
    not-applicable verdict: whether the configuration declared the model untrained (``random_weights = true``)
    rather than a checkpoint marker showing it (strict mode accepts only the declaration)."""
    record: dict[str, Any] = {"check": check, "verdict": verdict, "first_finding": first_finding,
                              "findings": [f.to_dict() for f in findings], "detail": detail}
    if declared is not None:
        record["declared"] = declared
    return record


#: The order in which :meth:`DecodeCheck.finish` names the checks that did not reach a verdict: the one that
#: most needs a user's attention first (an unverifiable fact is a gap in the evidence; not applicable and
#: skipped are by design).
_KEPT_ORDER: tuple[OracleVerdict, ...] = ("unverifiable", "not-applicable", "skipped")


class CheckFailed(LLMServeError):
    """A check of :class:`DecodeCheck` failed: ``message`` is what the test's failure says (the pytest face shows it
    without a traceback, as ``pytest.fail`` does); its record is already in the check's ``records``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DecodeCheck:
    """Oracles for one server, chained (``decode_check.no_nan().coherent()``): a check that fails raises
    :class:`CheckFailed` and ends the chain; one that reaches no verdict is kept, and :meth:`finish` says them all
    when the chain is done. It never calls pytest: the plugin's face turns both into the test's failure or skip.

    ``verbose``: pytest's verbosity; from 2 (``-vv``) a failure shows every finding in full.
    ``records``: where :func:`oracle_record` of each oracle run goes (the test's row in the reports).
    ``failure_note``: (run directory, test id) where a failure is also noted for the run's benchmarks of this server
    (:mod:`pytest_llmserve.gates.failed_checks`), set by :meth:`for_run`.
    ``probes``: the server's independent probes (:mod:`pytest_llmserve.gates.probes`): the requests of
    ``no_nan``, ``known_answers`` and ``coherent`` go out together, taken first from ``prefetched`` (this
    test's share of a prefetch); None, or a concurrency of 1, sends them one at a time.
    ``planning``: a dry run for :func:`pytest_llmserve.gates.probes.plan`: the independent checks run
    against this recording client and conclude nothing; the others do nothing.
    """

    #: Tokens of the long-decode probe (coherence), and of each request of a batch case.
    long_decode_tokens = 256
    batch_tokens = 32

    def __init__(self, server: Any, *, reference_server: Callable[[str | ServerSpec], Any] | None = None,
                 verbose: int = 0, records: list[dict[str, Any]] | None = None, probes: ServerProbes | None = None,
                 prefetched: AnswerBook | None = None, planning: LLMClient | None = None,
                 reference_plan: ReferencePlan | None = None, failure_note: tuple[Path, str] | None = None) -> None:
        self.server = server
        self.reference_plan = reference_plan
        self.probes = probes
        self.prefetched = prefetched
        self.planning = planning
        self.verbose = verbose
        self.records: list[dict[str, Any]] = records if records is not None else []
        self.failure_note = failure_note
        # Turns a spec id / ServerSpec into a running server (the plugin's pool, keeping this one alive).
        self.reference_server = reference_server
        self.reports: list[OracleReport] = []
        # Checks that did not reach a verdict, (verdict, reason), in order: the chain goes on past them, and
        # finish() reports them when the test's body is done.
        self.kept: list[tuple[OracleVerdict, str]] = []

    @classmethod
    def for_run(cls, settings: Settings, *, server: Any, spec: ServerSpec, run_dir: Path, test_id: str,
                pool: ServerPool, verbose: int, records: list[dict[str, Any]], probes: ServerProbes,
                prefetched: AnswerBook | None) -> DecodeCheck:
        """The check of one test of ``spec``'s server under the run's ``settings``. A failure is also noted
        in ``run_dir`` for the run's benchmarks of this server (on any xdist worker): their figures are then
        not a pass. A reference configuration is booted beside this one (:meth:`ServerPool.get_beside`)."""
        def reference_server(reference: str | ServerSpec) -> Any:
            return pool.get_beside(resolve_reference_spec(settings.cfg, reference), spec)

        return cls(server, reference_server=reference_server, verbose=verbose, records=records, probes=probes,
                   prefetched=prefetched, failure_note=(run_dir, test_id),
                   reference_plan=reference_plan(settings.cfg, spec, run_dir, settings.reference_answers))

    def record(self, entry: dict[str, Any]) -> None:
        self.records.append(entry)

    def _failed(self, message: str) -> CheckFailed:
        """The failure to raise, noted first for the run's benchmarks of this server."""
        if self.failure_note is not None:
            run_dir, test_id = self.failure_note
            record_correctness_failure(run_dir, self.spec.id, test_id, message)
        return CheckFailed(message)

    @property
    def spec(self) -> ServerSpec:
        spec = getattr(self.server, "spec_for_checks", None) or self.server.spec
        assert isinstance(spec, ServerSpec)
        return spec

    def _client(self, kind: str = "probes") -> Any:
        self.server.ensure_alive()
        client = self.server.client()
        client.request_kind = kind  # where its time goes in the suite's accounting
        return client

    def _independent(self, run: IndependentRun) -> DecodeCheck:
        """Run a check whose requests do not depend on the batch they share: its planned requests all at
        once (or from this test's prefetched share), then the oracle on those answers."""
        if self.planning is not None:
            run(self.planning, None)
            return self
        if self.probes is None or not self.probes.together:
            with self._client() as client:
                return self._conclude(run(client, None))
        planned = plan(lambda recorder: run(recorder, None), self.server.model_name, "probes")
        with self._client() as client:
            client.answers, batch = self.probes.answer(planned, client, self.prefetched)
            report = run(client, batch)
        return self._conclude(report)

    def fail(self, message: str, *, check: str = "decode-check", detail: str | None = None,
             findings: Sequence[Finding] = ()) -> None:
        """Record the failure (with ``detail``, the full evidence, when the message is shortened), then raise
        :class:`CheckFailed`."""
        self.record(oracle_record(check, "fail", first_finding=one_line(message), findings=findings,
                                  detail=detail or message))
        raise self._failed(message)

    def skip(self, message: str, *, check: str = "decode-check", unverifiable: bool = False) -> None:
        """Record why the check did not reach a verdict (``unverifiable``: its evidence does not exist) and keep
        it for :meth:`finish`; the next check of the chain still runs."""
        verdict: OracleVerdict = "unverifiable" if unverifiable else "skipped"
        self.record(oracle_record(check, verdict, first_finding=one_line(message), detail=message))
        self.kept.append((verdict, message))

    def finish(self) -> str | None:
        """The checks that reached no verdict, once the chain is done: the test's skip message, the most telling
        reason first (unverifiable, then not applicable, then skipped) and the others after it; None when every
        check reached a verdict. The plugin calls it when a test's body returns (and skips the test with it); a
        script calls it itself."""
        if not self.kept:
            return None
        kept = sorted(self.kept, key=lambda item: _KEPT_ORDER.index(item[0]))
        self.kept = []
        others = [f"  also {verdict}: {one_line(message)}" for verdict, message in kept[1:]]
        return "\n".join([kept[0][1], *others])

    @property
    def untrained(self) -> Untrained | None:
        """Whether this server's model is untrained, and why (then oracles that need a trained model do not
        apply): declared in the configuration, or shown by a checkpoint marker whose weights hash matched."""
        return untrained(self.spec)

    def not_applicable(self, check: str, why: str) -> DecodeCheck:
        """Record that ``check`` does not apply to this model (never a pass, never a failure), with whether the
        configuration declared the model untrained, and keep it for :meth:`finish` (a reason that starts with
        :data:`NOT_APPLICABLE`)."""
        message = f"{NOT_APPLICABLE} {check} on {self.spec.id}: {why}"
        found = self.untrained
        self.record(oracle_record(check, "not-applicable", first_finding=one_line(message), detail=message,
                                  declared=found is not None and found.declared))
        self.kept.append(("not-applicable", message))
        return self

    def _needs_trained_model(self, check: str, what: str) -> bool:
        """True (after keeping ``check`` as not applicable) on an untrained model."""
        found = self.untrained
        if found is None:
            return False
        if self.planning is None:  # a dry run plans no requests for it, and concludes nothing
            self.not_applicable(check, f"{what} means nothing on an untrained model ({found.reason})")
        return True

    def _conclude(self, report: OracleReport, extra: str = "", note: str | None = None,
                  head: str | None = None) -> DecodeCheck:
        """Record and judge ``report``. ``note``: said in the record's detail whatever the verdict (e.g.
        which findings were not applicable, a differential's table); ``head``: a failure's first line (and
        first finding) in place of the report's own."""
        self.reports.append(report)
        if note:
            extra = f"{extra}\n{note}" if extra else note
        if report.ok:
            self.record(oracle_record(report.check, "pass", findings=report.findings, detail=note))
            return self
        self.server.ensure_alive()  # a dead server is the better explanation, with its log tail
        where = f"\n{self.server.describe()}" + (f"\n{extra}" if extra else "")
        lead = f"{head}\n" if head else ""
        full = lead + report.message(self.spec.id, full=True) + where
        shown = full if self.verbose >= 2 else lead + report.message(self.spec.id) + where
        self.record(oracle_record(report.check, "fail", first_finding=head or report.first_finding(),
                                  findings=report.findings, detail=full))
        raise self._failed(shown)

    def _exact(self) -> bool:
        return bool(engine_of(self.server).deterministic_flag_on(self.spec))

    def _log_since(self, offset: int) -> Callable[[], list[str]]:
        def read() -> list[str]:
            text = str(self.server.log_text())
            return text[offset:].replace("\r", "\n").splitlines()

        return read

    # ------------------------------------------------------------------ oracles
    def no_nan(self) -> DecodeCheck:
        """Greedy requests with logprobs; NaN evidence from responses, metrics and the server log."""
        adapter = engine_of(self.server)  # an attached vLLM's log is read for vLLM's NaN lines

        def run(client: LLMClient, batch: SentBatch | None) -> OracleReport:
            # Requests sent ahead left their log lines and counters before this call: read from before them.
            offset = batch.log_offset if batch is not None else len(self.server.log_text())
            return oracle_runs.run_nan_check(client, self.spec.id, read_log=self._log_since(offset),
                                             log_patterns=adapter.nan_log_patterns, nan_counters=adapter.nan_counters,
                                             metrics_before=batch.metrics_before if batch is not None else None)

        return self._independent(run)

    def known_answers(self, probes: Sequence[oracles.KnownAnswer] | None = None) -> DecodeCheck:
        """Each known-answer probe's greedy answer holds an expected word (not applicable untrained)."""
        if self._needs_trained_model("known-answers", "an expected answer"):
            return self
        return self._independent(lambda client, _batch: oracle_runs.run_known_answers(
            client, probes or oracles.DEFAULT_KNOWN_ANSWERS, self.spec.id))

    def coherent(self, max_tokens: int | None = None,
                 thresholds: CoherenceThresholds | None = None) -> DecodeCheck:
        """A long greedy decode (256 tokens by default) is not degenerate (not applicable untrained: its
        collapse metrics and mean-logprob floor judge a trained model's text)."""
        if self._needs_trained_model("long-decode", "coherence of a long decode (collapse, mean-logprob floor)"):
            return self
        return self._independent(lambda client, _batch: oracle_runs.run_long_decode(
            client, self.spec.id, max_tokens or self.long_decode_tokens, thresholds))

    def deterministic(self) -> DecodeCheck:
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        with self._client() as client:
            report = oracle_runs.run_determinism(client, self.spec.id, exact=self._exact())
        return self._conclude(report)

    def matches(self, reference: Any, *, prompts: Sequence[oracles.ProbePrompt] | None = None,
                max_tokens: int | None = None, concurrent: bool = False, exact: bool | None = None,
                tolerance: DifferentialTolerance = DEFAULT_TOLERANCE) -> DecodeCheck:
        """Differential check against a reference configuration (e.g. graphs off, batch size 1, another
        engine build): the same greedy prompts on both servers, each answer compared with the
        reference's by the differential rule under ``tolerance`` (:mod:`pytest_llmserve.verdicts.differential`:
        |Δlogprob| and top-k distance at every position, a divergence only as a near-tie on both sides, early
        divergences bounded, truncation an error), or by exact equality when both servers run in deterministic
        mode.

        ``reference``: a running server (a ``ServerHandle``), or a spec id / server name / ``ServerSpec``
        that the plugin boots from the configuration while this server stays up. ``concurrent`` sends the
        candidate's prompts all at once (a batch) against the reference's one-at-a-time answers.
        """
        if self.planning is not None:  # composition-controlled: not planned ahead
            return self
        ref_server = reference
        if isinstance(reference, (str, ServerSpec)):
            if self.reference_server is None:
                self.fail(f"{self.spec.id}: decode_check.matches({reference!r}) needs a running server here "
                          "(no configuration to boot a reference from)", check="differential")
            try:
                ref_server = self.reference_server(reference)  # type: ignore[misc]
            except LLMServeError as exc:
                self.fail(f"{self.spec.id}: the reference configuration {reference!r} is not available: "
                          f"{exc}", check="differential")
        ref_spec = getattr(ref_server, "spec_for_checks", None) or ref_server.spec
        if exact is None:
            exact = self._exact() and bool(engine_of(ref_server).deterministic_flag_on(ref_spec))
        if prompts is None:
            long = self._long_context_probes((ref_spec, getattr(ref_server, "facts", None)),
                                             (self.spec, getattr(self.server, "facts", None)))
            prompts = (*oracles.DEFAULT_DIFFERENTIAL_PROMPTS, *long)
        ref_server.ensure_alive()
        with ref_server.client() as ref_client, self._client() as client:
            report = oracle_runs.run_differential(ref_client, client, name_ref=ref_spec.id,
                                                  name_cand=self.spec.id, prompts=prompts,
                                                  max_tokens=max_tokens or self.batch_tokens, exact=exact,
                                                  concurrent=concurrent, tolerance=tolerance)
        if not report.ok:
            ref_server.ensure_alive()
        self._conclude(report, extra=f"reference: {ref_server.describe()}")
        return self._selection_reached(report.check, prompts, report.completions)

    def _long_context_probes(self, *sides: tuple[ServerSpec, Callable[[], Any] | None]
                             ) -> tuple[oracles.ProbePrompt, ...]:
        """:func:`long_context_probes`, a configuration that asks for them without an index_topk failing the
        check."""
        try:
            return long_context_probes(*sides)
        except ConfigError as exc:
            self.fail(f"{self.spec.id}: {exc}", check="long-context probes")
            raise  # not reached: fail raises

    def _selection_reached(self, check: str, prompts: Sequence[oracles.ProbePrompt],
                           answers: Sequence[Any]) -> DecodeCheck:
        """After a check that passed with long-context probes: each probe whose context the server counted past
        index_topk is evidence of sparse selection; one that did not get there (a tokenizer that counts fewer
        tokens, a prompt the server truncated) is kept as *unverifiable*, never taken for a pass."""
        reaches = reach_of(prompts, answers)
        if not reaches:
            return self
        short = unreached(reaches)
        if short:
            self.skip(f"{self.spec.id}: unverifiable: {len(short)} of {len(reaches)} long-context probes did not "
                      f"reach sparse selection, so {check} says nothing about the token selection there:\n  "
                      + "\n  ".join(r.describe() for r in reaches), check=f"{check} (sparse selection)",
                      unverifiable=True)
        else:
            self.record(oracle_record(f"{check} (sparse selection)", "pass",
                                      detail="\n".join(r.describe() for r in reaches)))
        return self

    def matches_reference(self) -> DecodeCheck:
        """This combination against its matrix's declared reference combination, on the same greedy prompts
        (:data:`oracles.DEFAULT_DIFFERENTIAL_PROMPTS`, :data:`REFERENCE_MAX_TOKENS` tokens, top-5 logprobs),
        without both servers up at once: the reference combination records its answers (the test passes as
        "recorded"), every other combination replays the prompts and is compared with the recording by the
        differential rule under the plan's ``tolerance`` (:mod:`pytest_llmserve.verdicts.differential`): per request
        the tokens compared, the first divergence and its near-tie gap on both sides, the largest |Δlogprob| and
        top-k distance before it, a truncated answer; over the set, how many diverge early.

        When the reference has not recorded yet (it is not selected, or ran on another host), it is booted
        beside this server (``reference_server``) and recorded under a file lock; a recording given by the
        plan (an earlier run's) replaces recording altogether, after its model and prompts are checked."""
        if self.planning is not None:  # composition-controlled: not planned ahead
            return self

        plan, spec = self.reference_plan, self.spec
        check = "reference differential"
        if plan is None:
            self.skip(f"{spec.id}: no reference combination declared for server {spec.name!r} (reference = "
                      f"\"<combination id>\" in [tool.llmserve.matrix.{spec.name}])", check=check)
            return self
        prompts = self._reference_prompts(plan.reference)
        try:
            if plan.given is not None:
                recorded = store.load(store.given_file(plan.given, spec.name), "--llmserve-reference-answers")
                differing = recorded.differences(spec, prompts, REFERENCE_MAX_TOKENS, oracles.DEFAULT_LOGPROBS)
                if differing:
                    self.fail(f"{spec.id}: the reference answers {recorded.describe()} were recorded for something "
                              "else; refused: " + "; ".join(differing), check=check)
            else:
                recorded = self._recorded_reference(plan)
                # The reference combination's own test reports its recording, also when another process recorded
                # it first (a combination that ran before it on another xdist worker booted it and recorded).
                if spec.id == plan.reference.id:
                    return self._recorded(recorded)
        except ReferenceAnswersError as exc:
            self.fail(f"{spec.id}: {exc}", check=check)
            raise  # not reached: fail raises
        return self._compare_with_reference(recorded, plan.tolerance)

    def _reference_prompts(self, reference: ServerSpec) -> tuple[oracles.ProbePrompt, ...]:
        """What a matrix's reference records and every combination replays: the differential prompts, and for a
        DSA model the long-context probes of the reference's index_topk (from its configuration: a recording and
        its replays agree without the reference running)."""
        return (*oracles.DEFAULT_DIFFERENTIAL_PROMPTS, *self._long_context_probes((reference, None)))

    def _reference_answers(self, server: Any, spec: ServerSpec) -> Any:
        """The reference prompts sent to ``server`` (one at a time), as a recording of ``spec``."""
        prompts = self._reference_prompts(spec)
        server.ensure_alive()
        with server.client() as client:
            client.request_kind = "probes"
            answers = oracle_runs.send_prompts(client, prompts, REFERENCE_MAX_TOKENS,
                                               logprobs=oracles.DEFAULT_LOGPROBS)
        identity = store.model_identity(spec)
        version = None
        try:
            version = getattr(server.facts(), "version", None)
        except Exception:  # noqa: BLE001 - the version is context, not a verdict
            pass
        return store.ReferenceAnswers(server=spec.name, combination=spec.id, model=identity["model"],
                                      model_sha256=identity[store.SHA_KEY], engine=spec.engine,
                                      engine_version=str(version) if version else None,
                                      max_tokens=REFERENCE_MAX_TOKENS, logprobs=oracles.DEFAULT_LOGPROBS,
                                      prompts=prompts, answers=tuple(answers))

    def _recorded_reference(self, plan: ReferencePlan) -> Any:
        """This run's recording of the reference: read when it exists, else recorded under a lock, so that one
        process records: from this server when it is the reference, else from the reference booted beside it."""
        # lazy: filelock takes ~40 ms to import (-X importtime)
        from filelock import FileLock

        spec = self.spec
        path = store.answers_file(plan.record_dir, spec.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if path.exists():
                return store.load(path)
            if spec.id == plan.reference.id:
                source: Any = self.server
            elif self.reference_server is None:
                raise ReferenceAnswersError(f"the reference {plan.reference.id} has recorded no answers in this "
                                            "run and there is no configuration to boot it from")
            else:
                try:
                    source = self.reference_server(plan.reference)
                except LLMServeError as exc:
                    raise ReferenceAnswersError(f"the reference {plan.reference.id} has recorded no answers in "
                                                f"this run and could not be booted: {exc}") from None
            try:
                answers = self._reference_answers(source, plan.reference)
            except RequestError as exc:
                raise ReferenceAnswersError(f"recording the reference {plan.reference.id}'s answers failed: {exc}"
                                            f"\n{source.describe()}") from None
            return store.record(path, answers)

    def _recorded(self, recorded: Any) -> DecodeCheck:
        """The reference combination's own test: its answers recorded, and sound (NaN-free, answered)."""
        labels = [f"differential[{p.label}]" for p in recorded.prompts]
        report = OracleReport(f"reference answers recorded[{recorded.combination}]",
                              server_id=self.spec.id, completions=list(recorded.answers))
        for label, c in zip(labels, recorded.answers, strict=True):
            report.add(oracles.response_findings(c, probe=label))
        if report.ok:
            self.record(oracle_record(report.check, "pass", findings=report.findings,
                                      detail=f"recorded: {recorded.describe()}; {len(recorded.answers)} greedy "
                                             f"prompts, {recorded.max_tokens} tokens, top-{recorded.logprobs}"))
            return self
        return self._conclude(report, extra=f"recorded anyway (the other combinations report it): {recorded.path}")

    def _compare_with_reference(self, recorded: Any, tolerance: DifferentialTolerance) -> DecodeCheck:
        spec = self.spec
        labels = [f"differential[{p.label}]" for p in recorded.prompts]
        with self._client() as client:
            report = oracle_runs.run_differential(recorded.answers, client,
                                                  name_ref=f"{recorded.combination} (recorded)", name_cand=spec.id,
                                                  prompts=recorded.prompts, max_tokens=recorded.max_tokens,
                                                  logprobs=recorded.logprobs, tolerance=tolerance)
        report.check = (f"reference differential[{spec.id} vs reference {recorded.combination}; "
                        f"{len(recorded.prompts)} greedy prompts, {recorded.max_tokens} tokens, |Δlogprob| "
                        f"tolerance {tolerance.max_logprob_delta:g}, near-tie gap {tolerance.near_tie_gap:g}]")
        rows = divergence_rows(recorded.answers, report.completions, labels)
        table = (f"{spec.id} vs {recorded.describe()}:\n"
                 + divergence_table(rows, name_ref="reference", name_cand=spec.id, tolerance=tolerance))
        head = None
        if not report.ok:
            worst = worst_row(rows, tolerance)
            failing = {f.probe for f in report.errors}
            if worst is None or worst.probe not in failing:  # e.g. only the reference's answers are broken
                worst = next((r for r in rows if r.probe in failing), worst)
            head = f"{spec.id} disagrees with reference {recorded.combination}" + (
                f": worst request {worst.summary()}" if worst is not None else "")
        self._conclude(report, note=table, head=head)
        return self._selection_reached("reference differential", recorded.prompts, report.completions)

    def _reference(self, client: Any) -> OracleReport:
        """The engine's own batch-1 answers (sent once per server and kept), with their findings: NaN and
        transport always, coherence only on a trained model. Not judged here: a batch case compares with
        whatever the engine answered, and reports the reference's findings beside its comparisons."""
        cache = self.server.__dict__.setdefault("_llmserve_batch_reference", {})
        pool = self._batch_pool()
        key = (self.batch_tokens, self.untrained is None, pool)
        if key not in cache:
            cache[key] = oracle_runs.run_batch_reference(client, self.spec.id, max_tokens=self.batch_tokens,
                                                         prompts=pool, judge_coherence=key[1])
        ref: OracleReport = cache[key]
        return ref

    def _batch_pool(self) -> tuple[oracles.ProbePrompt, ...]:
        """The batch cases' prompts: the short ones, with a DSA model's long-context probes among them."""
        return _batch_pool(self._long_context_probes((self.spec, getattr(self.server, "facts", None))))

    def _batch_cases(self, check: str, cases: Sequence[BatchCase]) -> DecodeCheck:
        """Run ``cases`` against the batch-1 reference: every comparison runs; the reference's own findings
        (its NaN and transport failures, which make a comparison impossible; on a trained model its
        coherence, a separate finding) are added to the report, each named as the reference's."""
        found = self.untrained
        combined = OracleReport(check, server_id=self.spec.id)
        pool = self._batch_pool()
        with self._client("batch") as client:
            ref = self._reference(client)
            reference = oracles.usable_reference(ref.completions)
            for case in cases:
                combined.merge(oracle_runs.run_batch_case(client, case, reference, self.spec.id, self.batch_tokens,
                                                          prompts=pool, exact=self._exact(),
                                                          judge_coherence=found is None))
        combined.add(replace(f, message=f"bs=1 reference: {f.message}") for f in ref.findings)
        note = (f"coherence of the outputs and of their bs=1 reference not judged (not applicable: "
                f"{found.reason}); each output compared with the engine's own bs=1 answer") if found else None
        self._conclude(combined, note=note)
        # Selection shown by the batch-1 answers of the long probes (each batch case reuses the same ones).
        return self._selection_reached(check, pool, ref.completions)

    def batch_case(self, case: BatchCase) -> DecodeCheck:
        """``case.size`` concurrent greedy requests, each checked and compared with its batch-1 reference."""
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        return self._batch_cases(f"batch[{case.id}]", [case])

    def cuda_graph_sizes_covered(self) -> DecodeCheck:
        """Run every batch case derived from the sizes the server reports it captured.

        Graphs requested but none captured is a failure (the configuration did not run). A server that does not
        say what it captured gets the configured sizes' batch cases, and their verdict: a failure fails, a pass
        is kept as *unverifiable* coverage (the outputs agreed, but nothing shows that graphs ran them)."""
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        spec = self.spec
        check = "cuda-graph coverage"
        graphs = spec.cuda_graph is not None and spec.cuda_graph.enabled
        facts = self.server.facts()
        captured = getattr(facts, "captured_batch_sizes", None)
        if not graphs:
            if captured:
                self.fail(f"{spec.id}: CUDA graphs are off in the configuration but the server captured "
                          f"batch sizes {list(captured)}\n{self.server.describe()}", check=check)
            self.skip(f"{spec.id}: CUDA graphs are off in this configuration (the server reports "
                      f"{'none captured' if captured is not None else 'nothing about graphs'}); "
                      "the concurrent batch cases ran as test_batch_size", check=check)
            return self
        configured = spec.cuda_graph.batch_sizes if spec.cuda_graph else None
        if captured is not None and not captured:
            self.fail(f"{spec.id}: CUDA graphs were requested"
                      + (f" for batch sizes {list(configured)}" if configured else "")
                      + " but the server reports that it captured none: the graphs this configuration exists for "
                      f"never ran\n{self.server.describe()}", check=check)
            return self
        if captured is None:
            if configured is None:
                self.skip(f"{spec.id}: unverifiable: the server did not report which batch sizes it captured "
                          "and none were configured", check=check, unverifiable=True)
                return self
            cases = coverage_plan(None, configured)
            self._batch_cases(f"{check} from the configured sizes {list(configured)}: "
                              + ", ".join(c.id for c in cases), cases)
            self.skip(f"{spec.id}: unverifiable: the server did not report which batch sizes it captured; the "
                      f"configured sizes' batch cases ({', '.join(c.id for c in cases)}) agreed with batch 1, but "
                      "nothing shows that CUDA graphs ran them", check=check, unverifiable=True)
            return self
        cases = coverage_plan(captured, configured)
        return self._batch_cases(f"{check} from captured sizes {list(captured)}: " + ", ".join(c.id for c in cases),
                                 cases)

    def config_is_execution(self) -> DecodeCheck:
        """Each requested option against what the server's log and metrics say ran."""
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        spec = self.spec
        facts = self.server.facts()
        # Nothing to check for an unknown engine (``external``): it declares no options.
        engine = engine_of(self.server)
        results = engine.check_execution(spec, facts) if engine.launches else []
        failed = [r for r in results if r.status == "fail"]
        unverifiable = [r for r in results if r.status == "unverifiable"]
        table = "\n".join(f"  {r.status.upper():<13} {r.name}: requested {r.requested}; observed {r.observed}"
                          for r in results)
        if failed:
            self.fail(f"config is not execution on {spec.id}: {len(failed)} mismatch(es): "
                      f"{', '.join(r.name for r in failed)}\n{table}\n\n"
                      + "\n\n".join(r.message for r in failed) + f"\n{self.server.describe()}",
                      check="config-is-execution")
        if not results:
            self.skip(f"{spec.id}: nothing to verify (attached server: no log; nothing requested)",
                      check="config-is-execution", unverifiable=True)
        elif unverifiable:
            self.skip(f"{spec.id}: UNVERIFIABLE (the server does not report these; not a pass): "
                      f"{', '.join(r.name for r in unverifiable)}\n{table}",
                      check="config-is-execution", unverifiable=True)
        else:
            self.record(oracle_record("config-is-execution", "pass", detail=table))
        return self
