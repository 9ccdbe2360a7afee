"""The plugin's settings, resolved once, and the typed benchmark spec a test's marker makes of them.

Every setting has three spellings: an ini key (``llmserve_tolerance`` in ``[tool.pytest.ini_options]``
or pytest.ini), an environment variable (``PYTEST_LLMSERVE_TOLERANCE``) and a command-line option
(``--llmserve-tolerance``), with one help text (:data:`OPTIONS`). The benchmark defaults
(:data:`pytest_llmserve.config.BENCH_KEYS`: workload, metric, tolerance, rounds, max_rounds, alpha,
warmup_rounds, warmup_agreement, extend_to_resolve, extend_budget_s,
contention_bound) may
also be written in the configuration file's ``[tool.llmserve.bench]`` table. Precedence, lowest first::

    ini  <  [tool.llmserve.bench]  <  environment (PYTEST_LLMSERVE_*)  <  command line (--llmserve-*)  <  marker

as pytest-timeout does for its three. The bench table outranks the ini because it sits beside the servers
and workloads it gates (and a ``--llmserve-config`` file chosen for a run brings its own defaults); the
environment and the command line are per-run overrides, the marker is per test. The first four are
resolved once per run into a frozen :class:`Settings`; the marker (``llmserve_benchmark(...)``) is
applied per test by :func:`bench_spec`, which turns its arguments into a frozen :class:`BenchSpec`.

Each value obeys one rule whatever its source (a tolerance is a fraction below 1 on the command line as
in a marker), and every bad value raises :class:`ConfigError` naming the value, where it came from and
what is allowed (``--llmserve-tolerance = 2: must be a fraction below 1 (0.05 = 5%)``,
``$PYTEST_LLMSERVE_ROUNDS = '0': ...``, ``ini llmserve_max_rounds = 0: ...``,
``pyproject.toml: [tool.llmserve.bench] tolerance = -7: ...``,
``tests/test_x.py::test_y: marker llmserve_benchmark tolerance = 2: ...``).

Only the ``PYTEST_LLMSERVE_*`` variables named in :data:`OPTIONS` are settings; the others
(``PYTEST_LLMSERVE_CACHE``, ``PYTEST_LLMSERVE_EVENT_LOOP``, ``PYTEST_LLMSERVE_VLLM_PYTHON``...) tune the
core and do not count as using the plugin (:attr:`Settings.configured`).

No pytest import: the plugin reads the three sources and hands them over as plain mappings.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_llmserve.config import (
    BENCH_KEYS,
    LLMServeConfig,
    ServerSpec,
    config_from_table,
    find_config_file,
    load_config,
)
from pytest_llmserve.config_values import (
    parse_bool,
    parse_count,
    parse_positive_float,
    parse_positive_int,
    parse_spread,
)
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.metrics import METRICS, is_known

# The settings' spellings and the raw sources live in options.py, which the plugin's entry module imports alone.
from pytest_llmserve.options import ENV_PREFIX as ENV_PREFIX
from pytest_llmserve.options import OPTIONS as OPTIONS
from pytest_llmserve.options import OPTIONS_BY_NAME as OPTIONS_BY_NAME
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.options import Option as Option
from pytest_llmserve.options import Sources as Sources

_DEFAULTS = BenchDefaults()

INCONCLUSIVE_POLICIES = ("warn", "fail")

EMBEDDED_DEFAULT_SOURCE = "<no configuration: embedded default>"


@dataclass(frozen=True, slots=True)
class Settings:
    """The run's settings from ini, environment, command line and the configuration file."""

    rootdir: Path
    cfg: LLMServeConfig
    servers: tuple[str, ...] | None  # None: the default server (all servers for the suite)
    url: str | None
    save_baseline: bool
    baseline_dir: Path
    results_dir: Path
    bench: BenchDefaults
    kill_stale: bool
    allow_confounded: bool
    allow_host_change: bool
    bench_json: Path | None
    suite: bool
    inconclusive: str  # "warn" or "fail" (INCONCLUSIVE_POLICIES)
    probe_concurrency: int | None  # None: the server's batch capacity (gates.probes.concurrency_bound)
    reference_answers: Path | None  # an earlier run's recording of the matrices' references (None: record)
    #: A configuration file or any llmserve setting was given: the plugin is in use before collection
    #: (see :mod:`pytest_llmserve.plugin` for what it does only then).
    configured: bool
    #: Strict mode (CI): a test that verified nothing fails (:func:`pytest_llmserve.report.checks.strict_failure`).
    strict: bool = False


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """One benchmark test's gate: the run's defaults with its ``llmserve_benchmark`` marker applied."""

    workload: str
    metric: str
    tolerance: float
    rounds: int
    max_rounds: int
    alpha: float
    warmup_rounds: int = _DEFAULTS.warmup_rounds
    warmup_agreement: float = _DEFAULTS.warmup_agreement
    extend_to_resolve: bool = _DEFAULTS.extend_to_resolve
    extend_budget_s: float = _DEFAULTS.extend_budget_s
    contention_bound: float = _DEFAULTS.contention_bound
    between_run_sd: float | None = _DEFAULTS.between_run_sd  # None: the measured prior (verdicts/between_runs)
    variable: str | None = None  # the context key the comparison may differ in (e.g. "cuda_graph")
    higher_is_better: bool | None = None  # None: the metric's own direction
    baseline_server: str | None = None  # compare against another server's baseline
    baseline_test: str | None = None  # ... or another test's, e.g. "test_llmserve_suite.py::test_throughput"


