import os
import tempfile

import pytest

# Tests run on the CPU unless a caller (the GPU check) says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The commands turn on JAX's persistent compilation cache (vit/inference/compile_cache.py);
# tests keep it off and out of the home folder. tests/test_inference.py turns it on in a temporary folder.
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("VIT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vit-test-cache"))


@pytest.fixture(autouse=True, scope="session")
def _expected_backend():
    """scripts/gpu_check.sh sets VIT_TEST_BACKEND=gpu (and JAX_PLATFORMS=cuda): then every test
    errors unless jax really runs there, rather than passing on a CPU."""
    expected = os.environ.get("VIT_TEST_BACKEND")
    if expected:
        import jax

        assert jax.default_backend() == expected, (
            f"VIT_TEST_BACKEND={expected} but jax runs on {jax.default_backend()}")

# Libraries the cross-checks compare against. CI installs them (the `compare` extra), so there a
# comparison test that skips for want of one is a failure, not a quiet pass.
PEERS = ("torch", "transformers")
_peer_skips: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("CI") == "true":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if any(f"'{peer}'" in reason or f"No module named {peer}" in reason for peer in PEERS):
            _peer_skips.append(f"{report.nodeid}: {reason}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _peer_skips and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _peer_skips:
        terminalreporter.write_line(
            f"FAILED (CI=true): {len(_peer_skips)} comparison test(s) skipped because torch or "
            "transformers is missing; CI must run them (install the `compare` extra):", red=True)
        for line in _peer_skips[:10]:
            terminalreporter.write_line(f"  {line}")
