#!/usr/bin/env bash
# GPU check of the flash-attention kernel on one GPU (sized for an H200): at most 530 s from
# start to end, Python start-ups included; --quick at most 175 s.
#
#   scripts/gpu_check.sh [--quick] [--dry-run] [RESULTS_DIR]
#
# Outside --dry-run it exports JAX_PLATFORMS=cuda and VIT_TEST_BACKEND=gpu, so nothing can run
# on the CPU by accident: jax refuses to start without a GPU, and every test asserts the backend
# it runs on (tests/conftest.py).
#   1. the kernel and dispatcher tests, compiled for the GPU (no interpreter);
#   2. the slow kernel test at real ViT shapes (seq 577 and 1025, head_dim 96 and 128), within
#      its own time limit;
#   3. `python -m benchmarks attention`: attention TFLOP/s (ours, cuDNN, XLA, jax's Pallas mha)
#      at sequence 577 and 197; the JSON is rewritten after every row.
# --quick (to rerun after a small fix): step 1 and the seq-577 attention rows only.
#
# Exit status: 0 passed with every row measured; 1 something failed (a test, a benchmark row, a
# step past its hard time limit); 3 nothing failed but the time budget skipped benchmark rows
# (bench_attention.json marks them "skipped", failures "failed").
# Results go to RESULTS_DIR (default benchmarks/gpu): bench_attention.json and the tests' logs
# and JUnit XML. Runs the machine's python3 (PYTHON to override) from the repo root; installs
# nothing.
#
# --dry-run (CPU, for CI): the same steps, with the tests collected instead of run (CI runs them)
# and the benchmark on tiny shapes in Pallas interpret mode. GPU_CHECK_BENCH_BUDGET_S overrides
# the benchmark's time budget (a test sets 0 to prove the skipped path).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
USAGE="usage: scripts/gpu_check.sh [--quick] [--dry-run] [RESULTS_DIR]"
DRY_RUN=0
QUICK=0
RESULTS_DIR="$ROOT/benchmarks/gpu"
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --quick) QUICK=1 ;;
    -*) echo "gpu_check.sh: unknown option $arg; $USAGE" >&2; exit 2 ;;
    *) RESULTS_DIR="$arg" ;;
  esac
done
mkdir -p "$RESULTS_DIR" || exit 2
RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Seconds for the whole script; each step's hard limit is cut to what is left. Interpret mode on
# a shared CPU is slow, so the dry run gets more.
if [ $DRY_RUN -eq 1 ]; then TOTAL=1500; elif [ $QUICK -eq 1 ]; then TOTAL=175; else TOTAL=530; fi
left() { echo $(( TOTAL - SECONDS )); }
cap() { local l; l=$(left); echo $(( $1 < l ? $1 : (l > 1 ? l : 1) )); }
failed=0
skipped=0

if [ $DRY_RUN -eq 1 ]; then
  echo "== dry run on $(uname -n): tests collected only, benchmark on tiny shapes (interpret mode)"
else
  export JAX_PLATFORMS=cuda VIT_TEST_BACKEND=gpu
  echo "== JAX_PLATFORMS=$JAX_PLATFORMS VIT_TEST_BACKEND=$VIT_TEST_BACKEND"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader
fi
"$PY" -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())" || {
  echo "== gpu_check: FAILED: jax did not start on ${JAX_PLATFORMS:-its default platform}"
  exit 1
}
"$PY" -c "import pytest" 2>/dev/null || {
  echo "== gpu_check: FAILED: pytest is not installed, so the compiled tests cannot run"; exit 1
}

# Our own pytest flags only (no project addopts: its "not slow" would deselect step 2).
run_tests() {  # name, seconds, pytest selection...
  local name=$1 seconds=$2 mode=()
  shift 2
  [ $DRY_RUN -eq 1 ] && mode=(--collect-only)
  timeout "$(cap "$seconds")" "$PY" -m pytest "$@" -q "${mode[@]}" -o addopts="" \
    -p no:cacheprovider -p no:warnings --junitxml="$RESULTS_DIR/$name.xml" 2>&1 \
    | tee "$RESULTS_DIR/$name.log" | tail -n 25
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "$name: stopped at its time limit"
  [ "$rc" -eq 0 ] || failed=1
}

echo "== 1/3 kernel and dispatcher tests, compiled ($(left) s left)"
# The dry-run tests run gpu_check.sh itself: CI's job, not the GPU's.
run_tests flash_attention_tests $(( QUICK == 1 ? 120 : 130 )) tests/test_flash_attention.py \
  tests/test_attention_dispatch.py -m "not slow" -k "not dry_run and not without_a_gpu"

if [ $QUICK -eq 0 ]; then
  echo "== 2/3 kernel at real ViT shapes, compiled ($(left) s left)"
  run_tests vit_shapes_tests 60 tests/test_flash_attention.py -m slow -k test_vit_lengths
fi

echo "== 3/3 benchmarks ($(left) s left)"
# --budget-s stops new measurements in time (a row already started runs on: it compiles, then
# times); timeout is the hard stop.
bench=(--out "$RESULTS_DIR")
[ $DRY_RUN -eq 1 ] && bench+=(--dry-run)
[ $QUICK -eq 1 ] && bench+=(--quick)
hard=$(( $(left) - 5 ))
budget=${GPU_CHECK_BENCH_BUDGET_S:-$(( hard - 15 ))}
if [ "$hard" -lt 10 ]; then
  echo "no time left for the benchmarks"; skipped=1
else
  timeout "$hard" "$PY" -m benchmarks attention "${bench[@]}" --budget-s "$budget"
  rc=$?
  case $rc in
    0) ;;
    3) skipped=1 ;;
    124) echo "benchmarks: stopped at their hard time limit"; failed=1 ;;
    *) failed=1 ;;
  esac
fi

if [ $failed -eq 1 ]; then verdict="FAILED"; code=1
elif [ $skipped -eq 1 ]; then verdict="PASSED, INCOMPLETE (rows skipped by the time budget)"; code=3
else verdict="PASSED"; code=0; fi
echo "== gpu_check: $verdict in ${SECONDS} s; results in $RESULTS_DIR"
exit $code
