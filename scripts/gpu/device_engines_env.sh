#!/usr/bin/env bash
# On the lent GPU machine (no registry there): put together what scripts/gpu/prepare_engines.sh staged in
# .gpu-transfer/engines/call1..call4 — the SmolLM2-135M-Instruct model (bf16 safetensors), the SGLang 0.5.15
# and vLLM 0.26.0 environments and the plugin's missing wheels — under /root/llmserve-engines.
#
#   bash scripts/gpu/device_engines_env.sh STEP...     (no step: stage check)
#   . scripts/gpu/device_engines_env.sh; eng_main STEP...   (sourced by a runner: defines eng_* functions and
#                                                         exports the NVLink-multicast switches, runs nothing)
# Steps (each is skipped when already done on this warm machine; /root survives between calls only while
# the machine stays warm, so chain the calls back to back):
#   stage       copy the files of every .gpu-transfer/engines/call*/ carried in this call to
#               /root/llmserve-engines/transfer, checked against its MANIFEST.txt  [always run first when executed]
#   model       join the GGUF parts, check the sha256, convert with the image's transformers 5.17 to
#               /root/llmserve-engines/models/SmolLM2-135M-Instruct (bf16 safetensors + the carried plain config)
#   sglang-env  unpack sglang-site.tar.xz into sglang/site, tokenizers 0.22.2 into sglang/site2; sglang/env.sh
#   vllm-env    join + unpack vsite into vllm/site, add third_party_py and _vllm_fa3_C, its wheels into vllm/site2;
#               vllm/env.sh
#   plugin-env  tenacity into plugin-site; plugin-env.sh (PYTHONPATH=plugin-site:<repo> for pytest)
#   check       report what is there and what is missing
#   all         model sglang-env vllm-env plugin-env check
#
# Device calls (one machine kept warm; carry one folder each; timeout_s 600): scripts/gpu/engines_suite.sh c1..c4
# runs the steps below and the tests:
#   1. carry [".gpu-transfer/engines/call1"]  stage plugin-env
#   2. carry [".gpu-transfer/engines/call2"]  stage model
#   3. carry [".gpu-transfer/engines/call3"]  stage sglang-env   (vsite part aa rides along)
#   4. carry [".gpu-transfer/engines/call4"]  stage vllm-env
# Overrides: LLMSERVE_ENGINES_ROOT (default /root/llmserve-engines), PYTHON (default python3: the image's
# /opt/torch/.venv python; the `pip` on PATH belongs to another python), ENG_CONVERT_PYTHON (the python that
# converts the model, default $PYTHON).

# shellcheck disable=SC2015  # `a && b && c || { error; return 1; }`: the error branch is meant for any failure
# Never let anything here use NVLink multicast (the device README: it can take the host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ENG_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ENG_ROOT="${LLMSERVE_ENGINES_ROOT:-/root/llmserve-engines}"
ENG_T="$ENG_ROOT/transfer"
ENG_PY="${PYTHON:-python3}"
ENG_CONVERT_PY="${ENG_CONVERT_PYTHON:-$ENG_PY}"
ENG_GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
ENG_MODEL="$ENG_ROOT/models/SmolLM2-135M-Instruct"
ENG_HF_TAR="SmolLM2-135M-Instruct-hf-files.tar.xz"

eng_say() { echo "[engines $(date +%H:%M:%S)] $*"; }
eng_sha() { sha256sum < "$1" | cut -c1-64; }

# eng_where REL: the call that carries transfer/REL, from the plan the preparation wrote.
eng_where() {
  local plan c
  for plan in "$ENG_T/PLAN.txt" "$ENG_REPO"/.gpu-transfer/engines/call*/PLAN.txt; do
    [ -f "$plan" ] || continue
    c="$(awk -v r="$1" '$2 == r { print $1; exit }' "$plan")"
    [ -n "$c" ] && { echo "$c"; return 0; }
  done
  case "$1" in  # no plan seen yet (no call carried anything on this machine): the usual placement
    vsite.tar.xz.part-aa|sglang-site*) echo "call3 (usually)" ;;
    vsite*) echo "call4 (usually)" ;;
    *gguf.part-ab|*.gguf.sha256|_vllm_fa3*) echo "call2 (usually)" ;;
    *.part-aa|*hf-files*|wheels-*|third_party_py*) echo "call1 (usually)" ;;
    *) echo "an unknown call" ;;
  esac
}

