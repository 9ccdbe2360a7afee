"""The pytest face of a run that uses llmserve: one plugin object, :class:`LLMServeFace`, holding every hook such
a run needs and the bodies of the fixtures, wired to the modules that do the work: :mod:`pytest_llmserve.session`
(the run's settings and state, the SIGTERM guard, the teardown), :mod:`pytest_llmserve.collection`
(parametrization, markers checked, items grouped and ordered), :mod:`pytest_llmserve.report_hooks` (each test's
verdict row, a dead server's failure, the terminal summary) and :mod:`pytest_llmserve.xdist_hooks` (what an xdist
controller hands its workers and hears back, the scheduler across hosts).

The entry module, :mod:`pytest_llmserve.plugin`, declares the options, markers and fixtures, decides when the run
uses llmserve, and then registers this object (its docstring says when). This module is imported then, once, and
imports at module level everything such a run needs. Settings are resolved by :mod:`pytest_llmserve.settings` (ini
< ``PYTEST_LLMSERVE_*`` < ``--llmserve-*`` < marker); state lives in ``config.stash`` and ``item.stash``; the core
gets plain dataclasses.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmserve import collection, report_hooks, session, xdist_hooks
from pytest_llmserve.bench_face import ABFace, BenchFace
from pytest_llmserve.collection import benchmark_spec as _benchmark_spec
from pytest_llmserve.collection import item_spec as _item_spec
from pytest_llmserve.collection import prefetched, selected_specs, suite_requests
from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import ServerError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates.ab import ABRunner
from pytest_llmserve.gates.bench import BenchGate
from pytest_llmserve.gates.decode import CheckFailed, DecodeCheck
from pytest_llmserve.gates.prefetch import server_probes
from pytest_llmserve.gates.preflight import refusal_before_boot, save_command
from pytest_llmserve.gates.probes import ServerProbes
from pytest_llmserve.options import Sources
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.handle import RunningServer, ServerHandle
from pytest_llmserve.server.hosts import config_groups
from pytest_llmserve.server.pool import ServerPool
from pytest_llmserve.settings import Settings

if TYPE_CHECKING:
    import openai
    from xdist.scheduler.protocol import Scheduling

# The built-in suite: every test_llmserve_*.py file here (named one by one, so the user's python_files
# and norecursedirs settings cannot drop any of them).
SUITE_DIR = Path(__file__).parent / "suite"
# Node ids of the built-in suite start with this instead of a path: the suite files lie in the installed
# package, outside the rootdir, where pytest would give them an empty path (``::test_boots_and_generates[a]``).
SUITE_NODEID_PREFIX = "llmserve-suite"

SETTINGS_KEY = pytest.StashKey[Settings]()
STATE_KEY = pytest.StashKey[session.RunState]()  # set once the run uses llmserve (LLMServeFace.use)
SPEC_KEY = pytest.StashKey[ServerSpec]()
DECODE_CHECK_KEY = pytest.StashKey[DecodeCheck]()  # the test's decode_check, finished when its body returns
SIGTERM_KEY = pytest.StashKey[Any]()  # the SIGTERM handler ours replaced
RUN_DIR_NAME_KEY = pytest.StashKey[Path]()  # the run directory's name, handed to xdist workers before use
SESSION_KEY = pytest.StashKey[pytest.Session]()  # the ended session, for the terminal summary (how much of it ran)


class LLMServeFace:
    """The hooks of a run that uses llmserve, and the bodies of its fixtures (declared in the entry module).

    Registered by :mod:`pytest_llmserve.plugin` and in use from then on, except on an unconfigured xdist
    controller (``-n``, ``--tx``): it collects nothing, so only its workers can tell it whether the run uses
    llmserve; until one does (:meth:`used_state`), or its own collection meets an llmserve test (``--dist no``),
    it only hands them the run directory's name and its hooks leave the run alone."""

    def __init__(self, config: pytest.Config, sources: Sources) -> None:
        self.config = config
        self.sources = sources  # the raw settings, resolved on first use (resolve_settings)
        # On an xdist controller: what it hands its workers and hears back from them (see configure).
        self.controller: xdist_hooks.XdistController | None = None

    # ------------------------------------------------------------------------ the run's settings and state

    @staticmethod
    def resolve_settings(config: pytest.Config, sources: Sources) -> Settings:
        """The run's settings, resolved once and kept in ``config.stash``; a bad one is a usage error."""
        settings = config.stash[SETTINGS_KEY] = session.resolve(Path(config.rootpath), sources)
        return settings

    def settings(self) -> Settings:
        settings = self.config.stash.get(SETTINGS_KEY, None)
        return settings if settings is not None else self.resolve_settings(self.config, self.sources)

    def use(self) -> session.RunState:
        """The run uses llmserve from here on: its settings and run state, made once."""
        state = self.config.stash.get(STATE_KEY, None)
        if state is None:
            state = self.config.stash[STATE_KEY] = session.start(self.config, self.settings(),
                                                                 _run_dir_name(self.config))
        return state

    def used_state(self) -> session.RunState | None:
        """The run state, if the run used llmserve; an unconfigured xdist controller, which collects nothing,
        learns it from its workers (their reports home, or the run directory a boot of theirs made)."""
        state = self.config.stash.get(STATE_KEY, None)
        if state is None and self.controller is not None:
            if self.controller.used or _run_dir_name(self.config).exists():
                state = self.use()
        return state

    def configure(self, *, configured: bool) -> None:
        """At configuration. On an xdist controller, what it hands its workers; across hosts, tests placed by
        configuration (``--dist load`` becomes ``loadgroup``, crashed remote workers are not restarted). Configured
        (a configuration file or an llmserve setting), the rest: ``-n`` alone runs the benchmarks on one worker,
        the SIGTERM guard, and with ``--llmserve-suite`` the built-in suite's files."""
        config = self.config
        if xdist_hooks.is_controller(config) and config.pluginmanager.hasplugin("xdist"):
            by_config = configured and xdist_hooks.distributes_by_config(config)
            self.controller = xdist_hooks.XdistController(str(_run_dir_name(config)), config, self._config_groups,
                                                          by_config)
            if by_config:
                xdist_hooks.prepare_controller(config)
        if not configured:
            return
        xdist_hooks.keep_benchmarks_on_one_worker(config)
        self._start_using()
        if self.settings().suite:
            collection.add_suite(config, SUITE_DIR)

    def _config_groups(self) -> dict[str, str]:
        """Each configuration's server id -> its xdist group (how the controller places and names tests)."""
        self.use()
        return config_groups(self.settings().cfg.all_specs())

    def _start_using(self) -> None:
        """What the plugin does once it is in use: guard the run's servers against SIGTERM (not on xdist
        workers: their controller stops the shared servers)."""
        config = self.config
        if not xdist_hooks.is_worker(config) and SIGTERM_KEY not in config.stash:
            previous = session.install_sigterm_handler()
            if previous is not None:
                config.stash[SIGTERM_KEY] = previous

    # ------------------------------------------------------------------------ collection

    def parametrize(self, metafunc: pytest.Metafunc) -> None:
        """``pytest_generate_tests`` of a test that uses ``llm_server`` (called by the entry module)."""
        collection.parametrize(metafunc, self.settings())

    def check_and_order(self, items: list[pytest.Item], llmserve_items: list[pytest.Item]) -> None:
        """``pytest_collection_modifyitems`` of a collection with llmserve items (called by the entry module): every
        bad marker as one usage error, the GPU skip, the items grouped and ordered."""
        config = self.config
        settings = self.settings()
        problems = collection.marker_problems(config, items, settings)
        if problems:
            raise pytest.UsageError("\n".join(f"pytest-llmserve: {problem}" for problem in problems))
        self._start_using()
        if not config.option.collectonly:
            collection.skip_without_gpu(llmserve_items)
        collection.order_items(config, items, settings)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """On an xdist worker: the groups that keep tests on one worker (:func:`collection.mark_worker_groups`),
        first among the collection hooks: pytest-xdist's worker reads them into the node ids in its own."""
        if xdist_hooks.is_worker(config):
            collection.mark_worker_groups(config, items, self.settings(), SUITE_DIR)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(self, module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
        """Built-in suite modules as ``llmserve-suite/<file>::test_x[server]``. Baseline keys do not change:
        they are built from the file's name and the function's (see :meth:`llm_bench`)."""
        if module_path.parent != SUITE_DIR or not module_path.name.startswith("test_llmserve_"):
            return None
        return pytest.Module.from_parent(parent, path=module_path,
                                         nodeid=f"{SUITE_NODEID_PREFIX}/{module_path.name}")

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        settings = config.stash.get(SETTINGS_KEY, None)
        if settings is None or not settings.configured:
            return []
        return collection.header_lines(settings)

    # ------------------------------------------------------------------------ the fixtures' bodies

    def llmserve_config(self) -> LLMServeConfig:
        return self.settings().cfg

    def llm_server(self, request: pytest.FixtureRequest) -> RunningServer:
        config = request.config
        spec = getattr(request, "param", None)
        if spec is None:
            spec = selected_specs(config.stash[SETTINGS_KEY], None)[0]
        problem = None
        try:
            handle = _pool(config).get(spec)
        except ServerError as exc:
            problem = str(exc)
        if problem is not None:
            pytest.fail(problem, pytrace=False)  # outside the except: no chained traceback
        request.node.stash[SPEC_KEY] = spec
        return handle

    def decode_check(self, llm_server: RunningServer, request: pytest.FixtureRequest) -> DecodeCheck:
        config = request.config
        node = request.node
        assert isinstance(node, pytest.Item)
        current = node.stash.get(SPEC_KEY, None) or llm_server.spec_for_checks or llm_server.spec
        probes = _server_probes(config, llm_server, current)
        check = DecodeCheck.for_run(config.stash[SETTINGS_KEY], server=llm_server, spec=current,
                                    run_dir=config.stash[STATE_KEY].run_dir, test_id=node.nodeid, pool=_pool(config),
                                    verbose=config.option.verbose, records=report_hooks.oracle_records(node),
                                    probes=probes,
                                    prefetched=prefetched(node, llm_server, probes))
        node.stash[DECODE_CHECK_KEY] = check
        return check

    def llm_client(self, llm_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[LLMClient]:
        client = llm_server.client()
        node = request.node
        assert isinstance(node, pytest.Item)
        declared = suite_requests(node)
        if declared is not None:
            client.request_kind = declared[0]
            if declared[1]:
                spec = node.stash.get(SPEC_KEY, None) or llm_server.spec_for_checks or llm_server.spec
                client.answers = prefetched(node, llm_server, _server_probes(request.config, llm_server, spec))
        yield client
        client.close()

    def llm_openai(self, llm_server: RunningServer) -> Iterator[openai.OpenAI]:
        client: openai.OpenAI = _openai().OpenAI(**openai_client_options(llm_server))
        yield client
        client.close()

    def llm_async_openai(self, llm_server: RunningServer) -> openai.AsyncOpenAI:
        client: openai.AsyncOpenAI = _openai().AsyncOpenAI(**openai_client_options(llm_server))
        return client

    def llm_bench(self, llm_server: RunningServer, request: pytest.FixtureRequest) -> BenchFace:
        config = request.config
        settings = config.stash[SETTINGS_KEY]
        node = request.node
        assert isinstance(node, pytest.Item)
        spec = node.stash.get(SPEC_KEY, None) or llm_server.spec
        command = save_command(config.invocation_params.args, nodeid=node.nodeid,
                               test_name=getattr(node, "originalname", node.name), server_name=spec.name,
                               suite=SUITE_DIR in node.path.parents)
        gate = BenchGate.for_run(settings, server=llm_server, options=_benchmark_spec(node, settings),
                                 test_id=node.nodeid, key_test=_key_test(node), run_dir=config.stash[STATE_KEY].run_dir,
                                 record_command=command)
        return BenchFace(gate, record=_outcome_recorder(request), say=lambda msg: _say(config, msg))

    def llm_ab(self, request: pytest.FixtureRequest) -> ABFace:
        config = request.config
        settings = config.stash[SETTINGS_KEY]
        runner = ABRunner(pool=_pool(config), cfg=settings.cfg, test_id=request.node.nodeid,
                          results_dir=settings.results_dir)
        return ABFace(runner, record=_outcome_recorder(request), say=lambda msg: _say(config, msg))

    # ------------------------------------------------------------------------ running the tests

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """A benchmark whose refusal follows from the configuration alone fails here, in set-up, before its
        ``llm_server`` fixture boots anything (see :func:`pytest_llmserve.gates.preflight.preflight_refusal`)."""
        if "llm_bench" not in getattr(item, "fixturenames", ()) or STATE_KEY not in item.config.stash:
            return
        spec = _item_spec(item)
        settings = item.config.stash[SETTINGS_KEY]
        if spec is None or settings.url:
            return
        refusal, message = refusal_before_boot(spec, settings, _benchmark_spec(item, settings),
                                               key_test=_key_test(item), test_id=item.nodeid)
        if refusal is not None:
            item.user_properties.append(("llmserve_benchmark", refusal.to_json()))
            item.config.stash[STATE_KEY].outcomes.append(refusal)
        if message:
            pytest.fail(message, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """When a test's body returns, its decode_check reports the checks that reached no verdict (a skip that
        names each): a chain's skip never stops the checks after it, so it is raised here, after all of them. A
        check that failed (:class:`~pytest_llmserve.gates.decode.CheckFailed`) fails the test with its message, as
        ``pytest.fail`` without a traceback; a body that raised anything else is reported as it is."""
        failed_message = None
        try:
            yield
        except CheckFailed as failed:
            failed_message = failed.message
        if failed_message is not None:  # outside the except: a fail raised in it would chain the message twice
            pytest.fail(failed_message, pytrace=False)
        check = item.stash.get(DECODE_CHECK_KEY, None)
        kept = check.finish() if check is not None else None
        if kept:
            pytest.skip(kept)

    # ------------------------------------------------------------------------ reporting and teardown

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        if STATE_KEY not in item.config.stash:
            return (yield)  # the run does not use llmserve (yet): see LLMServeFace
        server = _item_server(item) if call.excinfo is not None and call.when == "call" else None
        death = report_hooks.blame_server_death(call, server)
        report = yield
        spec = item.stash.get(SPEC_KEY, None) or _item_spec(item)
        failed_by_strict = report_hooks.record_verdict(item, call, report, spec.id if spec else None, SUITE_DIR,
                                                       strict=item.config.stash[SETTINGS_KEY].strict)
        # A test strict mode failed verified nothing; its server did nothing wrong, and its log would say nothing.
        if report.failed and death is None and call.when == "call" and not failed_by_strict:
            server = _item_server(item)
            if server is not None and server.log_path is not None:
                # The server is up: its last lines often say why a request failed.
                report.sections.append(report_hooks.server_log_section(server))
        return report

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, exitstatus: int,
                                config: pytest.Config) -> None:
        state = self.used_state()
        if state is None or xdist_hooks.is_worker(config):
            return
        reports = [report for category in terminalreporter.stats.values() for report in category]
        outcomes, checks = report_hooks.session_verdicts(reports, state.outcomes)
        # Under xdist the servers were used in the workers.
        workers = list(self.controller.worker_accounting) if self.controller is not None else []
        ended = config.stash.get(SESSION_KEY, None)
        completeness = None if ended is None else report_hooks.run_completeness(
            reports, collected=ended.testscollected, exitstatus=exitstatus, shouldfail=ended.shouldfail,
            shouldstop=ended.shouldstop, maxfail=config.option.maxfail)
        report_hooks.write_summary(terminalreporter, config.stash[SETTINGS_KEY], run_dir=state.run_dir,
                                   host_reports=dict(self.controller.host_reports) if self.controller else {},
                                   outcomes=outcomes, checks=checks,
                                   accounting=state.accounting if state.pool is not None or workers else None,
                                   workers=workers, session_start=state.session_start, completeness=completeness)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        # The terminal summary comes after this hook and is not handed the session: whether it stopped early is there.
        config.stash[SESSION_KEY] = session
        state = config.stash.get(STATE_KEY, None)
        if state is not None:
            worker = xdist_hooks.is_worker(config)
            state.stop_servers(worker=worker, say=lambda msg: _say(config, msg))
            if worker:
                xdist_hooks.send_home(config, state.accounting, state.run_dir)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        state = self.used_state()
        if state is None:
            return
        state.finish(worker=xdist_hooks.is_worker(config), say=lambda msg: _say(config, msg))
        previous = config.stash.get(SIGTERM_KEY, None)
        if previous is not None:
            session.restore_sigterm_handler(previous)
            del config.stash[SIGTERM_KEY]

    # ------------------------------------------------------------------------ pytest-xdist's hooks, on its controller

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.controller is not None:
            self.controller.configure_node(node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if self.controller is not None:
            self.controller.node_down(node, error)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Scheduling | None:
        return self.controller.scheduler(config, log) if self.controller is not None else None

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        if self.controller is not None:
            self.controller.name_crash(crashitem, report)


# ---------------------------------------------------------------------------- helpers of the hooks and fixtures

def _run_dir_name(config: pytest.Config) -> Path:
    """Only a name: the directory is made when a server boots (in this process or an xdist worker)."""
    if RUN_DIR_NAME_KEY not in config.stash:
        config.stash[RUN_DIR_NAME_KEY] = Path(tempfile.gettempdir()) / f"llmserve-run-{uuid.uuid4().hex[:16]}"
    return config.stash[RUN_DIR_NAME_KEY]


def _pool(config: pytest.Config) -> ServerPool:
    return config.stash[STATE_KEY].server_pool(config.stash[SETTINGS_KEY], shared=xdist_hooks.is_worker(config),
                                               say=lambda msg: _say(config, msg))


def _say(config: pytest.Config, msg: str) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and not xdist_hooks.is_worker(config):
        tr.write_line(f"[llmserve] {msg}")
    else:
        print(f"[llmserve] {msg}", file=sys.stderr, flush=True)


def _server_probes(config: pytest.Config, server: RunningServer, spec: ServerSpec) -> ServerProbes:
    """This process's independent probes of ``server`` (see :mod:`pytest_llmserve.gates.prefetch`)."""
    return server_probes(config.stash[STATE_KEY].probes, server, spec, config.stash[SETTINGS_KEY].probe_concurrency)


def _key_test(node: pytest.Item) -> str:
    """The baseline key's test: file and function, the same whatever the rootdir."""
    return f"{node.path.name}::{getattr(node, 'originalname', node.name)}"


def _outcome_recorder(request: pytest.FixtureRequest) -> Callable[[BenchOutcome], None]:
    """Keep a benchmark outcome for the summary: in this process and, as JSON in user_properties, across xdist."""
    state = request.config.stash[STATE_KEY]

    def record(outcome: BenchOutcome) -> None:
        request.node.user_properties.append(("llmserve_benchmark", outcome.to_json()))
        state.outcomes.append(outcome)

    return record


def _item_server(item: pytest.Item) -> ServerHandle | None:
    """The launched server this item's test ran against, if any."""
    spec = item.stash.get(SPEC_KEY, None)
    pool = item.config.stash[STATE_KEY].pool
    return pool.launched_handle(spec) if spec is not None and pool is not None else None


def openai_client_options(server: RunningServer) -> dict[str, Any]:
    """How an openai SDK client reaches ``server``: its /v1 URL and key, its request timeout, no retries
    (a retried request would hide the failure a test is looking for)."""
    return {"base_url": server.base_url + "/v1", "api_key": server.spec.api_key or "EMPTY",
            "timeout": server.spec.request_timeout_s, "max_retries": 0}


def _openai() -> ModuleType:
    """The openai SDK, for its two fixtures."""
    # lazy: the SDK takes about a second to import (-X importtime), and only these two fixtures need it
    import openai

    return openai
