"""The `vit` command's surface: help, info, one-line errors with exit code 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow  # the installed command in two processes, a run and a refusal
def test_the_vit_command_leaves_its_run_whole_and_its_output_flushed(tmp_path):
    """The installed `vit` command ends without the interpreter's teardown (`_exit_now`): its
    piped output, the run's last timing record, the curves and the checkpoint must all be
    there when it has exited, and an error keeps its one line and exit code 2."""
    from builders import tiny_recipe_sets
    from PIL import Image

    command = [str(Path(sys.executable).parent / "vit"), "train", "--config", "digits",
               "--workdir", str(tmp_path / "run"), "--no-cache"]
    sets = [a for s in tiny_recipe_sets("train.steps=2") for a in ("--set", s)]
    # Piped output is block-buffered, as for any user (unless PYTHONUNBUFFERED says not).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(command + sets, capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("done: 2 steps"), done.stdout[-500:]
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "exit_s" in records[-1], records[-1]  # the run's very last write
    Image.open(tmp_path / "run" / "curves.png").verify()
    assert (tmp_path / "run" / "checkpoints" / "2" / "params").is_dir()
    refused = subprocess.run(command + sets + ["--set", "train.stepz=3"], capture_output=True,
                             text=True, timeout=170, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("vit train: error: "), \
        refused.stderr[-500:]
