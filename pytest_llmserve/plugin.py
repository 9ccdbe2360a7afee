"""The pytest plugin: options, ini keys, markers, fixtures, hooks and the terminal summary.

This is the only module that imports pytest. It resolves settings once (precedence, lowest first:
ini < ``PYTEST_LLMSERVE_*`` environment < command line < marker), keeps its state in
``config.stash`` and hands plain dataclasses to the core.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import (
    BenchDefaults,
    LLMServeConfig,
    ServerSpec,
    load_config,
    parse_bool,
    parse_positive_float,
    parse_positive_int,
)
from pytest_llmserve.errors import ConfigError, LLMServeError, ServerError

# The built-in suite: every test_llmserve_*.py file here (named one by one, so the user's python_files
# and norecursedirs settings cannot drop any of them).
SUITE_DIR = Path(__file__).parent / "suite"

# Help texts shared between options and ini keys (pytest-timeout's *_DESC style).
SUITE_HELP = ("run the built-in suite (boot, config-is-execution, decode oracles, throughput gate) "
              "on every configured server")
SERVER_HELP = "server name(s) from [tool.llmserve.servers] to use (comma separated); default: all for the suite"
URL_HELP = "attach to an already-running OpenAI-compatible server at this URL instead of booting one"
CONFIG_HELP = "configuration file (default: llmserve.toml or pyproject.toml in the rootdir)"
SAVE_HELP = "save the measured samples as a new baseline record (append; old records are kept)"
BASELINE_DIR_HELP = "directory of the baseline store (default: baselines/ in the rootdir)"
TOLERANCE_HELP = "relative change of the gated metric that counts as a regression (default 0.05)"
ROUNDS_HELP = "benchmark rounds per side before the first verdict (default 3)"
MAX_ROUNDS_HELP = "most rounds per side when the verdict is inconclusive (default 6)"
WORKLOAD_HELP = "default workload of benchmarks without one in their marker (default smoke)"
METRIC_HELP = "default gated metric (default output_throughput)"
RESULTS_DIR_HELP = "where logs, reports, plots and result JSON are written (default llmserve-results/ in the rootdir)"
KILL_STALE_HELP = "kill servers left running by an earlier, interrupted run instead of refusing to boot"
ALLOW_CONFOUNDED_HELP = ("compare against a baseline whose context differs in more than the variable under test "
                         "(reported)")
BENCH_JSON_HELP = "also write results as pytest-benchmark compatible JSON to this path"

ENV_PREFIX = "PYTEST_LLMSERVE_"

MARKERS = {
    "gpu": "gpu: the test needs a GPU; skipped with a reason where none is visible",
    "llmserve_server": "llmserve_server(*names): run this test once per configuration of the named server(s) "
                       "(matrix combinations included); '*' means every configured server",
    "llmserve_correctness": "llmserve_correctness: a decode-correctness oracle test "
                            "(select with -m llmserve_correctness)",
    "llmserve_benchmark": "llmserve_benchmark(workload=None, *, metric=None, tolerance=None, rounds=None, "
                          "max_rounds=None, variable=None, higher_is_better=None, baseline_server=None, "
                          "baseline_test=None): a throughput/latency gate "
                          "against the stored baseline (of another server/test when baseline_server/baseline_test "
                          "name one, e.g. 'test_llmserve_suite.py::test_throughput'); runs on one xdist worker only",
}


@dataclass
class Settings:
    """Resolved plugin settings (not per-test)."""

    rootdir: Path
    cfg: LLMServeConfig
    servers: tuple[str, ...] | None
    url: str | None
    save_baseline: bool
    baseline_dir: Path
    results_dir: Path
    bench: BenchDefaults
    kill_stale: bool
    allow_confounded: bool
    bench_json: Path | None
    suite: bool


@dataclass
class RunState:
    """Per-process state: the server pool, benchmark outcomes, timing accounting."""

    run_dir: Path
    owns_run_dir: bool
    pool: Any = None
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    accounting: Any = None  # pytest_llmserve.gates.accounting.Accounting, from pytest_configure
    request_s: float = 0.0
    session_start: float = field(default_factory=time.monotonic)


SETTINGS_KEY = pytest.StashKey[Settings]()
STATE_KEY = pytest.StashKey[RunState]()
SPEC_KEY = pytest.StashKey[ServerSpec]()


# ---------------------------------------------------------------------------- options

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmserve", "LLM inference server fixtures, correctness oracles and benchmark gates")
    group.addoption("--llmserve-suite", action="store_true", default=False, help=SUITE_HELP)
    group.addoption("--llmserve-server", default=None, help=SERVER_HELP)
    group.addoption("--llmserve-url", default=None, help=URL_HELP)
    group.addoption("--llmserve-config", default=None, help=CONFIG_HELP)
    group.addoption("--llmserve-save-baseline", action="store_true", default=None, help=SAVE_HELP)
    group.addoption("--llmserve-baseline-dir", default=None, help=BASELINE_DIR_HELP)
    group.addoption("--llmserve-tolerance", default=None, help=TOLERANCE_HELP)
    group.addoption("--llmserve-rounds", default=None, help=ROUNDS_HELP)
    group.addoption("--llmserve-max-rounds", default=None, help=MAX_ROUNDS_HELP)
    group.addoption("--llmserve-workload", default=None, help=WORKLOAD_HELP)
    group.addoption("--llmserve-metric", default=None, help=METRIC_HELP)
    group.addoption("--llmserve-results-dir", default=None, help=RESULTS_DIR_HELP)
    group.addoption("--llmserve-kill-stale", action="store_true", default=None, help=KILL_STALE_HELP)
    group.addoption("--llmserve-allow-confounded", action="store_true", default=None, help=ALLOW_CONFOUNDED_HELP)
    group.addoption("--llmserve-benchmark-json", default=None, help=BENCH_JSON_HELP)
    parser.addini("llmserve_servers", SERVER_HELP, default=None)
    parser.addini("llmserve_baseline_dir", BASELINE_DIR_HELP, default=None)
    parser.addini("llmserve_tolerance", TOLERANCE_HELP, default=None)
    parser.addini("llmserve_rounds", ROUNDS_HELP, default=None)
    parser.addini("llmserve_max_rounds", MAX_ROUNDS_HELP, default=None)
    parser.addini("llmserve_workload", WORKLOAD_HELP, default=None)
    parser.addini("llmserve_metric", METRIC_HELP, default=None)
    parser.addini("llmserve_results_dir", RESULTS_DIR_HELP, default=None)


def _setting(config: pytest.Config, name: str) -> tuple[Any, str] | None:
    """Resolve one setting: CLI > environment > ini. Returns (value, where) or None."""
    cli = config.getoption(f"--llmserve-{name.replace('_', '-')}", default=None)
    if cli is not None:
        return cli, f"--llmserve-{name.replace('_', '-')}"
    env_name = ENV_PREFIX + name.upper()
    if os.environ.get(env_name) not in (None, ""):
        return os.environ[env_name], f"${env_name}"
    try:
        ini = config.getini(f"llmserve_{name}")
    except ValueError:
        ini = None
    if ini not in (None, "", []):
        return ini, f"ini llmserve_{name}"
    return None


def resolve_settings(config: pytest.Config) -> Settings:
    rootdir = Path(config.rootpath)
    from pytest_llmserve.engines import embedded

    cfg_opt = _setting(config, "config")
    if cfg_opt:
        path = Path(cfg_opt[0])
        if not path.is_file():
            raise ConfigError(f"{cfg_opt[1]} = {cfg_opt[0]!r}: no such file")
        from pytest_llmserve.config import config_from_table, find_config_file

        found = find_config_file(path.parent) if path.name in ("pyproject.toml", "llmserve.toml") else None
        if found is None or found[0].resolve() != path.resolve():
            import tomllib

            data = tomllib.loads(path.read_text())
            table = data.get("tool", {}).get("llmserve", data)
            cfg = config_from_table(table, str(path), embedded.default_spec)
        else:
            cfg = config_from_table(found[1], str(found[0]), embedded.default_spec)
    else:
        cfg = load_config(rootdir, embedded.default_spec)

    url = _setting(config, "url")
    servers_opt = _setting(config, "servers") or (
        (config.getoption("--llmserve-server"), "--llmserve-server") if config.getoption("--llmserve-server") else None)
    servers = None
    if servers_opt:
        servers = tuple(s.strip() for s in str(servers_opt[0]).split(",") if s.strip())
        for name in servers:
            if name != "*" and name not in {s.name for s in cfg.servers}:
                raise ConfigError(f"{servers_opt[1]} = {servers_opt[0]!r}: no server named {name!r} "
                                  f"(configured: {', '.join(s.name for s in cfg.servers)}; from {cfg.source})")
    if url:
        attach = ServerSpec(name="external", engine="external", url=str(url[0]), source=url[1],
                            api_key=os.environ.get("OPENAI_API_KEY") or None)
        cfg = replace(cfg, servers=(attach,), default_server="external", matrices={})
        servers = ("external",)

    def num(name: str, parser: Any, default: Any) -> Any:
        got = _setting(config, name)
        return default if got is None else parser(got[0], got[1])

    base = BenchDefaults()
    workload = _setting(config, "workload")
    if workload:
        cfg.workload(str(workload[0]), where=workload[1])
    bench = BenchDefaults(
        workload=str(workload[0]) if workload else base.workload,
        metric=str((_setting(config, "metric") or (base.metric, ""))[0]),
        tolerance=num("tolerance", parse_positive_float, base.tolerance),
        rounds=num("rounds", parse_positive_int, base.rounds),
        max_rounds=num("max_rounds", parse_positive_int, base.max_rounds),
    )
    if bench.max_rounds < bench.rounds:
        raise ConfigError(f"llmserve max_rounds = {bench.max_rounds} is below rounds = {bench.rounds}")
    baseline_dir = _setting(config, "baseline_dir")
    results_dir = _setting(config, "results_dir")
    save = _setting(config, "save_baseline")
    kill_stale = _setting(config, "kill_stale")
    confounded = _setting(config, "allow_confounded")
    bench_json = config.getoption("--llmserve-benchmark-json")
    return Settings(
        rootdir=rootdir,
        cfg=cfg,
        servers=servers,
        url=str(url[0]) if url else None,
        save_baseline=bool(save and (save[0] is True or parse_bool(str(save[0]), save[1]))),
        baseline_dir=(rootdir / str(baseline_dir[0])) if baseline_dir else rootdir / "baselines",
        results_dir=(rootdir / str(results_dir[0])) if results_dir else rootdir / "llmserve-results",
        bench=bench,
        kill_stale=bool(kill_stale and (kill_stale[0] is True or parse_bool(str(kill_stale[0]), kill_stale[1]))),
        allow_confounded=bool(confounded and (confounded[0] is True or parse_bool(str(confounded[0]), confounded[1]))),
        bench_json=Path(bench_json) if bench_json else None,
        suite=bool(config.getoption("--llmserve-suite")),
    )


# ---------------------------------------------------------------------------- configure

def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not _is_xdist_worker(config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    try:
        settings = resolve_settings(config)
    except LLMServeError as exc:
        raise pytest.UsageError(f"pytest-llmserve: {exc}") from None
    config.stash[SETTINGS_KEY] = settings
    if _is_xdist_controller(config) and getattr(config.option, "dist", None) == "load":
        # Benchmarks carry xdist_group("llmserve-bench"); loadgroup keeps them on one worker.
        config.option.dist = "loadgroup"
    if _is_xdist_worker(config):
        run_dir = Path(config.workerinput["llmserve_run_dir"])  # type: ignore[attr-defined]
        owns = False
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="llmserve-run-"))
        owns = True
    from pytest_llmserve.gates.accounting import Accounting

    config.stash[STATE_KEY] = RunState(run_dir=run_dir, owns_run_dir=owns, accounting=Accounting())
    if not _is_xdist_worker(config):
        _install_sigterm_handler(config)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "llmserve-xdist-hooks")
    if settings.suite:
        _add_suite(config)


SIGTERM_KEY = pytest.StashKey[Any]()


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

    def on_sigterm(signum: int, frame: Any) -> None:
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


class XdistHooks:
    """Registered only when pytest-xdist is installed: hands the run directory to the workers."""

    def pytest_configure_node(self, node: Any) -> None:
        state = node.config.stash[STATE_KEY]
        node.workerinput["llmserve_run_dir"] = str(state.run_dir)


def _pool(config: pytest.Config) -> Any:
    state = config.stash[STATE_KEY]
    if state.pool is None:
        from pytest_llmserve.server.pool import ServerPool

        settings = config.stash[SETTINGS_KEY]
        if settings.kill_stale:
            from pytest_llmserve.server.handle import kill_stale

            kill_stale(say=lambda msg: _say(config, msg))
        state.pool = ServerPool(state.run_dir, settings.results_dir / "logs", shared=_is_xdist_worker(config),
                                say=lambda msg: _say(config, msg))
        state.pool.accounting = state.accounting
    return state.pool


def _say(config: pytest.Config, msg: str) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and not _is_xdist_worker(config):
        tr.write_line(f"[llmserve] {msg}")
    else:
        print(f"[llmserve] {msg}", file=sys.stderr, flush=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return []
    specs = _selected_specs(settings, None)
    lines = [f"llmserve: config {settings.cfg.source}; servers: {', '.join(s.id for s in specs)}",
             f"llmserve: baselines {settings.baseline_dir}; results {settings.results_dir}; "
             f"workload {settings.bench.workload}, metric {settings.bench.metric}, "
             f"tolerance {settings.bench.tolerance}, "
             f"rounds {settings.bench.rounds}..{settings.bench.max_rounds}"]
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


def _marker_servers(item_or_metafunc: Any) -> tuple[str, ...] | None:
    definition = getattr(item_or_metafunc, "definition", item_or_metafunc)
    marker = definition.get_closest_marker("llmserve_server")
    if marker is None:
        return None
    names = tuple(str(a) for a in marker.args)
    if not names:
        raise pytest.UsageError(f"{definition.nodeid}: @pytest.mark.llmserve_server needs at least one server name")
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "llm_server" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash[SETTINGS_KEY]
    names = _marker_servers(metafunc)
    try:
        if names:
            for name in names:
                if name != "*":
                    settings.cfg.server(name)
        specs = _selected_specs(settings, names)
    except ConfigError as exc:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: marker llmserve_server: {exc}") from None
    # Parametrization comes from configuration only (never a live server), so every xdist worker
    # collects the same items in the same order.
    if "llmserve_batch_case" in metafunc.fixturenames:
        from pytest_llmserve.verdicts.oracles import coverage_plan

        pairs = []
        for spec in specs:
            sizes = spec.cuda_graph.batch_sizes if spec.cuda_graph and spec.cuda_graph.enabled else None
            for case in coverage_plan(None, sizes):
                pairs.append(pytest.param(spec, case, id=f"{spec.id}-{case.id}",
                                          marks=[pytest.mark.gpu] if spec.gpu else []))
        metafunc.parametrize(["llm_server", "llmserve_batch_case"], pairs, indirect=["llm_server"])
        return
    params = [pytest.param(spec, id=spec.id, marks=[pytest.mark.gpu] if spec.gpu else []) for spec in specs]
    metafunc.parametrize("llm_server", params, indirect=True, scope="function")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    settings = config.stash[SETTINGS_KEY]
    order: dict[str, int] = {s.id: i for i, s in enumerate(settings.cfg.all_specs())}
    gpu_reason = _gpu_skip_reason()
    for item in items:
        if item.get_closest_marker("gpu") and gpu_reason:
            item.add_marker(pytest.mark.skip(reason=gpu_reason))
        bench_marker = item.get_closest_marker("llmserve_benchmark")
        if bench_marker is not None:
            try:  # at collection, so a typo in a marker costs no server boot
                parse_benchmark_marker(bench_marker, settings, item.nodeid)
            except ConfigError as exc:
                raise pytest.UsageError(str(exc)) from None
        if bench_marker or "llm_ab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("llmserve-bench"))

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        idx, item = indexed
        spec = _item_spec(item)
        bench = 1 if item.get_closest_marker("llmserve_benchmark") else 0
        return (order.get(spec.id, -1) if spec else -1, bench, idx)

    # Stable sort by configuration so each one boots exactly once; benchmarks last within it.
    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def _item_spec(item: pytest.Item) -> ServerSpec | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("llm_server")
    return value if isinstance(value, ServerSpec) else None


_GPU_CACHE: list[str | None] = []


def _gpu_skip_reason() -> str | None:
    """None when a GPU is visible, else why ``gpu`` tests are skipped."""
    if _GPU_CACHE:
        return _GPU_CACHE[0]
    reason: str | None = None
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        reason = f"no GPU visible (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
    elif not shutil.which("nvidia-smi") and not Path("/dev/nvidia0").exists():
        reason = "no GPU visible (no nvidia-smi and no /dev/nvidia0)"
    else:
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode != 0 or "GPU" not in out.stdout:
                reason = f"no GPU visible (nvidia-smi -L: {out.stdout.strip() or out.stderr.strip()})"
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = f"no GPU visible (nvidia-smi failed: {exc})"
    _GPU_CACHE.append(reason)
    return reason


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def llmserve_config(pytestconfig: pytest.Config) -> LLMServeConfig:
    """The loaded configuration (servers, matrices, workloads)."""
    return pytestconfig.stash[SETTINGS_KEY].cfg


@pytest.fixture
def llm_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The running server (a :class:`pytest_llmserve.server.handle.ServerHandle`) for this test's configuration.

    Booted once per configuration per run and shared by every test (and xdist worker) that uses it.
    """
    config = request.config
    spec = getattr(request, "param", None)
    if spec is None:
        settings = config.stash[SETTINGS_KEY]
        spec = _selected_specs(settings, None)[0]
    pool = _pool(config)
    problem = None
    try:
        handle = pool.get(spec)
    except ServerError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    request.node.stash[SPEC_KEY] = spec
    yield handle
    if not handle.is_alive():
        # Fail the *next* users fast: the pool raises "server died" with the log tail for them.
        pass


