"""The pytest face of the package: options, ini keys, markers, fixtures and hooks, wired to the modules
that do the work: :mod:`pytest_llmserve.session` (the run's settings and state, the SIGTERM guard, the
teardown), :mod:`pytest_llmserve.collection` (parametrization, markers checked, items grouped and ordered),
:mod:`pytest_llmserve.report_hooks` (each test's verdict row, a dead server's failure, the terminal summary)
and :mod:`pytest_llmserve.xdist_hooks`.

Settings are resolved by :mod:`pytest_llmserve.settings` (ini < ``PYTEST_LLMSERVE_*`` < ``--llmserve-*`` <
marker); state lives in ``config.stash``; the core gets plain dataclasses.

Inert unless used. A run *configures* the plugin when there is a configuration file (``[tool.llmserve]``
in pyproject.toml, or llmserve.toml) or any llmserve setting (an ``--llmserve-*`` option, an
``llmserve_*`` ini key, a ``PYTEST_LLMSERVE_*`` variable named in :data:`pytest_llmserve.options.OPTIONS`);
it *uses* it when, in addition or instead, a collected item asks for an llmserve fixture or carries an
``llmserve_*`` marker. pytest_configure decides the first once; every later hook returns at once while
neither holds (in the style of hypothesis's hooks). Until then the plugin adds no header line, registers
no ``gpu`` marker, installs no signal handler, creates no directory, starts no process and imports
nothing of the package but :mod:`pytest_llmserve.options` (the rest is imported by the hooks that
run only when used). Because the header, and pytest-xdist's choice of scheduler, come before collection
(and an xdist controller collects nothing), those follow the configuration only:

* header lines, the ``gpu`` marker, the ``-n`` ``--dist load`` -> ``loadgroup`` switch, and across hosts
  ``--max-worker-restart 0`` and the by-configuration scheduler: only when configured;
* the SIGTERM handler: at configuration when configured, else once an llmserve item is collected;
* the run directory: when the first server is booted (an xdist controller hands its path to the workers);
* the GPU probe: only when an llmserve item marked ``gpu`` (a server configured with ``gpu = true``
  marks its items) is collected and the run is not ``--collect-only``; a project's own ``gpu`` tests
  are left to the project.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The only module of the package imported with the plugin: a run that does not use llmserve pays for no more.
from pytest_llmserve.options import OPTIONS, Sources, may_hold_config

if TYPE_CHECKING:
    import openai

    from pytest_llmserve.bench_face import ABFace, BenchFace
    from pytest_llmserve.config import LLMServeConfig, ServerSpec
    from pytest_llmserve.evidence.client import LLMClient
    from pytest_llmserve.gates.decode import DecodeCheck
    from pytest_llmserve.gates.probes import ServerProbes
    from pytest_llmserve.report.outcome import BenchOutcome
    from pytest_llmserve.server.handle import RunningServer, ServerHandle
    from pytest_llmserve.server.pool import ServerPool
    from pytest_llmserve.session import RunState
    from pytest_llmserve.settings import BenchSpec, Settings

# The built-in suite: every test_llmserve_*.py file here (named one by one, so the user's python_files
# and norecursedirs settings cannot drop any of them).
SUITE_DIR = Path(__file__).parent / "suite"

MARKERS = {
    # Registered only when the run is configured: a project's own gpu marker is the project's business.
    "gpu": "gpu: an llmserve test that needs a GPU (a server with gpu = true marks its tests); skipped with a "
           "reason where none is visible",
    "llmserve_server": "llmserve_server(*names): run this test once per configuration of the named server(s) "
                       "(matrix combinations included); '*' means every configured server",
    "llmserve_correctness": "llmserve_correctness: a decode-correctness oracle test "
                            "(select with -m llmserve_correctness)",
    "llmserve_after_traffic": "llmserve_after_traffic: runs after the other tests of its server configuration "
                              "(before its benchmarks): it reads what their requests left in the server's log",
    "llmserve_benchmark": "llmserve_benchmark(workload=None, *, metric=None, tolerance=None, rounds=None, "
                          "max_rounds=None, variable=None, higher_is_better=None, baseline_server=None, "
                          "baseline_test=None, warmup_rounds=None, warmup_agreement=None, extend_to_resolve=None, "
                          "extend_budget_s=None, contention_bound=None, between_run_sd=None): a throughput/latency "
                          "gate against the stored baseline (of another server/test when baseline_server/baseline_test "
                          "name one, e.g. 'test_llmserve_suite.py::test_throughput'); runs on one xdist worker only",
}
# What makes a collected item an llmserve item (the gpu marker alone only asks for the GPU probe).
LLMSERVE_MARKERS = ("llmserve_server", "llmserve_correctness", "llmserve_benchmark")
LLMSERVE_FIXTURES = frozenset({"llmserve_config", "llm_server", "llmserve_batch_case", "decode_check", "llm_client",
                               "llm_openai", "llm_async_openai", "llm_bench", "llm_ab"})

_INI_TYPES = {"flag": "bool", "string": "string", "int": "int", "float": "float"}

SETTINGS_KEY = pytest.StashKey["Settings"]()
STATE_KEY = pytest.StashKey["RunState"]()  # set once the run uses llmserve (see _use)
SPEC_KEY = pytest.StashKey["ServerSpec"]()
DECODE_CHECK_KEY = pytest.StashKey["DecodeCheck"]()  # the test's decode_check, finished when its body returns
SIGTERM_KEY = pytest.StashKey[Any]()  # the SIGTERM handler ours replaced
RUN_DIR_NAME_KEY = pytest.StashKey[Path]()  # the run directory's name, handed to xdist workers before use
SESSION_KEY = pytest.StashKey[pytest.Session]()  # the ended session, for the terminal summary (how much of it ran)


# ---------------------------------------------------------------------------- options

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmserve", "LLM inference server fixtures, correctness oracles and benchmark gates")
    for option in OPTIONS:
        if option.kind == "flag":
            group.addoption(option.flag, action="store_true", default=None, help=option.help)
        else:
            group.addoption(option.flag, default=None, help=option.help)
        parser.addini(option.ini, option.help, type=_INI_TYPES[option.kind], default=None)  # type: ignore[arg-type]


def _sources(config: pytest.Config) -> Sources:
    ini: dict[str, Any] = {}
    for option in OPTIONS:
        try:
            ini[option.name] = config.getini(option.ini)
        except (ValueError, TypeError, pytest.UsageError) as exc:  # a value of the wrong type
            raise pytest.UsageError(f"pytest-llmserve: ini {option.ini}: {exc}") from None
    return Sources(cli={option.name: config.getoption(option.flag) for option in OPTIONS}, ini=ini,
                   env=dict(os.environ))


# ---------------------------------------------------------------------------- configure

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, line in MARKERS.items():
        if name != "gpu":
            config.addinivalue_line("markers", line)
    sources = _sources(config)
    configured = False
    # The settings (and the modules they need) only where a setting or a configuration file may be.
    if any(sources.lookup(option) is not None for option in OPTIONS) or may_hold_config(Path(config.rootpath)):
        configured = _resolve_settings(config, sources).configured
    if _is_xdist_controller(config):
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve import xdist_hooks

        # The run directory's name goes to the workers even unconfigured: their tests may still use a server.
        xdist_hooks.register(config, str(_run_dir_name(config)), lambda: _config_groups(config),
                             configured=configured)
    if not configured:
        return
    config.addinivalue_line("markers", MARKERS["gpu"])
    _use(config)
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import xdist_hooks

    xdist_hooks.keep_benchmarks_on_one_worker(config)
    _start_using(config)
    if config.stash[SETTINGS_KEY].suite:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.collection import add_suite

        add_suite(config, SUITE_DIR)


def _is_worker(config: pytest.Config) -> bool:
    """An xdist worker (as :func:`pytest_llmserve.xdist_hooks.is_worker`, without importing that module)."""
    return hasattr(config, "workerinput")


def _is_xdist_controller(config: pytest.Config) -> bool:
    distributing = bool(getattr(config.option, "numprocesses", None)) or bool(getattr(config.option, "tx", None))
    return distributing and not _is_worker(config) and config.pluginmanager.hasplugin("xdist")


def _resolve_settings(config: pytest.Config, sources: Sources) -> Settings:
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.session import resolve

    settings = config.stash[SETTINGS_KEY] = resolve(Path(config.rootpath), sources)
    return settings


def _settings(config: pytest.Config) -> Settings:
    _use(config)
    return config.stash[SETTINGS_KEY]


def _run_dir_name(config: pytest.Config) -> Path:
    """Only a name: the directory is made when a server boots (in this process or an xdist worker)."""
    if RUN_DIR_NAME_KEY not in config.stash:
        config.stash[RUN_DIR_NAME_KEY] = Path(tempfile.gettempdir()) / f"llmserve-run-{uuid.uuid4().hex[:16]}"
    return config.stash[RUN_DIR_NAME_KEY]


def _use(config: pytest.Config) -> RunState:
    """The run uses llmserve from here on: its settings, run state and, on an xdist worker, the worker's
    hooks (made once; at configuration when configured, else by the first llmserve item collected)."""
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        return state
    settings = config.stash.get(SETTINGS_KEY, None) or _resolve_settings(config, _sources(config))
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import collection, session

    state = config.stash[STATE_KEY] = session.start(config, settings, _run_dir_name(config))
    if _is_worker(config):
        collection.register_worker_groups(config, settings, SUITE_DIR)
    return state


def _used_state(config: pytest.Config) -> RunState | None:
    """The run state, if the run used llmserve; an unconfigured xdist controller, which collects nothing,
    learns it from its workers (their reports home, or the run directory a boot of theirs made)."""
    state = config.stash.get(STATE_KEY, None)
    if state is None and RUN_DIR_NAME_KEY in config.stash:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve import xdist_hooks

        if xdist_hooks.workers_used_llmserve(config) or config.stash[RUN_DIR_NAME_KEY].exists():
            state = _use(config)
    return state


def _config_groups(config: pytest.Config) -> dict[str, str]:
    """Each configuration's server id -> its xdist group (how the controller places and names tests)."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.server.hosts import config_groups

    return config_groups(_settings(config).cfg.all_specs())


