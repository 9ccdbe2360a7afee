#!/usr/bin/env bash
# The DSA (DeepSeek Sparse Attention) matrix, its faults and the seeds' CUDA-graph A/B on the lent H200, as three
# device calls on one warm machine. Prepare the carried files on the development machine first
# (scripts/gpu/prepare_dsa.sh); the SGLang environment is put together by scripts/gpu/device_engines_env.sh.
#
#   bash scripts/gpu/dsa_suite.sh CALL        (d1, d2, d3; each call checks what it expects on the machine)
#
# The plan (kind nvidia-h200, timeout_s 600 each, issued back to back: /root survives only while the machine stays
# warm, about 30 s after a call returns):
#   d1  carry .gpu-transfer/engines/call-dsa1  SGLang env (+ FlashMLA, DeepGEMM); the tiny DSA checkpoints built here
#                                              by `python -m pytest_llmserve.testing.dsa_checkpoint`; SmolLM2's
#                                              architecture with random weights; the built-in suite on
#                                              {flashmla_sparse, flashmla_kv} x {graphs 1,2,4,8; off}, the reference
#                                              (flashmla_sparse + graphs) recording its answers
#   d2  carry .gpu-transfer/engines/call-dsa2  TileLang; the suite on tilelang x {graphs; off} replaying d1's reference
#                                              answers; the fp8-kv-outlier fault and the nan-late variant on every
#                                              backend; fa3 and trtllm requested (must fail at boot, reason named)
#   d3b no carry                               what d2's limits cut on 2026-12-02: tilelang without graphs, the FP8-KV
#                                              fault on tilelang and flashmla_kv, nan-late on every backend
#   d3  no carry                               the FP8-KV fault on flashmla_kv (its reference recorded in the run);
#                                              SmolLM2 graphs (up to bs 64) vs none: A/B at concurrency 1 (graphs must
#                                              come out "improved") and saturated (64 x 256/256: a decided verdict, its
#                                              direction recorded): scripts/gpu/test_dsa_gpu.py; the saturated baseline
#                                              saved with graphs; then compared at another mem_fraction (refused with
#                                              the diff, before any boot)
# Issue 34 (contexts past index_topk; same machine, same warm chain, each call checks what it expects):
#   l1  carry .gpu-transfer/engines/call-dsa1  SGLang env; the tiny DSA checkpoint (index_topk 2048, room for 16k
#                                              positions); the reference (flashmla_sparse + graphs) recording the
#                                              short prompts and the long-context probes (2,560 / 4,096 / 8,192
#                                              tokens), flashmla_kv + graphs against it; the sparse-selection fault
#                                              (dsa-topk-fault: index_topk 1024 by --json-model-override-args) must
#                                              fail the reference differential on the long probes only
#   l1b no carry (after l1, same machine)      SGLang's fused top-k asserts index_topk == 2048 (seen 2026-12-06): the
#                                              topk fault on the torch top-k backend beside its control (same backend,
#                                              topk 2048, must agree with the reference); the GPU contention test;
#                                              tilelang with graphs against l1's reference
#   l4  carry .gpu-transfer/engines/call-dsa1  the sparse-selection fault again, on a fresh machine: reference,
#                                              control (torch top-k, topk 2048) and fault (topk 256), then topk 1024
#   l5  no carry (after l4, same machine)      the seeds' A/B of d3 (SmolLM2 graphs up to 64 vs none; the
#                                              mem-fraction refusal), its test asserting a decided verdict
#   l2  carry .gpu-transfer/engines/call-dsa2  TileLang; FP8 KV caches (dsa-fp8kv: flashmla_kv, tilelang) against
#                                              l1's bf16 reference; the fp8-kv-outlier fault on flashmla_kv
# Issue 35 (the spread between runs on the GPU; scripts/gpu/between_gpu.toml.in):
#   b1  carry .gpu-transfer/engines/call-dsa1  SGLang env; SmolLM2-random; fresh boots of it (graphs up to 64), each
#                                              one `pytest --llmserve-save-baseline` of the saturated workload
#                                              (tools/between_runs.py), until the call's time is spent
#   b2  no carry (after b1, same machine)      more fresh boots appended to b1's; the A/A analysis of them all (b3: again)
#   l3  no carry                               the GPU side of host contention (scripts/gpu/test_gpu_contention.py:
#                                              a quiet round; a round and a benchmark beside a matmul loop on the
#                                              same GPU); the rest of the bf16 matrix (tilelang; graphs off) against l1's reference
# Each fault run (fault_run) is judged by scripts/gpu/check_fault_results.py on its results.json: nan-late must fail
# test_no_nan with NaN findings on every backend; fp8-kv-outlier must fail the reference differential on flashmla_kv
# and pass on the bf16-KV backends (flashmla_sparse, tilelang); every backend must boot. A miss sets the call's exit.
# What comes back ($OUT): run.log (this call's whole output), results-CALL.tar.gz (server logs, results.json,
# summary.md, junit XML, the configs, the recorded reference answers).
set -uo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/gpu/suite_lib.sh
. "$repo/scripts/gpu/suite_lib.sh"
suite_start dsa

