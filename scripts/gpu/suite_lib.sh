# Shared by the device-side runners (engines_suite.sh, dsa_suite.sh): sourced first, then `suite_start NAME`.

# suite_start NAME: ROOT (the assembled engines), RUN=/root/llmserve-run/NAME, OUT (what comes back), py (the
# python that runs pytest), this call's output also into $OUT/run.log, the NVLink-multicast switches off, status=0.
suite_start() {
  SUITE_NAME=$1
  ROOT="${LLMSERVE_ENGINES_ROOT:-/root/llmserve-engines}"
  RUN=/root/llmserve-run/$1
  OUT="${OUT:-$RUN/out}"
  py="${PYTHON:-python3}"
  mkdir -p "$RUN" "$OUT"
  exec > >(tee -a "$OUT/run.log") 2>&1
  export PYTHONUNBUFFERED=1
  # Never let anything here use NVLink multicast (the device README: it can take the host's GPUs down).
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  status=0
}

say() { echo "[$SUITE_NAME-suite $(date +%H:%M:%S) +${SECONDS}s] $*"; }

need() {  # need PATH WHAT: stop this call with a clear message when an earlier call's result is missing
  [ -e "$1" ] || { say "MISSING $2 ($1): an earlier call did not run on this machine (it went cold?)"; exit 3; }
}

# plugin_env FIRST_CALL MODULES: PYTHONPATH for pytest (the plugin's carried wheels + this checkout), checked by
# importing the plugin and MODULES.
plugin_env() {
  need "$ROOT/plugin-site" "the plugin's wheels (call $1)"
  export PYTHONPATH="$ROOT/plugin-site:$repo"
  "$py" -c "import pytest_llmserve.plugin, $2" || { say "the plugin does not import"; exit 4; }
}

# run_pytest NAME DIR LIMIT_S ARGS...: one pytest session in DIR (its rootdir), cut at LIMIT_S so the call still
# collects what ran; junit XML and the reports land in DIR.
run_pytest() {
  local name=$1 dir=$2 limit=$3; shift 3
  local t0=$SECONDS
  say "pytest $name (limit ${limit}s): $*"
  (cd "$dir" && timeout --signal=INT --kill-after=30 "$limit" "$py" -m pytest -p pytest_llmserve.plugin \
      --rootdir "$dir" -o cache_dir="$dir/.pytest_cache" --llmserve-results-dir "$dir/results-$name" \
      --junitxml="$dir/$name.xml" -v "$@")
  local rc=$?
  say "pytest $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
  return $rc
}

# check_fault_run NAME DIR SERVER BACKENDS: a fault run's failing tests are what it is for, so pytest's exit code
# cannot judge it: scripts/gpu/check_fault_results.py reads the run's results.json and checks, per decode backend in
# BACKENDS (comma-separated), which check fails and with which oracle, and that the others pass. A missing row (a boot
# cut by the limit) or a run that wrote no report is a failure. Sets status=1 when an expectation does not hold.
check_fault_run() {
  local name=$1 dir=$2 server=$3 backends=$4
  local results="$dir/results-$name"
  say "checking fault run $name ($server on $backends): the latest report under $results"
  if "$py" "$repo/scripts/gpu/check_fault_results.py" "$results" --server "$server" --backends "$backends"; then
    say "EXPECTED: fault run $name caught its fault where it must, and only there"
  else
    say "UNEXPECTED: fault run $name did not show what its fault must (above)"; status=1
  fi
}
