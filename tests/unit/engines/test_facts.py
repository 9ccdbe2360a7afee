"""Facts parsed from server logs/metrics, and the config-is-execution checks built on them."""

# Log and metric lines are quoted verbatim, whatever their length.
# ruff: noqa: E501

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines import adapter_named
from pytest_llmserve.engines.sglang.facts import parse_sglang_log, parse_sglang_server_info
from pytest_llmserve.engines.vllm.facts import parse_vllm_log
from pytest_llmserve.evidence.facts import ServerFacts, fill_missing, normalize_backend, split_lines
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.verdicts.execution import CheckResult, check_config_is_execution


def merge_metrics(facts: ServerFacts, metrics_text: str, engine: str) -> ServerFacts:
    adapter_named(engine).merge_metrics(facts, metrics_text)
    return facts

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
REAL_VLLM_LOGS = sorted(LOGS.glob("real_vllm_*.log"))


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def spec(**kwargs: object) -> ServerSpec:
    return ServerSpec(name="s", model="/m", **kwargs)  # type: ignore[arg-type]


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


# Fields that always have a value (counters, containers) and need no evidence.
_ALWAYS_SET = {
    "engine",
    "evidence",
    "graph_captures",
    "decode_batches_on_graph",
    "decode_batches_off_graph",
    "decode_batches",
    "graph_passes",
    "graph_passes_on",
    "graph_passes_off",
    "graph_use_by_size",
    "graph_use_hint",
    "nan_events",
    "errors",
}


def assert_every_fact_has_evidence(facts: ServerFacts) -> None:
    for f in fields(ServerFacts):
        if f.name in _ALWAYS_SET or getattr(facts, f.name) is None:
            continue
        assert facts.evidence.get(f.name), f"fact {f.name}={getattr(facts, f.name)!r} has no evidence lines"
    if facts.decode_batches_on_graph:
        assert facts.evidence["decode_batches_on_graph"]
    if facts.graph_passes:
        assert facts.evidence["graph_passes"]


# --------------------------------------------------------------------------- lines


def test_split_lines_treats_carriage_return_as_line_break() -> None:
    text = (
        "a\r\nCapturing CUDA graphs (decode, FULL):   0%|  | 0/19\rCapturing CUDA graphs (decode, FULL): "
        "100%|##| 19/19\n\x1b[32mINFO\x1b[0m done\n\n"
    )
    assert split_lines(text) == [
        "a",
        "Capturing CUDA graphs (decode, FULL):   0%|  | 0/19",
        "Capturing CUDA graphs (decode, FULL): 100%|##| 19/19",
        "INFO done",
    ]


def test_progress_bars_redrawn_with_carriage_returns_give_the_final_count() -> None:
    bar = "Capturing CUDA graphs (decode, FULL): "
    log = (
        "(EngineCore pid=1) INFO 05-02 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.21.0) with config: "
        "model='m', speculative_config=None, enforce_eager=False, seed=0, compilation_config={'mode': "
        "<CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, "
        "'cudagraph_capture_sizes': [1, 2, 4, 8]}\n"
        + "\r".join(f"{bar}{100 * i // 4:3d}%| | {i}/4 [00:00<00:00]" for i in range(5))
        + "\n"
    )
    facts = parse_vllm_log(log)
    assert facts.graph_captures == {"decode, FULL": 4}
    assert facts.captured_batch_sizes == (1, 2, 4, 8)
    assert facts.evidence["graph_captures"] == [f"{bar}100%| | 4/4 [00:00<00:00]"]


def test_normalize_backend_spellings() -> None:
    assert normalize_backend("AttentionBackendEnum.FLASH_ATTN") == "flash_attn"
    assert normalize_backend("'FLASHINFER'") == "flashinfer"
    assert normalize_backend("Flash Attention") == "flash_attn"
    assert normalize_backend("Torch SDPA") == "torch_sdpa"
    assert normalize_backend("fa3") == "fa3"
    assert normalize_backend(None) is None


