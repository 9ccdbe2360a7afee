"""SGLang: map logical options to the flags of the installed version, and read back what ran.

SGLang renames flags between releases (``reference/sglang.md`` §1 "Flag drift"): 0.5.15 turned
``--cuda-graph-bs`` / ``--cuda-graph-max-bs`` / ``--disable-cuda-graph`` / ``--nsa-*`` into
deprecated aliases of ``--cuda-graph-bs-decode`` / ``--cuda-graph-max-bs-decode`` /
``--cuda-graph-backend-decode disabled`` / ``--dsa-*``, and 0.5.23 removed most of the aliases.
So the adapter asks the installed SGLang for its flags once (``--help``), prefers the
non-deprecated spelling, and says exactly which option has no flag when a version lacks one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan
from pytest_llmserve.engines.sglang.facts import NAN_LOG_PATTERNS as SGLANG_NAN_LOG_PATTERNS
from pytest_llmserve.engines.sglang.facts import merge_sglang_metrics, parse_sglang_log, parse_sglang_server_info
from pytest_llmserve.errors import ConfigError, ServerStartError
from pytest_llmserve.evidence.facts import ServerFacts, fill_missing
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.redaction import MASK

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec

__all__ = [
    "KNOWN_VERSIONS",
    "FlagSet",
    "SGLangAdapter",
    "clear_flag_cache",
    "detect_sglang_flags",
    "flagset_for_version",
    "flagset_from_help",
]

HELP_TIMEOUT_S = 180.0  # importing sglang (torch, flashinfer...) can take a minute on a cold cache


@dataclass(frozen=True, slots=True)
class FlagSet:
    """The command-line flags one SGLang installation accepts."""

    version: str | None
    flags: frozenset[str]
    deprecated: frozenset[str] = frozenset()
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (flag, allowed values)
    source: str = "unknown"  # where the set came from, for messages

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def preferred(self, *candidates: str) -> str | None:
        """The first candidate that exists and is not deprecated, else the first that exists."""
        present = [c for c in candidates if c in self.flags]
        for flag in present:
            if flag not in self.deprecated:
                return flag
        return present[0] if present else None

    def choices_for(self, flag: str) -> tuple[str, ...] | None:
        for name, values in self.choices:
            if name == flag:
                return values
        return None

    def describe(self) -> str:
        return f"SGLang {self.version or '(version unknown)'} ({self.source})"


# --------------------------------------------------------------------------- flag sets


def _block_flags(definition: str) -> list[str]:
    """Flags in an argparse invocation like ``--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE``."""
    out: list[str] = []
    for token in definition.replace(",", " ").split():
        if token.startswith("--") and len(token) > 2 and token[2].isalnum():
            out.append(token.split("=", 1)[0])
    return out


def flagset_from_help(help_text: str, version: str | None = None, source: str = "--help") -> FlagSet:
    """Parse ``python -m sglang.launch_server --help`` output into a :class:`FlagSet`.

    Only option definition lines count (indented like argparse does it): flags that help texts
    merely mention ("[Deprecated] Use --dsa-prefill-backend instead.") must not count as present.
    """
    flags: set[str] = set()
    deprecated: set[str] = set()
    choices: dict[str, tuple[str, ...]] = {}
    current: list[str] = []
    current_help: list[str] = []

    def close() -> None:
        if current and "deprecated" in " ".join(current_help).lower():
            deprecated.update(current)

    for line in help_text.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if 1 <= indent <= 4 and stripped.startswith("-"):
            close()
            definition, _, help_part = stripped.partition("  ")  # argparse: two spaces before help
            current = _block_flags(definition)
            current_help = [help_part]
            flags.update(current)
            if "{" in definition and "}" in definition:
                values = tuple(
                    v.strip()
                    for v in definition[definition.index("{") + 1 : definition.index("}")].split(",")
                    if v.strip()
                )
                for flag in current:
                    choices[flag] = values
        elif current and indent > 4:
            current_help.append(stripped)
        elif stripped and indent == 0:
            close()  # a section title ("options:", "Model and tokenizer:") ends the block
            current, current_help = [], []
    close()
    return FlagSet(
        version=version,
        flags=frozenset(flags),
        deprecated=frozenset(deprecated),
        choices=tuple(sorted(choices.items())),
        source=source,
    )


_SPECULATIVE_FLAGS = (
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-draft-model",
    "--speculative-draft-model-revision",
    "--speculative-draft-load-format",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc",
    "--speculative-token-map",
    "--speculative-attention-mode",
    "--speculative-draft-attention-backend",
    "--speculative-moe-runner-backend",
    "--speculative-draft-model-quantization",
    "--enable-multi-layer-eagle",
)
_COMMON_FLAGS = (
    "--model-path",
    "--model",
    "--tokenizer-path",
    "--host",
    "--port",
    "--skip-server-warmup",
    "--tensor-parallel-size",
    "--tp-size",
    "--mem-fraction-static",
    "--max-running-requests",
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--kv-cache-dtype",
    "--quantization",
    "--context-length",
    "--chunked-prefill-size",
    "--disable-radix-cache",
    "--trust-remote-code",
    "--served-model-name",
    "--api-key",
    "--enable-torch-compile",
    "--enable-metrics",
    "--enable-metrics-for-all-schedulers",
    "--log-level",
    "--log-level-http",
    "--log-requests",
    "--log-requests-level",
    "--crash-dump-folder",
    "--decode-log-interval",
    "--random-seed",
    "--watchdog-timeout",
    "--enable-deterministic-inference",
    "--moe-runner-backend",
    "--sampling-backend",
    "--fp8-gemm-backend",
    "--fp4-gemm-backend",
    *_SPECULATIVE_FLAGS,
)
_ATTENTION_059 = (
    "triton",
    "torch_native",
    "flex_attention",
    "nsa",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
_ATTENTION_0515 = (*_ATTENTION_059, "dsa", "dsv4", "compressed", "cutedsl_mla", "tokenspeed_mla")
_ATTENTION_0523 = (
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
_DSA_059 = ("flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3", "tilelang", "aiter", "trtllm")
_DSA_PREFILL_0523 = (
    "flashmla_sparse",
    "flashmla_sparse_q8",
    "flashmla_kv",
    "flashmla_auto",
    "flashinfer_sparse_mla",
    "triton_sparse_mla",
    "fa3",
    "tilelang",
    "triton",
    "aiter",
    "trtllm",
    "intel_xpu",
)
_DSA_DECODE_0523 = tuple(v for v in _DSA_PREFILL_0523 if v != "triton_sparse_mla")
_GRAPH_BACKENDS = ("full", "breakable", "disabled")
# 0.5.9's fixed choices; from 0.5.15 on the algorithm is looked up in a registry (DFLASH, later DSPARK, UNO).
_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


def _table(
    version: str, flags: Iterable[str], deprecated: Iterable[str], choices: Mapping[str, tuple[str, ...]]
) -> FlagSet:
    return FlagSet(
        version=version,
        flags=frozenset(flags) | frozenset(deprecated),
        deprecated=frozenset(deprecated),
        choices=tuple(sorted(choices.items())),
        source=f"built-in flag table for {version} from reference/sglang.md",
    )


def _attention_choices(values: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {
        flag: values
        for flag in ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
    }


_BUILTIN: dict[str, FlagSet] = {
    "0.5.9": _table(
        "0.5.9",
        (
            *_COMMON_FLAGS,
            "--cuda-graph-max-bs",
            "--cuda-graph-bs",
            "--disable-cuda-graph",
            "--disable-cuda-graph-padding",
            "--enable-profile-cuda-graph",
            "--enable-cudagraph-gc",
            "--enable-piecewise-cuda-graph",
            "--piecewise-cuda-graph-max-tokens",
            "--piecewise-cuda-graph-tokens",
            "--nsa-prefill-backend",
            "--nsa-decode-backend",
            "--enable-nan-detection",
            "--stream-output",
        ),
        (),
        {
            **_attention_choices(_ATTENTION_059),
            "--nsa-prefill-backend": _DSA_059,
            "--nsa-decode-backend": _DSA_059,
            "--speculative-algorithm": _SPEC_ALGORITHMS,
        },
    ),
    "0.5.15": _table(
        "0.5.15",
        (
            *_COMMON_FLAGS,
            "--cuda-graph-max-bs-decode",
            "--cuda-graph-bs-decode",
            "--cuda-graph-backend-decode",
            "--cuda-graph-backend-prefill",
            "--cuda-graph-bs-prefill",
            "--cuda-graph-max-bs-prefill",
            "--cuda-graph-tc-compiler",
            "--dsa-prefill-backend",
            "--dsa-decode-backend",
            "--incremental-streaming-output",
        ),
        (
            "--cuda-graph-max-bs",
            "--cuda-graph-bs",
            "--disable-cuda-graph",
            "--nsa-prefill-backend",
            "--nsa-decode-backend",
            "--stream-output",
        ),
        {
            **_attention_choices(_ATTENTION_0515),
            "--dsa-prefill-backend": _DSA_059,
            "--dsa-decode-backend": _DSA_059,
            "--nsa-prefill-backend": _DSA_059,
            "--nsa-decode-backend": _DSA_059,
            "--cuda-graph-backend-decode": _GRAPH_BACKENDS,
            "--cuda-graph-backend-prefill": _GRAPH_BACKENDS,
        },
    ),
    "0.5.23": _table(
        "0.5.23",
        (
            *_COMMON_FLAGS,
            "--cuda-graph-max-bs-decode",
            "--cuda-graph-max-bs-prefill",
            "--cuda-graph-bs-decode",
            "--cuda-graph-bs-prefill",
            "--cuda-graph-backend-decode",
            "--cuda-graph-backend-prefill",
            "--disable-decode-cuda-graph",
            "--disable-prefill-cuda-graph",
            "--cuda-graph-config",
            "--dsa-prefill-backend",
            "--dsa-decode-backend",
            "--incremental-streaming-output",
        ),
        ("--disable-cuda-graph",),
        {
            **_attention_choices(_ATTENTION_0523),
            "--dsa-prefill-backend": _DSA_PREFILL_0523,
            "--dsa-decode-backend": _DSA_DECODE_0523,
            "--cuda-graph-backend-decode": _GRAPH_BACKENDS,
            "--cuda-graph-backend-prefill": _GRAPH_BACKENDS,
        },
    ),
}
KNOWN_VERSIONS = tuple(_BUILTIN)


def flagset_for_version(version: str) -> FlagSet:
    """The flags of a known SGLang release, from the reference (for tests and offline planning)."""
    try:
        return _BUILTIN[version.lstrip("v")]
    except KeyError:
        raise ConfigError(
            f"no built-in SGLang flag table for version {version!r} "
            f"(known: {', '.join(KNOWN_VERSIONS)}); detect_sglang_flags() reads the installed "
            "version's --help instead"
        ) from None


_FLAG_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], FlagSet] = {}
_FLAG_LOCK = threading.Lock()


def clear_flag_cache() -> None:
    with _FLAG_LOCK:
        _FLAG_CACHE.clear()


def detect_sglang_flags(
    python: str, timeout_s: float = HELP_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> FlagSet:
    """Run ``python -m sglang.launch_server --help`` once per interpreter and parse its flags.

    The key is the interpreter path as given, not its realpath (two virtualenvs share one real
    binary but hold different SGLang builds), plus the server's extra environment (a PYTHONPATH
    pointing at a source checkout changes the flags too).
    """
    extra = dict(env or {})
    key = (os.path.abspath(python), tuple(sorted(extra.items())))
    with _FLAG_LOCK:
        cached = _FLAG_CACHE.get(key)
    if cached is not None:
        return cached
    command = [python, "-m", "sglang.launch_server", "--help"]
    run_env = {**os.environ, **extra}
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            env=run_env,
        )
    except subprocess.TimeoutExpired:
        raise ServerStartError(
            f"`{' '.join(command)}` did not finish within {timeout_s:g} s; cannot tell which "
            "flags this SGLang accepts"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot run SGLang's interpreter {python!r}: {exc}") from None
    if done.returncode != 0 or "--model-path" not in done.stdout:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ConfigError(
            f"`{' '.join(command)}` failed (exit {done.returncode}): {' | '.join(tail)}. "
            "Is SGLang installed in that interpreter? Set python = '/path/to/venv/bin/python' "
            "for this server."
        )
    flagset = flagset_from_help(
        done.stdout,
        version=_installed_version(python, timeout_s, run_env),
        source=f"`{python} -m sglang.launch_server --help`",
    )
    with _FLAG_LOCK:
        _FLAG_CACHE[key] = flagset
    return flagset


def _installed_version(python: str, timeout_s: float, env: Mapping[str, str]) -> str | None:
    # Package metadata, not `import sglang`: cheap, and it does not import torch a second time.
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        done = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            env=dict(env),
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# --------------------------------------------------------------------------- the adapter


@dataclass
class _Plan:
    """argv being built, the flags it sets (to refuse duplicates in ``args``) and the notes."""

    spec: ServerSpec
    flagset: FlagSet
    argv: list[str] = field(default_factory=list)
    owned: dict[str, str] = field(default_factory=dict)  # flag (and its aliases) -> option that set it
    notes: list[str] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.spec.source}: [tool.llmserve.servers.{self.spec.name}]"

    def pick(self, option: str, value: object, *candidates: str) -> str:
        """The flag for ``option`` in this version, or a ConfigError naming option, value and version."""
        flag = self.flagset.preferred(*candidates)
        if flag is None:
            raise ConfigError(
                f"{self.where()} {option} = {value!r}: {self.flagset.describe()} has no flag for it "
                f"(looked for {', '.join(candidates)})"
            )
        for candidate in candidates:
            self.owned[candidate] = option
        return flag

    def check_choice(self, option: str, flag: str, value: str) -> None:
        allowed = self.flagset.choices_for(flag)
        if allowed is not None and value not in allowed:
            raise ConfigError(
                f"{self.where()} {option} = {value!r}: not accepted by {flag} in "
                f"{self.flagset.describe()} (choices: {', '.join(allowed)})"
            )

    def add(
        self, option: str, value: object, candidates: Sequence[str], *values: str, choice: str | None = None
    ) -> None:
        flag = self.pick(option, value, *candidates)
        if choice is not None:
            self.check_choice(option, flag, choice)
        self.argv.extend([flag, *values])
        shown = " ".join([flag, *values])
        if flag != candidates[0] or len(candidates) > 1:
            state = " (deprecated in this version)" if flag in self.flagset.deprecated else ""
            self.notes.append(f"{option}={value!r} -> {shown}{state} [{self.flagset.describe()}]")
        else:
            self.notes.append(f"{option}={value!r} -> {shown}")


# Kernels that exist only for some GPUs or in some sgl_kernel builds (what a boot would otherwise fail on, late and
# with a long traceback): the DSA backend trtllm runs flashinfer's trtllm-gen kernels, built for SM100/SM103 only;
# fa3 (the DSA backend, and the attention backend of that name) needs sgl_kernel's FA3 library, flash_ops.abi3.so
# (1.76 GB; left out of a slimmed install such as the one carried to the lent H200).
TRTLLM_MIN_MAJOR = 10
_FLASH_OPS_PROBE = """
import importlib.util, pathlib
spec = importlib.util.find_spec("sgl_kernel")
if spec is None or not spec.submodule_search_locations:
    print("NO_SGL_KERNEL")
