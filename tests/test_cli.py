"""The `vit` command's surface: help, info, one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from vit.cli import main

pytestmark = pytest.mark.timeout(180)


def vit_out(capsys, *args):
    """`vit ARGS` in this process: -> (exit code, stdout, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's --help and usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_commands():
    # The module entry point, in a fresh interpreter: `python -m vit.cli` as users run it.
    out = subprocess.run([sys.executable, "-m", "vit.cli", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "info" in out.stdout


def test_info_json_reports_params_gmacs_tokens(capsys):
    code, out, err = vit_out(capsys, "info", "vit_b16", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["params"] == 86_567_656 and info["tokens"] == 197
    assert abs(info["gmacs"] - 17.58) < 0.03
    code, out, _ = vit_out(capsys, "info", "B/32", "--set", "classifier=gap", "--set",
                           "class_token=false")
    assert code == 0 and "gap classifier" in out
    # The shared `--set` rules: AxB pairs, none, Python-style True.
    code, out, err = vit_out(capsys, "info", "vit_b16", "--json", "--set", "image_size=384x384",
                             "--set", "representation_size=none", "--set", "qkv_bias=True")
    assert code == 0, err
    assert json.loads(out)["tokens"] == 577


@pytest.mark.parametrize("args,needle", [
    (("info", "vit_b61"), "unknown model 'vit_b61'"),
    (("info", "vit_b16", "--set", "num_head=3"), "did you mean num_heads"),
    (("info", "vit_b16", "--set", "depth=deep"), "depth=deep"),
    (("info", "vit_b16", "--set", "class_token=maybe"), "expected true or false"),
    (("info", "vit_b16", "--image-size", "225"), "not a multiple of patch_size"),
])
def test_user_mistakes_are_one_line_exit_2(args, needle, capsys):
    code, _, err = vit_out(capsys, *args)
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
