#!/usr/bin/env bash
# GPU check of the flash-attention kernel, under 8 minutes on one H200 (at most 120 s of tests,
# then 340 s of benchmarks):
#   1. the kernel tests compiled for the GPU (VIT_TEST_COMPILED=1: no interpreter), and the
#      dispatcher tests: a ViT on the kernel equals the XLA path at float32 "highest" precision;
#   2. scripts/bench_attention.py: compiled correctness at ViT shapes, attention TFLOP/s (ours,
#      cuDNN, XLA, jax's Pallas mha), a ViT-B/16 training step per attention path, and a
#      block-size sweep of our kernel in the time left.
# Results go to RESULTS_DIR (default benchmarks/): bench_attention.json, flash_attention_tests.*.
# Runs with the machine's python3 (PYTHON to override) from the repo root; installs nothing.
#
#   scripts/gpu_check.sh [--dry-run] [RESULTS_DIR]
#
# --dry-run (CPU, for CI): collects the tests instead of running them (CI's suite runs them) and
# runs the benchmark on tiny shapes in Pallas interpret mode, so the script is proven to work.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DRY_RUN=0
RESULTS_DIR="$ROOT/benchmarks"
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -*) echo "gpu_check.sh: unknown option $arg; usage: scripts/gpu_check.sh [--dry-run] [RESULTS_DIR]" >&2
        exit 2 ;;
    *) RESULTS_DIR="$arg" ;;
  esac
done
mkdir -p "$RESULTS_DIR" || exit 2
RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader
"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1

echo "== 1/2 kernel and dispatcher tests, compiled"
if "$PY" -c "import pytest" 2>/dev/null; then
  # Our own flags only (no project addopts or warning filters: pytest-timeout may be missing).
  # The CPU-only dry-run test is left to CI.
  if [ $DRY_RUN -eq 1 ]; then mode=(--collect-only); compiled=0; else mode=(); compiled=1; fi
  VIT_TEST_COMPILED=$compiled timeout 120 "$PY" -m pytest tests/test_flash_attention.py \
    tests/test_attention_dispatch.py -q "${mode[@]}" \
    -o addopts="" -p no:warnings -p no:cacheprovider -m "not slow" -k "not dry_run" \
    --junitxml="$RESULTS_DIR/flash_attention_tests.xml" 2>&1 \
    | tee "$RESULTS_DIR/flash_attention_tests.log" | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "pytest is not installed: the benchmark's correctness section checks the compiled kernel"
fi

echo "== 2/2 benchmarks"
# --budget-s stops new measurements in time; timeout is the hard stop. The JSON is rewritten
# after each section, so a stop keeps what was measured.
if [ $DRY_RUN -eq 1 ]; then bench=(--dry-run); else bench=(--budget-s 300); fi
timeout 340 "$PY" scripts/bench_attention.py --out "$RESULTS_DIR" "${bench[@]}" || status=1

echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED); results in $RESULTS_DIR"
exit $status