BENCH_MARKER_ARGS = ("workload", "metric", "tolerance", "rounds", "max_rounds", "variable", "higher_is_better",
                     "alpha", "baseline_server", "baseline_test", "warmup_rounds", "warmup_agreement",
                     "extend_to_resolve", "extend_budget_s", "contention_bound", "between_run_sd")
#: What a benchmark setting becomes: a name (workload, metric), a number or a switch.
BenchValue = str | float | int | bool


#: A setting's winning value and where it came from (:meth:`Sources.lookup`), or None when none was given.
Given = tuple[object, str] | None


def _flag(got: Given) -> bool:
    if got is None:
        return False
    value, where = got
    return value if isinstance(value, bool) else parse_bool(str(value), where)


def _load(rootdir: Path, got: Given,
          default_factory: Callable[[], ServerSpec] | None) -> tuple[LLMServeConfig, bool]:
    """The configuration, and whether it came from a file."""
    if got is None:
        cfg = load_config(rootdir, default_factory)
        return cfg, cfg.source != EMBEDDED_DEFAULT_SOURCE
    value, where = got
    path = Path(str(value))
    if not path.is_file():
        raise ConfigError(f"{where} = {value!r}: no such file")
    found = find_config_file(path.parent) if path.name in ("pyproject.toml", "llmserve.toml") else None
    if found is None or found[0].resolve() != path.resolve():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where} = {value!r}: not valid TOML: {exc}") from None
        table = data.get("tool", {}).get("llmserve", data)
        return config_from_table(table, str(path), default_factory), True
    return config_from_table(found[1], str(found[0]), default_factory), True


