"""The pytest face of the package: options, ini keys, markers, fixtures, hooks and the terminal summary.

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

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

# The only module of the package imported with the plugin: a run that does not use llmserve pays for no more.
from pytest_llmserve.options import OPTIONS, Sources, may_hold_config

if TYPE_CHECKING:
    import openai

    from pytest_llmserve.config import LLMServeConfig, ServerSpec
    from pytest_llmserve.evidence.client import LLMClient
    from pytest_llmserve.gates.ab import ABRunner
    from pytest_llmserve.gates.accounting import Accounting
    from pytest_llmserve.gates.bench import BenchGate
    from pytest_llmserve.gates.decode import DecodeCheck
    from pytest_llmserve.gates.probes import AnswerBook, ServerProbes
    from pytest_llmserve.report.checks import CheckOutcome
    from pytest_llmserve.report.outcome import BenchOutcome
    from pytest_llmserve.server.handle import RunningServer, ServerHandle
    from pytest_llmserve.server.pool import ServerPool
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
                          "extend_budget_s=None, contention_bound=None): a throughput/latency gate "
                          "against the stored baseline (of another server/test when baseline_server/baseline_test "
                          "name one, e.g. 'test_llmserve_suite.py::test_throughput'); runs on one xdist worker only",
}
# What makes a collected item an llmserve item (the gpu marker alone only asks for the GPU probe).
LLMSERVE_MARKERS = ("llmserve_server", "llmserve_correctness", "llmserve_benchmark")
LLMSERVE_FIXTURES = frozenset({"llmserve_config", "llm_server", "llmserve_batch_case", "decode_check", "llm_client",
                               "llm_openai", "llm_async_openai", "llm_bench", "llm_ab"})

_INI_TYPES = {"flag": "bool", "string": "string", "int": "int", "float": "float"}


@dataclass
class RunState:
    """Per-process state: the server pool, benchmark outcomes, timing accounting."""

    run_dir: Path  # created by the first boot (ServerPool), removed by its owner at unconfigure
    owns_run_dir: bool
    accounting: Accounting
    host_local: bool = False  # a worker on another host: its own run directory; it stops what it boots
    pool: ServerPool | None = None
    outcomes: list[BenchOutcome] = field(default_factory=list)
    session_start: float = field(default_factory=time.monotonic)
    probes: dict[str, ServerProbes] = field(default_factory=dict)  # by server id: independent probes sent ahead


SETTINGS_KEY = pytest.StashKey["Settings"]()
STATE_KEY = pytest.StashKey[RunState]()  # set once the run uses llmserve (see _use)
SPEC_KEY = pytest.StashKey["ServerSpec"]()
SIGTERM_KEY = pytest.StashKey[Any]()  # the SIGTERM handler ours replaced
RUN_DIR_NAME_KEY = pytest.StashKey[Path]()  # the run directory's name, handed to xdist workers before use


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
        xdist_hooks.register(config, str(_run_dir_name(config)), lambda: _config_groups(_settings(config)),
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
        _add_suite(config)


def _is_worker(config: pytest.Config) -> bool:
    """An xdist worker (as :func:`pytest_llmserve.xdist_hooks.is_worker`, without importing that module)."""
    return hasattr(config, "workerinput")


def _is_xdist_controller(config: pytest.Config) -> bool:
    distributing = bool(getattr(config.option, "numprocesses", None)) or bool(getattr(config.option, "tx", None))
    return distributing and not _is_worker(config) and config.pluginmanager.hasplugin("xdist")


def _resolve_settings(config: pytest.Config, sources: Sources) -> Settings:
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.builds import install_builds
    from pytest_llmserve.engines import embedded
    from pytest_llmserve.errors import LLMServeError
    from pytest_llmserve.settings import resolve_settings

    try:
        settings = resolve_settings(Path(config.rootpath), sources, embedded.default_spec)
        # The builds the matrices want, installed now (cached): a step of its own, never the configuration's.
        settings = replace(settings, cfg=install_builds(settings.cfg))
    except LLMServeError as exc:
        raise pytest.UsageError(f"pytest-llmserve: {exc}") from None
    config.stash[SETTINGS_KEY] = settings
    return settings


def _settings(config: pytest.Config) -> Settings:
    _use(config)
    return config.stash[SETTINGS_KEY]


def _run_dir_name(config: pytest.Config) -> Path:
    """Only a name: the directory is made when a server boots (in this process or an xdist worker)."""
    if RUN_DIR_NAME_KEY not in config.stash:
        import tempfile
        import uuid

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
    from pytest_llmserve import xdist_hooks
    from pytest_llmserve.gates.accounting import Accounting

    host_local = False
    if _is_worker(config):
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.server.hosts import host_run_dir

        gateway = xdist_hooks.worker_gateway(config)
        run_dir, host_local = host_run_dir(xdist_hooks.worker_run_dir(config), settings.results_dir,
                                           remote=bool(gateway.get("remote")), label=str(gateway.get("label", "host")))
        owns = False
    else:
        run_dir, owns = _run_dir_name(config), True
    state = config.stash[STATE_KEY] = RunState(run_dir=run_dir, owns_run_dir=owns, accounting=Accounting(),
                                               host_local=host_local)
    if _is_worker(config):
        xdist_hooks.register_worker(config, state.accounting, lambda: state.run_dir)
        if xdist_hooks.distributes_by_config(config):
            config.pluginmanager.register(ConfigGroups(), "llmserve-config-groups")
        else:
            config.pluginmanager.register(ReferenceGroups(settings), "llmserve-reference-groups")
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


def _config_groups(settings: Settings) -> dict[str, str]:
    """Each configuration's server id -> its xdist group (how the controller places and names tests)."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.server.hosts import config_group

    return {spec.id: config_group(spec) for spec in settings.cfg.all_specs()}