@pytest.fixture
def decode_check(llm_server: Any, request: pytest.FixtureRequest) -> Any:
    """Decode oracles bound to this test's server: ``decode_check.no_nan().coherent()...``;
    ``decode_check.matches("other-server-id")`` boots that configuration beside this one as the reference."""
    from pytest_llmserve.gates.decode import DecodeCheck, resolve_reference_spec

    config = request.config
    current = (request.node.stash.get(SPEC_KEY, None) or getattr(llm_server, "spec_for_checks", None)
               or llm_server.spec)

    def reference_server(reference: Any) -> Any:
        spec = resolve_reference_spec(config.stash[SETTINGS_KEY].cfg, reference)
        pool = _pool(config)
        before = pool.max_alive
        pool.max_alive = max(before, 2)  # the reference and this server side by side, for this call only
        try:
            return pool.get(spec, keep=(current,))
        finally:
            pool.max_alive = before

    return DecodeCheck(llm_server, fail=_fail, skip=_skip, reference_server=reference_server)


@pytest.fixture
def llm_client(llm_server: Any) -> Iterator[Any]:
    """A :class:`pytest_llmserve.evidence.client.LLMClient` for this test's server."""
    client = llm_server.client()
    yield client
    client.close()


@pytest.fixture
def llm_bench(llm_server: Any, request: pytest.FixtureRequest) -> Any:
    """Benchmark gate bound to this test's server and its ``llmserve_benchmark`` marker: ``llm_bench.run()``."""
    from pytest_llmserve.gates.bench import BenchGate

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    spec_marker = request.node.get_closest_marker("llmserve_benchmark")
    try:
        options = parse_benchmark_marker(spec_marker, settings, request.node.nodeid)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None

    record = _outcome_recorder(request)

    return BenchGate(server=llm_server, cfg=settings.cfg, options=options, store_dir=settings.baseline_dir,
                     results_dir=settings.results_dir, save=settings.save_baseline,
                     allow_confounded=settings.allow_confounded, test_id=request.node.nodeid,
                     key_test=f"{request.node.path.name}::{getattr(request.node, 'originalname', request.node.name)}",
                     record=record, fail=_fail, pool=_pool(config), skip=_skip,
                     say=lambda msg: _say(config, msg))