def resolve_settings(rootdir: Path, sources: Sources,
                     default_factory: Callable[[], ServerSpec] | None = None) -> Settings:
    """Resolve every setting once (ini < environment < command line); ``default_factory`` makes the
    embedded default server when no server is configured.

    Bad values are named in this order: the configuration file, the servers, the benchmark defaults, the reference
    answers, the inconclusive policy, then the switches and the probe concurrency as the fields come."""

    def get(name: str) -> Given:
        return sources.lookup(OPTIONS_BY_NAME[name])

    cfg, from_file = _load(rootdir, get("config"), default_factory)
    servers = _chosen_servers(cfg, get("servers"))
    url = get("url")
    if url is not None:
        cfg, servers = _attached(cfg, url), ("external",)
    bench = _checked_bench_defaults(cfg, sources)
    reference_answers = _existing_path(rootdir, get("reference_answers"))
    inconclusive = _inconclusive_policy(get("inconclusive"))
    return Settings(
        rootdir=rootdir,
        cfg=cfg,
        servers=servers,
        url=None if url is None else str(url[0]),
        save_baseline=_flag(get("save_baseline")),
        baseline_dir=rootdir / _text_or(get("baseline_dir"), "baselines"),
        results_dir=rootdir / _text_or(get("results_dir"), "llmserve-results"),
        bench=bench,
        kill_stale=_flag(get("kill_stale")),
        allow_confounded=_flag(get("allow_confounded")),
        allow_host_change=_flag(get("allow_host_change")),
        bench_json=_path(get("benchmark_json")),
        suite=_flag(get("suite")),
        inconclusive=inconclusive,
        probe_concurrency=_positive_int_or_none(get("probe_concurrency")),
        reference_answers=reference_answers,
        configured=from_file or any(sources.lookup(option) is not None for option in OPTIONS),
        strict=_flag(get("strict")),
    )


def _chosen_servers(cfg: LLMServeConfig, got: Given) -> tuple[str, ...] | None:
    """``--llmserve-server a,b``: configured server names (``*``: all); None when not given."""
    if not got:
        return None
    value, where = got
    servers = tuple(s.strip() for s in str(value).split(",") if s.strip())
    for name in servers:
        if name != "*" and name not in {s.name for s in cfg.servers}:
            raise ConfigError(f"{where} = {value!r}: no server named {name!r} "
                              f"(configured: {', '.join(s.name for s in cfg.servers)}; from {cfg.source})")
    return servers


def _attached(cfg: LLMServeConfig, url: tuple[object, str]) -> LLMServeConfig:
    """The configuration with its servers replaced by the one server ``--llmserve-url`` attaches to."""
    value, where = url
    attach = ServerSpec(name="external", engine="external", url=str(value), source=where,
                        api_key=os.environ.get("OPENAI_API_KEY") or None)
    return replace(cfg, servers=(attach,), default_server="external", matrices={})


def _checked_bench_defaults(cfg: LLMServeConfig, sources: Sources) -> BenchDefaults:
    bench, bench_where = _bench_defaults(cfg, sources)
    if bench.max_rounds < bench.rounds:
        raise ConfigError(f"{bench_where['max_rounds']} = {bench.max_rounds} is below "
                          f"{bench_where['rounds']} = {bench.rounds}: max_rounds must be >= rounds")
    return bench


def _existing_path(rootdir: Path, got: Given) -> Path | None:
    """A file or folder that must exist (``~`` expanded, relative to the rootdir); None when not given."""
    if not got:
        return None
    value, where = got
    path = rootdir / Path(str(value)).expanduser()
    if not path.exists():
        raise ConfigError(f"{where} = {value!r}: no such file or directory")
    return path


def _inconclusive_policy(got: Given) -> str:
    if not got:
        return "warn"
    value, where = got
    policy = str(value).strip().lower()
    if policy not in INCONCLUSIVE_POLICIES:
        raise ConfigError(f"{where} = {value!r}: must be one of {', '.join(INCONCLUSIVE_POLICIES)}")
    return policy


def _text_or(got: Given, default: str) -> str:
    return str(got[0]) if got else default


def _path(got: Given) -> Path | None:
    return Path(str(got[0])) if got else None


def _positive_int_or_none(got: Given) -> int | None:
    return parse_positive_int(*got) if got else None