# eng_need REL...: true when every transfer/REL is there; else names each missing file and its call.
eng_need() {
  local rel ok=0 c
  for rel in "$@"; do
    [ -s "$ENG_T/$rel" ] && continue
    c="$(eng_where "$rel")"
    eng_say "MISSING $ENG_T/$rel: it travels in $c: carry .gpu-transfer/engines/${c%% *} in a call of this same warm machine (run prepare_engines.sh on the dev machine first)"
    ok=1
  done
  return $ok
}

# eng_planned PREFIX: the planned transfer paths under PREFIX (from the plan, else what is there).
eng_planned() {
  local plan
  for plan in "$ENG_T/PLAN.txt" "$ENG_REPO"/.gpu-transfer/engines/call*/PLAN.txt; do
    [ -f "$plan" ] && { awk -v p="$1" 'index($2, p) == 1 { print $2 }' "$plan" | sort -u; return 0; }
  done
  (cd "$ENG_T" 2>/dev/null && find "${1%/}" -type f 2>/dev/null | sort)
}

eng_untar_xz() {  # ARCHIVE DIR
  if command -v xz >/dev/null 2>&1; then tar -xJf "$1" -C "$2"
  else "$ENG_PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$1" "$2"; fi
}
eng_unxz() {  # FILE.xz OUT
  if command -v xz >/dev/null 2>&1; then xz -dc "$1" > "$2"
  else "$ENG_PY" -c 'import sys, lzma, shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi
}
eng_pip_target() {  # DIR WHEEL...: install wheels (no index, no deps) into DIR
  local dir=$1; shift
  "$ENG_PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target "$dir" "$@"
}

eng_stage() {
  local d call rel bytes sum src dest n_new=0 n_same=0 bad=0 any=0
  mkdir -p "$ENG_T/manifests"
  for d in "$ENG_REPO"/.gpu-transfer/engines/call*/; do
    [ -d "$d" ] || continue
    any=1
    call="$(basename "$d")"
    if [ ! -f "$d/MANIFEST.txt" ]; then
      eng_say "ERROR: $call carried no MANIFEST.txt: re-run scripts/gpu/prepare_engines.sh"; bad=1; continue
    fi
    if [ -f "$d/PLAN.txt" ]; then
      if [ -f "$ENG_T/PLAN.txt" ] && ! diff -q <(grep -v '^#' "$ENG_T/PLAN.txt") <(grep -v '^#' "$d/PLAN.txt") >/dev/null; then
        eng_say "WARNING: $call comes from another preparation than the files already in $ENG_T (PLAN.txt differs); the joined sha256 checks will tell"
      fi
      cp "$d/PLAN.txt" "$ENG_T/PLAN.txt"
    fi
    while read -r rel bytes sum; do
      case "$rel" in ''|'#'*) continue ;; esac
      src="$d/$rel"; dest="$ENG_T/$rel"
      if [ ! -f "$src" ]; then
        eng_say "ERROR: $call/MANIFEST.txt lists $rel but the carried folder lacks it"; bad=1; continue
      fi
      if [ "$(stat -c %s "$src")" != "$bytes" ] || [ "$(eng_sha "$src")" != "$sum" ]; then
        eng_say "ERROR: carried $call/$rel does not match its MANIFEST.txt (size/sha256): damaged or stale; re-run prepare_engines.sh"
        bad=1; continue
      fi
      if [ -f "$dest" ] && [ "$(stat -c %s "$dest")" = "$bytes" ] && [ "$(eng_sha "$dest")" = "$sum" ]; then
        n_same=$((n_same + 1)); continue
      fi
      mkdir -p "$(dirname "$dest")"
      cp "$src" "$dest.tmp" && mv "$dest.tmp" "$dest" && n_new=$((n_new + 1))
    done < "$d/MANIFEST.txt"
    cp "$d/MANIFEST.txt" "$ENG_T/manifests/$call.MANIFEST.txt"
    eng_say "staged $call: verified against its MANIFEST.txt"
  done
  [ $any = 1 ] || eng_say "no .gpu-transfer/engines/call*/ was carried in this call (nothing to stage)"
  eng_say "staged $n_new new file(s), $n_same already there; $ENG_T now holds:"
  (cd "$ENG_T" && find . -type f ! -path './manifests/*' ! -name PLAN.txt -printf '  %P %s\n' | sort)
  if [ -f "$ENG_T/PLAN.txt" ]; then
    local c have want
    while read -r c; do
      want=0; have=0
      while read -r rel bytes; do
        want=$((want + 1))
        [ "$(stat -c %s "$ENG_T/$rel" 2>/dev/null)" = "$bytes" ] && have=$((have + 1))
      done < <(awk -v c="$c" '$1 == c { print $2, $3 }' "$ENG_T/PLAN.txt")
      eng_say "  $c: $have of $want planned file(s) present"
    done < <(awk '!/^#/ { print $1 }' "$ENG_T/PLAN.txt" | sort -u)
  fi
  return $bad
}

