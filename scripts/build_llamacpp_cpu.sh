#!/usr/bin/env bash
# Build a CPU-only llama-server (the llama.cpp vendored in llama-cpp-python 0.3.36) for the adapter's
# end-to-end tests on machines without a GPU. Cached: a second run returns at once.
#
#   scripts/build_llamacpp_cpu.sh        ->  $CACHE/llama.cpp-0.3.36/build-cpu/bin/llama-server
#
# $CACHE is $PYTEST_LLMSERVE_CACHE or ~/.cache/pytest-llmserve. The llama-server adapter finds the
# binary there by itself (after argv, $LLAMA_SERVER and PATH), and tests/llamacpp_e2e boots it.
# Measured on the project's 2-core machine at -j2: configure 5-9 s; the llama-server target (212 steps,
# most of the time in ggml-cpu and the ~150 files of src/models/) took 1131 s and 1351 s of wall time
# while other sessions' tests kept the load average at 8-12, for 659 s of CPU time (user 614 + sys 45),
# i.e. about 5.5-6 minutes of wall time on two otherwise idle cores.
set -euo pipefail

LCPP_PY_VERSION="${LCPP_PY_VERSION:-0.3.36}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${PYTEST_LLMSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-llmserve}"
home="$cache/llama.cpp-$LCPP_PY_VERSION"
bin="$home/build-cpu/bin/llama-server"
jobs="${JOBS:-$(nproc)}"

# -march=native without AMX: on a CPU with AMX tiles (seen 2026-12-01) a native build's AMX kernels crashed the
# server at its first matmul (SIGILL / SIGSEGV 0.5 s after launch) in this sandbox. The stamp rebuilds older builds.
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
stamp="$home/build-cpu/.llmserve-flags"
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$flags" ]; then
  echo "[build-cpu] cached: $bin"
  exit 0
fi
rm -rf "$home/build-cpu"
tarball="$cache/transfer/llama.cpp-$LCPP_PY_VERSION-src.tar.gz"
if [ ! -s "$tarball" ]; then
  # The same source tarball the GPU run carries (downloads the sdist once).
  bash "$repo/scripts/gpu/prepare_llamacpp.sh" --source-only
fi
mkdir -p "$home"
rm -rf "$home/src"
mkdir -p "$home/src"
tar -xzf "$tarball" -C "$home/src"
# shellcheck disable=SC1091
. "$home/src/llama.cpp/BUILD_INFO"
t0=$SECONDS
cmake -S "$home/src/llama.cpp" -B "$home/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_COMMIT="$LLAMA_BUILD_COMMIT" -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER" > "$home/configure.log"
echo "[build-cpu] configured in $((SECONDS - t0)) s; building llama-server with $jobs jobs"
cmake --build "$home/build-cpu" --target llama-server -j "$jobs" > "$home/build.log" 2>&1 \
  || { tail -30 "$home/build.log"; exit 1; }
echo "$flags" > "$stamp"
echo "[build-cpu] built in $((SECONDS - t0)) s: $bin"
"$bin" --version 2>&1 | head -2