# --------------------------------------------------------------------------- vLLM


def test_vllm_cpu_eager_excerpt() -> None:
    facts = parse_vllm_log(read("vllm_cpu_0.32_eager.log"))
    assert facts.engine == "vllm"
    assert facts.version == "0.32.0"
    assert facts.compilation_mode == "NONE"
    assert facts.cudagraph_mode == "NONE"
    assert facts.enforce_eager is True
    assert facts.seed == 0
    assert facts.speculative is False
    assert facts.kv_cache_tokens == 93184  # two-line form, "CPU KV cache size: 93,184 tokens"
    assert facts.cuda_graph_enabled is False
    assert facts.captured_batch_sizes == ()
    assert facts.attention_backend is None  # 0.32 on CPU names no backend: unreported, not guessed
    assert facts.startup_s == 43.0
    assert facts.ready is True
    assert facts.errors == []
    assert facts.nan_events == []
    assert_every_fact_has_evidence(facts)
    assert any("CompilationMode.NONE" in line for line in facts.evidence["compilation_mode"])


def test_vllm_cpu_compiled_excerpt_one_line_kv() -> None:
    facts = parse_vllm_log(read("vllm_cpu_0.32_compiled.log"))
    assert facts.compilation_mode == "DYNAMO_TRACE_ONCE"
    assert facts.cudagraph_mode == "NONE"
    assert facts.enforce_eager is False
    assert facts.kv_cache_tokens == 93184  # "GPU KV cache size: 93,184 tokens, Maximum concurrency ..."
    assert facts.startup_s == 175.0
    assert_every_fact_has_evidence(facts)


def test_vllm_eager_checks_on_cpu() -> None:
    eager = parse_vllm_log(read("vllm_cpu_0.32_eager.log"))
    compiled = parse_vllm_log(read("vllm_cpu_0.32_compiled.log"))
    want_eager = spec(eager=True, cuda_graph=CudaGraphSpec(enabled=False))
    checks = by_name(check_config_is_execution(want_eager, eager))
    assert checks["eager"].status == "pass"
    assert checks["cuda_graph.captured"].status == "pass"
    assert checks["speculative"].status == "pass"
    assert checks["seed"].status == "pass"
    # The compiled server answers an eager request: caught, with the config line as proof.
    wrong = by_name(check_config_is_execution(want_eager, compiled))["eager"]
    assert wrong.status == "fail"
    assert "DYNAMO_TRACE_ONCE" in wrong.observed
    assert any("CompilationMode.DYNAMO_TRACE_ONCE" in line for line in wrong.evidence)
    assert by_name(check_config_is_execution(spec(eager=False), compiled))["eager"].status == "pass"


def test_vllm_attention_backend_unreported_on_cpu_is_unverifiable() -> None:
    facts = parse_vllm_log(read("vllm_cpu_0.32_eager.log"))
    result = by_name(check_config_is_execution(spec(attention_backend="CPU_ATTN"), facts))[
        "attention_backend"
    ]
    assert result.status == "unverifiable"
    assert result.observed == "not reported"


def test_vllm_gpu_downgrade_is_the_effective_mode() -> None:
    facts = parse_vllm_log(read("vllm_gpu_0.20_downgrade.log"))
    assert facts.version == "0.20.2"
    assert facts.compilation_mode == "VLLM_COMPILE"
    assert facts.cudagraph_mode == "PIECEWISE"  # the config line said FULL_AND_PIECEWISE
    assert any("setting cudagraph_mode=PIECEWISE" in line for line in facts.evidence["cudagraph_mode"])
    assert facts.attention_backend == "flashinfer"
    assert facts.kv_cache_tokens == 5463232
    assert facts.graph_captures == {"mixed prefill-decode, PIECEWISE": 17}
    assert facts.cuda_graph_enabled is True
    assert facts.captured_batch_sizes == (
        4,
        8,
        16,
        24,
        32,
        40,
        48,
        56,
        64,
        72,
        80,
        88,
        96,
        104,
        112,
        120,
        128,
    )
    assert facts.speculative is True
    assert facts.speculative_detail
    assert "ngram" in facts.speculative_detail
    assert facts.mem_fraction == 0.8
    assert facts.max_batch_size == 64
    assert_every_fact_has_evidence(facts)