# shellcheck source=scripts/gpu/device_engines_env.sh
. "$repo/scripts/gpu/device_engines_env.sh"

TL_SITE="$ROOT/tilelang-site"
STUBS=""
# The server's environment for DSA on this image (scripts/gpu/dsa_gpu.toml.in passes PYTHONPATH and
# FLASHINFER_USE_CUDA_NORM; the rest is inherited from here).
dsa_env() {
  local s="$ROOT/sglang"
  need "$s/env.sh" "the SGLang environment (call d1)"
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-13*/bin; do [ -x "$d/nvcc" ] && { export PATH="$d:$PATH"; break; }; done
  fi
  # DeepGEMM (the DSA indexer) and SGLang's tvm-ffi kernels JIT-compile with nvcc at run time.
  command -v nvcc >/dev/null 2>&1 && export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
  # Without FA3 (flash_ops does not travel), prefills of <= 2048 tokens would take SGLang's FA3 "dense" path on SM90.
  export SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0
  # flashinfer travels without its cubins and JIT headers: keep SGLang's DSA indexer off flashinfer's LayerNorm.
  export SGLANG_IS_FLASHINFER_AVAILABLE=false
  export SGLANG_USE_SGL_FA3_KERNEL=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  if [ -d "$TL_SITE/tilelang" ]; then
    export LD_LIBRARY_PATH="$s/site/tvm_ffi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libtilelang needs libtvm_ffi
  fi
  if ! env PYTHONPATH="$s/site2:$s/site" timeout 120 "$py" -c "import cutlass.cute" >/dev/null 2>&1; then
    STUBS="$repo/scripts/gpu/dsa_stubs:"
    say "cutlass (CuTe-DSL) does not import here: the import-only stand-in scripts/gpu/dsa_stubs is on the server's path"
  fi
  SERVER_PYTHONPATH="$STUBS$TL_SITE:$s/site2:$s/site"
}

write_config() {  # write_config DIR MEM
  mkdir -p "$1"
  sed -e "s#@ROOT@#$ROOT#g" -e "s#@MEM@#$2#g" -e "s#@PYTHONPATH@#$SERVER_PYTHONPATH#g" \
    "$repo/scripts/gpu/dsa_gpu.toml.in" > "$1/llmserve.toml"
  printf '[tool.pytest.ini_options]\naddopts = "-ra"\n' > "$1/pyproject.toml"
}

# build_checkpoint VARIANT DIR: the tiny DSA model (byte-identical anywhere), with SmolLM2's tokenizer.
build_checkpoint() {
  "$py" -m pytest_llmserve.testing.dsa_checkpoint "$2" --variant "$1" --tokenizer "$ROOT/models/hf-files/SmolLM2-135M-Instruct"
}

