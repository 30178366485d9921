#!/usr/bin/env bash
# Run the test suite: sets up .venv when missing (package + test and compare extras), then pytest.
# The default set leaves out the tests marked slow; `./scripts/test.sh -m ""` runs everything
# (.ci/run does). Extra arguments go to pytest, e.g. ./scripts/test.sh tests/test_models.py
# Tests run in VIT_TEST_WORKERS processes (default 2, pytest-xdist): most of a test's time is
# single-threaded XLA compilation. --dist worksteal hands each process a contiguous half of the
# files and moves tests only when one runs dry, so a module's fixtures are mostly built once.
set -euo pipefail
cd "$(dirname "$0")/.."
VIT_EXTRAS="test,compare" source scripts/setup_env.sh
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
python -m pytest -q --durations=15 -n "${VIT_TEST_WORKERS:-2}" --dist worksteal "$@"