else:
    where = pathlib.Path(list(spec.submodule_search_locations)[0])
    print(("HAS " if any(where.glob("flash_ops*.so")) else "LACKS ") + str(where))
"""


def sgl_kernel_lacks_flash_ops(python: str, env: Mapping[str, str] | None = None) -> str | None:
    """The sgl_kernel folder of ``python`` (with the server's extra environment) when it has no ``flash_ops``
    library; None when it has one or nothing can be said (no sgl_kernel there: the boot's own error is clearer)."""
    try:
        done = subprocess.run([python, "-c", _FLASH_OPS_PROBE], capture_output=True, text=True, timeout=60,
                              check=False, stdin=subprocess.DEVNULL, env={**os.environ, **dict(env or {})})
    except (OSError, subprocess.SubprocessError):
        return None
    answer = done.stdout.strip()
    return answer.removeprefix("LACKS ") if answer.startswith("LACKS ") else None


def _map_server(plan: _Plan, model: str, host: str, port: int) -> None:
    """The model, the address, the seed (SGLang draws a random one when none is given: always pass one), TP."""
    spec = plan.spec
    plan.add("model", model, ("--model-path", "--model"), model)
    plan.add("host", host, ("--host",), host)
    plan.add("port", port, ("--port",), str(port))
    plan.add("seed", spec.seed, ("--random-seed",), str(spec.seed))
    if spec.tp != 1:
        plan.add("tp", spec.tp, ("--tp-size", "--tensor-parallel-size"), str(spec.tp))


def _map_backends(plan: _Plan) -> None:
    """The attention backends, then the DSA (formerly NSA) ones, each checked against the version's choices."""
    spec = plan.spec
    for option in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        value = getattr(spec, option)
        if value is not None:
            plan.add(option, value, ("--" + option.replace("_", "-"),), value, choice=value)
    for phase in ("prefill", "decode"):
        value = getattr(spec, f"nsa_{phase}_backend")
        if value is not None:
            plan.add(f"nsa_{phase}_backend", value, (f"--dsa-{phase}-backend", f"--nsa-{phase}-backend"), value,
                     choice=value)


def _map_capacity(plan: _Plan) -> None:
    spec = plan.spec
    if spec.max_batch_size is not None:
        plan.add("max_batch_size", spec.max_batch_size, ("--max-running-requests",), str(spec.max_batch_size))
    if spec.mem_fraction is not None:
        plan.add("mem_fraction", spec.mem_fraction, ("--mem-fraction-static",), f"{spec.mem_fraction:g}")


def _map_serving(plan: _Plan) -> None:
    """Deterministic inference, the served model name and the API key (masked in the notes)."""
    spec = plan.spec
    if spec.deterministic:
        plan.add("deterministic", True, ("--enable-deterministic-inference",))
    if spec.served_model_name:
        plan.add("served_model_name", spec.served_model_name, ("--served-model-name",), spec.served_model_name)
    if spec.api_key:
        plan.pick("api_key", MASK, "--api-key")
        plan.argv.extend(["--api-key", spec.api_key])
        plan.notes.append(f"api_key -> --api-key {MASK}")


def _refuse_owned_flags(plan: _Plan, user_flags: set[str]) -> None:
    """Flags in ``args`` that an option already set (or an alias of one)."""
    clashes = sorted(flag for flag in user_flags if flag in plan.owned)
    if clashes:
        raise ConfigError(
            f"{plan.where()} args {list(plan.spec.args)!r} set {', '.join(clashes)}, which the "
            f"plugin sets from {', '.join(sorted({plan.owned[f] for f in clashes}))}; "
            "set the option instead of passing the flag"
        )


def _add_evidence_flags(plan: _Plan, user_flags: set[str]) -> None:
    """What the execution checks read, where this version has it and ``args`` do not set it already."""
    # /metrics carries sglang:cuda_graph_passes_total, the proof that decode replayed graphs.
    if plan.flagset.has("--enable-metrics") and "--enable-metrics" not in user_flags:
        plan.argv.append("--enable-metrics")
        plan.notes.append("--enable-metrics added: graph-pass and token counters for the execution checks")
    # Decode lines come every --decode-log-interval steps (40 by default): with short probes only one appears,
    # so the per-step graph check would see almost nothing. One line per step proves every batch size.
    if plan.spec.cuda_graph is not None and plan.flagset.has("--decode-log-interval") \
            and "--decode-log-interval" not in user_flags:
        plan.argv.extend(["--decode-log-interval", "1"])
        plan.notes.append("--decode-log-interval 1 added: a decode line per step proves graph use per batch size")


class SGLangAdapter(EngineAdapter):
    """``python -m sglang.launch_server`` with flags mapped to the installed version."""

    name = "sglang"
    env_prefixes = ("SGLANG_", "SGL_", "FLASHINFER_")
    generation_counter = "sglang:generation_tokens_total"
    request_counter = "sglang:num_requests_total"
    prefix_cache_hit_counter = "sglang:cached_tokens_total"
    running_requests_gauge = "sglang:num_running_reqs"
    metrics_prefix = "sglang:"
    nan_log_patterns = SGLANG_NAN_LOG_PATTERNS
    # 0.5.15 opens a gRPC port at --port + 10000 and refuses to start when that is above 65535 (seen on the H200:
    # "SGLANG_GRPC_PORT (66707) must be between 1 and 65535").
    highest_port = 55535
    log_signature = re.compile(r"server_args=(?:ServerArgs\(|\{)|The server is fired up and ready to roll")
    server_info_path = "/server_info"

    def __init__(self, flagset: FlagSet | None = None) -> None:
        self._flagset = flagset  # injected (tests, offline planning); else detected per interpreter

    def flagset(self, python: str, env: Mapping[str, str] | None = None) -> FlagSet:
        """The injected flag set, else the one the interpreter's ``--help`` reports (cached)."""
        return self._flagset if self._flagset is not None else detect_sglang_flags(python, env=env)

    def preflight_problems(self, spec: ServerSpec, gpus: Sequence[tuple[str, str | None]]) -> list[str]:
        problems: list[str] = []
        chosen = [(f"nsa_{phase}_backend", getattr(spec, f"nsa_{phase}_backend")) for phase in ("prefill", "decode")]
        chosen.append(("attention_backend", spec.attention_backend))
        for key, backend in chosen:
            if backend == "trtllm" and key.startswith("nsa_"):
                for label, capability in gpus:
                    if capability and int(capability.split(".")[0]) < TRTLLM_MIN_MAJOR:
                        problems.append(f"{key} = 'trtllm' (from {spec.source}) runs only on SM100/SM103 GPUs "
                                        f"(flashinfer's trtllm-gen kernels); {label} has compute capability "
                                        f"{capability}")
            if backend == "fa3":
                python = spec.python or sys.executable
                lacking = sgl_kernel_lacks_flash_ops(python, spec.env_dict)
                if lacking:
                    problems.append(f"{key} = 'fa3' (from {spec.source}) needs sgl_kernel's FA3 kernels "
                                    f"(flash_ops.abi3.so), which {python} does not have: {lacking} holds no "
                                    "flash_ops library")
        return problems

    def launch_plan(self, spec: ServerSpec, host: str, port: int) -> LaunchPlan:
        python = spec.python or sys.executable
        if not spec.model:
            raise ConfigError(
                f"{spec.source}: [tool.llmserve.servers.{spec.name}] engine = 'sglang' needs model"
            )
        plan = _Plan(spec, self.flagset(python, spec.env_dict))
        plan.argv = [python, "-m", "sglang.launch_server"]
        _map_server(plan, spec.model, host, port)
        _map_backends(plan)
        self._map_cuda_graph(plan)
        _map_capacity(plan)
        self._map_speculative(plan)
        _map_serving(plan)
        user_flags = {arg.split("=", 1)[0] for arg in spec.args if arg.startswith("--")}
        _refuse_owned_flags(plan, user_flags)
        _add_evidence_flags(plan, user_flags)
        plan.argv.extend(spec.args)
        if spec.args:
            plan.notes.append(f"args passed through verbatim: {' '.join(spec.args)}")
        url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return LaunchPlan(
            argv=plan.argv,
            env=spec.env_dict,
            base_url=f"http://{url_host}:{port}",
            model_name=spec.served_model_name or spec.model,
            health_path="/health_generate",  # 503 until warm-up is done, then a real 1-token generation
            generation_probe=True,
            notes=plan.notes,
        )

    @staticmethod
    def _map_cuda_graph(plan: _Plan) -> None:
        graph = plan.spec.cuda_graph
        if graph is None:
            return
        flagset = plan.flagset
        if not graph.enabled:
            flag = flagset.preferred(
                "--cuda-graph-backend-decode", "--disable-decode-cuda-graph", "--disable-cuda-graph"
            )
            if flag == "--cuda-graph-backend-decode":
                plan.add(
                    "cuda_graph",
                    "off",
                    ("--cuda-graph-backend-decode", "--disable-decode-cuda-graph", "--disable-cuda-graph"),
                    "disabled",
                    choice="disabled",
                )
                # The deprecated --disable-cuda-graph meant "both"; keep that meaning, unless the user chose the
                # prefill graph backend in args (e.g. prefill graphs off for every combination of a matrix).
                if flagset.has("--cuda-graph-backend-prefill") and "--cuda-graph-backend-prefill" not in plan.spec.args:
                    plan.add(
                        "cuda_graph",
                        "off",
                        ("--cuda-graph-backend-prefill", "--disable-prefill-cuda-graph"),
                        "disabled",
                        choice="disabled",
                    )
            else:
                plan.add(
                    "cuda_graph",
                    "off",
                    ("--disable-decode-cuda-graph", "--disable-cuda-graph", "--cuda-graph-backend-decode"),
                )
                if flag == "--disable-decode-cuda-graph" and flagset.has("--disable-prefill-cuda-graph"):
                    plan.add("cuda_graph", "off", ("--disable-prefill-cuda-graph",))
            return
        if graph.batch_sizes:
            plan.add(
                "cuda_graph.batch_sizes",
                list(graph.batch_sizes),
                ("--cuda-graph-bs-decode", "--cuda-graph-bs"),
                *(str(b) for b in graph.batch_sizes),
            )
        if graph.max_batch_size:
            plan.add(
                "cuda_graph.max_batch_size",
                graph.max_batch_size,
                ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"),
                str(graph.max_batch_size),
            )
        if graph.mode:
            plan.add("cuda_graph.mode", graph.mode, ("--cuda-graph-backend-decode",), graph.mode.lower(),
                     choice=graph.mode.lower())
        if not graph.batch_sizes and not graph.max_batch_size and not graph.mode:
            plan.notes.append("cuda_graph=on -> no flag (SGLang captures decode graphs by default)")

    @staticmethod
    def _map_speculative(plan: _Plan) -> None:
        value = plan.spec.speculative
        if value is None:
            plan.notes.append("speculative=None -> no speculative flags (decoding must be plain)")
            return
        text = value.strip()
        if not text.startswith("{"):
            plan.add("speculative", value, ("--speculative-algorithm",), text, choice=text)
            return
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{plan.where()} speculative = {value!r}: not an algorithm name nor a JSON object ({exc})"
            ) from None
        if not isinstance(config, dict):
            raise ConfigError(
                f"{plan.where()} speculative = {value!r}: JSON must be an object of SGLang "
                '--speculative-* options, e.g. {"algorithm": "EAGLE", "num_steps": 3}'
            )
        for key, item in config.items():
            name = str(key).replace("_", "-").removeprefix("speculative-")
            flag = (
                "--enable-multi-layer-eagle"
                if name == "enable-multi-layer-eagle"
                else f"--speculative-{name}"
            )
            option = f"speculative.{key}"
            if item is True:
                plan.add(option, item, (flag,))
            elif item is False or item is None:
                continue
            elif isinstance(item, list):
                plan.add(option, item, (flag,), *(str(v) for v in item))
            else:
                plan.add(
                    option,
                    item,
                    (flag,),
                    str(item),
                    choice=str(item) if flag == "--speculative-algorithm" else None,
                )

    def parse_facts(
        self, log_text: str, metrics_text: str | None = None, server_info: Mapping[str, object] | None = None
    ) -> ServerFacts:
        """Log facts, plus graph-pass counters from /metrics, plus gaps filled from /server_info."""
        facts = parse_sglang_log(log_text)
        if metrics_text:
            self.merge_metrics(facts, metrics_text)
        if server_info:
            fill_missing(facts, parse_sglang_server_info(server_info))
        if not facts.decode_graph_reported:
            facts.graph_use_hint = ("no 'Decode batch' lines and no sglang:cuda_graph_passes_total: the adapter sets "
                                    "--decode-log-interval 1 and --enable-metrics when graph use must be proven")
        return facts

    def merge_metrics(self, facts: ServerFacts, metrics_text: str) -> None:
        merge_sglang_metrics(facts, parse_prometheus(metrics_text))
        facts.compact_evidence()