def _start_using(config: pytest.Config) -> None:
    """What the plugin does once it is in use: guard the run's servers against SIGTERM (not on xdist
    workers: their controller stops the shared servers)."""
    if not _is_worker(config) and SIGTERM_KEY not in config.stash:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.session import install_sigterm_handler

        previous = install_sigterm_handler()
        if previous is not None:
            config.stash[SIGTERM_KEY] = previous


# Node ids of the built-in suite start with this instead of a path: the suite files lie in the installed
# package, outside the rootdir, where pytest would give them an empty path (``::test_boots_and_generates[a]``).
SUITE_NODEID_PREFIX = "llmserve-suite"


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Built-in suite modules as ``llmserve-suite/<file>::test_x[server]``. Baseline keys do not change:
    they are built from the file's name and the function's (see :func:`llm_bench`)."""
    if module_path.parent != SUITE_DIR or not module_path.name.startswith("test_llmserve_"):
        return None
    return pytest.Module.from_parent(parent, path=module_path,
                                     nodeid=f"{SUITE_NODEID_PREFIX}/{module_path.name}")


def _pool(config: pytest.Config) -> ServerPool:
    return config.stash[STATE_KEY].server_pool(config.stash[SETTINGS_KEY], shared=_is_worker(config),
                                               say=lambda msg: _say(config, msg))


def _say(config: pytest.Config, msg: str) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and not _is_worker(config):
        tr.write_line(f"[llmserve] {msg}")
    else:
        print(f"[llmserve] {msg}", file=sys.stderr, flush=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None or not settings.configured:
        return []
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.collection import header_lines

    return header_lines(settings)


# ---------------------------------------------------------------------------- collection

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "llm_server" not in metafunc.fixturenames:
        return
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.collection import parametrize

    parametrize(metafunc, _settings(metafunc.config))


def _is_llmserve_item(item: pytest.Item) -> bool:
    return (not LLMSERVE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(name) is not None for name in LLMSERVE_MARKERS))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    llmserve_items = [item for item in items if _is_llmserve_item(item)]
    if not llmserve_items:
        return  # nothing of ours to check, mark, probe for or order (configured or not)
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import collection

    settings = _settings(config)
    problems = collection.marker_problems(config, items, settings)
    if problems:
        raise pytest.UsageError("\n".join(f"pytest-llmserve: {problem}" for problem in problems))
    _start_using(config)
    if not config.option.collectonly:
        collection.skip_without_gpu(llmserve_items)
    collection.order_items(config, items, settings)


def _item_spec(item: pytest.Item) -> ServerSpec | None:
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.collection import item_spec

    return item_spec(item)


def _benchmark_spec(item: pytest.Item, settings: Settings) -> BenchSpec:
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.collection import benchmark_spec

    return benchmark_spec(item, settings)


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def llmserve_config(pytestconfig: pytest.Config) -> LLMServeConfig:
    """The loaded configuration (servers, matrices, workloads)."""
    return pytestconfig.stash[SETTINGS_KEY].cfg


@pytest.fixture
def llm_server(request: pytest.FixtureRequest) -> RunningServer:
    """The running server for this test's configuration.

    Booted once per configuration per run and shared by every test (and xdist worker) that uses it.
    """
    config = request.config
    spec = getattr(request, "param", None)
    if spec is None:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.collection import selected_specs

        spec = selected_specs(config.stash[SETTINGS_KEY], None)[0]
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.errors import ServerError

    problem = None
    try:
        handle = _pool(config).get(spec)
    except ServerError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)  # outside the except: no chained traceback
    request.node.stash[SPEC_KEY] = spec
    return handle


@pytest.fixture
def decode_check(llm_server: RunningServer, request: pytest.FixtureRequest) -> DecodeCheck:
    """Decode oracles bound to this test's server: ``decode_check.no_nan().coherent()...``;
    ``decode_check.matches("other-server-id")`` boots that configuration beside this one as the reference."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks
    from pytest_llmserve.collection import prefetched
    from pytest_llmserve.gates.decode import DecodeCheck

    config = request.config
    node = request.node
    assert isinstance(node, pytest.Item)
    current = node.stash.get(SPEC_KEY, None) or llm_server.spec_for_checks or llm_server.spec
    probes = _server_probes(config, llm_server, current)
    check = DecodeCheck.for_run(config.stash[SETTINGS_KEY], server=llm_server, spec=current,
                                run_dir=config.stash[STATE_KEY].run_dir, test_id=node.nodeid, pool=_pool(config),
                                fail=_fail, skip=_skip, verbose=config.option.verbose,
                                record=report_hooks.oracle_recorder(node), probes=probes,
                                prefetched=prefetched(node, llm_server, probes))
    node.stash[DECODE_CHECK_KEY] = check
    return check


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """When a test's body returns, its decode_check reports the checks that reached no verdict (a skip that
    names each): a chain's skip never stops the checks after it, so it is raised here, after all of them. A
    body that raised (a failure) is reported as it is."""
    yield
    check = item.stash.get(DECODE_CHECK_KEY, None)
    if check is not None:
        check.finish()