def _start_using(config: pytest.Config) -> None:
    """What the plugin does once it is in use: guard the run's servers against SIGTERM (not on xdist
    workers: their controller stops the shared servers)."""
    if not _is_worker(config) and SIGTERM_KEY not in config.stash:
        _install_sigterm_handler(config)


def _install_sigterm_handler(config: pytest.Config) -> None:
    """SIGTERM (a CI cancel, ``timeout``, ``kill``) ends Python without any teardown, which would leave
    the servers running: turn it into KeyboardInterrupt, as pytest does with Ctrl-C, so sessionfinish and
    unconfigure stop them. Only where no one else handles SIGTERM; a repeated SIGTERM during that
    (bounded) shutdown is ignored so the teardown is not cut short."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    fired: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise KeyboardInterrupt("SIGTERM: stopping servers and ending the run")

    config.stash[SIGTERM_KEY] = signal.signal(signal.SIGTERM, on_sigterm)


def _restore_sigterm_handler(config: pytest.Config) -> None:
    import signal

    previous = config.stash.get(SIGTERM_KEY, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
        del config.stash[SIGTERM_KEY]


def _add_suite(config: pytest.Config) -> None:
    # The main suite file first: its boot test is the clearest first failure.
    files = sorted(SUITE_DIR.glob("test_llmserve_*.py"),
                   key=lambda p: (p.name != "test_llmserve_suite.py", p.name))
    suite = [str(path) for path in files]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.extend(path for path in suite if path not in config.args)
    else:
        config.args[:] = suite  # only the suite, not the rootdir's testpaths


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
    state = config.stash[STATE_KEY]
    if state.pool is None:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.server.pool import ServerPool

        settings = config.stash[SETTINGS_KEY]
        if settings.kill_stale:
            # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
            from pytest_llmserve.server.handle import kill_stale

            kill_stale(say=lambda msg: _say(config, msg))
        state.run_dir.mkdir(mode=0o700, parents=state.host_local, exist_ok=True)
        state.pool = ServerPool(state.run_dir, settings.results_dir / "logs", shared=_is_worker(config),
                                say=lambda msg: _say(config, msg), host_local=state.host_local)
        state.pool.accounting = state.accounting
    return state.pool


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
    specs = _selected_specs(settings, None)
    lines = [f"llmserve: config {settings.cfg.source}; servers: {', '.join(s.id for s in specs)}",
             f"llmserve: baselines {settings.baseline_dir}; results {settings.results_dir}; "
             f"workload {settings.bench.workload}, metric {settings.bench.metric}, "
             f"tolerance {settings.bench.tolerance}, "
             f"rounds {settings.bench.rounds}..{settings.bench.max_rounds} after up to "
             f"{settings.bench.warmup_rounds} warm-up (agreeing within {settings.bench.warmup_agreement:.0%}); "
             f"rounds with host contention above {settings.bench.contention_bound:.0%} are not samples"]
    attached = [s for s in specs if s.attached]
    if attached:
        lines.append("llmserve: attached, not launched by this run: "
                     + ", ".join(f"{s.id} at {s.url}" for s in attached))
    return lines


# ---------------------------------------------------------------------------- parametrization

def _selected_specs(settings: Settings, names: tuple[str, ...] | None) -> list[ServerSpec]:
    cfg = settings.cfg
    if names is None or "*" in names:
        wanted = settings.servers if settings.servers and "*" not in settings.servers else None
        if names is None and wanted is None and not settings.suite:
            wanted = (cfg.default_server,)
        names = wanted or tuple(s.name for s in cfg.servers)
    elif settings.servers and "*" not in settings.servers:
        names = tuple(n for n in names if n in settings.servers)
    out: list[ServerSpec] = []
    for name in names:
        out.extend(cfg.expanded(name))
    return out


def marker_server_names(marker: pytest.Mark | None, cfg: LLMServeConfig) -> tuple[str, ...] | None:
    """The server names of an ``llmserve_server`` marker (None: no marker), each a configured server or
    ``'*'``; a :class:`ConfigError` listing what is allowed otherwise."""
    if marker is None:
        return None
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.errors import ConfigError

    known = f"configured servers: {', '.join(s.name for s in cfg.servers)} or '*'; from {cfg.source}"
    if marker.kwargs:
        given = ", ".join(f"{key}={value!r}" for key, value in marker.kwargs.items())
        raise ConfigError(f"unknown keyword argument(s) {given}: it takes no keywords, only server names "
                          f"as positional arguments, e.g. llmserve_server('a', 'b') ({known})")
    if not marker.args:
        raise ConfigError(f"needs at least one server name ({known})")
    names: list[str] = []
    for arg in marker.args:
        if not isinstance(arg, str):
            raise ConfigError(f"{arg!r} is not a server name: pass names as separate strings ({known})")
        if arg != "*" and arg not in {s.name for s in cfg.servers}:
            raise ConfigError(f"unknown server {arg!r} ({known})")
        names.append(arg)
    return tuple(names)


# Usage errors found while parametrizing: raised from pytest_collection_modifyitems as one UsageError
# (a UsageError raised inside pytest_generate_tests becomes a collection error with a traceback).
MARKER_PROBLEMS_KEY = pytest.StashKey[list[str]]()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "llm_server" not in metafunc.fixturenames:
        return
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.errors import ConfigError

    settings = _settings(metafunc.config)
    try:
        names = marker_server_names(metafunc.definition.get_closest_marker("llmserve_server"), settings.cfg)
    except ConfigError as exc:
        metafunc.config.stash.setdefault(MARKER_PROBLEMS_KEY, []).append(
            f"{metafunc.definition.nodeid}: marker llmserve_server: {exc}")
        return
    specs = _selected_specs(settings, names)
    # Parametrization comes from configuration only (never a live server), so every xdist worker
    # collects the same items in the same order.
    if "llmserve_batch_case" in metafunc.fixturenames:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.verdicts.batch_sizes import coverage_plan

        pairs = []
        for spec in specs:
            sizes = spec.cuda_graph.batch_sizes if spec.cuda_graph and spec.cuda_graph.enabled else None
            for case in coverage_plan(None, sizes):
                pairs.append(pytest.param(spec, case, id=f"{spec.id}-{case.id}", marks=_gpu_marks(spec)))
        metafunc.parametrize(["llm_server", "llmserve_batch_case"], pairs, indirect=["llm_server"])
        return
    params = [pytest.param(spec, id=spec.id, marks=_gpu_marks(spec)) for spec in specs]
    metafunc.parametrize("llm_server", params, indirect=True, scope="function")


def _gpu_marks(spec: ServerSpec) -> list[pytest.MarkDecorator]:
    """``gpu = true``: the items need a GPU here (skipped where none is visible); not for a server attached
    by url, whose GPUs are on the host that runs it."""
    return [pytest.mark.gpu] if spec.gpu and not spec.attached else []


def _is_llmserve_item(item: pytest.Item) -> bool:
    return (not LLMSERVE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(name) is not None for name in LLMSERVE_MARKERS))


def _benchmark_spec(item: pytest.Item, settings: Settings) -> BenchSpec:
    """The item's benchmark gate; a bad marker argument is a usage error naming the test and the value."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.errors import ConfigError
    from pytest_llmserve.settings import bench_spec

    marker = item.get_closest_marker("llmserve_benchmark")
    args, kwargs = (tuple(marker.args), dict(marker.kwargs)) if marker is not None else ((), {})
    try:
        return bench_spec(settings, args, kwargs, where=f"{item.nodeid}: marker llmserve_benchmark")
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-llmserve: {exc}") from None


