"""The pytest side of collection: which server configurations a test runs against, the markers checked
before anything boots, and the collected items marked, grouped and ordered.

* **Parametrization** (:func:`parametrize`) comes from the configuration only (never a live server), so
  every xdist worker collects the same items in the same order.
* **Markers**: a bad ``llmserve_server`` or ``llmserve_benchmark`` argument is found while collecting and
  reported once, with every other (:func:`marker_problems`), so a typo costs no server boot.
* **Order** (:func:`order_items`): by configuration (each boots once), a matrix's reference combination
  first among its server's; within one, the checks that read the traffic's trace after that traffic,
  benchmarks last. Benchmarks share one ``xdist_group``; a server's independent probes share one too, so
  one worker sends them together (:mod:`pytest_llmserve.gates.prefetch`, handed each test's plain data
  here by :func:`prefetched`).
* **The header** (:func:`header_lines`): the configurations selected and the benchmark gate's settings.

The plugin's face (:mod:`pytest_llmserve.face`) calls this once a run uses llmserve; the configuration's
decisions it applies are plain data (:mod:`pytest_llmserve.config`, :mod:`pytest_llmserve.settings`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmserve import xdist_hooks
from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates import prefetch
from pytest_llmserve.gates.probes import AnswerBook, ServerProbes
from pytest_llmserve.server.gpu import no_gpu_reason
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.server.hosts import config_group
from pytest_llmserve.settings import BenchSpec, Settings, bench_spec
from pytest_llmserve.suite import SUITE_REQUESTS_ATTR
from pytest_llmserve.verdicts.batch_sizes import coverage_plan

# Usage errors found while parametrizing: raised from pytest_collection_modifyitems as one UsageError
# (a UsageError raised inside pytest_generate_tests becomes a collection error with a traceback).
MARKER_PROBLEMS_KEY = pytest.StashKey[list[str]]()


def add_suite(config: pytest.Config, suite_dir: Path) -> None:
    """The built-in suite's files, named one by one, added to the run's arguments (with none given, they
    are the run: not the rootdir's testpaths)."""
    # The main suite file first: its boot test is the clearest first failure.
    files = sorted(suite_dir.glob("test_llmserve_*.py"),
                   key=lambda p: (p.name != "test_llmserve_suite.py", p.name))
    suite = [str(path) for path in files]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.extend(path for path in suite if path not in config.args)
    else:
        config.args[:] = suite  # only the suite, not the rootdir's testpaths


# ---------------------------------------------------------------------------- parametrization

def selected_specs(settings: Settings, names: tuple[str, ...] | None) -> list[ServerSpec]:
    """The configurations a test runs against: those of the marker's ``names`` (None: no marker, the
    default server, or every server for the suite), narrowed to ``--llmserve-server``'s."""
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


def header_lines(settings: Settings) -> list[str]:
    """The run's header lines: the configuration, the servers selected, where baselines and results go,
    the benchmark gate's settings, and the servers attached rather than launched."""
    specs = selected_specs(settings, None)
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
    if settings.strict:
        lines.append("llmserve: strict mode: unverifiable, undeclared not applicable, no baseline, inconclusive and "
                     "confounded fail")
    return lines


def marker_server_names(marker: pytest.Mark | None, cfg: LLMServeConfig) -> tuple[str, ...] | None:
    """The server names of an ``llmserve_server`` marker (None: no marker), each a configured server or
    ``'*'``; a :class:`ConfigError` listing what is allowed otherwise."""
    if marker is None:
        return None
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


def parametrize(metafunc: pytest.Metafunc, settings: Settings) -> None:
    """A test that uses ``llm_server``: one item per selected configuration (per batch-size case too, for
    ``llmserve_batch_case``); a bad ``llmserve_server`` marker is kept for :func:`marker_problems`."""
    try:
        names = marker_server_names(metafunc.definition.get_closest_marker("llmserve_server"), settings.cfg)
    except ConfigError as exc:
        metafunc.config.stash.setdefault(MARKER_PROBLEMS_KEY, []).append(
            f"{metafunc.definition.nodeid}: marker llmserve_server: {exc}")
        return
    specs = selected_specs(settings, names)
    # Parametrization comes from configuration only (never a live server), so every xdist worker
    # collects the same items in the same order.
    if "llmserve_batch_case" in metafunc.fixturenames:
        pairs = []
        for spec in specs:
            sizes = spec.cuda_graph.batch_sizes if spec.cuda_graph and spec.cuda_graph.enabled else None
            for case in coverage_plan(None, sizes):
                pairs.append(pytest.param(spec, case, id=f"{spec.id}-{case.id}", marks=gpu_marks(spec)))
        metafunc.parametrize(["llm_server", "llmserve_batch_case"], pairs, indirect=["llm_server"])
        return
    params = [pytest.param(spec, id=spec.id, marks=gpu_marks(spec)) for spec in specs]
    metafunc.parametrize("llm_server", params, indirect=True, scope="function")


def gpu_marks(spec: ServerSpec) -> list[pytest.MarkDecorator]:
    """``gpu = true``: the items need a GPU here (skipped where none is visible); not for a server attached
    by url, whose GPUs are on the host that runs it."""
    return [pytest.mark.gpu] if spec.gpu and not spec.attached else []


def item_spec(item: pytest.Item) -> ServerSpec | None:
    """The configuration an item was parametrized with (None: it does not use ``llm_server``)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("llm_server")
    if value is None:
        return None
    return value if isinstance(value, ServerSpec) else None


# ---------------------------------------------------------------------------- markers checked

def benchmark_spec(item: pytest.Item, settings: Settings) -> BenchSpec:
    """The item's benchmark gate; a bad marker argument is a usage error naming the test and the value."""
    marker = item.get_closest_marker("llmserve_benchmark")
    args, kwargs = (tuple(marker.args), dict(marker.kwargs)) if marker is not None else ((), {})
    try:
        return bench_spec(settings, args, kwargs, where=f"{item.nodeid}: marker llmserve_benchmark")
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-llmserve: {exc}") from None


def marker_problems(config: pytest.Config, items: list[pytest.Item], settings: Settings) -> list[str]:
    """Every bad llmserve marker of the run (server names found while parametrizing, benchmark arguments
    checked here), so that a typo costs no server boot and all of them are shown at once."""
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


def skip_without_gpu(llmserve_items: list[pytest.Item]) -> None:
    """llmserve's own items marked ``gpu`` (a gpu = true server marks its items) are skipped, with the
    reason, where no GPU is visible; a project's own gpu-marked tests keep whatever the project does."""
    gpu_items = [item for item in llmserve_items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    gpu_reason = no_gpu_reason()
    if gpu_reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=gpu_reason))