# SmolLM2-135M's architecture and tokenizer with random weights (the A/B measures speed, not answers), marked as
# untrained for the suite.
build_smollm2_random() {
  local dir="$ROOT/models/SmolLM2-135M-random"
  [ -f "$dir/llmserve-checkpoint.json" ] && return 0
  rm -rf "$dir.tmp"
  "$py" - "$ROOT/models/hf-files/SmolLM2-135M-Instruct" "$dir.tmp" <<'EOF' || return 1
import json, shutil, sys, pathlib, torch
from transformers import AutoConfig, AutoModelForCausalLM
src, out = sys.argv[1], pathlib.Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
for f in pathlib.Path(src).iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
shutil.copy(pathlib.Path(src) / "config.json", out / "config.json")
(out / "llmserve-checkpoint.json").write_text(json.dumps({"builder": "smollm2-random (scripts/gpu/dsa_suite.sh)",
    "architecture": "LlamaForCausalLM", "random_weights": True, "seed": 0}, indent=1))
print("built", out)
EOF
  mv "$dir.tmp" "$dir"
}

collect() {  # collect CALL
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu memory after the call] /'
  tar -czf "$OUT/results-$1.tar.gz" -C "$RUN" --exclude='*/.pytest_cache' --exclude='out' . 2>/dev/null
  say "call $1 done; results-$1.tar.gz $(stat -c %s "$OUT/results-$1.tar.gz") bytes"
}

left() { echo $((${CALL_BUDGET:-570} - SECONDS)); }

# fault_run NAME DIR LIMIT SERVER BACKENDS CHECKS ARGS...: the suite's CHECKS (a -k expression) on a fault server's
# BACKENDS (comma-separated), judged by check_fault_run (suite_lib.sh), not by pytest's exit code: the failing tests
# are the point. The run's `latest` pointer goes first, so a run that wrote no report is not judged by an earlier one's.
fault_run() {
  local name=$1 dir=$2 limit=$3 server=$4 backends=$5 checks=$6; shift 6
  local before=$status
  rm -f "$dir/results-$name/latest" "$dir/results-$name/latest.txt"
  run_pytest "$name" "$dir" "$limit" -m gpu --llmserve-suite --llmserve-server "$server" \
    -k "(${backends//,/ or }) and ($checks)" "$@"
  status=$before
  check_fault_run "$name" "$dir" "$server" "$backends"
}

# first_call NAME: a fresh machine's set-up for a DSA call (the engines staged, the plugin's environment, SmolLM2's
# tokenizer files, the server environment) and the healthy tiny DSA checkpoint built; exits 1 or 5 as the calls did.
first_call() {
  eng_main stage sglang-env plugin-env || return 1
  plugin_env "$1" "tenacity, numpy"
  nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv,noheader
  mkdir -p "$ROOT/models/hf-files"
  [ -f "$ROOT/models/hf-files/SmolLM2-135M-Instruct/tokenizer.json" ] \
    || eng_untar_xz "$ENG_T/SmolLM2-135M-Instruct-hf-files.tar.xz" "$ROOT/models/hf-files" || return 1
  dsa_env
  build_checkpoint healthy "$ROOT/models/dsa-tiny" || { say "the DSA checkpoint was not built"; return 5; }
}

# install_tilelang: TileLang's site directory unpacked once per machine (from the call-dsa2 carry).
install_tilelang() {
  [ -d "$TL_SITE/tilelang" ] && return 0
  eng_need tilelang_site.tar.xz || return 1
  rm -rf "$TL_SITE.tmp" && mkdir -p "$TL_SITE.tmp" && eng_untar_xz "$ENG_T/tilelang_site.tar.xz" "$TL_SITE.tmp" \
    && mv "$TL_SITE.tmp" "$TL_SITE"
}