def _marker_problems(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """Every bad llmserve marker of the run (server names found while parametrizing, benchmark arguments
    checked here), so that a typo costs no server boot and all of them are shown at once."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.errors import ConfigError
    from pytest_llmserve.settings import bench_spec

    settings = config.stash[SETTINGS_KEY]
    problems: list[str] = list(config.stash.get(MARKER_PROBLEMS_KEY, None) or ())
    for item in items:
        marker = item.get_closest_marker("llmserve_benchmark")
        if marker is not None:
            try:
                bench_spec(settings, tuple(marker.args), dict(marker.kwargs),
                           where=f"{item.nodeid}: marker llmserve_benchmark")
            except ConfigError as exc:
                if str(exc) not in problems:  # once per test function, not per parametrization
                    problems.append(str(exc))
    return problems


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    llmserve_items = [item for item in items if _is_llmserve_item(item)]
    if not llmserve_items:
        return  # nothing of ours to check, mark, probe for or order (configured or not)
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import xdist_hooks

    settings = _settings(config)
    problems = _marker_problems(config, items)
    if problems:
        raise pytest.UsageError("\n".join(f"pytest-llmserve: {problem}" for problem in problems))
    _start_using(config)
    # The GPU probe is for llmserve's own items (a gpu = true server marks its items): a project's own
    # gpu-marked tests keep whatever the project does with its marker.
    gpu_items = [item for item in llmserve_items if item.get_closest_marker("gpu")]
    if not config.option.collectonly and gpu_items:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.server.gpu import no_gpu_reason

        gpu_reason = no_gpu_reason()
        if gpu_reason:
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason=gpu_reason))
    order: dict[str, int] = {s.id: i for i, s in enumerate(_run_order(settings.cfg))}
    by_config = xdist_hooks.distributes_by_config(config)
    for item in items:
        if by_config and _item_spec(item) is not None:
            continue  # grouped by configuration (ConfigGroups)
        bench_marker = item.get_closest_marker("llmserve_benchmark")
        if bench_marker or "llm_ab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("llmserve-bench"))
        elif settings.probe_concurrency != 1 and _independent(item):
            # One worker runs a server's independent probes, so they go out together once.
            spec = _item_spec(item)
            item.add_marker(pytest.mark.xdist_group(f"llmserve-probes-{order.get(spec.id, -1) if spec else -1}"))

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        idx, item = indexed
        spec = _item_spec(item)
        phase = 2 if item.get_closest_marker("llmserve_benchmark") else \
            1 if item.get_closest_marker("llmserve_after_traffic") else 0
        return (order.get(spec.id, -1) if spec else -1, phase, idx)

    # Stable sort by configuration so each one boots exactly once; within it the checks that read the traffic's
    # trace in the log (config is execution: graph use per batch size) come after that traffic, benchmarks last.
    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def _run_order(cfg: LLMServeConfig) -> list[ServerSpec]:
    """The configurations in the order they run: as configured, except that a matrix's declared reference
    combination comes first among its server's (its test_matches_reference records what the others replay)."""
    out: list[ServerSpec] = []
    for server in cfg.servers:
        combos = list(cfg.expanded(server.name))
        reference = cfg.reference_of(server.name)
        if reference is not None:
            combos.sort(key=lambda spec: spec.id != reference.id)
        out.extend(combos)
    return out


def _is_reference_differential(item: pytest.Item) -> bool:
    return (getattr(item, "originalname", None) == "test_matches_reference"
            and Path(str(item.path)).parent == SUITE_DIR)


class ReferenceGroups:
    """On each xdist worker (one host): a server's reference differentials (test_matches_reference) join one
    ``xdist_group``, so that under ``--dist loadgroup`` one worker runs them in the run's order, the reference
    combination first (it records what the others replay; without the group, a combination that comes first
    boots the reference and records it). First among the collection hooks, as for :class:`ConfigGroups`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            spec = _item_spec(item)
            if spec is not None and _is_reference_differential(item) and self.settings.cfg.reference_of(spec.name):
                item.add_marker(pytest.mark.xdist_group(f"llmserve-reference-{spec.name}"))


class ConfigGroups:
    """Across hosts, on each worker: every test of a configuration joins that configuration's
    ``xdist_group``, so one host runs (and boots) it, its benchmarks included (they run alone on the host
    that booted it; other hosts' benchmarks run on other machines). First among the collection hooks:
    pytest-xdist's worker reads the groups into the node ids in its own."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.server.hosts import config_group

        for item in items:
            spec = _item_spec(item)
            if spec is not None:
                item.add_marker(pytest.mark.xdist_group(config_group(spec)))


def _item_spec(item: pytest.Item) -> ServerSpec | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("llm_server")
    if value is None:
        return None
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.config import ServerSpec

    return value if isinstance(value, ServerSpec) else None


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
        spec = _selected_specs(config.stash[SETTINGS_KEY], None)[0]
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
    from pytest_llmserve.gates.decode import DecodeCheck, reference_plan, resolve_reference_spec

    config = request.config
    current = request.node.stash.get(SPEC_KEY, None) or llm_server.spec_for_checks or llm_server.spec

    def reference_server(reference: str | ServerSpec) -> RunningServer:
        spec = resolve_reference_spec(config.stash[SETTINGS_KEY].cfg, reference)
        pool = _pool(config)
        before = pool.max_alive
        pool.max_alive = max(before, 2)  # the reference and this server side by side, for this call only
        try:
            return pool.get(spec, keep=(current,))
        finally:
            pool.max_alive = before

    node = request.node
    assert isinstance(node, pytest.Item)

    def fail(message: str) -> None:
        # Noted for the run's benchmarks of this server (any xdist worker): their figures are not a pass.
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.gates.bench import record_correctness_failure

        record_correctness_failure(config.stash[STATE_KEY].run_dir, current.id, request.node.nodeid, message)
        _fail(message)

    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks

    probes = _server_probes(config, llm_server, current)
    settings = config.stash[SETTINGS_KEY]
    plan = reference_plan(settings.cfg, current, config.stash[STATE_KEY].run_dir, settings.reference_answers)
    return DecodeCheck(llm_server, fail=fail, skip=_skip, reference_server=reference_server,
                       verbose=config.option.verbose, record=report_hooks.oracle_recorder(node),
                       probes=probes, prefetched=_prefetched(node, llm_server, probes), reference_plan=plan)


@pytest.fixture
def llm_client(llm_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[LLMClient]:
    """A :class:`pytest_llmserve.evidence.client.LLMClient` for this test's server."""
    client = llm_server.client()
    node = request.node
    assert isinstance(node, pytest.Item)
    declared = _suite_requests(node)
    if declared is not None:
        client.request_kind = declared[0]
        if declared[1]:
            spec = node.stash.get(SPEC_KEY, None) or llm_server.spec_for_checks or llm_server.spec
            client.answers = _prefetched(node, llm_server, _server_probes(request.config, llm_server, spec))
    yield client
    client.close()


# ---------------------------------------------------------------------------- independent probes sent ahead

def _suite_requests(item: pytest.Item) -> tuple[str, bool] | None:
    """A built-in test's request kind and whether its probes are independent (see
    :func:`pytest_llmserve.suite.suite_requests`); None for other tests."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.suite import SUITE_REQUESTS_ATTR

    declared = getattr(getattr(item, "obj", None), SUITE_REQUESTS_ATTR, None)
    return declared if isinstance(declared, tuple) else None


def _independent(item: pytest.Item) -> bool:
    declared = _suite_requests(item)
    return declared is not None and declared[1]


def _server_probes(config: pytest.Config, server: RunningServer, spec: ServerSpec) -> ServerProbes:
    """This process's independent probes of ``server``, bounded by its batch capacity (made once)."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.probes import ServerProbes, concurrency_bound

    state = config.stash[STATE_KEY]
    probes = state.probes.get(spec.id)
    if probes is None or probes.server is not server:
        requested = config.stash[SETTINGS_KEY].probe_concurrency
        reported = None
        if requested != 1 and not spec.max_batch_size:
            reported = getattr(server.facts(), "max_batch_size", None)
        probes = ServerProbes(server, concurrency_bound(requested, spec.max_batch_size, reported))
        state.probes[spec.id] = probes
    return probes


def _prefetched(item: pytest.Item, server: RunningServer, probes: ServerProbes) -> AnswerBook | None:
    """This test's answers sent ahead. The first independent test of a server plans and sends, together,
    the probes of every independent test of that server this process will run (under xdist: those of its
    xdist group, which loadgroup keeps on one worker; else its own), by running each once against a
    recording client; later ones find theirs waiting."""
    if not probes.together or not _independent(item):
        return None
    if item.nodeid not in probes.planned_items:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.gates.probes import plan

        plans = {}
        for other in _prefetch_scope(item):
            declared = _suite_requests(other)
            if other.nodeid not in probes.planned_items and declared is not None:
                plans[other.nodeid] = plan(functools.partial(_dry_run, other, server), server.model_name,
                                           declared[0])
        probes.prefetch(plans)
    return probes.answers_for(item.nodeid)


def _prefetch_scope(item: pytest.Item) -> list[pytest.Item]:
    spec = _item_spec(item)
    config = item.config
    if _is_worker(config) and getattr(config.option, "dist", None) != "loadgroup":
        return [item]  # which of the others this worker will run is not known here
    group = _probe_group(item)
    return [other for other in item.session.items
            if _independent(other) and _item_spec(other) == spec and _probe_group(other) == group]


def _probe_group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else None


def _dry_run(item: pytest.Item, server: RunningServer, recorder: LLMClient) -> None:
    """Run a built-in test's function once against ``recorder`` (its Hypothesis examples included: the
    same derandomized draws as the real run): what it would send is recorded, nothing is judged."""
    import inspect

    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.decode import DecodeCheck

    def ignore(message: str) -> None:
        pass

    planning = {"llm_server": server, "llm_client": recorder,
                "decode_check": DecodeCheck(server, fail=ignore, skip=ignore, planning=recorder)}
    function = getattr(item, "obj", None)
    if function is None:
        return
    names = list(inspect.signature(function).parameters)
    if all(name in planning for name in names):
        function(**{name: planning[name] for name in names})


def openai_client_options(server: RunningServer) -> dict[str, Any]:
    """How an openai SDK client reaches ``server``: its /v1 URL and key, its request timeout, no retries
    (a retried request would hide the failure a test is looking for)."""
    return {"base_url": server.base_url + "/v1", "api_key": server.spec.api_key or "EMPTY",
            "timeout": server.spec.request_timeout_s, "max_retries": 0}


@pytest.fixture
def llm_openai(llm_server: RunningServer) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` client for this test's server (use ``llm_server.model_name`` as the model)."""
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
    import openai

    return openai.AsyncOpenAI(**openai_client_options(llm_server))


@pytest.fixture
def llm_bench(llm_server: RunningServer, request: pytest.FixtureRequest) -> BenchGate:
    """Benchmark gate bound to this test's server and its ``llmserve_benchmark`` marker: ``llm_bench.run()``."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.bench import BenchGate, correctness_failures
    from pytest_llmserve.gates.preflight import save_command

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    node = request.node
    assert isinstance(node, pytest.Item)
    spec = node.stash.get(SPEC_KEY, None) or llm_server.spec
    run_dir = config.stash[STATE_KEY].run_dir
    command = save_command(config.invocation_params.args, nodeid=node.nodeid,
                           test_name=getattr(node, "originalname", node.name), server_name=spec.name,
                           suite=SUITE_DIR in node.path.parents)
    return BenchGate(server=llm_server, cfg=settings.cfg, options=_benchmark_spec(node, settings),
                     store_dir=settings.baseline_dir, results_dir=settings.results_dir, save=settings.save_baseline,
                     allow_confounded=settings.allow_confounded, allow_host_change=settings.allow_host_change,
                     test_id=node.nodeid,
                     key_test=_key_test(node), record=_outcome_recorder(request), fail=_fail, pool=_pool(config),
                     skip=_skip, say=lambda msg: _say(config, msg), inconclusive=settings.inconclusive,
                     record_command=command,
                     correctness_failed=lambda server_id: correctness_failures(run_dir, server_id))


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
    from pytest_llmserve.errors import LLMServeError
    from pytest_llmserve.gates.preflight import preflight_refusal

    try:
        refusal = preflight_refusal(spec=spec, cfg=settings.cfg, options=_benchmark_spec(item, settings),
                                    store_dir=settings.baseline_dir, key_test=_key_test(item), test_id=item.nodeid,
                                    save=settings.save_baseline, allow_confounded=settings.allow_confounded,
                                    allow_host_change=settings.allow_host_change,
                                    results_dir=settings.results_dir)
    except LLMServeError as exc:
        refusal = None
        message = f"{item.nodeid}: {exc}"
    else:
        message = (refusal.note or "") if refusal else ""
    if refusal is not None:
        item.user_properties.append(("llmserve_benchmark", refusal.to_json()))
        item.config.stash[STATE_KEY].outcomes.append(refusal)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture
def llm_ab(request: pytest.FixtureRequest) -> ABRunner:
    """A/B of two configured server configurations in one run: ``llm_ab.run(a="id", b="id")``.

    Both servers stay up; rounds are interleaved A B A B; fails when B regressed against A.
    """
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.gates.ab import ABRunner

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    return ABRunner(pool=_pool(config), cfg=settings.cfg, test_id=request.node.nodeid,
                    results_dir=settings.results_dir, record=_outcome_recorder(request), fail=_fail,
                    say=lambda msg: _say(config, msg))


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
    if spec is None or pool is None:
        return None
    for handle in pool.handles.values():
        if handle.spec.id == spec.id and handle.log_path:
            return handle
    return None


def server_death_failure(death: str, error: str) -> str:
    """A test's failure when its server died under it, in the style of the tests after it (whose
    ``llm_server`` setup fails with ``death``): who died and how, the test's own error in one line, then
    the log's last lines once; the traceback into the client would only show where the socket closed."""
    head, _, tail = death.partition("\n")
    first = error.strip().splitlines()[0] if error.strip() else "?"
    return f"{head}\nthe test failed with: {first}" + (f"\n{tail}" if tail else "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    if STATE_KEY not in item.config.stash:
        return (yield)  # the run does not use llmserve
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks

    server = _item_server(item) if call.excinfo is not None and call.when == "call" else None
    death = server.death_report() if server is not None else None
    if death is not None and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        try:
            pytest.fail(server_death_failure(death, f"{call.excinfo.typename}: {call.excinfo.value}"),
                        pytrace=False)
        except pytest.fail.Exception:
            call.excinfo = pytest.ExceptionInfo.from_current()
    report = yield
    spec = item.stash.get(SPEC_KEY, None) or _item_spec(item)
    report_hooks.record_verdict(item, call, report, spec.id if spec else None, SUITE_DIR)
    if report.failed and death is None and call.when == "call":
        server = _item_server(item)
        if server is not None and server.log_path is not None:
            # The server is up: its last lines often say why a request failed.
            # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
            from pytest_llmserve.server.handle import LOG_TAIL_LINES, read_tail, redact_text, secret_values

            # Masked as in a death report: some engines print their arguments, an API key included.
            tail = redact_text(read_tail(server.log_path),
                               secret_values(server.spec, server.plan.argv if server.plan else None))
            report.sections.append(("llmserve server log",
                                    f"{server.describe()}\n--- last {LOG_TAIL_LINES} lines ---\n{tail}"))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    state = _used_state(config)
    if state is None or _is_worker(config):
        return
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import xdist_hooks
    from pytest_llmserve.gates.accounting import Accounting
    from pytest_llmserve.server.pool import read_boots

    settings = config.stash[SETTINGS_KEY]

    host_reports = xdist_hooks.host_reports(config)
    # Across hosts the boots were recorded in each host's own run directory and came home with its report.
    boots = read_boots(state.run_dir) + [boot for r in host_reports.values() for boot in r.boots
                                         if boot not in read_boots(state.run_dir)]
    outcomes, checks = _session_verdicts(terminalreporter, state)
    by_host = _rows_by_host(terminalreporter, settings, host_reports) if host_reports else []
    if not boots and not outcomes and not checks and not by_host:
        return
    terminalreporter.section("llmserve")
    if by_host:
        terminalreporter.write_line("configurations by host:")
        for row in by_host:
            terminalreporter.write_line("  " + row.line())
        settings.results_dir.mkdir(parents=True, exist_ok=True)
        (settings.results_dir / "hosts.json").write_text(json.dumps([row.to_dict() for row in by_host], indent=2))
    wall = time.monotonic() - state.session_start
    # Attached servers (launched elsewhere) are not boots: each xdist worker records its own attachment.
    attached = list({b["server"]: b for b in boots if b.get("launched") is False}.values())
    boots = [b for b in boots if b.get("launched") is not False]
    boot_s = sum(float(b.get("boot_s") or 0) for b in boots)
    ok = [b for b in boots if b.get("ok")]
    if boots or attached:
        terminalreporter.write_line(
            f"server boots: {len(ok)}" + (f" ({', '.join(b['server'] for b in ok)})" if ok else "")
            + (f"; failed boots: {len(boots) - len(ok)}" if len(ok) != len(boots) else ""))
    for b in boots:
        terminalreporter.write_line(f"  {b['server']}: boot {b.get('boot_s')} s, log {b.get('log')}")
    for b in attached:
        terminalreporter.write_line(
            f"attached: {b['server']} at {b.get('url')}, not launched by this run (nor stopped by it)"
            + (f"; log {b['log']}" if b.get("log") else "")
            + ("" if b.get("ok") else f"; not ready: {b.get('error')}"))
    workers = xdist_hooks.workers_accounting(config)  # under xdist the servers were used in the workers
    if state.pool is not None or workers:
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.gates.accounting import format_report, report

        snapshot = Accounting.merge([state.accounting.snapshot(), *workers])
        terminalreporter.write_line("time: " + format_report(report(snapshot)))
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.report.session import render_session
    from pytest_llmserve.store.reference_answers import DIR_NAME

    # A matrix reference's answers, recorded in the run's shared directory (removed at the end), kept with
    # the run's reports, where --llmserve-reference-answers can name them in a later run.
    recorded = sorted((state.run_dir / DIR_NAME).glob("*.json")) if (state.run_dir / DIR_NAME).is_dir() else []
    for line in render_session(outcomes, checks, settings.results_dir, bench_json=settings.bench_json,
                               wall_s=wall, boot_s=boot_s,
                               files=[(f"{DIR_NAME}/{path.name}", path) for path in recorded]).splitlines():
        terminalreporter.write_line(line)


def _rows_by_host(terminalreporter: pytest.TerminalReporter, settings: Settings,
                  host_reports: dict[str, Any]) -> list[Any]:
    """Per configuration run on a remote host: that host, its boots and the verdicts of its tests."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve.server.hosts import merge_by_config, server_of_nodeid

    if not any(report.label != "localhost" for report in host_reports.values()):
        return []
    groups = _config_groups(settings)
    outcomes = []
    for category in terminalreporter.stats.values():
        for report in category:
            node = getattr(report, "node", None)
            when = getattr(report, "when", None)
            # "???": pytest-xdist's report of the test a worker was running when it went down.
            decided = when in ("call", "???") or (when == "setup" and not getattr(report, "passed", True))
            server = server_of_nodeid(str(getattr(report, "nodeid", "")), groups) if decided else None
            if server is not None and node is not None:
                outcomes.append((server, str(node.gateway.id), str(report.outcome)))
    return merge_by_config(groups, outcomes, host_reports)


def _session_verdicts(terminalreporter: pytest.TerminalReporter,
                      state: RunState) -> tuple[list[BenchOutcome], list[CheckOutcome]]:
    """Every benchmark record and check row of the session: from the reports (which, under xdist, come
    from the workers) and the benchmark records made in this process."""
    # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
    from pytest_llmserve import report_hooks

    reports = [report for category in terminalreporter.stats.values() for report in category]
    benches, checks = report_hooks.collected(reports)
    outcomes = list(state.outcomes)
    # This process's outcomes came back in its reports too: one row each (the JSON is the record's identity).
    kept = {outcome.to_json() for outcome in outcomes}
    outcomes += [record for record in benches if record.to_json() not in kept]
    return outcomes, checks


@pytest.hookimpl(tryfirst=True)  # before the worker's report home is written
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(STATE_KEY, None)
    if state is not None and state.pool is not None and state.host_local:
        # A worker on another host: the controller cannot reach its servers, so it stops them itself.
        for err in state.pool.stop_owned():
            _say(config, f"teardown problem: {err}")
        return
    if state is None or state.pool is None or _is_worker(config):
        return
    errors = state.pool.stop_all()
    for err in errors:
        _say(config, f"teardown problem: {err}")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _used_state(config)
    if state is None:
        return
    if state.pool is not None and not _is_worker(config):
        state.pool.stop_all()
    if state.owns_run_dir and state.run_dir.exists():
        # lazy: the plugin imports only options.py until a run uses it (tests/plugin/test_inert.py)
        from pytest_llmserve.server.pool import stop_shared_servers

        leftovers = stop_shared_servers(state.run_dir, say=lambda msg: _say(config, msg))
        if leftovers:
            _say(config, f"processes left after teardown: {', '.join(leftovers)}")
        import shutil

        shutil.rmtree(state.run_dir, ignore_errors=True)
    _restore_sigterm_handler(config)
