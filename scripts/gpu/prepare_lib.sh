# Shared by the development-machine preparations (prepare_engines.sh, prepare_dsa.sh), sourced after `repo` is set:
# where the cache and the staged carry folders live, which pythons download and install, and the pip platform of
# the GPU machine (CPython 3.12, x86-64 manylinux, wheels only).
# Environment: PYTEST_LLMSERVE_CACHE (cache root), PYTHON (runs pip download), PY312 (a local CPython 3.12 for
# `pip install --target`, default `PYENV_VERSION=3.12.1 python3.12`), XZ_THREADS (default 2).
cache="${PYTEST_LLMSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-llmserve}"
eng="$cache/transfer/engines"
dl="$eng/downloads"
out="$eng/out"
build="$eng/build"
stage_root="$repo/.gpu-transfer/engines"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py=python3
if [ -n "${PY312:-}" ]; then read -r -a py312 <<< "$PY312"; else py312=(env PYENV_VERSION=3.12.1 python3.12); fi
XZ_THREADS="${XZ_THREADS:-2}"
LIMIT=$((58 * 1024 * 1024))            # per carried folder; the call limit is 64 MiB with the ~3.5 MB repo
P=(--python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --only-binary=:all:)
mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
