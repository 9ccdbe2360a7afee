"""``DecodeCheck``: the decode oracles bound to one running server, chainable from a test.

    decode_check.no_nan().coherent().cuda_graph_sizes_covered()

Each method runs one oracle (:mod:`pytest_llmserve.verdicts.oracles`) and calls ``fail`` with a message that says
what was sent, what came back and which server configuration it was: the first findings, each shortened,
and a count of the rest (every finding in full with ``verbose >= 2``, pytest's ``-vv``). ``skip`` is called
when a check cannot apply or its evidence does not exist (an *unverifiable* fact is never reported as a
pass). Before either, ``record`` gets the oracle's verdict and its full evidence, which the plugin puts in
the check's row of results.json.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import ConfigError, LLMServeError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates.probes import AnswerBook, SentBatch, ServerProbes, plan
from pytest_llmserve.server.handle import engine_of
from pytest_llmserve.verdicts import oracles

# An independent check's run: the oracle on a client, given the batch its answers came from (None: sent
# by the oracle itself, one at a time).
IndependentRun = Callable[[LLMClient, SentBatch | None], oracles.OracleReport]


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


OracleVerdict = Literal["pass", "fail", "unverifiable", "skipped"]


def oracle_record(check: str, verdict: OracleVerdict, *, first_finding: str | None = None,
                  findings: Sequence[oracles.Finding] = (), detail: str | None = None) -> dict[str, Any]:
    """What one oracle run leaves for the reports (JSON-plain: it crosses xdist workers)."""
    return {"check": check, "verdict": verdict, "first_finding": first_finding,
            "findings": [f.to_dict() for f in findings], "detail": detail}


class DecodeCheck:
    """Oracles for one server. ``fail``/``skip`` raise (pytest.fail / pytest.skip in the plugin).

    ``verbose``: pytest's verbosity; from 2 (``-vv``) a failure shows every finding in full.
    ``record``: called with :func:`oracle_record` of each oracle run, before ``fail``/``skip``.
    ``probes``: the server's independent probes (:mod:`pytest_llmserve.gates.probes`): the requests of
    ``no_nan``, ``known_answers`` and ``coherent`` go out together, taken first from ``prefetched`` (this
    test's share of a prefetch); None, or a concurrency of 1, sends them one at a time.
    ``planning``: a dry run for :func:`pytest_llmserve.gates.probes.plan`: the independent checks run
    against this recording client and conclude nothing; the others do nothing.
    """

    def __init__(self, server: Any, fail: Callable[[str], None], skip: Callable[[str], None] | None = None, *,
                 long_decode_tokens: int = 256, batch_tokens: int = 32,
                 reference_server: Callable[[str | ServerSpec], Any] | None = None, verbose: int = 0,
                 record: Callable[[dict[str, Any]], None] | None = None, probes: ServerProbes | None = None,
                 prefetched: AnswerBook | None = None, planning: LLMClient | None = None) -> None:
        self.server = server
        self.probes = probes
        self.prefetched = prefetched
        self.planning = planning
        self._fail = fail
        self._skip = skip or fail
        self.verbose = verbose
        self.record = record or (lambda entry: None)
        self.long_decode_tokens = long_decode_tokens
        self.batch_tokens = batch_tokens
        # Turns a spec id / ServerSpec into a running server (the plugin's pool, keeping this one alive).
        self.reference_server = reference_server
        self.reports: list[oracles.OracleReport] = []

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
             findings: Sequence[oracles.Finding] = ()) -> None:
        """Record the failure (with ``detail``, the full evidence, when the message is shortened), then fail."""
        from pytest_llmserve.report.checks import one_line

        self.record(oracle_record(check, "fail", first_finding=one_line(message), findings=findings,
                                  detail=detail or message))
        self._fail(message)

    def skip(self, message: str, *, check: str = "decode-check", unverifiable: bool = False) -> None:
        """Record why the check did not run (``unverifiable``: its evidence does not exist), then skip."""
        from pytest_llmserve.report.checks import one_line

        self.record(oracle_record(check, "unverifiable" if unverifiable else "skipped",
                                  first_finding=one_line(message), detail=message))
        self._skip(message)

    def _conclude(self, report: oracles.OracleReport, extra: str = "") -> DecodeCheck:
        self.reports.append(report)
        if report.ok:
            self.record(oracle_record(report.check, "pass", findings=report.findings))
            return self
        self.server.ensure_alive()  # a dead server is the better explanation, with its log tail
        where = f"\n{self.server.describe()}" + (f"\n{extra}" if extra else "")
        full = report.message(self.spec.id, full=True) + where
        shown = full if self.verbose >= 2 else report.message(self.spec.id) + where
        self.record(oracle_record(report.check, "fail", first_finding=report.first_finding(),
                                  findings=report.findings, detail=full))
        self._fail(shown)
        return self

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

        def run(client: LLMClient, batch: SentBatch | None) -> oracles.OracleReport:
            # Requests sent ahead left their log lines and counters before this call: read from before them.
            offset = batch.log_offset if batch is not None else len(self.server.log_text())
            return oracles.run_nan_check(client, self.spec.id, read_log=self._log_since(offset),
                                         log_patterns=adapter.nan_log_patterns, nan_counters=adapter.nan_counters,
                                         metrics_before=batch.metrics_before if batch is not None else None)

        return self._independent(run)

    def known_answers(self, probes: Sequence[oracles.KnownAnswer] | None = None) -> DecodeCheck:
        return self._independent(lambda client, _batch: oracles.run_known_answers(
            client, probes or oracles.DEFAULT_KNOWN_ANSWERS, self.spec.id))

    def coherent(self, max_tokens: int | None = None,
                 thresholds: oracles.CoherenceThresholds | None = None) -> DecodeCheck:
        """A long greedy decode (256 tokens by default) is not degenerate."""
        return self._independent(lambda client, _batch: oracles.run_long_decode(
            client, self.spec.id, max_tokens or self.long_decode_tokens, thresholds))

    def deterministic(self) -> DecodeCheck:
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        with self._client() as client:
            report = oracles.run_determinism(client, self.spec.id, exact=self._exact())
        return self._conclude(report)

    def matches(self, reference: Any, *, prompts: Sequence[oracles.ProbePrompt] | None = None,
                max_tokens: int | None = None, concurrent: bool = False,
                exact: bool | None = None) -> DecodeCheck:
        """Differential check against a reference configuration (e.g. graphs off, batch size 1, another
        engine build): the same greedy prompts on both servers, each answer compared with the
        reference's by vLLM's check_logprobs_close rule (at the first divergence each side's token must
        be in the other's top-k), or by exact equality when both servers run in deterministic mode.

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
        ref_server.ensure_alive()
        with ref_server.client() as ref_client, self._client() as client:
            report = oracles.run_differential(ref_client, client, name_ref=ref_spec.id,
                                              name_cand=self.spec.id,
                                              prompts=prompts or oracles.DEFAULT_DIFFERENTIAL_PROMPTS,
                                              max_tokens=max_tokens or self.batch_tokens, exact=exact,
                                              concurrent=concurrent)
        if not report.ok:
            ref_server.ensure_alive()
        return self._conclude(report, extra=f"reference: {ref_server.describe()}")

    def _reference(self, client: Any) -> list[Any]:
        cache = self.server.__dict__.setdefault("_llmserve_batch_reference", {})
        key = self.batch_tokens
        if key not in cache:
            ref = oracles.run_batch_reference(client, self.spec.id, max_tokens=self.batch_tokens)
            self._conclude(ref)
            cache[key] = ref.completions
        return list(cache[key])

    def batch_case(self, case: oracles.BatchCase) -> DecodeCheck:
        """``case.size`` concurrent greedy requests, each checked and compared with its batch-1 reference."""
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        with self._client("batch") as client:
            reference = self._reference(client)
            report = oracles.run_batch_case(client, case, reference, self.spec.id, self.batch_tokens,
                                            exact=self._exact())
        return self._conclude(report)

    def cuda_graph_sizes_covered(self) -> DecodeCheck:
        """Run every batch case derived from the sizes the server reports it captured."""
        if self.planning is not None:  # composition-controlled or no requests: not planned ahead
            return self
        spec = self.spec
        graphs = spec.cuda_graph is not None and spec.cuda_graph.enabled
        facts = self.server.facts()
        captured = getattr(facts, "captured_batch_sizes", None)
        if not graphs:
            if captured:
                self.fail(f"{spec.id}: CUDA graphs are off in the configuration but the server captured "
                          f"batch sizes {list(captured)}\n{self.server.describe()}", check="cuda-graph coverage")
            self.skip(f"{spec.id}: CUDA graphs are off in this configuration (the server reports "
                      f"{'none captured' if captured is not None else 'nothing about graphs'}); "
                      "the concurrent batch cases ran as test_batch_size", check="cuda-graph coverage")
            return self
        configured = spec.cuda_graph.batch_sizes if spec.cuda_graph else None
        if not captured:
            if configured is None:
                self.skip(f"{spec.id}: unverifiable: the server did not report which batch sizes it captured "
                          "and none were configured", check="cuda-graph coverage", unverifiable=True)
            cases = oracles.coverage_plan(None, configured)
            source = "configured sizes (the server did not report captured sizes: unverifiable)"
        else:
            cases = oracles.coverage_plan(captured, configured)
            source = f"captured sizes {list(captured)}"
        combined = oracles.OracleReport(f"cuda-graph coverage from {source}")
        with self._client("batch") as client:
            reference = self._reference(client)
            for case in cases:
                combined.merge(oracles.run_batch_case(client, case, reference, spec.id, self.batch_tokens,
                                                      exact=self._exact()))
        combined.check += ": " + ", ".join(c.id for c in cases)
        return self._conclude(combined)

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
        if unverifiable:
            self.skip(f"{spec.id}: UNVERIFIABLE (the server does not report these; not a pass): "
                      f"{', '.join(r.name for r in unverifiable)}\n{table}",
                      check="config-is-execution", unverifiable=True)
        self.record(oracle_record("config-is-execution", "pass", detail=table))
        return self