def test_vllm_graph_checks_missing_sizes_and_unverifiable_use() -> None:
    facts = parse_vllm_log(read("vllm_gpu_0.20_downgrade.log"))
    wanted = spec(
        attention_backend="FLASHINFER",
        cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4)),
        speculative='{"method": "ngram", "num_speculative_tokens": 3}',
        mem_fraction=0.8,
    )
    checks = by_name(check_config_is_execution(wanted, facts))
    assert checks["attention_backend"].status == "pass"
    captured = checks["cuda_graph.captured"]
    assert captured.status == "fail"
    assert "missing sizes [1, 2]" in captured.message
    # vLLM logs no per-batch graph use: never "pass" without proof.
    assert checks["cuda_graph.used_in_decode"].status == "unverifiable"
    assert checks["speculative"].status == "pass"
    assert checks["mem_fraction"].status == "pass"


@pytest.mark.parametrize(
    ("kv_lines", "tokens"),
    [
        (
            "INFO 01-01 00:00:01 [kv_cache_utils.py:1708] GPU KV cache size: 5,463,232 tokens\n"
            "INFO 01-01 00:00:01 [kv_cache_utils.py:1709] Maximum concurrency for 262,144 tokens per request: 20.84x\n",
            5463232,
        ),
        (
            "INFO 01-01 00:00:01 [kv_cache_utils.py:2327] GPU KV cache size: 174,720 tokens, Maximum concurrency "
            "for 2,048 tokens per request: 85.31x\n",
            174720,
        ),
        (
            "INFO 01-01 00:00:01 [kv_cache_utils.py:2327] CPU KV cache size: 93,184 tokens, Maximum concurrency "
            "for 2,048 tokens per request: 45.50x\n",
            93184,
        ),
        ("INFO 01-01 00:00:01 [kv_cache_utils.py:2146] GPU KV cache size: 5760 tokens\n", 5760),
    ],
)
def test_vllm_kv_cache_line_variants(kv_lines: str, tokens: int) -> None:
    assert parse_vllm_log(kv_lines).kv_cache_tokens == tokens


@pytest.mark.parametrize(
    ("line", "backend"),
    [
        (
            "(EngineCore_DP0 pid=9) INFO 05-02 10:00:17 [cuda.py:308] Using AttentionBackendEnum.FLASHINFER backend.",
            "flashinfer",
        ),
        (
            "INFO 05-02 10:00:17 [cuda.py:367] Using FLASH_ATTN attention backend out of potential backends: "
            "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
            "flash_attn",
        ),
        # vLLM 0.22-0.24 on CPU (the only line there that names the backend)
        (
            "(Worker pid=19850) INFO 06-13 20:03:25 [selector.py:138] Using HND KV cache layout for CPU_ATTN backend.",
            "cpu_attn",
        ),
        ("INFO 03-01 10:00:00 [cpu.py:70] Using Torch SDPA backend.", "torch_sdpa"),
    ],
)
def test_vllm_attention_backend_lines(line: str, backend: str) -> None:
    facts = parse_vllm_log(line + "\n")
    assert facts.attention_backend == backend
    assert facts.evidence["attention_backend"] == [line]


def test_vllm_vit_backend_line_is_not_the_model_backend() -> None:
    facts = parse_vllm_log(
        "INFO 05-02 10:00:17 [vit.py:1] Using backend AttentionBackendEnum.FLASH_ATTN for vit "
        "attention\nINFO 05-02 10:00:18 [cuda.py:308] Using AttentionBackendEnum.TRITON_ATTN "
        "backend.\n"
    )
    assert facts.attention_backend == "triton_attn"


