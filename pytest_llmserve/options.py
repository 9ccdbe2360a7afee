"""The settings' names and spellings (option, ini key, environment variable, one help text), the benchmark
defaults, and the raw values as read from their three sources.

Standard library only: the plugin's entry module imports this module, and nothing else of the package, to
register its options and to decide whether a run uses llmserve at all (see :mod:`pytest_llmserve.plugin`).
Resolving the values is :mod:`pytest_llmserve.settings`' job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

#: Where :func:`pytest_llmserve.config.find_config_file` looks in the rootdir, in this order.
CONFIG_FILE_NAMES = ("llmserve.toml", "pyproject.toml")


@dataclass(frozen=True, slots=True)
class BenchDefaults:
    """Benchmark gate settings from ini/env/CLI; a marker may override per test."""

    workload: str = "smoke"
    metric: str = "output_throughput"
    # The change of the gated metric the gate is built to catch: a drop of it is passed with a chance of at most
    # beta (5 %), a change within half of it is never failed (verdicts/stats.py, "The sequential rule"). 0.10
    # since issue 35 (0.05 before, when the pass excluded twice the tolerance: the same decisions).
    tolerance: float = 0.10
    # The sequential rule looks after every round from the second (docs/performance.md, "Time to verdict").
    rounds: int = 2
    max_rounds: int = 8
    alpha: float = 0.02  # over all looks of the sequential rule
    # Warm-up rounds of the gated workload before the measured ones (gates/bench.py, "Warm-up"): at most this
    # many are discarded, fewer when a round agrees with the one before it within ``warmup_agreement``.
    warmup_rounds: int = 3
    warmup_agreement: float = 0.05
    # An inconclusive verdict at max_rounds whose tolerance this noise resolves in more rounds: on, the gate adds
    # rounds up to the count stats.resolution states (and gates.bench.EXTEND_ROUND_LIMIT) within this time budget.
    extend_to_resolve: bool = False
    extend_budget_s: float = 600.0
    # A round during which processes other than the server's and the load generator's took more than this share
    # of the machine (CPU, or a GPU's SM) is not a sample (load/contention.py; gates/bench.py, "Host contention").
    # 10 %: on a 2-core machine one CPU-bound process beside a round can take half of it and move the round's
    # throughput far beyond the default 5 % tolerance, while an idle host's background (the pytest controller,
    # logging) stays far below (quiet figures: docs/performance.md, section 8). A server that scales with its
    # cores loses at most about this much of its throughput to the others, on the order of the tolerance.
    contention_bound: float = 0.10
    # The spread between runs (sd of log throughput from boot to boot) assumed when the baseline holds one
    # recorded run; None: the prior measured on the embedded default (verdicts/between_runs.PRIOR_BETWEEN_RUN_SD).
    # From two recorded runs on it is estimated from them and this is not used.
    between_run_sd: float | None = None


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
    Option("tolerance", "float", "the change of the gated metric the gate is built to catch, a fraction: a drop "
                                 "of it is passed with a chance of at most 5 percent, a change within half of it is "
                                 f"never failed (default {_DEFAULTS.tolerance})"),
    Option("rounds", "int", f"benchmark rounds per side before the first verdict (default {_DEFAULTS.rounds})"),
    Option("max_rounds", "int", "most rounds per side when the verdict is inconclusive "
                                f"(default {_DEFAULTS.max_rounds})"),
    Option("warmup_rounds", "int", "most warm-up rounds of the benchmark's own workload discarded before the "
                                   "measured rounds; fewer when a round agrees with the one before it within "
                                   f"warmup_agreement; 0: none (default {_DEFAULTS.warmup_rounds})"),
    Option("warmup_agreement", "float", "relative difference of the gated metric within which two consecutive "
                                        "rounds count as warmed up, a fraction below 1 (default "
                                        f"{_DEFAULTS.warmup_agreement})"),
    Option("extend_to_resolve", "flag", "when a benchmark verdict is still inconclusive at max_rounds and the "
                                        "measured noise resolves the tolerance in more rounds, add rounds up to "
                                        "that count (at most 30) within extend_budget_s (default off)"),
    Option("extend_budget_s", "float", "seconds the rounds added by extend_to_resolve may take "
                                       f"(default {_DEFAULTS.extend_budget_s:g})"),
    Option("contention_bound", "float", "share of the machine (CPU, or a GPU's SM) other processes than the "
                                        "server's and the load generator's may take during a benchmark round; a "
                                        "round above it is not a sample and is measured again ('confounded: host "
                                        f"busy' when the host stays busy), a fraction below 1 (default "
                                        f"{_DEFAULTS.contention_bound})"),
    Option("between_run_sd", "float", "spread between runs (sd of the log metric from boot to boot, 0.03 = 3 percent) "
                                      "assumed when a baseline holds one recorded run; from two runs on it is "
                                      "estimated from them (default: the prior measured on the embedded default, "
                                      "docs/performance.md 'Between runs'); 0 treats runs as one"),
    Option("workload", "string", "default workload of benchmarks without one in their marker "
                                 f"(default {_DEFAULTS.workload})"),
    Option("metric", "string", f"default gated metric (default {_DEFAULTS.metric})"),
    Option("results_dir", "string", "where logs, reports, plots and result JSON are written "
                                    "(default llmserve-results/ in the rootdir)"),
    Option("kill_stale", "flag", "kill servers left running by an earlier, interrupted run "
                                 "instead of refusing to boot"),
    Option("allow_confounded", "flag", "compare against a baseline whose context differs in more than the variable "
                                       "under test (reported)"),
    Option("allow_host_change", "flag", "compare against a baseline recorded on another host (CPU, its instruction "
                                        "sets, cores, memory or GPUs differ) on purpose; the differing host fields are "
                                        "printed beside the verdict. Other context differences are still refused"),
    Option("benchmark_json", "string", "also write results as pytest-benchmark compatible JSON to this path"),
    Option("probe_concurrency", "int", "most independent correctness probes (known answers, NaN, long decode, "
                                       "property examples) in flight at once (default: the server's max batch "
                                       "size when configured or reported, else 8); 1 sends them one at a time"),
    Option("reference_answers", "string", "a matrix reference's answers recorded by an earlier run (its "
                                          "reference-answers/<server>.json, or that folder): test_matches_reference "
                                          "compares every combination with them instead of recording the reference "
                                          "in this run; refused for another model or other prompts"),
    Option("inconclusive", "string", "what a benchmark verdict still inconclusive after max_rounds does: "
                                     "warn (default: reported, the test passes with a warning) or fail"),
    Option("strict", "flag", "for CI: fail every test that verified nothing: an unverifiable check, a check not "
                             "applicable without random_weights = true declared, and a benchmark without baseline, "
                             "inconclusive or confounded by a busy host (a plain skip stays a skip; default off)"),
)
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}


@dataclass(frozen=True, slots=True)
class Sources:
    """The raw values, as the plugin read them: ``cli`` and ``ini`` by option name (None = not given)."""

    cli: Mapping[str, object]
    ini: Mapping[str, object]
    env: Mapping[str, str]

    def lookup(self, option: Option) -> tuple[object, str] | None:
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


def may_hold_config(rootdir: Path) -> bool:
    """Whether the rootdir may hold an llmserve configuration: an llmserve.toml, or a pyproject.toml that
    mentions llmserve at all (a ``[tool.llmserve]`` table cannot be written without the word). False means
    :func:`pytest_llmserve.config.find_config_file` finds nothing, without parsing any TOML."""
    llmserve_toml, pyproject = (rootdir / name for name in CONFIG_FILE_NAMES)
    if llmserve_toml.is_file():
        return True
    try:
        return b"llmserve" in pyproject.read_bytes()
    except OSError:
        return False
