"""The plugin's settings, resolved once, and the typed benchmark spec a test's marker makes of them.

Every setting has three spellings: an ini key (``llmserve_tolerance`` in ``[tool.pytest.ini_options]``
or pytest.ini), an environment variable (``PYTEST_LLMSERVE_TOLERANCE``) and a command-line option
(``--llmserve-tolerance``), with one help text (:data:`OPTIONS`). The benchmark defaults
(:data:`pytest_llmserve.config.BENCH_KEYS`: workload, metric, tolerance, rounds, max_rounds, alpha) may
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
from typing import Any, Literal

from pytest_llmserve.config import (
    BENCH_KEYS,
    BenchDefaults,
    LLMServeConfig,
    ServerSpec,
    config_from_table,
    find_config_file,
    load_config,
    parse_bool,
    parse_positive_float,
    parse_positive_int,
)
from pytest_llmserve.errors import ConfigError

ENV_PREFIX = "PYTEST_LLMSERVE_"

OptionKind = Literal["flag", "string", "int", "float"]


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its command-line option, ini key and environment variable share ``help``."""

    name: str  # the key in the resolved sources, e.g. "max_rounds"
    kind: OptionKind
    help: str
    flag_name: str | None = None  # when the option's spelling differs from the name
    ini_name: str | None = None

    @property
    def flag(self) -> str:
        return "--llmserve-" + (self.flag_name or self.name).replace("_", "-")

    @property
    def ini(self) -> str:
        return "llmserve_" + (self.ini_name or self.name)

    @property
    def env(self) -> str:
        return ENV_PREFIX + (self.ini_name or self.name).upper()


_DEFAULTS = BenchDefaults()

OPTIONS: tuple[Option, ...] = (
    Option("suite", "flag", "run the built-in suite (boot, config-is-execution, decode oracles, throughput gate) "
                            "on every configured server"),
    Option("servers", "string", "server name(s) from [tool.llmserve.servers] to use (comma separated); "
                                "default: all for the suite", flag_name="server"),
    Option("url", "string", "attach to an already-running OpenAI-compatible server at this URL instead of booting one"),
    Option("config", "string", "configuration file (default: llmserve.toml or pyproject.toml in the rootdir)"),
    Option("save_baseline", "flag", "save the measured samples as a new baseline record "
                                    "(append; old records are kept)"),
    Option("baseline_dir", "string", "directory of the baseline store (default: baselines/ in the rootdir)"),
    Option("tolerance", "float", "relative change of the gated metric that counts as a regression "
                                 f"(default {_DEFAULTS.tolerance})"),
    Option("rounds", "int", f"benchmark rounds per side before the first verdict (default {_DEFAULTS.rounds})"),
    Option("max_rounds", "int", "most rounds per side when the verdict is inconclusive "
                                f"(default {_DEFAULTS.max_rounds})"),
    Option("workload", "string", "default workload of benchmarks without one in their marker "
                                 f"(default {_DEFAULTS.workload})"),
    Option("metric", "string", f"default gated metric (default {_DEFAULTS.metric})"),
    Option("results_dir", "string", "where logs, reports, plots and result JSON are written "
                                    "(default llmserve-results/ in the rootdir)"),
    Option("kill_stale", "flag", "kill servers left running by an earlier, interrupted run "
                                 "instead of refusing to boot"),
    Option("allow_confounded", "flag", "compare against a baseline whose context differs in more than the variable "
                                       "under test (reported)"),
    Option("benchmark_json", "string", "also write results as pytest-benchmark compatible JSON to this path"),
    Option("probe_concurrency", "int", "most independent correctness probes (known answers, NaN, long decode, "
                                       "property examples) in flight at once (default: the server's max batch "
                                       "size when configured or reported, else 8); 1 sends them one at a time"),
    Option("inconclusive", "string", "what a benchmark verdict still inconclusive after max_rounds does: "
                                     "warn (default: reported, the test passes with a warning) or fail"),
)
INCONCLUSIVE_POLICIES = ("warn", "fail")
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}

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
    bench_json: Path | None
    suite: bool
    inconclusive: str  # "warn" or "fail" (INCONCLUSIVE_POLICIES)
    probe_concurrency: int | None  # None: the server's batch capacity (gates.probes.concurrency_bound)
    #: A configuration file or any llmserve setting was given: the plugin is in use before collection
    #: (see :mod:`pytest_llmserve.plugin` for what it does only then).
    configured: bool


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """One benchmark test's gate: the run's defaults with its ``llmserve_benchmark`` marker applied."""

    workload: str
    metric: str
    tolerance: float
    rounds: int
    max_rounds: int
    alpha: float
    variable: str | None = None  # the context key the comparison may differ in (e.g. "cuda_graph")
    higher_is_better: bool | None = None  # None: the metric's own direction
    baseline_server: str | None = None  # compare against another server's baseline
    baseline_test: str | None = None  # ... or another test's, e.g. "test_llmserve_suite.py::test_throughput"


BENCH_MARKER_ARGS = ("workload", "metric", "tolerance", "rounds", "max_rounds", "variable", "higher_is_better",
                     "alpha", "baseline_server", "baseline_test")


@dataclass(frozen=True, slots=True)
class Sources:
    """The raw values, as the plugin read them: ``cli`` and ``ini`` by option name (None = not given)."""

    cli: Mapping[str, Any]
    ini: Mapping[str, Any]
    env: Mapping[str, str]

    def lookup(self, option: Option) -> tuple[Any, str] | None:
        """The winning value of one setting and where it came from, or None when none was given."""
        cli = self.cli.get(option.name)
        if cli is not None:
            return cli, option.flag
        env = self.env.get(option.env)
        if env not in (None, ""):
            return env, f"${option.env}"
        ini = self.ini.get(option.name)
        if ini not in (None, "", []):
            return ini, f"ini {option.ini}"
        return None