def test_vllm_downgrade_chain_last_word_wins() -> None:
    log = "\n".join(
        [
            "INFO 05-02 10:00:14 [core.py:93] Initializing a V1 LLM engine (v0.19.0) with config: model='m', "
            "speculative_config=None, enforce_eager=False, seed=3, compilation_config={'mode': 3, 'cudagraph_mode': "
            "'FULL', 'cudagraph_capture_sizes': [1, 2]}",
            "WARNING 05-02 10:00:20 [compilation.py:1390] CUDAGraphMode.FULL is not supported with FlashInferBackend "
            "backend (support: AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode=FULL_AND_PIECEWISE",
            "WARNING 05-02 10:00:20 [compilation.py:900] Piecewise compilation with empty splitting_ops do not contains "
            "piecewise cudagraph. Setting cudagraph_mode to FULL.",
        ]
    )
    facts = parse_vllm_log(log)
    assert facts.compilation_mode == "VLLM_COMPILE"  # integer mode
    assert facts.cudagraph_mode == "FULL"
    assert facts.seed == 3
    assert len(facts.evidence["cudagraph_mode"]) == 3


def test_vllm_old_level_config_and_banner() -> None:
    log = (
        "INFO 01-02 03:04:05 api_server.py:1 vLLM API server version 0.9.2\n"
        "INFO 01-02 03:04:06 llm_engine.py:2 Initializing an LLM engine (v0.9.2) with config: model='m', "
        'speculative_config=None, enforce_eager=False, seed=0, compilation_config={"level":3,'
        '"cudagraph_capture_sizes":[1,2,4]}\n'
    )
    facts = parse_vllm_log(log)
    assert facts.version == "0.9.2"
    assert facts.compilation_mode == "VLLM_COMPILE"


def test_vllm_errors_and_nan_lines() -> None:
    log = (
        "(EngineCore pid=1) ERROR 06-13 19:57:36 [multiproc_executor.py:989] WorkerProc hit an exception.\n"
        "ValueError: No available memory for the cache blocks.\n"
        "(APIServer pid=1) INFO 06-13 19:58:00 [serving.py:1] Out of range float values are not JSON compliant: nan\n"
    )
    facts = parse_vllm_log(log)
    assert len(facts.errors) == 2
    assert facts.nan_events == [log.splitlines()[2]]


def test_vllm_truncated_log_reports_nothing_about_graphs() -> None:
    facts = parse_vllm_log(
        "(APIServer pid=1) INFO 11-30 12:00:00 [api_utils.py:339]  ▄▄ ▄█ █  version 0.32.0\n"
    )
    assert facts.version == "0.32.0"
    assert facts.cuda_graph_enabled is None
    assert facts.captured_batch_sizes is None
    result = by_name(check_config_is_execution(spec(cuda_graph=CudaGraphSpec(enabled=False)), facts))
    assert result["cuda_graph.captured"].status == "unverifiable"


@pytest.mark.skipif(not REAL_VLLM_LOGS, reason="no tests/data/logs/real_vllm_*.log recorded yet")
@pytest.mark.parametrize("path", REAL_VLLM_LOGS, ids=lambda p: p.name)
def test_real_vllm_logs_parse(path: Path) -> None:
    facts = parse_vllm_log(path.read_text(encoding="utf-8", errors="replace"))
    assert facts.engine == "vllm"
    assert facts.version, "a real boot log states its version (banner or config line)"
    assert facts.compilation_mode is not None
    assert facts.cudagraph_mode is not None
    assert facts.kv_cache_tokens
    assert facts.kv_cache_tokens > 0
    assert facts.seed is not None
    assert_every_fact_has_evidence(facts)
    json.dumps(facts.to_dict())
    if "eager" in path.name:
        assert facts.enforce_eager is True
        assert facts.compilation_mode == "NONE"
    if "compiled" in path.name:
        assert facts.enforce_eager is False
        assert facts.compilation_mode != "NONE"


# --------------------------------------------------------------------------- SGLang


