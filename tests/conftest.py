import os

import pytest

# Tests run on the CPU unless a caller (the GPU check) says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
