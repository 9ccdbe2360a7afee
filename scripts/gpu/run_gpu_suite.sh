#!/usr/bin/env bash
# Run the GPU suite on the lent GPU machine (no registry there): build llama-server with CUDA, put
# the GGUF together, run the device tests, the built-in suite over the CUDA-graph x flash-attention
# matrix and the A/B verdicts, and leave the reports under $OUT.
#
#   bash scripts/gpu/run_gpu_suite.sh STEP...
#
# Steps (each one is skipped when already done on this warm machine; files under /root survive
# between calls while it stays warm):
#   stage     copy what this call carried (.gpu-transfer/call*/) to /root/llmserve-transfer  [always]
#   build     unpack llama.cpp and build llama-server for sm_90 (CUDA_ARCHS) under /root/llmserve-build
#             (~6 min at -j16 on the lent H200: one call of its own)
#   model     join the GGUF parts and check its sha256 (needs both parts carried)
#   devtests  tests/gpu: NVML/nvidia-smi inventory, a stale GPU process named by the preflight,
#             memory returned after teardown, the cuda_graph proof at -lv 5, a 2-GPU split
#   suite     pytest -m gpu --llmserve-suite over the matrix in scripts/gpu/llmserve_gpu.toml.in
#   ab        the A/B verdicts of scripts/gpu/test_gpu_ab.py (graphs off vs on, flash attention)
#   all       model devtests suite ab
#
# Device calls (prepare on the dev machine first: scripts/gpu/prepare_llamacpp.sh). Kind: nvidia-h200-x2
# when it is lent (the 2-GPU items need it; everything else runs on GPU 0), else nvidia-h200. Keep the
# machine warm between the calls (/root survives only while it is held); timeout_s 600 each:
#   1. carry [".gpu-transfer/call1"]  command: bash scripts/gpu/run_gpu_suite.sh build
#      (~6 min at -j16 on the H200, as tried; source + GGUF part 1 + wheels travel, 60 MiB)
#   2. carry [".gpu-transfer/call2"]  command: bash scripts/gpu/run_gpu_suite.sh model devtests suite
#   3. no carry                        command: bash scripts/gpu/run_gpu_suite.sh ab
# ("all" = model devtests suite ab in one call, if the budget allows ~8 minutes.)
# Reports come back from $OUT (8 files at most): run.log, build.log, gpu.json, devtests.xml, suite.xml,
# ab.xml, summary.md, results.tar.gz (server logs, results.json, plots, the llmserve.toml used).
set -uo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
store=/root/llmserve-transfer
build=/root/llmserve-build
run=/root/llmserve-run
OUT="${OUT:-$run/out}"
CUDA_ARCHS="${CUDA_ARCHS:-90}"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
model="$build/models/$GGUF_NAME"
bin="$build/cuda/bin/llama-server"
py="${PYTHON:-python3}"
mkdir -p "$store" "$build" "$run" "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
# Never let anything here use NVLink multicast (the device README: it can take the host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

say() { echo "[gpu-suite $(date +%H:%M:%S)] $*"; }
status=0