def test_sglang_059_excerpt() -> None:
    facts = parse_sglang_log(read("sglang_0.5.9.log"))
    assert facts.engine == "sglang"
    assert facts.attention_backend == "fa3"
    assert facts.prefill_attention_backend == facts.decode_attention_backend == "fa3"
    assert facts.nsa_prefill_backend is None
    assert facts.cuda_graph_enabled is True
    assert facts.cudagraph_mode == "full"
    assert facts.captured_batch_sizes == (1, 2, 4, 8, 16, 24, 32)
    assert facts.decode_batches_on_graph == 3
    assert facts.decode_batches_off_graph == 0
    assert [b.running_reqs for b in facts.decode_batches] == [8, 8, 3]
    assert facts.decode_batches[0].tokens == 2336
    assert facts.decode_batches[0].gen_throughput == 1200.40
    assert facts.kv_cache_tokens == 413142
    assert facts.max_batch_size == 32
    assert facts.mem_fraction == 0.85
    assert facts.seed == 0
    assert facts.speculative is False
    assert facts.deterministic is False
    assert facts.startup_s == 22.0
    assert facts.nan_events == []
    assert facts.errors == []
    assert_every_fact_has_evidence(facts)


def test_sglang_0515_dsa_excerpt() -> None:
    facts = parse_sglang_log(read("sglang_0.5.15_dsa.log"))
    assert facts.attention_backend == "dsa"
    assert facts.nsa_prefill_backend == "flashmla_auto"
    assert facts.nsa_decode_backend == "flashmla_kv"
    assert any("Set DSA backends" in line for line in facts.evidence["nsa_decode_backend"])
    # decode sizes from the target decode capture; the prefill capture (num_tokens=8192) is not a batch size
    assert facts.captured_batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert facts.cudagraph_mode == "full"
    assert facts.kv_cache_tokens == 1187456
    assert facts.seed == 1234
    assert facts.max_batch_size == 64
    assert len(facts.nan_events) == 1
    assert "NaN detected in sampler" in facts.nan_events[0]
    assert_every_fact_has_evidence(facts)


def test_sglang_0523_excerpt() -> None:
    facts = parse_sglang_log(read("sglang_0.5.23.log"))
    assert facts.captured_batch_sizes == (1, 2, 4, 8, 12, 16, 24, 32)  # from the *end* line in 0.5.23
    assert facts.decode_batches_on_graph == 2
    assert facts.decode_batches_off_graph == 1  # 48 running > largest graph 32: eager
    assert facts.deterministic is True
    assert facts.attention_backend == "flashinfer"
    assert facts.seed == 7
    assert_every_fact_has_evidence(facts)


def test_sglang_0515_capture_list_cut_by_max_running_requests_is_a_failure() -> None:
    facts = parse_sglang_log(read("sglang_0.5.15_dsa.log"))
    wanted = spec(
        engine="sglang",
        seed=1234,
        nsa_prefill_backend="flashmla_auto",
        nsa_decode_backend="flashmla_kv",
        cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128)),
    )
    checks = by_name(check_config_is_execution(wanted, facts))
    assert checks["nsa_prefill_backend"].status == "pass"
    assert checks["nsa_decode_backend"].status == "pass"
    assert checks["cuda_graph.captured"].status == "fail"
    assert "missing sizes [128]" in checks["cuda_graph.captured"].message
    assert checks["cuda_graph.used_in_decode"].status == "pass"
    assert checks["seed"].status == "pass"


def test_graphs_requested_but_decode_ran_eager_fails_with_proof() -> None:
    facts = parse_sglang_log(read("sglang_0.5.9_graph_not_replayed.log"))
    wanted = spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8)))
    checks = by_name(check_config_is_execution(wanted, facts))
    assert checks["cuda_graph.captured"].status == "pass"  # captured fine...
    used = checks["cuda_graph.used_in_decode"]
    assert used.status == "fail"  # ...but never replayed
    assert used.requested == "cuda graphs on, batch sizes [1, 2, 4, 8]"
    assert used.observed.startswith("ran WITHOUT a graph within the captured sizes (bs 3: 1 step(s), bs 8: 2 step(s))")
    message = used.message
    assert "requested cuda graphs on, batch sizes [1, 2, 4, 8]" in message
    assert "observed ran WITHOUT a graph within the captured sizes" in message
    assert "Decode batch, #running-req: 8, #token: 2336, token usage: 0.01, cuda graph: False" in message
    assert all("cuda graph: False" in line for line in used.evidence)