@pytest.fixture
def llm_ab(request: pytest.FixtureRequest) -> Any:
    """A/B of two configured server configurations in one run: ``llm_ab.run(a="id", b="id")``.

    Both servers stay up; rounds are interleaved A B A B; fails when B regressed against A.
    """
    from pytest_llmserve.gates.bench import ABRunner

    config = request.config
    settings = config.stash[SETTINGS_KEY]

    record = _outcome_recorder(request)

    return ABRunner(pool=_pool(config), cfg=settings.cfg, test_id=request.node.nodeid,
                    results_dir=settings.results_dir, record=record, fail=_fail, say=lambda msg: _say(config, msg))


def _outcome_recorder(request: pytest.FixtureRequest) -> Any:
    """Keep a benchmark outcome for the summary: in this process and, via user_properties, across xdist."""
    state = request.config.stash[STATE_KEY]

    def record(outcome: dict[str, Any]) -> None:
        request.node.user_properties.append(("llmserve_benchmark", json.dumps(outcome, default=str)))
        state.outcomes.append(outcome)

    return record


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def _skip(message: str) -> None:
    pytest.skip(message)


def parse_benchmark_marker(marker: Any, settings: Settings, nodeid: str) -> dict[str, Any]:
    """Marker arguments, checked in one place; a bad one names the test and the value."""
    base = settings.bench
    out: dict[str, Any] = {"workload": base.workload, "metric": base.metric, "tolerance": base.tolerance,
                           "rounds": base.rounds, "max_rounds": base.max_rounds, "variable": None,
                           "higher_is_better": None, "alpha": base.alpha, "baseline_server": None,
                           "baseline_test": None}
    if marker is None:
        return out
    where = f"{nodeid}: marker llmserve_benchmark"
    if len(marker.args) > 1:
        raise ConfigError(f"{where}: takes at most one positional argument (the workload), got {marker.args!r}")
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("workload", marker.args[0])
    allowed = set(out)
    for key, value in kwargs.items():
        if key not in allowed:
            raise ConfigError(f"{where}: unknown argument {key}={value!r} (known: {', '.join(sorted(allowed))})")
        if key == "workload":
            settings.cfg.workload(str(value), where=where)
            out[key] = str(value)
        elif key == "tolerance":
            out[key] = parse_positive_float(value, f"{where} tolerance")
            if out[key] >= 1:
                raise ConfigError(f"{where} tolerance = {value!r}: must be a fraction below 1 (0.05 = 5%)")
        elif key in ("rounds", "max_rounds"):
            out[key] = parse_positive_int(value, f"{where} {key}")
        elif key == "higher_is_better":
            if not isinstance(value, bool):
                raise ConfigError(f"{where} higher_is_better = {value!r}: must be True or False")
            out[key] = value
        elif key == "metric":
            from pytest_llmserve.metrics import is_known

            if not is_known(str(value)):
                raise ConfigError(f"{where} metric = {value!r}: unknown metric")
            out[key] = str(value)
        else:
            out[key] = value
    if out["max_rounds"] < out["rounds"]:
        out["max_rounds"] = out["rounds"]
    return out