eng_model() {
  if [ -f "$ENG_MODEL/.llmserve-ready" ] && [ -s "$ENG_MODEL/model.safetensors" ]; then
    eng_say "model ready: $ENG_MODEL"; return 0
  fi
  local gwhl
  gwhl="$(eng_planned wheels-model/ | head -1)"
  eng_need "$ENG_GGUF.part-aa" "$ENG_GGUF.part-ab" "$ENG_GGUF.sha256" "$ENG_HF_TAR" "${gwhl:-wheels-model/gguf-0.19.0-py3-none-any.whl}" \
    || return 1
  local gdir="$ENG_ROOT/models/gguf" want t0=$SECONDS
  mkdir -p "$gdir"
  want="$(cut -c1-64 "$ENG_T/$ENG_GGUF.sha256")"
  if [ ! -s "$gdir/$ENG_GGUF" ] || [ "$(eng_sha "$gdir/$ENG_GGUF")" != "$want" ]; then
    cat "$ENG_T/$ENG_GGUF".part-* > "$gdir/$ENG_GGUF.tmp"
    if [ "$(eng_sha "$gdir/$ENG_GGUF.tmp")" != "$want" ]; then
      eng_say "ERROR: the joined GGUF does not match sha256 $want (parts from different preparations?)"
      rm -f "$gdir/$ENG_GGUF.tmp"; return 1
    fi
    mv "$gdir/$ENG_GGUF.tmp" "$gdir/$ENG_GGUF"
  fi
  eng_say "GGUF joined and verified: $gdir/$ENG_GGUF"
  local gsite="$ENG_ROOT/gguf-site"
  if [ ! -d "$gsite/gguf" ]; then eng_pip_target "$gsite" "$ENG_T/$gwhl" || { eng_say "ERROR: installing $gwhl failed"; return 1; }; fi
  local hf="$ENG_ROOT/models/hf-files"
  rm -rf "$hf" && mkdir -p "$hf" && eng_untar_xz "$ENG_T/$ENG_HF_TAR" "$hf" || { eng_say "ERROR: cannot unpack $ENG_HF_TAR"; return 1; }
  local tmp="$ENG_MODEL.partial"
  rm -rf "$tmp"
  eng_say "converting to bf16 safetensors with $ENG_CONVERT_PY (PYTHONPATH=$gsite only; ~25 s)"
  env PYTHONPATH="$gsite" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1 "$ENG_CONVERT_PY" - "$gdir" "$ENG_GGUF" \
      "$hf/SmolLM2-135M-Instruct" "$tmp" <<'EOF' || { eng_say "ERROR: conversion failed"; return 1; }
import sys, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
gdir, gname, hfdir, out = sys.argv[1:5]
print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
transformers.utils.logging.disable_progress_bar()
loaded = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.bfloat16)
# save_pretrained refuses a GGUF-quantized model: rebuild a plain one from the carried plain config.
config = AutoConfig.from_pretrained(hfdir)
plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
assert not unexpected, unexpected
assert all("lm_head" in k for k in missing), missing
if missing:
    plain.tie_weights()