def test_graphs_disabled_but_captured_fails() -> None:
    facts = parse_sglang_log(read("sglang_0.5.9.log"))
    checks = by_name(
        check_config_is_execution(spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=False)), facts)
    )
    captured = checks["cuda_graph.captured"]
    assert captured.status == "fail"
    assert captured.requested == "cuda graphs off"
    assert captured.observed == "captured [1, 2, 4, 8, 16, 24, 32]"
    assert any("Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]" in line for line in captured.evidence)
    assert checks["cuda_graph.used_in_decode"].status == "fail"


def test_graphs_disabled_and_none_captured_passes() -> None:
    log = "\n".join(
        [
            "[2026-02-23 08:00:00] server_args=ServerArgs(model_path='m', random_seed=5, attention_backend='torch_native', "
            "cuda_graph_max_bs=8, cuda_graph_bs=[1, 2, 4, 8], disable_cuda_graph=True, speculative_algorithm=None)",
            "[2026-02-23 08:00:00] Cuda graph is disabled because of using torch native attention backend",
            "[2026-02-23 08:00:30] The server is fired up and ready to roll!",
            "[2026-02-23 08:00:40 TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.00, cuda graph: False, "
            "gen throughput (token/s): 20.00, #queue-req: 0",
        ]
    )
    facts = parse_sglang_log(log)
    assert facts.captured_batch_sizes == ()
    assert facts.cuda_graph_enabled is False
    assert facts.cudagraph_mode == "disabled"
    checks = by_name(
        check_config_is_execution(
            spec(engine="sglang", seed=5, cuda_graph=CudaGraphSpec(enabled=False)), facts
        )
    )
    assert checks["cuda_graph.captured"].status == "pass"
    assert checks["cuda_graph.used_in_decode"].status == "pass"
    # and asking for graphs on that server fails (torch_native silently switched them off)
    on = by_name(
        check_config_is_execution(spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=True)), facts)
    )
    assert on["cuda_graph.captured"].status == "fail"
    assert any("torch native" in line for line in on["cuda_graph.captured"].evidence)


def test_unreported_facts_are_unverifiable_never_pass() -> None:
    facts = parse_sglang_log("")  # nothing logged at all
    wanted = spec(
        engine="sglang",
        attention_backend="fa3",
        nsa_decode_backend="trtllm",
        mem_fraction=0.9,
        max_batch_size=16,
        deterministic=True,
        eager=True,
        cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2)),
    )
    results = check_config_is_execution(wanted, facts)
    assert {r.name for r in results} == {
        "attention_backend",
        "nsa_decode_backend",
        "cuda_graph.captured",
        "cuda_graph.used_in_decode",
        "speculative",
        "eager",
        "mem_fraction",
        "max_batch_size",
        "seed",
        "deterministic",
        "dsa sparse path",  # a DSA backend requested: where the sparse kernels ran must be shown too
    }
    assert all(r.status == "unverifiable" for r in results), [r.message for r in results]
    assert "evidence: none" in results[0].message


def test_nothing_requested_emits_only_always_requested_checks() -> None:
    facts = parse_sglang_log(read("sglang_0.5.9.log"))
    names = [r.name for r in check_config_is_execution(spec(engine="sglang"), facts)]
    assert names == ["speculative", "seed"]  # speculative None means "must be off"; the seed is always passed