def _flag(got: tuple[Any, str] | None) -> bool:
    if got is None:
        return False
    value, where = got
    return value if isinstance(value, bool) else parse_bool(str(value), where)


def _load(rootdir: Path, got: tuple[Any, str] | None,
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
    embedded default server when no server is configured."""

    def get(name: str) -> tuple[Any, str] | None:
        return sources.lookup(OPTIONS_BY_NAME[name])

    cfg, from_file = _load(rootdir, get("config"), default_factory)
    url = get("url")
    servers_got = get("servers")
    servers = None
    if servers_got:
        servers = tuple(s.strip() for s in str(servers_got[0]).split(",") if s.strip())
        for name in servers:
            if name != "*" and name not in {s.name for s in cfg.servers}:
                raise ConfigError(f"{servers_got[1]} = {servers_got[0]!r}: no server named {name!r} "
                                  f"(configured: {', '.join(s.name for s in cfg.servers)}; from {cfg.source})")
    if url:
        attach = ServerSpec(name="external", engine="external", url=str(url[0]), source=url[1],
                            api_key=os.environ.get("OPENAI_API_KEY") or None)
        cfg = replace(cfg, servers=(attach,), default_server="external", matrices={})
        servers = ("external",)

    bench, bench_where = _bench_defaults(cfg, sources)
    if bench.max_rounds < bench.rounds:
        raise ConfigError(f"{bench_where['max_rounds']} = {bench.max_rounds} is below "
                          f"{bench_where['rounds']} = {bench.rounds}: max_rounds must be >= rounds")
    baseline_dir, results_dir, bench_json = get("baseline_dir"), get("results_dir"), get("benchmark_json")
    inconclusive = get("inconclusive")
    probe_concurrency = get("probe_concurrency")
    if inconclusive and str(inconclusive[0]).strip().lower() not in INCONCLUSIVE_POLICIES:
        raise ConfigError(f"{inconclusive[1]} = {inconclusive[0]!r}: must be one of "
                          f"{', '.join(INCONCLUSIVE_POLICIES)}")
    return Settings(
        rootdir=rootdir,
        cfg=cfg,
        servers=servers,
        url=str(url[0]) if url else None,
        save_baseline=_flag(get("save_baseline")),
        baseline_dir=(rootdir / str(baseline_dir[0])) if baseline_dir else rootdir / "baselines",
        results_dir=(rootdir / str(results_dir[0])) if results_dir else rootdir / "llmserve-results",
        bench=bench,
        kill_stale=_flag(get("kill_stale")),
        allow_confounded=_flag(get("allow_confounded")),
        bench_json=Path(str(bench_json[0])) if bench_json else None,
        suite=_flag(get("suite")),
        inconclusive=str(inconclusive[0]).strip().lower() if inconclusive else "warn",
        probe_concurrency=parse_positive_int(*probe_concurrency) if probe_concurrency else None,
        configured=from_file or any(sources.lookup(option) is not None for option in OPTIONS),
    )


def bench_spec(settings: Settings, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None,
               where: str = "") -> BenchSpec:
    """The gate of one benchmark test: ``settings.bench`` with the marker's ``args``/``kwargs`` applied.

    The one place marker arguments are checked; ``where`` (``nodeid: marker llmserve_benchmark``)
    starts every error message.
    """
    base = settings.bench
    spec = BenchSpec(workload=base.workload, metric=base.metric, tolerance=base.tolerance, rounds=base.rounds,
                     max_rounds=base.max_rounds, alpha=base.alpha)
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


def _bench_value(settings: Settings, key: str, value: Any, where: str) -> Any:
    if key in BENCH_KEYS:
        return parse_bench_default(settings.cfg, key, value, f"{where} {key}")
    if key == "higher_is_better":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} higher_is_better = {value!r}: must be True or False")
        return value
    # variable, baseline_server, baseline_test: names
    return None if value is None else str(value)


def parse_fraction(value: Any, where: str) -> float:
    """A tolerance or significance level: a number in (0, 1), whichever source it came from."""
    number = parse_positive_float(value, where)
    if number >= 1:
        raise ConfigError(f"{where} = {value!r}: must be a fraction below 1 (0.05 = 5%)")
    return number


def parse_bench_default(cfg: LLMServeConfig, key: str, value: Any, where: str) -> Any:
    """One benchmark default (a :data:`~pytest_llmserve.config.BENCH_KEYS` name) by the rule every source
    shares; ``where`` names the source and key, e.g. ``--llmserve-tolerance``."""
    if key == "workload":
        cfg.workload(str(value), where=where)
        return str(value)
    if key == "metric":
        from pytest_llmserve.metrics import METRICS, is_known

        if not is_known(str(value)):
            flat = [name for name in METRICS if not name.endswith("_ms")]
            raise ConfigError(f"{where} = {value!r}: unknown metric (known: {', '.join(flat)} and the "
                              "latencies <mean|median|p90|p99|std>_<ttft|tpot|itl|e2e>_ms)")
        return str(value)
    if key in ("tolerance", "alpha"):
        return parse_fraction(value, where)
    if key in ("rounds", "max_rounds"):
        return parse_positive_int(value, where)
    raise ConfigError(f"{where}: not a benchmark setting (known: {', '.join(BENCH_KEYS)})")


def _bench_defaults(cfg: LLMServeConfig, sources: Sources) -> tuple[BenchDefaults, dict[str, str]]:
    """The run's benchmark defaults (ini < [tool.llmserve.bench] < environment < command line), and
    where each came from (for messages that compare two of them)."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key in BENCH_KEYS:
        got: tuple[Any, str] | None = None
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