# ---------------------------------------------------------------------------- reporting and teardown

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and SPEC_KEY in item.stash:
        state = item.config.stash[STATE_KEY]
        pool = state.pool
        if pool is not None:
            for handle in pool.handles.values():
                if handle.spec.id == item.stash[SPEC_KEY].id and getattr(handle, "log_path", None):
                    # A request error is often a dead server: then say so, with the log's last lines.
                    death = handle.death_report() if hasattr(handle, "death_report") else None
                    report.sections.append(("llmserve: server died", death) if death
                                           else ("llmserve server log", f"{handle.describe()}"))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    settings = config.stash.get(SETTINGS_KEY, None)
    if state is None or settings is None or _is_xdist_worker(config):
        return
    from pytest_llmserve.server.pool import read_boots

    boots = read_boots(state.run_dir)
    outcomes = list(state.outcomes)
    for report in terminalreporter.getreports("passed") + terminalreporter.getreports("failed"):
        for name, value in getattr(report, "user_properties", []):
            if name == "llmserve_benchmark":
                outcome = json.loads(value)
                if outcome not in outcomes:
                    outcomes.append(outcome)
    if not boots and not outcomes:
        return
    terminalreporter.section("llmserve")
    wall = time.monotonic() - state.session_start
    boot_s = sum(float(b.get("boot_s") or 0) for b in boots)
    attached = [b for b in boots if b.get("launched") is False]
    boots = [b for b in boots if b.get("launched") is not False]
    ok = [b for b in boots if b.get("ok")]
    if boots:
        terminalreporter.write_line(
            f"server boots: {len(ok)} ({', '.join(b['server'] for b in ok)})"
            + (f"; failed boots: {len(boots) - len(ok)}" if len(ok) != len(boots) else ""))
    for b in boots:
        terminalreporter.write_line(f"  {b['server']}: boot {b.get('boot_s')} s, log {b.get('log')}")
    for b in attached:
        terminalreporter.write_line(f"attached (not booted, not stopped): {b['server']} at {b.get('url')}")
    if state.pool is not None and state.accounting is not None:
        from pytest_llmserve.gates.accounting import format_report

        terminalreporter.write_line("time: " + format_report(state.accounting.report()))
    if outcomes:
        from pytest_llmserve.gates.bench import render_outcomes

        for line in render_outcomes(outcomes, settings, state.run_dir, wall, boot_s).splitlines():
            terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.pool is None or _is_xdist_worker(config):
        return
    errors = state.pool.stop_all()
    for err in errors:
        _say(config, f"teardown problem: {err}")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    if state.pool is not None and not _is_xdist_worker(config):
        state.pool.stop_all()
    if state.owns_run_dir:
        from pytest_llmserve.server.pool import stop_shared_servers

        leftovers = stop_shared_servers(state.run_dir, say=lambda msg: _say(config, msg))
        if leftovers:
            _say(config, f"processes left after teardown: {', '.join(leftovers)}")
        shutil.rmtree(state.run_dir, ignore_errors=True)
    _restore_sigterm_handler(config)