def test_graph_used_needs_proof_when_only_capture_is_known() -> None:
    log = (
        "[2026-10-20 10:00:23 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
        "avail mem=35.02 GB\n[2026-10-20 10:00:26 TP0] Capture target decode CUDA graph end. bs=[1, 2], "
        "elapsed=3.12 s, mem usage=0.41 GB, avail mem=34.61 GB.\n"
    )
    facts = parse_sglang_log(log)
    checks = by_name(
        check_config_is_execution(spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=True)), facts)
    )
    assert checks["cuda_graph.captured"].status == "pass"
    assert checks["cuda_graph.used_in_decode"].status == "unverifiable"


def test_sglang_speculative_decode_lines_prove_speculation() -> None:
    log = (
        "[2026-02-23 08:12:31 TP0] Decode batch, #running-req: 4, #token: 900, token usage: 0.01, "
        "accept len: 2.81, accept rate: 0.70, cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0\n"
    )
    facts = parse_sglang_log(log)
    assert facts.speculative is True
    assert facts.decode_batches[0].accept_len == 2.81
    result = by_name(check_config_is_execution(spec(engine="sglang"), facts))["speculative"]
    assert result.status == "fail"
    assert result.requested == "off"


def test_sglang_log_prefix_variants_and_failure_lines() -> None:
    log = "\n".join(
        [
            "[2026-03-21 03:31:56] INFO server_args.py:2233: Attention backend not specified. Use fa3 backend by default.",
            "[2026-03-21 03:31:57 DP0 TP0] Decode batch [1200], #running-req: 2, #token: 80, token usage: 0.00, "
            "cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0",
            "[2026-03-21 03:31:58 TP0] Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB",
            "[2026-03-21 03:31:58 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            "RuntimeError: Detected errors during sampling! NaN in the logits.",
        ]
    )
    facts = parse_sglang_log(log)
    assert facts.attention_backend == "fa3"
    assert facts.decode_batches_on_graph == 1
    assert facts.cuda_graph_enabled is False  # capture failed
    assert len(facts.errors) == 3
    assert facts.nan_events == ["RuntimeError: Detected errors during sampling! NaN in the logits."]


def test_evidence_is_compacted_for_long_runs() -> None:
    line = (
        "[2026-02-23 08:12:{:02d} TP0] Decode batch, #running-req: 8, #token: {}, token usage: 0.01, "
        "cuda graph: True, gen throughput (token/s): 1200.40, #queue-req: 0"
    )
    facts = parse_sglang_log("\n".join(line.format(i % 60, 1000 + i) for i in range(50)))
    assert facts.decode_batches_on_graph == 50
    lines = facts.evidence["decode_batches_on_graph"]
    assert len(lines) == 11
    assert lines[5] == "... (40 more lines) ..."


# --------------------------------------------------------------------------- metrics and /server_info

SGLANG_METRICS = """\
# HELP sglang:cuda_graph_passes_total Number of forward passes by cuda graph mode.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_cuda_graph",model_name="m",tp_rank="0"} 1520.0
sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_cuda_graph",model_name="m",tp_rank="1"} 1520.0
sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_none",model_name="m",tp_rank="0"} 12.0
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 413142.0
sglang:engine_startup_time{model_name="m"} 21.5
sglang:generation_tokens_total{model_name="m",label="a \\"quoted\\", comma"} 2.5e+04
sglang:gen_throughput{model_name="m"} NaN
"""


def test_parse_prometheus() -> None:
    metrics = parse_prometheus(SGLANG_METRICS)
    assert len(metrics["sglang:cuda_graph_passes_total"]) == 3
    labels, value = metrics["sglang:generation_tokens_total"][0]
    assert value == 25000.0
    assert labels["label"] == 'a "quoted", comma'
    assert metrics["sglang:gen_throughput"][0][1] != metrics["sglang:gen_throughput"][0][1]  # NaN kept


def test_metrics_prove_graph_use_without_decode_lines() -> None:
    facts = merge_metrics(ServerFacts(engine="sglang"), SGLANG_METRICS, "sglang")
    assert facts.graph_passes == {
        "decode_cuda_graph": 1520.0,
        "decode_none": 12.0,
    }  # TP ranks not double-counted
    assert facts.kv_cache_tokens == 413142
    assert facts.startup_s == 21.5
    assert_every_fact_has_evidence(facts)
    used = by_name(
        check_config_is_execution(spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=True)), facts)
    )["cuda_graph.used_in_decode"]
    assert used.status == "pass"
    assert any('mode="decode_cuda_graph"' in line for line in used.evidence)


