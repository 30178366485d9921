"""Under CI=true a comparison test skipped for want of torch or transformers fails the run
(tests/conftest.py), so a missing `compare` extra cannot pass CI quietly."""

import shutil
import subprocess
import sys
from pathlib import Path

SKIPPING = '''
import pytest

def test_compares_against_torch():
    raise pytest.skip.Exception("could not import 'torch': No module named 'torch'")

def test_other_skip_is_fine():
    pytest.skip("not this platform")
'''


def _run(tmp_path, ci: str | None):
    for name in ("conftest.py", "builders.py"):  # conftest's fixtures use the builders
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    (tmp_path / "test_peer.py").write_text(SKIPPING)
    env = {"PATH": "/usr/bin:/bin", **({"CI": ci} if ci is not None else {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, env=env)


def test_a_skipped_comparison_fails_under_ci(tmp_path):
    out = _run(tmp_path, "true")
    assert out.returncode == 1, out.stdout
    assert "test_compares_against_torch" in out.stdout and "compare" in out.stdout
    assert "test_other_skip_is_fine" not in out.stdout.split("FAILED (CI=true)")[1]


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    out = _run(tmp_path, None)
    assert out.returncode == 0, out.stdout
