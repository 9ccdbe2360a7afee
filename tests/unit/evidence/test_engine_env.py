"""The shell environment a launched server inherits is part of the baseline context (issue 12, item 5)."""

from __future__ import annotations

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.engines import engine_env_prefixes, engine_environment
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.verdicts.comparability import comparability

VLLM = ServerSpec(name="a", engine="vllm", model="/m")
WORKLOAD = Workload("tiny", num_prompts=4, input_len=8, output_len=8)


def _context(spec: ServerSpec, environ: dict[str, str]) -> dict[str, object]:
    return build_context(spec, WORKLOAD, engine_version="0.32.0", hardware={"cpu_model": "x"},
                         plugin_version="0", python="CPython 3.11", environ=environ)


def test_contexts_differing_only_in_an_inherited_engine_variable_are_not_the_same() -> None:
    two = _context(VLLM, {"VLLM_CPU_KVCACHE_SPACE": "2", "PATH": "/bin"})
    one = _context(VLLM, {"VLLM_CPU_KVCACHE_SPACE": "1", "PATH": "/usr/bin"})
    verdict = comparability(two, one)
    assert verdict.status == "refused"
    assert [d.key for d in verdict.diffs] == ["engine_env.VLLM_CPU_KVCACHE_SPACE"]
    assert 'engine_env.VLLM_CPU_KVCACHE_SPACE: "2" -> "1"' in verdict.message
    # Declared as the variable under test, the same pair is an allowed A/B.
    assert comparability(two, one, variable="engine_env.VLLM_CPU_KVCACHE_SPACE").status == "allowed-variable"


def test_a_variable_set_only_on_one_side_counts_too() -> None:
    verdict = comparability(_context(VLLM, {}), _context(VLLM, {"OMP_NUM_THREADS": "1"}))
    assert verdict.status == "refused"
    assert [(d.key, d.old_present) for d in verdict.diffs] == [("engine_env.OMP_NUM_THREADS", False)]


def test_no_inherited_variables_leave_the_context_as_before() -> None:
    # Baselines recorded before engine_env existed still compare with a run in a clean shell.
    ctx = _context(VLLM, {"PATH": "/bin", "HOME": "/root"})
    assert "engine_env" not in ctx
    assert comparability(_context(VLLM, {}), ctx).status == "same"


def test_secrets_are_masked_and_place_only_variables_left_out() -> None:
    env = {"HF_TOKEN": "hf_abc", "VLLM_API_KEY": "k", "HF_HOME": "/data/hf", "CUDA_VISIBLE_DEVICES": "3",
           "TRITON_CACHE_DIR": "/tmp/t", "TOKENIZERS_PARALLELISM": "false", "NCCL_P2P_DISABLE": "1",
           "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    assert engine_environment(VLLM, env) == {"HF_TOKEN": "***", "NCCL_P2P_DISABLE": "1", "VLLM_API_KEY": "***",
                                             "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    assert "hf_abc" not in repr(_context(VLLM, env))


def test_the_specs_own_env_overrides_the_shell() -> None:
    spec = ServerSpec(name="a", engine="vllm", model="/m", env=(("VLLM_CPU_KVCACHE_SPACE", "2"),))
    # The server runs with the spec's value whatever the shell says: those contexts are the same.
    assert comparability(_context(spec, {"VLLM_CPU_KVCACHE_SPACE": "1"}),
                         _context(spec, {"VLLM_CPU_KVCACHE_SPACE": "4"})).status == "same"


def test_each_engine_reads_its_own_prefixes() -> None:
    sglang = ServerSpec(name="s", engine="sglang", model="/m")
    env = {"VLLM_X": "1", "SGLANG_ENABLE_TORCH_COMPILE": "1", "GGML_CUDA_DISABLE_GRAPHS": "1", "OMP_NUM_THREADS": "4"}
    assert engine_environment(VLLM, env) == {"OMP_NUM_THREADS": "4", "VLLM_X": "1"}
    assert engine_environment(sglang, env) == {"OMP_NUM_THREADS": "4", "SGLANG_ENABLE_TORCH_COMPILE": "1"}
    assert engine_environment(ServerSpec(name="l", engine="llamacpp", model="/m"), env) == {
        "GGML_CUDA_DISABLE_GRAPHS": "1", "OMP_NUM_THREADS": "4"}
    # An attached server does not run in this shell; a command may run any engine.
    assert engine_env_prefixes("external") == ()
    assert engine_environment(ServerSpec(name="c", engine="command", argv=("srv",)), env) == env
