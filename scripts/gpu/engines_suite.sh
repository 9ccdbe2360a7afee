#!/usr/bin/env bash
# The H200 run of the seeds' engines: SGLang 0.5.15 and vLLM 0.26.0 under `pytest -m gpu --llmserve-suite`, their
# A/B verdicts and confounders, as a planned sequence of device calls on one warm machine. Prepare the carried files
# on the development machine first (scripts/gpu/prepare_engines.sh); the environments are put together on the device
# by scripts/gpu/device_engines_env.sh.
#
#   bash scripts/gpu/engines_suite.sh CALL        (c1 ... c6; each call checks what it expects on the machine)
#
# The plan (kind nvidia-h200, timeout_s 600 each, issued back to back: /root survives only while the machine stays
# warm, about 30 s after a call returns; the whole plan must end within the 30 minutes a machine may be held):
#   c1  carry .gpu-transfer/engines/call1   stage; plugin wheels; GPU and python report; the plugin imports
#   c2  carry .gpu-transfer/engines/call2   stage; the GGUF joined, checked and converted to bf16 safetensors
#   c3  carry .gpu-transfer/engines/call3   SGLang env; a flashinfer JIT probe in the background; SGLang graphs A/B
#                                           (concurrency 1 and 64), then the built-in suite on triton x {graphs, none}
#                                           (the A/B's two servers are reused: no extra boot)
#   c4  carry .gpu-transfer/engines/call4   vLLM env; vLLM A/B (eager vs FULL_AND_PIECEWISE at concurrency 1 and
#                                           64), the suite on FULL_AND_PIECEWISE and eager, baselines saved
#   c5  no carry                            unconfigured ngram speculation caught; the eager baseline compared at
#                                           another memory fraction (refused with the diff); the suite on PIECEWISE
#   c6  no carry (if the lease allows)      graph use per batch size on vLLM's V1 model runner
# The A/B tests (scripts/gpu/test_gpu_engines.py) assert a verdict each: graphs "improved" at concurrency 1 (measured
# on SGLang: +792 %), a decided one (not inconclusive) at 64 at once, where the direction is not known; every verdict
# from valid rounds.
# What comes back ($OUT, 8 files at most): run.log (this call's whole output), results.tar.gz (server logs,
# /metrics and /server_info captured at the end of each run, results.json, summary.md, junit XML, the configs).
set -uo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/gpu/suite_lib.sh
. "$repo/scripts/gpu/suite_lib.sh"
suite_start engines
t_call=$SECONDS

# shellcheck source=scripts/gpu/device_engines_env.sh
. "$repo/scripts/gpu/device_engines_env.sh"

write_config() {  # write_config DIR MEM: the run's llmserve.toml and pytest ini
  mkdir -p "$1"
  sed -e "s#@ROOT@#$ROOT#g" -e "s#@MEM@#$2#g" "$repo/scripts/gpu/engines_gpu.toml.in" > "$1/llmserve.toml"
  printf '[tool.pytest.ini_options]\naddopts = "-ra"\n' > "$1/pyproject.toml"
}

collect() {
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu memory after the call] /'
  tar -czf "$OUT/results.tar.gz" -C "$RUN" --exclude='*/.pytest_cache' --exclude='out' . 2>/dev/null
  say "call done in $((SECONDS - t_call)) s; results.tar.gz $(stat -c %s "$OUT/results.tar.gz") bytes"
}

