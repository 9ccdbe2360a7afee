"""Facts and config-is-execution from the logs, /metrics and /server_info of real SGLang 0.5.15 and vLLM 0.26.0
servers on an H200 (tests/data/logs/README.md says how each file was recorded), plus the formats the issue
found in SGLang 0.5.23 and 0.5.15 sources that no recorded log has yet."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines import adapter_named
from pytest_llmserve.engines.sglang.facts import parse_sglang_log, parse_sglang_server_info
from pytest_llmserve.engines.vllm.facts import parse_vllm_log
from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.verdicts.execution import CheckResult

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
GRAPHS_1_8 = CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8))


def recorded(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def facts_of(engine: str, stem: str, with_info: bool = False) -> ServerFacts:
    info = json.loads(recorded(stem + ".server_info.json")) if with_info else None
    return adapter_named(engine).parse_facts(recorded(stem + ".log"), recorded(stem + ".metrics.txt"), info)


def checks(engine: str, spec: ServerSpec, facts: ServerFacts) -> dict[str, CheckResult]:
    return {r.name: r for r in adapter_named(engine).check_execution(spec, facts)}


def test_real_sglang_0515_with_graphs_proves_what_ran() -> None:
    facts = facts_of("sglang", "real_sglang_0.5.15_h200_cuda_graph", with_info=True)
    assert (facts.version, facts.attention_backend, facts.cudagraph_mode) == ("0.5.15", "triton", "full")
    assert facts.captured_batch_sizes == (1, 2, 4, 8)
    assert (facts.mem_fraction, facts.seed, facts.speculative) == (0.5, 0, False)
    assert facts.kv_cache_tokens == 3227882
    # /metrics: 25 decode passes replayed a graph, 32 did not (10 running requests > 8 among them).
    assert (facts.graph_passes_on, facts.graph_passes_off) == (25.0, 32.0)
    # The one decode line of the default --decode-log-interval 40: 10 running requests, above the largest graph.
    assert facts.graph_use_by_size == {10: {"on": 0, "off": 1}}
    spec = ServerSpec(name="s", engine="sglang", model="/m", attention_backend="triton", cuda_graph=GRAPHS_1_8,
                      mem_fraction=0.5, seed=0)
    result = checks("sglang", spec, facts)
    assert result["cuda_graph.captured"].status == "pass"
    used = result["cuda_graph.used_in_decode"]
    assert used.status == "pass", used.message  # the step at 10 > 8 is not counted; the counter proves replays
    assert "not counted" in used.note and "25 decode passes" in used.note
    for name in ("attention_backend", "mem_fraction", "seed", "speculative"):
        assert result[name].status == "pass", result[name].message


def test_real_sglang_0515_without_graphs() -> None:
    facts = facts_of("sglang", "real_sglang_0.5.15_h200_no_cuda_graph")
    assert facts.cuda_graph_enabled is False and facts.captured_batch_sizes == ()
    assert facts.cudagraph_mode == "disabled" and facts.graph_passes_on == 0.0
    spec = ServerSpec(name="s", engine="sglang", model="/m", cuda_graph=CudaGraphSpec(enabled=False))
    result = checks("sglang", spec, facts)
    assert result["cuda_graph.captured"].status == "pass"
    assert result["cuda_graph.used_in_decode"].status == "pass"
    # Asking for graphs on this server is caught: nothing captured.
    wanted = ServerSpec(name="s", engine="sglang", model="/m", cuda_graph=GRAPHS_1_8)
    assert checks("sglang", wanted, facts)["cuda_graph.captured"].status == "fail"


def test_real_vllm_026_full_and_piecewise() -> None:
    facts = facts_of("vllm", "real_vllm_gpu_0.26.0_h200_full_and_piecewise")
    assert facts.version == "0.26.0" and facts.attention_backend == "triton_attn"
    assert facts.cudagraph_mode == "FULL_AND_PIECEWISE" and facts.compilation_mode == "VLLM_COMPILE"
    # 0.26's V2 model runner names its bars by mode only: "Capturing CUDA graphs (PIECEWISE)" / "(FULL)".
    assert facts.graph_captures == {"PIECEWISE": 4, "FULL": 4}
    assert facts.captured_batch_sizes == (1, 2, 4, 8)
    assert facts.kv_cache_tokens == 3226544 and facts.mem_fraction == 0.5
    spec = ServerSpec(name="s", engine="vllm", model="/m", attention_backend="TRITON_ATTN", cuda_graph=GRAPHS_1_8,
                      mem_fraction=0.5, seed=0)
    result = checks("vllm", spec, facts)
    assert result["cuda_graph.captured"].status == "pass"
    used = result["cuda_graph.used_in_decode"]
    assert used.status == "unverifiable" and "V2 model runner" in used.note  # 0.26 runs V2: no per-step table
    assert result["attention_backend"].status == "pass"


VLLM_TABLE = """(APIServer pid=1) INFO 12-01 21:17:23 [api_server.py:677] Starting vLLM server on http://0.0.0.0:8000
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] **CUDAGraph Config Settings:**
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120]
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] - Mode: CUDAGraphMode.FULL_AND_PIECEWISE
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] - Capture sizes: [1, 2, 4, 8]
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] **CUDAGraph Stats:**
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] | Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
(APIServer pid=1) INFO 12-01 21:17:33 [cuda_graph.py:120] |-----------------|---------------|--------------|--------------|-------|
| 8               | 8             | 0            | FULL         | 250   |
| 3               | 4             | 1            | FULL         | 40    |
| 5               | 5             | 0            | NONE         | {eager} |
| 37              | 37            | 0            | NONE         | 8     |
"""


def test_vllm_cudagraph_metrics_rows_prove_graph_use_per_batch_size() -> None:
    spec = ServerSpec(name="s", engine="vllm", model="/m", cuda_graph=GRAPHS_1_8)
    healthy = parse_vllm_log(recorded("real_vllm_gpu_0.26.0_h200_full_and_piecewise.log")
                             + VLLM_TABLE.replace("| 5               | 5             | 0            | NONE         | {eager} |\n", ""))
    assert healthy.graph_use_by_size == {8: {"on": 250, "off": 0}, 3: {"on": 40, "off": 0}, 37: {"on": 0, "off": 8}}
    used = checks("vllm", spec, healthy)["cuda_graph.used_in_decode"]
    assert used.status == "pass" and "8 step(s) above the largest captured size 8" in used.note
    broken = parse_vllm_log(recorded("real_vllm_gpu_0.26.0_h200_full_and_piecewise.log") + VLLM_TABLE.format(eager=6))
    used = checks("vllm", spec, broken)["cuda_graph.used_in_decode"]
    assert used.status == "fail" and "bs 5: 6 step(s)" in used.observed


def test_sglang_in_range_decode_step_without_a_graph_fails_even_when_others_replayed() -> None:
    log = recorded("real_sglang_0.5.15_h200_cuda_graph.log") + "\n".join(
        f"[2026-12-01 21:30:0{i}] Decode batch, #running-req: {bs}, #token: 100, token usage: 0.00, "
        f"cuda graph: {on}, gen throughput (token/s): 800.0, #queue-req: 0"
        for i, (bs, on) in enumerate([(1, True), (4, True), (3, False), (9, False)]))
    facts = parse_sglang_log(log)
    spec = ServerSpec(name="s", engine="sglang", model="/m", cuda_graph=GRAPHS_1_8)
    used = checks("sglang", spec, facts)["cuda_graph.used_in_decode"]
    assert used.status == "fail"
    assert "bs 3: 1 step(s)" in used.observed and "bs 9" not in used.observed.split(";")[0]


SGL_0523_ARGS = ("[2026-12-01 10:00:00] server_args={'model_path': '/models/GLM-5', 'attention_backend': 'flashinfer', "
                 "'dsa_prefill_backend': 'flashmla_sparse', 'dsa_decode_backend': 'flashmla_kv', 'random_seed': 7, "
                 "'mem_fraction_static': 0.82, 'speculative_algorithm': 'DSPARK', 'cuda_graph_backend_decode': 'full', "
                 "'load_format': <LoadFormat.AUTO: 'auto'>, 'max_running_requests': 64}")


def test_sglang_0523_dict_form_server_args() -> None:
    facts = parse_sglang_log(SGL_0523_ARGS)
    assert facts.attention_backend == "flashinfer"
    assert (facts.nsa_prefill_backend, facts.nsa_decode_backend) == ("flashmla_sparse", "flashmla_kv")
    assert (facts.seed, facts.mem_fraction, facts.max_batch_size) == (7, 0.82, 64)
    assert facts.speculative is True and facts.speculative_detail == "algorithm=DSPARK"


def test_sglang_lines_the_parser_used_to_miss() -> None:
    disabled = parse_sglang_log("[2026-12-01 10:00:00] CUDA graph is disabled because of using torch native "
                                "attention backend\n[2026-12-01 10:00:09] The server is fired up and ready to roll!")
    assert disabled.cuda_graph_enabled is False and disabled.cudagraph_mode == "disabled"
    hybrid = parse_sglang_log("[2026-12-01 10:00:10] Decode batch, #running-req: 2, #full token: 640, full token "
                              "usage: 0.01, #swa token: 512, swa token usage: 0.01, cuda graph: True, gen throughput "
                              "(token/s): 90.1, #queue-req: 0")
    assert hybrid.decode_batches[0].tokens == 640 and hybrid.graph_use_by_size == {2: {"on": 1, "off": 0}}
    cpu = parse_sglang_log("[2026-12-01 10:00:00] Capture cpu graph bs [1, 2, 4]\n"
                           "[2026-12-01 10:00:03] Capture cpu graph end. Time elapsed: 3.1 s.\n"
                           "[2026-12-01 10:00:09] The server is fired up and ready to roll!")
    assert cpu.cuda_graph_enabled is True and cpu.captured_batch_sizes == (1, 2, 4)


def test_sglang_0523_metrics_and_server_info_shapes() -> None:
    facts = ServerFacts(engine="sglang")
    adapter_named("sglang").merge_metrics(facts, 'sglang:startup_time_seconds{phase="load_weights"} 12.0\n'
                                                 'sglang:startup_time_seconds{phase="total"} 61.5\n')
    assert facts.startup_s == 61.5
    info = parse_sglang_server_info({"internal_states": [{"memory_usage": {"graph": {"decode": 0.4, "prefill": 0.2}}}]})
    assert info.cuda_graph_enabled is True
    none = parse_sglang_server_info({"internal_states": [{"memory_usage": {"graph": {"decode": 0.0}}}],
                                     "cuda_graph_backend_decode": "disabled"})
    assert none.cuda_graph_enabled is False


def test_a_requested_graph_mode_is_launched_and_checked() -> None:
    from pytest_llmserve.config import parse_cuda_graph

    graph = parse_cuda_graph({"enabled": True, "mode": "PIECEWISE", "batch_sizes": [1, 2, 4, 8]}, "cuda_graph")
    assert graph.label == "on(PIECEWISE:1,2,4,8)"
    spec = ServerSpec(name="s", engine="vllm", model="/m", cuda_graph=graph)
    plan = adapter_named("vllm").launch_plan(spec, "127.0.0.1", 8000)
    config = json.loads(plan.argv[plan.argv.index("--compilation-config") + 1])
    assert config["cudagraph_mode"] == "PIECEWISE" and config["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert "--cudagraph-metrics" in plan.argv
    # The recorded server ran FULL_AND_PIECEWISE: asking for PIECEWISE is a named mismatch.
    facts = facts_of("vllm", "real_vllm_gpu_0.26.0_h200_full_and_piecewise")
    mode = checks("vllm", spec, facts)["cuda_graph.mode"]
    assert (mode.status, mode.requested, mode.observed) == ("fail", "PIECEWISE", "FULL_AND_PIECEWISE")


def test_sglang_gets_a_port_its_derived_grpc_port_fits_beside() -> None:
    from pytest_llmserve.server import procs

    assert adapter_named("sglang").highest_port == 55535
    for _ in range(20):
        assert 1024 < procs.free_port("127.0.0.1", highest=55535) <= 55535


def test_real_sglang_run_on_the_real_model_proves_graph_use_for_every_batch_size() -> None:
    """The built-in suite on the H200 (SGLang 0.5.15, SmolLM2-135M-Instruct bf16, --decode-log-interval 1 added by the
    adapter): every decode step of 1..8 running requests replayed a graph; the 60 steps at 9 (above the largest
    captured size, the suite's bs=9-above-max-8 case) ran eager, as they must."""
    facts = parse_sglang_log(recorded("real_sglang_0.5.15_h200_smollm2_graphs_interval1.log"))
    assert facts.captured_batch_sizes == (1, 2, 4, 8)
    assert facts.graph_use_by_size[9] == {"on": 0, "off": 60}
    assert all(use["off"] == 0 and use["on"] > 0 for size, use in facts.graph_use_by_size.items() if size <= 8)
    assert set(facts.graph_use_by_size) >= {1, 2, 3, 4, 5, 8}  # captured sizes and padded ones in between
    spec = ServerSpec(name="s", engine="sglang", model="/m", attention_backend="triton", cuda_graph=GRAPHS_1_8,
                      mem_fraction=0.3, seed=0)
    result = checks("sglang", spec, facts)
    used = result["cuda_graph.used_in_decode"]
    assert used.status == "pass" and "60 step(s) above the largest captured size 8 not counted" in used.note
    # The same log with one in-range step (3 running requests) turned eager is caught.
    original = recorded("real_sglang_0.5.15_h200_smollm2_graphs_interval1.log")
    log = re.sub(r"(#running-req: 3, #token: \d+, token usage: [\d.]+, cuda graph: )True", r"\1False", original, count=1)
    assert log != original
    broken = checks("sglang", spec, parse_sglang_log(log))["cuda_graph.used_in_decode"]
    assert broken.status == "fail" and "bs 3: 1 step(s)" in broken.observed


def test_real_vllm_026_suite_runs_on_the_real_model() -> None:
    """The built-in suite's own launches on the H200 (real SmolLM2 weights): graphs captured as asked, graph use
    UNVERIFIABLE with the V2 runner named as the reason; eager really eager."""
    graphs = parse_vllm_log(recorded("real_vllm_gpu_0.26.0_h200_smollm2_full_and_piecewise_suite.log"))
    assert (graphs.cudagraph_mode, graphs.captured_batch_sizes) == ("FULL_AND_PIECEWISE", (1, 2, 4, 8))
    spec = ServerSpec(name="s", engine="vllm", model="/m", cuda_graph=CudaGraphSpec(
        enabled=True, batch_sizes=(1, 2, 4, 8), mode="FULL_AND_PIECEWISE"), mem_fraction=0.3, seed=0)
    result = checks("vllm", spec, graphs)
    assert result["cuda_graph.mode"].status == result["cuda_graph.captured"].status == "pass"
    assert result["cuda_graph.used_in_decode"].status == "unverifiable"
    assert "V2 model runner" in result["cuda_graph.used_in_decode"].note
    eager = parse_vllm_log(recorded("real_vllm_gpu_0.26.0_h200_smollm2_eager_suite.log"))
    assert (eager.enforce_eager, eager.compilation_mode, eager.cuda_graph_enabled) == (True, "NONE", False)


DSA_DECODE_LINES = ("Set DSA backends for bfloat16 KV Cache: prefill=flashmla_sparse, decode=",
                    "Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2, 4, 8]")


def test_real_sglang_0515_dsa_flashmla_kv_with_graphs_proves_backend_and_graph_use_per_batch_size() -> None:
    """The plugin's own launch on the H200 (scripts/gpu/dsa_suite.sh d1): the tiny DSA model, decode on flashmla_kv,
    graphs for 1, 2, 4, 8, through the built-in suite: every decode step of 1..8 running requests on a graph (3, 5
    and 6 padded up), every step above 8 eager."""
    text = recorded("real_sglang_0.5.15_h200_dsa_flashmla_kv_graphs_suite.log")
    assert all(line in text for line in DSA_DECODE_LINES)
    facts = parse_sglang_log(text)
    assert (facts.attention_backend, facts.nsa_prefill_backend, facts.nsa_decode_backend) == (
        "dsa", "flashmla_sparse", "flashmla_kv")
    assert facts.captured_batch_sizes == (1, 2, 4, 8) and facts.cudagraph_mode == "full"
    assert all(use["off"] == 0 and use["on"] > 0 for size, use in facts.graph_use_by_size.items() if size <= 8)
    assert all(use["on"] == 0 and use["off"] > 0 for size, use in facts.graph_use_by_size.items() if size > 8)
    assert {3, 5, 9} <= set(facts.graph_use_by_size)  # the padded and above-max batch cases ran
    assert (facts.kv_cache_tokens, facts.mem_fraction, facts.seed) == (65536, 0.25, 0)
    spec = ServerSpec(name="dsa", engine="sglang", model="/m", attention_backend="dsa",
                      nsa_prefill_backend="flashmla_sparse", nsa_decode_backend="flashmla_kv", cuda_graph=GRAPHS_1_8,
                      mem_fraction=0.25, seed=0)
    result = checks("sglang", spec, facts)
    assert {name: r.status for name, r in result.items()} == {name: "pass" for name in result}
    # The same log against another requested decode backend: caught, naming the line that proves what ran.
    other = checks("sglang", ServerSpec(name="dsa", engine="sglang", model="/m", nsa_decode_backend="tilelang"),
                   facts)["nsa_decode_backend"]
    assert other.status == "fail" and "decode=flashmla_kv" in other.message


def test_the_dsa_sparse_path_is_shown_by_the_threshold_line_and_unverifiable_without_it() -> None:
    """config-is-execution's "dsa sparse path": the real log's dense-attention threshold line (0: every prefill
    sparse) proves where the sparse kernels ran; the same log with that line removed shows nothing, and the check is
    unverifiable, never a pass."""
    text = recorded("real_sglang_0.5.15_h200_dsa_flashmla_kv_graphs_suite.log")
    spec = ServerSpec(name="dsa", engine="sglang", model="/m", attention_backend="dsa", nsa_decode_backend="flashmla_kv")
    shown = checks("sglang", spec, parse_sglang_log(text))["dsa sparse path"]
    assert shown.status == "pass"
    assert shown.observed == "prefills of more than 0 tokens of KV (all of them) and every decode step"
    assert any("Dense attention kv len threshold is manually set to 0" in line for line in shown.evidence)
    without = "\n".join(line for line in text.splitlines() if "Dense attention kv len threshold" not in line)
    hidden = checks("sglang", spec, parse_sglang_log(without))["dsa sparse path"]
    assert hidden.status == "unverifiable" and "logged no dense-attention threshold" in hidden.message


def test_real_sglang_0515_dsa_tilelang_without_graphs() -> None:
    facts = parse_sglang_log(recorded("real_sglang_0.5.15_h200_dsa_tilelang_nographs_suite.log"))
    assert (facts.nsa_decode_backend, facts.cuda_graph_enabled, facts.captured_batch_sizes) == ("tilelang", False, ())
    assert all(use["on"] == 0 for use in facts.graph_use_by_size.values())
    spec = ServerSpec(name="dsa", engine="sglang", model="/m", nsa_decode_backend="tilelang",
                      cuda_graph=CudaGraphSpec(enabled=False))
    result = checks("sglang", spec, facts)
    assert result["nsa_decode_backend"].status == "pass"
    assert result["cuda_graph.used_in_decode"].status == "pass"
    assert checks("sglang", ServerSpec(name="dsa", engine="sglang", model="/m", cuda_graph=GRAPHS_1_8),
                  facts)["cuda_graph.captured"].status == "fail"