plain = plain.to(torch.bfloat16)
plain.save_pretrained(out, safe_serialization=True)
print("saved", out, flush=True)
EOF
  cp "$hf/SmolLM2-135M-Instruct"/* "$tmp/"   # the plain config.json (the saved one may carry gguf bits) + tokenizer
  if grep -q quantization_config "$tmp/config.json" || [ ! -s "$tmp/model.safetensors" ]; then
    eng_say "ERROR: $tmp has no model.safetensors or a quantization_config in config.json"; return 1
  fi
  printf '{"gguf_sha256": "%s"}' "$want" > "$tmp/.llmserve-ready"
  rm -rf "$ENG_MODEL" && mv "$tmp" "$ENG_MODEL"
  eng_say "model ready in $((SECONDS - t0)) s: $ENG_MODEL ($(find "$ENG_MODEL" -maxdepth 1 -type f -printf '%f ' | sort))"
}

eng_sglang_env() {
  local s="$ENG_ROOT/sglang" rel wheels=()
  if [ ! -f "$s/site/.llmserve-unpacked" ]; then
    eng_need sglang-site.tar.xz || return 1
    eng_say "unpacking sglang-site.tar.xz (~270 MB)"
    rm -rf "$s/site.tmp" && mkdir -p "$s/site.tmp" && eng_untar_xz "$ENG_T/sglang-site.tar.xz" "$s/site.tmp" \
      || { eng_say "ERROR: cannot unpack sglang-site.tar.xz"; return 1; }
    touch "$s/site.tmp/.llmserve-unpacked"
    rm -rf "$s/site" && mv "$s/site.tmp" "$s/site"
  fi
  while read -r rel; do [ -n "$rel" ] && wheels+=("$rel"); done < <(eng_planned wheels-sglang/)
  [ ${#wheels[@]} -gt 0 ] || wheels=(wheels-sglang/tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl)
  if [ ! -f "$s/site2/.llmserve-installed" ]; then
    eng_need "${wheels[@]}" || return 1
    rm -rf "$s/site2"
    eng_pip_target "$s/site2" "${wheels[@]/#/$ENG_T/}" || { eng_say "ERROR: installing ${wheels[*]} failed"; return 1; }
    touch "$s/site2/.llmserve-installed"
  fi
  local grammar=""
  [ -d "$s/site/xgrammar" ] || grammar="--grammar-backend none"
  cat > "$s/env.sh" <<EOF
# SGLang 0.5.15 on the image's torch (written by scripts/gpu/device_engines_env.sh)
export PYTHONPATH="$s/site2:$s/site"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# add to the launch line (empty when xgrammar was carried in the site):
export SGLANG_GRAMMAR_ARGS="$grammar"
# launch that worked: python3 -m sglang.launch_server --model-path $ENG_MODEL --port 30000 --mem-fraction-static 0.5
#   --attention-backend triton --sampling-backend pytorch --random-seed 0 --enable-metrics --cuda-graph-bs-decode 1 2 4 8
EOF
  eng_say "wrote $s/env.sh (PYTHONPATH=$s/site2:$s/site${grammar:+; $grammar: no xgrammar in the site})"
  local outp rc
  outp="$(env PYTHONPATH="$s/site2:$s/site" "$ENG_PY" -c "
import sglang, sgl_kernel, transformers, tokenizers
print('sglang', sglang.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__)
try:
    import xgrammar; print('xgrammar', xgrammar.__version__)
except Exception as e:
    print('xgrammar not importable (use --grammar-backend none):', repr(e))
" 2>&1)"; rc=$?
  printf '%s\n' "$outp" | tail -n 25
  [ $rc -eq 0 ] || { eng_say "ERROR: import sglang, sgl_kernel failed (exit $rc) under $s/env.sh"; return 1; }
  eng_say "SGLang environment ready: . $s/env.sh"
}

eng_vllm_env() {
  local v="$ENG_ROOT/vllm" rel wheels=() fa3=_vllm_fa3_C.abi3.so.xz
  if [ ! -f "$v/site/.llmserve-unpacked" ]; then
    eng_need vsite.tar.xz.part-aa vsite.tar.xz.part-ab vsite.tar.xz.sha256 third_party_py.tar.xz "$fa3" || return 1
    local want
    want="$(cut -c1-64 "$ENG_T/vsite.tar.xz.sha256")"
    cat "$ENG_T"/vsite.tar.xz.part-* > "$v.tar.xz.tmp"
    if [ "$(eng_sha "$v.tar.xz.tmp")" != "$want" ]; then
      eng_say "ERROR: the joined vsite.tar.xz does not match sha256 $want (parts of different preparations? call4 and call5 must come from the same prepare run)"
      rm -f "$v.tar.xz.tmp"; return 1
    fi
    eng_say "vsite.tar.xz joined and verified; unpacking (~140 MB) + third_party_py + FA3"
    rm -rf "$v/site.tmp" && mkdir -p "$v/site.tmp" \
      && eng_untar_xz "$v.tar.xz.tmp" "$v/site.tmp" \
      && eng_untar_xz "$ENG_T/third_party_py.tar.xz" "$v/site.tmp" \
      && eng_unxz "$ENG_T/$fa3" "$v/site.tmp/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" \
      || { eng_say "ERROR: unpacking the vLLM site failed"; rm -f "$v.tar.xz.tmp"; return 1; }
    rm -f "$v.tar.xz.tmp"
    touch "$v/site.tmp/.llmserve-unpacked"
    rm -rf "$v/site" && mv "$v/site.tmp" "$v/site"
  fi
  while read -r rel; do [ -n "$rel" ] && wheels+=("$rel"); done < <(eng_planned wheels-vllm/)
  [ ${#wheels[@]} -gt 0 ] || { eng_say "MISSING the vLLM wheels (wheels-vllm/): carry .gpu-transfer/engines/call2"; return 1; }
  if [ ! -f "$v/site2/.llmserve-installed" ]; then
    eng_need "${wheels[@]}" || return 1
    rm -rf "$v/site2"
    eng_pip_target "$v/site2" "${wheels[@]/#/$ENG_T/}" || { eng_say "ERROR: installing ${wheels[*]} failed"; return 1; }
    touch "$v/site2/.llmserve-installed"
  fi
  cat > "$v/env.sh" <<EOF
# vLLM 0.26.0 on the image's torch and transformers 5.17 (written by scripts/gpu/device_engines_env.sh).
# site2 (llguidance, xgrammar, openai 2.54.0, apache-tvm-ffi) comes first: its openai shadows the site's 2.6.1.
export PYTHONPATH="$v/site2:$v/site"
export VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# launch that worked: python3 -m vllm.entrypoints.openai.api_server --model $ENG_MODEL --port 8000
#   --gpu-memory-utilization 0.5 --max-model-len 2048 --seed 0 --attention-backend TRITON_ATTN
#   --compilation-config '{"cudagraph_capture_sizes":[1,2,4,8]}'
EOF
  eng_say "wrote $v/env.sh (PYTHONPATH=$v/site2:$v/site, VLLM_USE_FLASHINFER_SAMPLER=0)"
  local outp rc
  outp="$(env PYTHONPATH="$v/site2:$v/site" VLLM_USE_FLASHINFER_SAMPLER=0 "$ENG_PY" -c "
import vllm, openai
print('vllm', vllm.__version__, '| openai', openai.__version__)
from vllm.platforms import current_platform
print('platform', type(current_platform).__name__)
" 2>&1)"; rc=$?
  printf '%s\n' "$outp" | tail -n 25
  [ $rc -eq 0 ] || { eng_say "ERROR: import vllm failed (exit $rc) under $v/env.sh"; return 1; }
  case "$outp" in *"platform Unspecified"*) eng_say "WARNING: vLLM sees no CUDA platform (is vllm/third_party/pynvml.py there?)" ;; esac
  eng_say "vLLM environment ready: . $v/env.sh"
}

eng_plugin_env() {
  local p="$ENG_ROOT/plugin-site" rel wheels=()
  while read -r rel; do [ -n "$rel" ] && wheels+=("$rel"); done < <(eng_planned wheels-plugin/)
  [ ${#wheels[@]} -gt 0 ] || wheels=(wheels-plugin/tenacity-9.2.1-py3-none-any.whl)
  if [ ! -f "$p/.llmserve-installed" ]; then
    eng_need "${wheels[@]}" || return 1
    rm -rf "$p"
    eng_pip_target "$p" "${wheels[@]/#/$ENG_T/}" || { eng_say "ERROR: installing ${wheels[*]} failed"; return 1; }
    touch "$p/.llmserve-installed"
  fi
  printf '# pytest-llmserve on the image (written by scripts/gpu/device_engines_env.sh)\nexport PYTHONPATH="%s:%s"\n' \
    "$p" "$ENG_REPO" > "$ENG_ROOT/plugin-env.sh"
  env PYTHONPATH="$p:$ENG_REPO" "$ENG_PY" -c "import tenacity, pytest_llmserve.plugin; print('tenacity', tenacity.__file__)" \
    || { eng_say "ERROR: import tenacity, pytest_llmserve.plugin failed with PYTHONPATH=$p:$ENG_REPO"; return 1; }
  eng_say "PYTHONPATH for pytest: $p:$ENG_REPO   (. $ENG_ROOT/plugin-env.sh)"
}

eng_check() {
  local bad=0 rel bytes c
  if [ -f "$ENG_T/PLAN.txt" ]; then
    while read -r c rel bytes; do
      [ "$(stat -c %s "$ENG_T/$rel" 2>/dev/null)" = "$bytes" ] \
        || { eng_say "not in transfer/: $rel (carry .gpu-transfer/engines/$c)"; bad=1; }
    done < <(awk '!/^#/ { print $1, $2, $3 }' "$ENG_T/PLAN.txt")
  else
    eng_say "no $ENG_T/PLAN.txt: no carried call has been staged on this machine yet"; bad=1
  fi
  eng_ready() {  # LABEL READY-MESSAGE NOT-READY-MESSAGE FILE...
    local label=$1 yes=$2 no=$3 f; shift 3
    for f in "$@"; do [ -f "$f" ] || { eng_say "$label: $no"; return 1; }; done
    eng_say "$label: $yes"
  }
  eng_ready model "ready ($ENG_MODEL)" "not converted (step model; needs call1 + call2)" \
    "$ENG_MODEL/.llmserve-ready" || bad=1
  eng_ready sglang "ready (. $ENG_ROOT/sglang/env.sh)" "not set up (step sglang-env; needs call1 + call3)" \
    "$ENG_ROOT/sglang/site2/.llmserve-installed" "$ENG_ROOT/sglang/env.sh" || bad=1
  eng_ready vllm "ready (. $ENG_ROOT/vllm/env.sh)" "not set up (step vllm-env; needs call2 + call3/call4 + call5)" \
    "$ENG_ROOT/vllm/site2/.llmserve-installed" "$ENG_ROOT/vllm/env.sh" || bad=1
  eng_ready plugin-site "ready (. $ENG_ROOT/plugin-env.sh)" "not set up (step plugin-env; needs call1)" \
    "$ENG_ROOT/plugin-site/.llmserve-installed" || bad=1
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
  df -h "$ENG_ROOT" 2>/dev/null | tail -1
  return $bad
}

eng_main() {
  local step rc=0
  mkdir -p "$ENG_T"
  [ $# -gt 0 ] || set -- stage check
  for step in "$@"; do
    case "$step" in
      stage) eng_stage || rc=1 ;;
      model) eng_model || return 1 ;;
      sglang-env) eng_sglang_env || return 1 ;;
      vllm-env) eng_vllm_env || return 1 ;;
      plugin-env) eng_plugin_env || return 1 ;;
      check) eng_check || rc=1 ;;
      all) eng_main model sglang-env vllm-env plugin-env check || return 1 ;;
      *) eng_say "unknown step $step (stage model sglang-env vllm-env plugin-env check all)"; return 2 ;;
    esac
  done
  return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  export PYTHONUNBUFFERED=1
  # Executed: stage first whatever the steps (idempotent), so each call keeps what it carried.
  if [ $# -eq 0 ]; then eng_main stage check
  else case " $* " in *" stage "*) eng_main "$@" ;; *) eng_main stage "$@" ;; esac; fi
  exit $?
fi
