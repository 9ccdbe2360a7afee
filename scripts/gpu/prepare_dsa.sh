#!/usr/bin/env bash
# Prepare, on THIS machine (it has PyPI), what the DSA (DeepSeek Sparse Attention) matrix needs on the lent H200,
# in two carry folders of at most 58 MiB each (the call limit is 64 MiB with the ~3.5 MB repo):
#
#   scripts/gpu/prepare_dsa.sh          # cached: a second run only re-stages
#
#   call-dsa1  sglang-site.tar.xz built with SGLANG_DSA=1 (sgl_kernel keeps flashmla_ops.abi3.so, the FlashMLA
#              kernels of the flashmla_sparse / flashmla_kv backends; DeepGEMM from sgl_deep_gemm 0.1.4 for the DSA
#              indexer), tokenizers 0.22.2, tenacity, and SmolLM2's config + tokenizer files (the tiny DSA model
#              uses SmolLM2's tokenizer; the SmolLM2 A/B uses its config with random weights made on the device)
#   call-dsa2  tilelang_site.tar.xz: tilelang 0.1.11 (without 3rdparty/composable_kernel, AMD only, 44 MB),
#              z3-solver 4.15.4.0 (without its z3 binary; libz3.so as a link), torch-c-dlpack-ext 0.1.5
#
# Not carried, so not run: the fa3 DSA backend (sgl_kernel's flash_ops.abi3.so is 1.76 GB) and trtllm (SM100/SM103
# kernels: they cannot run on Hopper). The device side: scripts/gpu/dsa_suite.sh (its header lists the calls).
# Environment: as scripts/gpu/prepare_engines.sh (PYTEST_LLMSERVE_CACHE, PY312, PYTHON, XZ_THREADS).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/gpu/prepare_lib.sh
. "$repo/scripts/gpu/prepare_lib.sh"
say() { echo "[prepare-dsa $(date +%H:%M:%S)] $*"; }
die() { echo "[prepare-dsa] ERROR: $*" >&2; exit 1; }

# 1. the SGLang site with the DSA kernels, its extra wheels, the plugin's wheels, SmolLM2's files.
ENGINES=sglang SGLANG_DSA=1 bash "$repo/scripts/gpu/prepare_engines.sh"

# 2. TileLang (the tilelang DSA decode backend), one xz of a site tree.
tl_pins="tilelang==0.1.11 z3-solver==4.15.4.0 torch-c-dlpack-ext==0.1.5"
tl="$out/tilelang_site.tar.xz"
if [ -s "$tl" ] && [ "$(cat "$tl.recipe" 2>/dev/null)" = "$tl_pins v1" ]; then
  say "cached: tilelang_site.tar.xz ($(mib "$(stat -c %s "$tl")"))"
else
  mkdir -p "$dl/tilelang"
  # shellcheck disable=SC2086
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps "${P[@]}" -d "$dl/tilelang" $tl_pins
  w="$eng/build/tilelang"; rm -rf "$w"; mkdir -p "$w/site"
  "${py312[@]}" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps \
    --no-compile --target "$w/site" "$dl"/tilelang/*.whl
  rm -rf "$w/site/tilelang/3rdparty/composable_kernel" "$w/site/bin" "$w"/site/z3_solver-*.data
  find "$w/site" -name __pycache__ -prune -exec rm -rf {} +
  # z3's wheel holds libz3.so and libz3.so.4.15 as two copies of one 30 MB library: keep one, link the other.
  if [ -f "$w/site/z3/lib/libz3.so.4.15" ] && [ -f "$w/site/z3/lib/libz3.so" ] && [ ! -L "$w/site/z3/lib/libz3.so" ]; then
    ln -sf libz3.so.4.15 "$w/site/z3/lib/libz3.so"
  fi
  say "tilelang site: $(du -sh "$w/site" | cut -f1) unpacked; packing (xz -9e)"
  XZ_OPT="-T$XZ_THREADS -9e" tar -cJf "$tl.tmp" -C "$w/site" .
  mv "$tl.tmp" "$tl"; echo "$tl_pins v1" > "$tl.recipe"
  rm -rf "$w"
fi
say "tilelang_site.tar.xz: $(mib "$(stat -c %s "$tl")")"

# 3. stage the two calls (ignored by git), each with MANIFEST.txt and the common PLAN.txt.
grep -qxF '/.gpu-transfer/' "$repo/.git/info/exclude" 2>/dev/null \
  || { mkdir -p "$repo/.git/info"; echo '/.gpu-transfer/' >> "$repo/.git/info/exclude"; }
rm -rf "$stage_root"
plan=()
add() { plan+=("$1 $2 $3"); }
add call-dsa1 sglang-site.tar.xz "$out/sglang-site.tar.xz"
for f in "$dl"/sglang-extra/*.whl; do add call-dsa1 "wheels-sglang/$(basename "$f")" "$f"; done
for f in "$dl"/plugin/*.whl; do add call-dsa1 "wheels-plugin/$(basename "$f")" "$f"; done
add call-dsa1 SmolLM2-135M-Instruct-hf-files.tar.xz "$out/SmolLM2-135M-Instruct-hf-files.tar.xz"
add call-dsa2 tilelang_site.tar.xz "$tl"
planfile="$eng/PLAN-dsa.txt"
{
  echo "# pytest-llmserve DSA transfer plan, $(date -u +%Y-%m-%dT%H:%M:%SZ): call path bytes sha256"
  for item in "${plan[@]}"; do
    read -r c rel src <<< "$item"
    mkdir -p "$(dirname "$stage_root/$c/$rel")"
    ln -f "$src" "$stage_root/$c/$rel" 2>/dev/null || cp "$src" "$stage_root/$c/$rel"
    echo "$c $rel $(stat -c %s "$src") $(sha256sum < "$src" | cut -d' ' -f1)"
  done
} > "$planfile"
repo_bytes="$(git -C "$repo" ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
for c in call-dsa1 call-dsa2; do
  d="$stage_root/$c"
  { echo "# $c: path bytes sha256"; awk -v c="$c" '$1 == c { print $2, $3, $4 }' "$planfile"; } > "$d/MANIFEST.txt"
  cp "$planfile" "$d/PLAN.txt"
  bytes=$(find "$d" -type f -printf '%s\n' | awk '{ t += $1 } END { print t }')
  say "$c: $(mib "$bytes"); with the repo tree $(mib $((bytes + repo_bytes)))"
  [ "$bytes" -le $LIMIT ] || die "$c holds $bytes bytes: over the $LIMIT-byte limit"
done
say "staged under $stage_root; on the device: scripts/gpu/dsa_suite.sh"