def test_metrics_with_only_eager_passes_fail_graph_use() -> None:
    text = 'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"} 0\nsglang:cuda_graph_passes_total{mode="decode_none"} 90\n'
    facts = merge_metrics(ServerFacts(engine="sglang"), text, "sglang")
    used = by_name(
        check_config_is_execution(spec(engine="sglang", cuda_graph=CudaGraphSpec(enabled=True)), facts)
    )["cuda_graph.used_in_decode"]
    assert used.status == "fail"
    assert "decode_none=90" in used.observed


def test_vllm_metrics_fill_gaps() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.9",num_gpu_blocks="5824"} 1.0\n'
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 42.0\n'
    )
    facts = merge_metrics(ServerFacts(engine="vllm"), text, "vllm")
    assert facts.mem_fraction == 0.9
    assert facts.kv_cache_tokens == 93184
    assert facts.speculative is True
    assert_every_fact_has_evidence(facts)


def test_sglang_server_info_and_fill_missing() -> None:
    info = {
        "version": "0.5.23",
        "attention_backend": "fa3",
        "prefill_attention_backend": None,
        "decode_attention_backend": "flashinfer",
        "dsa_prefill_backend": "tilelang",
        "random_seed": 11,
        "mem_fraction_static": 0.88,
        "max_total_num_tokens": 1000,
        "speculative_algorithm": None,
        "cuda_graph_backend_decode": "full",
        "startup_time": 33.3,
        "internal_states": [{"effective_max_running_requests_per_dp": 24, "memory_usage": {"graph": 0.41}}],
    }
    info_facts = parse_sglang_server_info(info)
    assert info_facts.version == "0.5.23"
    assert info_facts.prefill_attention_backend == "fa3"
    assert info_facts.decode_attention_backend == "flashinfer"
    assert info_facts.nsa_prefill_backend == "tilelang"
    assert info_facts.max_batch_size == 24
    assert info_facts.cuda_graph_enabled is True
    assert info_facts.cudagraph_mode == "full"
    assert info_facts.speculative is False
    assert_every_fact_has_evidence(info_facts)
    log_facts = parse_sglang_log(read("sglang_0.5.9.log"))
    merged = fill_missing(log_facts, info_facts)
    assert merged.version == "0.5.23"  # the log has no version; /server_info does
    assert merged.attention_backend == "fa3"
    assert merged.seed == 0
    assert merged.evidence["version"] == ["/server_info version='0.5.23'"]


def test_server_info_disabled_graphs() -> None:
    facts = parse_sglang_server_info({"disable_cuda_graph": True, "cuda_graph_bs": [1, 2]})
    assert facts.cuda_graph_enabled is False
    assert facts.cudagraph_mode == "disabled"
    assert facts.captured_batch_sizes is None  # a requested list is not a capture


# --------------------------------------------------------------------------- reports


def test_to_dict_is_json_serializable() -> None:
    for name in ("sglang_0.5.15_dsa.log", "vllm_gpu_0.20_downgrade.log"):
        facts = (parse_sglang_log if name.startswith("sglang") else parse_vllm_log)(read(name))
        data = json.loads(json.dumps(facts.to_dict()))
        assert data["engine"] in ("sglang", "vllm")
        assert isinstance(data["evidence"], dict)


def test_check_message_shortens_long_config_lines_around_the_proof() -> None:
    facts = parse_vllm_log(read("vllm_cpu_0.32_compiled.log"))
    result = by_name(check_config_is_execution(spec(eager=True), facts))["eager"]
    assert result.status == "fail"
    assert all(len(line) <= 402 for line in result.evidence)
    assert any("'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>" in line for line in result.evidence)
    assert result.to_dict()["status"] == "fail"