stage() {
  local n=0
  for f in "$repo"/.gpu-transfer/call*/* "$repo"/.gpu-transfer/call*/wheels/*; do
    [ -f "$f" ] || continue
    case "$f" in */wheels/*) mkdir -p "$store/wheels"; dest="$store/wheels/$(basename "$f")" ;;
                 *) dest="$store/$(basename "$f")" ;; esac
    if [ ! -s "$dest" ] || [ "$(stat -c %s "$f")" != "$(stat -c %s "$dest")" ]; then
      cp "$f" "$dest.tmp" && mv "$dest.tmp" "$dest" && n=$((n + 1))
    fi
  done
  say "staged $n new file(s); $store holds: $(ls "$store" | tr '\n' ' ')"
}

build_llama() {
  if [ -x "$bin" ]; then say "llama-server already built: $bin"; return 0; fi
  local tarball
  tarball="$(ls "$store"/llama.cpp-*-src.tar.gz 2>/dev/null | head -1)"
  [ -n "$tarball" ] || { say "no llama.cpp source tarball in $store: carry .gpu-transfer/call1"; return 1; }
  rm -rf "$build/src" && mkdir -p "$build/src" && tar -xzf "$tarball" -C "$build/src"
  # shellcheck disable=SC1091
  . "$build/src/llama.cpp/BUILD_INFO"
  say "building llama-server (llama.cpp $LLAMA_BUILD_COMMIT) for CUDA arch $CUDA_ARCHS with $(nproc) jobs"
  local t0=$SECONDS
  cmake -S "$build/src/llama.cpp" -B "$build/cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_COMMIT="$LLAMA_BUILD_COMMIT" -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER" \
    > "$build/configure.log" 2>&1 || { tail -30 "$build/configure.log"; return 1; }
  say "configured in $((SECONDS - t0)) s"
  cmake --build "$build/cuda" --target llama-server -j "$(nproc)" > "$build/build.log" 2>&1
  local rc=$?
  tail -c 200000 "$build/build.log" > "$OUT/build.log"
  [ $rc -eq 0 ] && [ -x "$bin" ] || { say "build FAILED (exit $rc)"; tail -30 "$build/build.log"; return 1; }
  say "built in $((SECONDS - t0)) s: $bin"
  "$bin" --version 2>&1 | head -3
}

join_model() {
  if [ -s "$model" ]; then say "model ready: $model"; return 0; fi
  local parts=("$store/$GGUF_NAME".part-*)
  if [ "${#parts[@]}" -lt 2 ] || [ ! -f "${parts[0]}" ]; then
    say "GGUF parts missing in $store (have: ${parts[*]}); carry .gpu-transfer/call1 and call2"; return 1
  fi
  mkdir -p "$(dirname "$model")"
  cat "${parts[@]}" > "$model.tmp"
  (cd "$(dirname "$model")" && sed "s/$GGUF_NAME/$GGUF_NAME.tmp/" "$store/$GGUF_NAME.sha256" | sha256sum -c --quiet) \
    || { say "joined GGUF fails its sha256"; rm -f "$model.tmp"; return 1; }
  mv "$model.tmp" "$model"
  say "model joined and verified: $model"
}

python_env() {
  if [ -d "$store/wheels" ] && ! PYTHONPATH=/tmp/llmserve-site "$py" -c "import tenacity" 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/llmserve-site "$store"/wheels/*.whl || return 1
  fi
  export PYTHONPATH="/tmp/llmserve-site:$repo${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c "import pytest_llmserve.plugin, pytest_llmserve.server.gpu, tenacity, httpx, psutil" || return 1
  export LLAMA_SERVER="$bin" LLMSERVE_GGUF="$model"
  # Load the plugin by module unless it is installed (then its pytest11 entry point loads it).
  plugin_opt=(-p pytest_llmserve.plugin)
  if "$py" -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.value == 'pytest_llmserve.plugin' for e in m.entry_points(group='pytest11')) else 1)"; then
    plugin_opt=()
  fi
  "$py" - "$OUT/gpu.json" <<'EOF'
import json, sys
from pytest_llmserve.server.handle import gpu
summary = gpu.gpu_summary()
summary["processes"] = [p.describe() for p in gpu.gpu_processes()]
json.dump(summary, open(sys.argv[1], "w"), indent=2)
print("GPUs:", summary["gpu_count"], summary["gpu_name"], "driver", summary["driver"], "CUDA", summary["cuda"],
      "via", summary["gpu_source"])
EOF
}

write_config() {
  local ngpu
  ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  sed -e "s#@LLAMA_SERVER@#$bin#g" -e "s#@MODEL@#$model#g" "$repo/scripts/gpu/llmserve_gpu.toml.in" > "$run/llmserve.toml"
  if [ "$ngpu" -ge 2 ]; then
    cat >> "$run/llmserve.toml" <<EOF

# One server spread over two GPUs (--split-mode layer --tensor-split 1,1).
[tool.llmserve.servers.smollm2-2gpu]
engine = "llamacpp"
model = "$model"
argv = ["$bin"]
gpu = true
tp = 2
gpu_layers = 99
context_size = 32768
parallel = 16
flash_attention = true
cuda_graph = true
startup_timeout_s = 300
env = { CUDA_VISIBLE_DEVICES = "0,1" }
EOF
  fi
  printf '[tool.pytest.ini_options]\naddopts = "-ra"\n' > "$run/pyproject.toml"
  say "configuration: $run/llmserve.toml ($ngpu GPU(s) visible)"
}

run_pytest() {  # name, directory to run in (its rootdir), then pytest arguments
  local name=$1 dir=$2; shift 2
  (cd "$dir" && "$py" -m pytest "${plugin_opt[@]}" --rootdir "$dir" -o cache_dir="$run/.pytest_cache" \
      --llmserve-results-dir "$run/results" --junitxml="$OUT/$name.xml" "$@")
  local rc=$?
  say "$name: pytest exit $rc"
  [ $rc -eq 0 ] || status=1
}

collect() {
  [ -d "$run/results" ] || return 0
  cp "$run/results/summary.md" "$OUT/summary.md" 2>/dev/null
  tar -czf "$OUT/results.tar.gz" -C "$run" results llmserve.toml 2>/dev/null
  # At most 16 MiB a file comes back: the -lv 5 server logs are the big ones; keep their first and
  # last 20,000 lines (boot facts and the last decode steps) if the whole set does not fit.
  if [ "$(stat -c %s "$OUT/results.tar.gz")" -gt 15000000 ]; then
    find "$run/results" -name '*.log' -size +20M | while read -r f; do
      { head -n 20000 "$f"; echo "... (cut by run_gpu_suite.sh to fit the 16 MiB transfer limit) ..."; tail -n 20000 "$f"; } > "$f.cut"
      mv "$f.cut" "$f"
    done
    tar -czf "$OUT/results.tar.gz" -C "$run" results llmserve.toml 2>/dev/null
  fi
  say "reports: $(cd "$OUT" && ls -l | awk 'NR > 1 {printf "%s (%s B) ", $NF, $5}')"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(all)
stage
for step in "${steps[@]}"; do
  case "$step" in
    stage) ;;
    build) build_llama || exit 1 ;;
    model) join_model || exit 1 ;;
    devtests|suite|ab|all)
      [ -x "$bin" ] || { say "llama-server is not built: run the build step first"; exit 1; }
      join_model || exit 1
      python_env || { say "python environment broken"; exit 1; }
      "$bin" --version 2>&1 | head -2
      nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv
      write_config
      if [ "$step" = devtests ] || [ "$step" = all ]; then
        run_pytest devtests "$repo" -m gpu -v tests/gpu  # the repo's conftest and ini apply
      fi
      if [ "$step" = suite ] || [ "$step" = all ]; then
        # The -lv 5 servers prove graph use; their throughput is not comparable, so no benchmark there.
        run_pytest suite "$run" -m gpu --llmserve-suite -k "not (lv5 and throughput)"
      fi
      if [ "$step" = ab ] || [ "$step" = all ]; then
        run_pytest ab "$run" -m gpu -v "$repo/scripts/gpu/test_gpu_ab.py"
      fi
      collect
      ;;
    *) say "unknown step $step (stage build model devtests suite ab all)"; exit 2 ;;
  esac
done
sleep 0.5  # let tee flush run.log
exit $status