@pytest.fixture
def llm_client(llm_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[LLMClient]:
    """A :class:`pytest_llmserve.evidence.client.LLMClient` for this test's server."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.collection import prefetched, suite_requests

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


def _server_probes(config: pytest.Config, server: RunningServer, spec: ServerSpec) -> ServerProbes:
    """This process's independent probes of ``server`` (see :mod:`pytest_llmserve.gates.prefetch`)."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.prefetch import server_probes

    return server_probes(config.stash[STATE_KEY].probes, server, spec, config.stash[SETTINGS_KEY].probe_concurrency)


def openai_client_options(server: RunningServer) -> dict[str, Any]:
    """How an openai SDK client reaches ``server``: its /v1 URL and key, its request timeout, no retries
    (a retried request would hide the failure a test is looking for)."""
    return {"base_url": server.base_url + "/v1", "api_key": server.spec.api_key or "EMPTY",
            "timeout": server.spec.request_timeout_s, "max_retries": 0}


@pytest.fixture
def llm_openai(llm_server: RunningServer) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` client for this test's server (use ``llm_server.model_name`` as the model)."""
    # lazy: the openai SDK takes ~0.57 s to import (-X importtime); only its fixtures need it
    import openai

    client = openai.OpenAI(**openai_client_options(llm_server))
    yield client
    client.close()


@pytest.fixture
def llm_async_openai(llm_server: RunningServer) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` client for this test's server, for async tests (anyio, pytest-asyncio).

    Its connections belong to the test's event loop, which is gone at teardown: ``async with`` it, or
    ``await llm_async_openai.close()``, to close them there.
    """
    # lazy: the openai SDK takes ~0.57 s to import (-X importtime); only its fixtures need it
    import openai

    return openai.AsyncOpenAI(**openai_client_options(llm_server))


@pytest.fixture
def llm_bench(llm_server: RunningServer, request: pytest.FixtureRequest) -> BenchFace:
    """Benchmark gate bound to this test's server and its ``llmserve_benchmark`` marker: ``llm_bench.run()``."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.bench_face import BenchFace
    from pytest_llmserve.gates.bench import BenchGate
    from pytest_llmserve.gates.preflight import save_command

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


def _key_test(node: pytest.Item) -> str:
    """The baseline key's test: file and function, the same whatever the rootdir."""
    return f"{node.path.name}::{getattr(node, 'originalname', node.name)}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A benchmark whose refusal follows from the configuration alone fails here, in set-up, before its
    ``llm_server`` fixture boots anything (see :func:`pytest_llmserve.gates.preflight.preflight_refusal`)."""
    if "llm_bench" not in getattr(item, "fixturenames", ()) or STATE_KEY not in item.config.stash:
        return
    spec = _item_spec(item)
    settings = item.config.stash[SETTINGS_KEY]
    if spec is None or settings.url:
        return
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.preflight import refusal_before_boot

    refusal, message = refusal_before_boot(spec, settings, _benchmark_spec(item, settings), key_test=_key_test(item),
                                           test_id=item.nodeid)
    if refusal is not None:
        item.user_properties.append(("llmserve_benchmark", refusal.to_json()))
        item.config.stash[STATE_KEY].outcomes.append(refusal)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture
def llm_ab(request: pytest.FixtureRequest) -> ABFace:
    """A/B of two configured server configurations in one run: ``llm_ab.run(a="id", b="id")``.

    Both servers stay up; rounds are interleaved A B A B; fails when B regressed against A.
    """
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.bench_face import ABFace
    from pytest_llmserve.gates.ab import ABRunner

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    runner = ABRunner(pool=_pool(config), cfg=settings.cfg, test_id=request.node.nodeid,
                      results_dir=settings.results_dir)
    return ABFace(runner, record=_outcome_recorder(request), say=lambda msg: _say(config, msg))


def _outcome_recorder(request: pytest.FixtureRequest) -> Callable[[BenchOutcome], None]:
    """Keep a benchmark outcome for the summary: in this process and, as JSON in user_properties, across xdist."""
    state = request.config.stash[STATE_KEY]

    def record(outcome: BenchOutcome) -> None:
        request.node.user_properties.append(("llmserve_benchmark", outcome.to_json()))
        state.outcomes.append(outcome)

    return record


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def _skip(message: str) -> None:
    pytest.skip(message)


# ---------------------------------------------------------------------------- reporting and teardown

def _item_server(item: pytest.Item) -> ServerHandle | None:
    """The launched server this item's test ran against, if any."""
    spec = item.stash.get(SPEC_KEY, None)
    pool = item.config.stash[STATE_KEY].pool
    return pool.launched_handle(spec) if spec is not None and pool is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    if STATE_KEY not in item.config.stash:
        return (yield)  # the run does not use llmserve
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks

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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    state = _used_state(config)
    if state is None or _is_worker(config):
        return
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks, xdist_hooks

    reports = [report for category in terminalreporter.stats.values() for report in category]
    outcomes, checks = report_hooks.session_verdicts(reports, state.outcomes)
    workers = xdist_hooks.workers_accounting(config)  # under xdist the servers were used in the workers
    session = config.stash.get(SESSION_KEY, None)
    completeness = None if session is None else report_hooks.run_completeness(
        reports, collected=session.testscollected, exitstatus=exitstatus, shouldfail=session.shouldfail,
        shouldstop=session.shouldstop, maxfail=config.option.maxfail)
    report_hooks.write_summary(terminalreporter, config.stash[SETTINGS_KEY], run_dir=state.run_dir,
                               host_reports=xdist_hooks.host_reports(config), outcomes=outcomes, checks=checks,
                               accounting=state.accounting if state.pool is not None or workers else None,
                               workers=workers, session_start=state.session_start, completeness=completeness)


@pytest.hookimpl(tryfirst=True)  # before the worker's report home is written
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    # The terminal summary comes after this hook and is not handed the session: whether it stopped early is there.
    config.stash[SESSION_KEY] = session
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        state.stop_servers(worker=_is_worker(config), say=lambda msg: _say(config, msg))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _used_state(config)
    if state is None:
        return
    state.finish(worker=_is_worker(config), say=lambda msg: _say(config, msg))
    previous = config.stash.get(SIGTERM_KEY, None)
    if previous is not None:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.session import restore_sigterm_handler

        restore_sigterm_handler(previous)
        del config.stash[SIGTERM_KEY]