# recorded SERVER RUN: the reference answers SERVER's matrix reference recorded in pytest run RUN (empty if none).
recorded() { ls "$RUN"/suite/results-"$2"/runs/*/reference-answers/"$1".json 2>/dev/null | head -1; }

# seeds_ab: the seeds' A/B (SmolLM2 graphs up to bs 64 vs none, scripts/gpu/test_dsa_gpu.py), its saturated baseline
# saved with graphs, then compared at another mem_fraction: refused with the diff before any boot.
seeds_ab() {
  write_config "$RUN/ab" 0.3
  run_pytest d3-ab "$RUN/ab" "$(( $(left) - 90 ))" -m gpu --llmserve-suite --llmserve-server smollm2 \
    "$repo/scripts/gpu/test_dsa_gpu.py" -k "cuda_graphs_ab or (throughput and max)" \
    --llmserve-save-baseline --llmserve-baseline-dir "$RUN/baselines"
  # The seeds' confounder: the baseline saved at mem_fraction 0.3, compared at 0.35: refused before any boot.
  write_config "$RUN/ab-mem" 0.35
  run_pytest d3-mem "$RUN/ab-mem" 80 -m gpu --llmserve-suite --llmserve-server smollm2 -k "throughput and max" \
    --llmserve-baseline-dir "$RUN/baselines" | tee "$RUN/mem-compare.out"
  if grep -q "mem_fraction" "$RUN/mem-compare.out" && grep -qi "refused" "$RUN/mem-compare.out"; then
    say "EXPECTED: the comparison at mem_fraction 0.35 against the 0.3 baseline was refused with the diff"
  else
    say "UNEXPECTED: no refusal naming mem_fraction"; status=1
  fi
}

# Issue 34's calls run the checks that judge decode (no throughput, no API properties: their time goes to boots).
L_CHECKS="boots or no_nan or deterministic or batch_size or captured or config_is_execution or matches_reference"

call=${1:-}
say "call $call on $(hostname), $(nproc) cores; repo $repo"
case "$call" in
  d1)
    first_call d1 || exit $?
    # Needed by d2 and d3: built while the first server boots (a call's processes end with it: waited for below).
    ( build_checkpoint fp8-kv-outlier "$ROOT/models/dsa-tiny-fp8-kv-outlier" \
      && build_checkpoint nan-late "$ROOT/models/dsa-tiny-nan-late" && build_smollm2_random ) > "$RUN/models.log" 2>&1 &
    models_pid=$!
    write_config "$RUN/suite" 0.3
    run_pytest d1 "$RUN/suite" "$(( $(left) - 25 ))" -m gpu --llmserve-suite --llmserve-server dsa \
      -k "not tilelang and not throughput"
    wait "$models_pid"; say "fault variants and SmolLM2-random: exit $? ($(tail -n 1 "$RUN/models.log"))"
    cp "$RUN"/suite/results-d1/runs/*/reference-answers/*.json "$OUT/" 2>/dev/null
    collect d1
    ;;
  d2)
    eng_main stage || exit 1
    plugin_env d1 "tenacity, numpy"
    need "$ROOT/models/dsa-tiny-nan-late/llmserve-checkpoint.json" "the fault variants (call d1)"
    install_tilelang || exit 1
    dsa_env
    ref="$(ls "$RUN"/suite/results-d1/runs/*/reference-answers/*.json 2>/dev/null | head -1)"
    need "$ref" "the reference answers recorded in call d1"
    write_config "$RUN/suite" 0.3
    # tilelang on both graph settings, and the two graph-off combinations d1 could not boot (its args clashed with
    # the prefill graph flag before the fix of this commit).
    run_pytest d2-matrix "$RUN/suite" 390 -m gpu --llmserve-suite --llmserve-server dsa \
      -k "(tilelang or off) and not throughput" --llmserve-reference-answers "$ref"
    fault_run d2-fp8-fault "$RUN/suite" "$(( $(left) - 25 ))" dsa-fp8-fault flashmla_sparse,tilelang,flashmla_kv \
      "no_nan or matches_reference or boots"
    collect d2
    ;;
  d3b)  # what d2's limits cut, in the device time left: tilelang without graphs, the FP8-KV fault on flashmla_kv and
        # tilelang (replaying the fault reference d2 recorded), the nan-late variant on every backend.
    plugin_env d1 "tenacity, numpy"
    dsa_env
    write_config "$RUN/suite" 0.3
    ref="$(ls "$RUN"/suite/results-d1/runs/*/reference-answers/*.json 2>/dev/null | head -1)"
    fref="$(ls "$RUN"/suite/results-d2-fp8-fault/runs/*/reference-answers/*.json 2>/dev/null | head -1)"
    need "$fref" "the fault reference recorded in call d2"
    run_pytest d3-tilelang-off "$RUN/suite" 160 -m gpu --llmserve-suite --llmserve-server dsa \
      -k "tilelang and off and not throughput" --llmserve-reference-answers "$ref"
    fault_run d3-fp8-fault "$RUN/suite" 190 dsa-fp8-fault tilelang,flashmla_kv "no_nan or matches_reference or boots" \
      --llmserve-reference-answers "$fref"
    fault_run d3-nan-late "$RUN/suite" "$(( $(left) - 20 ))" dsa-nan-late flashmla_sparse,tilelang,flashmla_kv \
      "no_nan or boots"
    collect d3b
    ;;
  d3)
    plugin_env d1 "tenacity, numpy"
    need "$ROOT/models/SmolLM2-135M-random/llmserve-checkpoint.json" "SmolLM2-random (call d1)"
    dsa_env
    # The FP8-KV fault on the backend it targets, with its reference recorded in the same run.
    write_config "$RUN/suite" 0.3
    fault_run d3-fp8-fault "$RUN/suite" 200 dsa-fp8-fault flashmla_sparse,flashmla_kv \
      "no_nan or matches_reference or boots"
    seeds_ab
    collect d3
    ;;
  l1)  # issue 34, call 1 of 3 (carry call-dsa1): contexts past index_topk. The reference (flashmla_sparse, graphs)
       # records the short prompts and the long-context probes (2,560 / 4,096 / 8,192 tokens); flashmla_kv with graphs
       # is compared with it; then the sparse-selection fault (index_topk 1024 on the same weights) must fail the
       # reference differential on the long probes and only there.
    first_call l1 || exit $?
    ( build_checkpoint fp8-kv-outlier "$ROOT/models/dsa-tiny-fp8-kv-outlier" ) > "$RUN/models.log" 2>&1 &
    models_pid=$!
    write_config "$RUN/suite" 0.3
    run_pytest l1 "$RUN/suite" 330 -m gpu --llmserve-suite --llmserve-server dsa \
      -k "not off and not tilelang and ($L_CHECKS)"
    wait "$models_pid"; say "fp8-kv-outlier variant: exit $? ($(tail -n 1 "$RUN/models.log"))"
    ref="$(recorded dsa l1)"
    need "$ref" "the reference answers recorded by this call's first run"
    cp "$ref" "$OUT/reference-answers-dsa.json"
    fault_run l1-topk "$RUN/suite" "$(( $(left) - 25 ))" dsa-topk-fault flashmla_sparse \
      "no_nan or matches_reference or boots" --llmserve-reference-answers "$ref"
    collect l1
    ;;
  l1b)  # issue 34, after l1 on the same warm machine: SGLang's fused top-k asserts index_topk == 2048, so the
        # sparse-selection fault runs on its torch top-k backend, beside a control (same backend, topk 2048) that
        # must agree with the reference; then the GPU contention test and what is left of the matrix.
    plugin_env l1 "tenacity, numpy"
    dsa_env
    ref="$(recorded dsa l1)"
    need "$ref" "the reference answers recorded in call l1"
    write_config "$RUN/suite" 0.3
    run_pytest l1b-control "$RUN/suite" 150 -m gpu --llmserve-suite --llmserve-server dsa-topk-control \
      -k "no_nan or matches_reference or boots" --llmserve-reference-answers "$ref"
    fault_run l1b-topk "$RUN/suite" 150 dsa-topk-fault flashmla_sparse \
      "no_nan or matches_reference or boots" --llmserve-reference-answers "$ref"
    LLMSERVE_TORCH_PYTHON="$py" LLMSERVE_CONTENTION_OUT="$OUT" run_pytest l3-contention "$RUN/suite" 130 -m gpu \
      --llmserve-server dsa-contention "$repo/scripts/gpu/test_gpu_contention.py" -s
    [ "$(left)" -gt 120 ] && run_pytest l3 "$RUN/suite" "$(( $(left) - 25 ))" -m gpu --llmserve-suite \
      --llmserve-server dsa -k "tilelang and not off and ($L_CHECKS)" --llmserve-reference-answers "$ref"
    collect l1b
    ;;
  l4)  # issue 34, the sparse-selection fault with its control (carry call-dsa1, a fresh machine): the reference
       # records the long-context probes (each its own sentences since 2026-12-06); the control (torch top-k, topk
       # 2048) must agree with it everywhere; the fault (torch top-k, topk 256) must fail on the long probes only;
       # then, for the record, the first construction (topk 1024) and flashmla_kv with graphs against the reference.
    first_call l1 || exit $?
    write_config "$RUN/suite" 0.3
    run_pytest l4-ref "$RUN/suite" 240 -m gpu --llmserve-suite --llmserve-server dsa \
      -k "flashmla_sparse and not off and (no_nan or matches_reference or boots)"
    ref="$(recorded dsa l4-ref)"
    need "$ref" "the reference answers recorded by this call's first run"
    cp "$ref" "$OUT/reference-answers-dsa.json"
    run_pytest l4-control "$RUN/suite" 110 -m gpu --llmserve-suite --llmserve-server dsa-topk-control \
      -k "no_nan or matches_reference or boots" --llmserve-reference-answers "$ref"
    fault_run l4-topk "$RUN/suite" 110 dsa-topk-fault flashmla_sparse \
      "no_nan or matches_reference or boots" --llmserve-reference-answers "$ref"
    [ "$(left)" -gt 110 ] && run_pytest l4-topk-1024 "$RUN/suite" "$(( $(left) - 25 ))" -m gpu --llmserve-suite \
      --llmserve-server dsa-topk-fault-1024 -k "matches_reference" --llmserve-reference-answers "$ref"
    collect l4
    ;;
  l5)  # issue 34, item 6, after l4 on the same machine (no carry): the seeds' A/B of d3 alone (SmolLM2-random built
       # here; the FP8-KV fault part of d3 ran in l2).
    plugin_env l1 "tenacity, numpy"
    dsa_env
    build_smollm2_random || { say "SmolLM2-random was not built"; exit 5; }
    seeds_ab
    collect l5
    ;;
  l2)  # issue 34, call 2 of 3 (carry call-dsa2: TileLang): FP8 KV caches against the bf16 reference, and the FP8
       # backend-specific fault on flashmla_kv (its reference, flashmla_sparse on the same fault weights, in the run).
    eng_main stage || exit 1
    plugin_env l1 "tenacity, numpy"
    need "$ROOT/models/dsa-tiny-fp8-kv-outlier/llmserve-checkpoint.json" "the fp8-kv-outlier variant (call l1)"
    install_tilelang || exit 1
    dsa_env
    ref="$(recorded dsa l1)"
    need "$ref" "the reference answers recorded in call l1"
    write_config "$RUN/suite" 0.3
    run_pytest l2-fp8kv "$RUN/suite" 260 -m gpu --llmserve-suite --llmserve-server dsa-fp8kv -k "$L_CHECKS" \
      --llmserve-reference-answers "$ref"
    fault_run l2-fp8-fault "$RUN/suite" "$(( $(left) - 25 ))" dsa-fp8-fault flashmla_sparse,flashmla_kv \
      "no_nan or matches_reference or boots"
    collect l2
    ;;
  l3)  # issue 34, call 3 of 3 (no carry): the rest of the bf16 matrix against l1's reference: tilelang with graphs
       # on and off, and flashmla_sparse and flashmla_kv without graphs.
    plugin_env l1 "tenacity, numpy"
    dsa_env
    ref="$(recorded dsa l1)"
    need "$ref" "the reference answers recorded in call l1"
    write_config "$RUN/suite" 0.3
    # Item 5 first (one boot of the reference combination, its kernels already compiled by l1): a quiet round, a
    # round and a benchmark beside a matmul loop on the same GPU; the NVML readings come back in $OUT.
    # L3_COMBOS narrows the combinations (after l1b ran the contention test and tilelang with graphs: "off").
    [ -z "${L3_COMBOS:-}" ] && LLMSERVE_TORCH_PYTHON="$py" LLMSERVE_CONTENTION_OUT="$OUT" run_pytest l3-contention \
      "$RUN/suite" 200 -m gpu --llmserve-server dsa-contention "$repo/scripts/gpu/test_gpu_contention.py" -s
    run_pytest l3 "$RUN/suite" "$(( $(left) - 25 ))" -m gpu --llmserve-suite --llmserve-server dsa \
      -k "(${L3_COMBOS:-tilelang or off}) and ($L_CHECKS)" --llmserve-reference-answers "$ref"
    collect l3
    ;;
  b1|b2|b3)  # issue 35: the spread between runs on the GPU. b1 (carry call-dsa1, a fresh machine): the SGLang environment,
          # SmolLM2-random, then fresh boots until the call's time is spent; b2, b3 (no carry, same machine): more boots,
          # appended to b1's. Each boot is one `pytest --llmserve-save-baseline` run (tools/between_runs.py); the
          # baseline's records, boots.jsonl and the A/A analysis (judged.json) come back in results-CALL.tar.gz.
    if [ "$call" = b1 ]; then
      eng_main stage sglang-env plugin-env || exit 1
      plugin_env b1 "tenacity, numpy"
      mkdir -p "$ROOT/models/hf-files"
      [ -f "$ROOT/models/hf-files/SmolLM2-135M-Instruct/tokenizer.json" ] \
        || eng_untar_xz "$ENG_T/SmolLM2-135M-Instruct-hf-files.tar.xz" "$ROOT/models/hf-files" || exit 1
      nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
    else
      plugin_env b1 "tenacity, numpy"
    fi
    dsa_env
    build_smollm2_random || { say "SmolLM2-random was not built"; exit 5; }
    mkdir -p "$RUN/between"
    sed -e "s#@ROOT@#$ROOT#g" -e "s#@PYTHONPATH@#$SERVER_PYTHONPATH#g" "$repo/scripts/gpu/between_gpu.toml.in" \
      > "$RUN/between/llmserve.toml"
    # No boot starts with less than ~110 s left (a boot with warm kernels took ~45-65 s, plus the rounds).
    "$py" "$repo/tools/between_runs.py" --out "$RUN/between/measured" --config "$RUN/between/llmserve.toml" \
      --workload saturated --boots 20 --seconds "$(( $(left) - 110 ))" -- -p pytest_llmserve.plugin || status=1
    cp "$RUN/between/measured/judged.json" "$OUT/judged-$call.json" 2>/dev/null
    collect "$call"
    ;;
  *) say "unknown call '$call' (d1, d2, d3b, d3; issue 34: l1, l1b, l2, l3, l4, l5; issue 35: b1, b2, b3)"; exit 2 ;;
esac
sleep 0.5
exit $status
