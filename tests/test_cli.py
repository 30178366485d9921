"""The `vit` command's surface: help, info, one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def vit_cli(*args):
    return subprocess.run([sys.executable, "-m", "vit.cli", *args], capture_output=True, text=True)


def test_help_lists_commands():
    out = vit_cli("--help")
    assert out.returncode == 0 and "info" in out.stdout


def test_info_json_reports_params_gmacs_tokens():
    out = vit_cli("info", "vit_b16", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["params"] == 86_567_656 and info["tokens"] == 197
    assert abs(info["gmacs"] - 17.58) < 0.03
    text = vit_cli("info", "B/32", "--set", "classifier=gap", "--set", "class_token=false")
    assert text.returncode == 0 and "gap classifier" in text.stdout
    # The shared `--set` rules: AxB pairs, none, Python-style True.
    big = vit_cli("info", "vit_b16", "--json", "--set", "image_size=384x384", "--set",
                  "representation_size=none", "--set", "qkv_bias=True")
    assert big.returncode == 0, big.stderr
    assert json.loads(big.stdout)["tokens"] == 577


@pytest.mark.parametrize("args,needle", [
    (("info", "vit_b61"), "unknown model 'vit_b61'"),
    (("info", "vit_b16", "--set", "num_head=3"), "did you mean num_heads"),
    (("info", "vit_b16", "--set", "depth=deep"), "depth=deep"),
    (("info", "vit_b16", "--set", "class_token=maybe"), "expected true or false"),
    (("info", "vit_b16", "--image-size", "225"), "not a multiple of patch_size"),
])
def test_user_mistakes_are_one_line_exit_2(args, needle):
    out = vit_cli(*args)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