flashinfer_probe() {  # JIT-build flashinfer's decode and prefill kernels with the image's nvcc, no cubin wheel
  (. "$ROOT/sglang/env.sh" && timeout 420 "$py" - <<'EOF'
import time, torch, flashinfer
t0 = time.time()
ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
indptr = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
indices = torch.tensor([0], dtype=torch.int32, device="cuda")
last = torch.tensor([1], dtype=torch.int32, device="cuda")
kv = torch.randn(1, 2, 16, 3, 64, dtype=torch.bfloat16, device="cuda")
dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
dec.plan(indptr, indices, last, 9, 3, 64, 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
out = dec.run(torch.randn(1, 9, 64, dtype=torch.bfloat16, device="cuda"), kv)
print(f"flashinfer decode kernel built and ran in {time.time() - t0:.0f} s, finite={bool(torch.isfinite(out).all())}")
pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
pre.plan(torch.tensor([0, 1], dtype=torch.int32, device="cuda"), indptr, indices, last, 9, 3, 64, 16, causal=True,
         q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
out = pre.run(torch.randn(1, 9, 64, dtype=torch.bfloat16, device="cuda"), kv)
print(f"flashinfer prefill kernel built and ran in {time.time() - t0:.0f} s, finite={bool(torch.isfinite(out).all())}")
print("FLASHINFER_PROBE_OK")
EOF
  ) > "$RUN/flashinfer_probe.log" 2>&1
  say "flashinfer probe exit $? (tail below)"; tail -n 15 "$RUN/flashinfer_probe.log"
}

call=${1:-}
say "call $call on $(hostname), $(nproc) cores; repo $repo"
case "$call" in
  c1)
    eng_main stage plugin-env || exit 1
    nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv
    "$py" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
    plugin_env c1 "tenacity, prometheus_client, httpx, psutil"
    "$py" -m pytest_llmserve.cli.main facts "$repo/tests/data/logs/real_sglang_0.5.15_h200_cuda_graph.log" > "$RUN/facts-selfcheck.txt" && say "llmserve facts runs here"
    ;;
  c2)
    eng_main stage model || exit 1
    need "$ENG_MODEL/model.safetensors" "the converted model"
    ls -la "$ENG_MODEL"
    ;;
  c3)
    eng_main stage sglang-env || exit 1
    plugin_env c1 "tenacity, prometheus_client, httpx, psutil"
    need "$ENG_MODEL/model.safetensors" "the converted model (call c2)"
    write_config "$RUN/sglang" 0.3
    # FLASHINFER_PROBE=1: try to JIT-build flashinfer's kernels (without the cubin wheel and without the wheel's
    # data/cccl, which is too big to carry, they failed on 2026-12-01: docs/gpu.md).
    probe_pid=""
    if [ "${FLASHINFER_PROBE:-0}" = 1 ]; then flashinfer_probe & probe_pid=$!; fi
    run_pytest sglang-triton "$RUN/sglang" 520 -m gpu --llmserve-suite --llmserve-server sglang \
      "$repo/scripts/gpu/test_gpu_engines.py" -k "triton or sglang_cuda_graphs_ab"
    [ -z "$probe_pid" ] || wait "$probe_pid"
    collect
    ;;
  c4)
    eng_main stage vllm-env || exit 1
    plugin_env c1 "tenacity, prometheus_client, httpx, psutil"
    need "$ENG_MODEL/model.safetensors" "the converted model (call c2)"
    write_config "$RUN/vllm" 0.3
    run_pytest vllm-graphs "$RUN/vllm" 530 -m gpu --llmserve-suite --llmserve-server vllm,vllm-eager \
      "$repo/scripts/gpu/test_gpu_engines.py" -k "FULL_AND_PIECEWISE or eager" \
      --llmserve-save-baseline --llmserve-baseline-dir "$RUN/baselines"
    collect
    ;;
  c5)
    plugin_env c1 "tenacity, prometheus_client, httpx, psutil"
    need "$ROOT/vllm/env.sh" "the vLLM environment (call c4)"
    write_config "$RUN/vllm" 0.3
    run_pytest vllm-ngram "$RUN/vllm" 200 -m gpu "$repo/scripts/gpu/test_gpu_engines.py" -k speculative
    # The memory-fraction confounder: c4 saved vllm-eager's throughput baseline at 0.3; compare a run at 0.35.
    need "$RUN/baselines" "the baselines saved in call c4"
    write_config "$RUN/vllm-mem-0.35" 0.35
    [ "${SKIP_MEM:-0}" = 1 ] || run_pytest mem-compare "$RUN/vllm-mem-0.35" 150 -m gpu --llmserve-suite --llmserve-server vllm-eager \
      -k throughput --llmserve-baseline-dir "$RUN/baselines" | tee "$RUN/mem-compare.out"
    if grep -q "refused" "$RUN/mem-compare.out" && grep -q "mem_fraction" "$RUN/mem-compare.out"; then
      say "EXPECTED: the comparison at mem_fraction 0.35 against the 0.3 baseline was refused with the diff"
    else
      say "UNEXPECTED: no refusal naming mem_fraction in the comparison run"; status=1
    fi
    run_pytest vllm-piecewise "$RUN/vllm" 230 -m gpu --llmserve-suite --llmserve-server vllm \
      -k "PIECEWISE and not FULL_AND_PIECEWISE"
    collect
    ;;
  c6)  # if the lease allows: graph use per batch size proven on vLLM's V1 model runner
    plugin_env c1 "tenacity, prometheus_client, httpx, psutil"
    need "$ROOT/vllm/env.sh" "the vLLM environment (call c4)"
    write_config "$RUN/vllm" 0.3
    run_pytest vllm-v1-runner "$RUN/vllm" 400 -m gpu --llmserve-suite --llmserve-server vllm-v1-runner \
      -k "config_is_execution or batch_size or boots"
    collect
    ;;
  *) say "unknown call '$call' (c1 ... c6)"; exit 2 ;;
esac
sleep 0.5
exit $status