def bench_spec(settings: Settings, args: tuple[object, ...] = (), kwargs: Mapping[str, object] | None = None,
               where: str = "") -> BenchSpec:
    """The gate of one benchmark test: ``settings.bench`` with the marker's ``args``/``kwargs`` applied.

    The one place marker arguments are checked; ``where`` (``nodeid: marker llmserve_benchmark``)
    starts every error message.
    """
    base = settings.bench
    spec = BenchSpec(workload=base.workload, metric=base.metric, tolerance=base.tolerance, rounds=base.rounds,
                     max_rounds=base.max_rounds, alpha=base.alpha, warmup_rounds=base.warmup_rounds,
                     warmup_agreement=base.warmup_agreement, extend_to_resolve=base.extend_to_resolve,
                     extend_budget_s=base.extend_budget_s,
                     contention_bound=base.contention_bound, between_run_sd=base.between_run_sd)
    given = dict(kwargs or {})
    if len(args) > 1:
        raise ConfigError(f"{where}: takes at most one positional argument (the workload), got {args!r}")
    if args:
        given.setdefault("workload", args[0])
    changes: dict[str, Any] = {}
    for key, value in given.items():
        if key not in BENCH_MARKER_ARGS:
            raise ConfigError(f"{where}: unknown argument {key}={value!r} "
                              f"(known: {', '.join(sorted(BENCH_MARKER_ARGS))})")
        changes[key] = _bench_value(settings, key, value, where)
    spec = replace(spec, **changes)
    if spec.max_rounds < spec.rounds:
        spec = replace(spec, max_rounds=spec.rounds)
    return spec


def _bench_value(settings: Settings, key: str, value: object, where: str) -> BenchValue | None:
    if key in BENCH_KEYS:
        return parse_bench_default(settings.cfg, key, value, f"{where} {key}")
    if key == "higher_is_better":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} higher_is_better = {value!r}: must be True or False")
        return value
    # variable, baseline_server, baseline_test: names
    return None if value is None else str(value)


def parse_fraction(value: object, where: str) -> float:
    """A tolerance or significance level: a number in (0, 1), whichever source it came from."""
    number = parse_positive_float(value, where)
    if number >= 1:
        raise ConfigError(f"{where} = {value!r}: must be a fraction below 1 (0.05 = 5%)")
    return number


def parse_bench_default(cfg: LLMServeConfig, key: str, value: object, where: str) -> BenchValue:
    """One benchmark default (a :data:`~pytest_llmserve.config.BENCH_KEYS` name) by the rule every source
    shares; ``where`` names the source and key, e.g. ``--llmserve-tolerance``."""
    if key == "workload":
        cfg.workload(str(value), where=where)
        return str(value)
    if key == "metric":
        if not is_known(str(value)):
            flat = [name for name in METRICS if not name.endswith("_ms")]
            raise ConfigError(f"{where} = {value!r}: unknown metric (known: {', '.join(flat)} and the "
                              "latencies <mean|median|p90|p99|std>_<ttft|tpot|itl|e2e>_ms)")
        return str(value)
    if key in ("tolerance", "alpha", "warmup_agreement", "contention_bound"):
        return parse_fraction(value, where)
    if key == "between_run_sd":
        return parse_spread(value, where)
    if key == "warmup_rounds":
        return parse_count(value, where)
    if key in ("rounds", "max_rounds"):
        return parse_positive_int(value, where)
    if key == "extend_to_resolve":
        return value if isinstance(value, bool) else parse_bool(str(value), where)
    if key == "extend_budget_s":
        if isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r}: must be a number of seconds > 0")
        return parse_positive_float(value, where)
    raise ConfigError(f"{where}: not a benchmark setting (known: {', '.join(BENCH_KEYS)})")


def _bench_defaults(cfg: LLMServeConfig, sources: Sources) -> tuple[BenchDefaults, dict[str, str]]:
    """The run's benchmark defaults (ini < [tool.llmserve.bench] < environment < command line), and
    where each came from (for messages that compare two of them)."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key in BENCH_KEYS:
        got: Given = None
        option = OPTIONS_BY_NAME.get(key)
        if option is not None:
            got = sources.lookup(option)
            if got is not None and got[1].startswith("ini ") and key in cfg.bench:
                got = None  # the bench table outranks the ini
        if got is None and key in cfg.bench:
            got = cfg.bench[key], f"{cfg.source}: [tool.llmserve.bench] {key}"
        if got is not None:
            values[key] = parse_bench_default(cfg, key, got[0], got[1])
            where[key] = got[1]
        else:
            where[key] = f"the default {key}"
    return replace(_DEFAULTS, **values), where