# ---------------------------------------------------------------------------- grouped and ordered

def order_items(config: pytest.Config, items: list[pytest.Item], settings: Settings) -> None:
    """Mark the xdist groups (benchmarks on one worker, a server's independent probes on one worker; across
    hosts :func:`mark_worker_groups` has grouped by configuration instead) and sort ``items`` in place."""
    order: dict[str, int] = {s.id: i for i, s in enumerate(run_order(settings.cfg))}
    by_config = xdist_hooks.distributes_by_config(config)
    for item in items:
        if by_config and item_spec(item) is not None:
            continue  # grouped by configuration (mark_worker_groups)
        bench_marker = item.get_closest_marker("llmserve_benchmark")
        if bench_marker or "llm_ab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("llmserve-bench"))
        elif settings.probe_concurrency != 1 and independent(item):
            # One worker runs a server's independent probes, so they go out together once.
            spec = item_spec(item)
            item.add_marker(pytest.mark.xdist_group(f"llmserve-probes-{order.get(spec.id, -1) if spec else -1}"))

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        idx, item = indexed
        spec = item_spec(item)
        phase = 2 if item.get_closest_marker("llmserve_benchmark") else \
            1 if item.get_closest_marker("llmserve_after_traffic") else 0
        return (order.get(spec.id, -1) if spec else -1, phase, idx)

    # Stable sort by configuration so each one boots exactly once; within it the checks that read the traffic's
    # trace in the log (config is execution: graph use per batch size) come after that traffic, benchmarks last.
    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def run_order(cfg: LLMServeConfig) -> list[ServerSpec]:
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


def mark_worker_groups(config: pytest.Config, items: list[pytest.Item], settings: Settings, suite_dir: Path) -> None:
    """On an xdist worker, first among the collection hooks (pytest-xdist's worker reads the groups into the node ids
    in its own): the groups that keep tests together on one worker.

    * Across hosts, every test of a configuration joins that configuration's ``xdist_group``, so one host runs
      (and boots) it, its benchmarks included (they run alone on the host that booted it; other hosts' benchmarks
      run on other machines).
    * On one host, a server's reference differentials (test_matches_reference) join one ``xdist_group``, so that
      under ``--dist loadgroup`` one worker runs them in the run's order, the reference combination first (it
      records what the others replay; without the group, a combination that comes first boots the reference and
      records it).
    """
    by_config = xdist_hooks.distributes_by_config(config)
    for item in items:
        spec = item_spec(item)
        if spec is None:
            continue
        if by_config:
            item.add_marker(pytest.mark.xdist_group(config_group(spec)))
        elif (getattr(item, "originalname", None) == "test_matches_reference"
              and Path(str(item.path)).parent == suite_dir and settings.cfg.reference_of(spec.name)):
            item.add_marker(pytest.mark.xdist_group(f"llmserve-reference-{spec.name}"))


# ---------------------------------------------------------------------------- independent probes sent ahead

def suite_requests(item: pytest.Item) -> tuple[str, bool] | None:
    """A built-in test's request kind and whether its probes are independent (see
    :func:`pytest_llmserve.suite.suite_requests`); None for other tests."""
    declared = getattr(getattr(item, "obj", None), SUITE_REQUESTS_ATTR, None)
    return declared if isinstance(declared, tuple) else None


def independent(item: pytest.Item) -> bool:
    declared = suite_requests(item)
    return declared is not None and declared[1]


def prefetched(item: pytest.Item, server: RunningServer, probes: ServerProbes) -> AnswerBook | None:
    """This test's answers sent ahead (:func:`pytest_llmserve.gates.prefetch.prefetched`), planned together
    with those of every independent test of the server this process will run (under xdist: those of its
    xdist group, which loadgroup keeps on one worker; else its own)."""
    if not independent(item):
        return None
    return prefetch.prefetched(probes, item.nodeid, server, lambda: _prefetch_scope(item))


def _prefetch_scope(item: pytest.Item) -> list[prefetch.ProbeTest]:
    """The independent tests whose probes go out with ``item``'s: of its server and xdist group."""
    config = item.config
    if xdist_hooks.is_worker(config) and getattr(config.option, "dist", None) != "loadgroup":
        scope = [item]  # which of the others this worker will run is not known here
    else:
        spec, group = item_spec(item), _probe_group(item)
        scope = [other for other in item.session.items
                 if independent(other) and item_spec(other) == spec and _probe_group(other) == group]
    tests = []
    for other in scope:
        declared = suite_requests(other)
        if declared is not None:
            tests.append(prefetch.ProbeTest(other.nodeid, getattr(other, "obj", None), declared[0]))
    return tests


def _probe_group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else None
