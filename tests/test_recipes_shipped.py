"""The recipes ship with the package: `--config digits` by name, `vit train --list-configs`, and
a wheel that holds them, installed into a fresh venv outside the repository, trains by name.
Nothing is downloaded: the wheel builds with the repo venv's setuptools, and the fresh venv
reads the repo venv's site-packages for the dependencies."""

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vit.cli import main
from vit.recipes.load import load_config

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))


def test_a_shipped_recipe_loads_by_name_as_from_its_file():
    by_file = load_config(ROOT / "configs" / "digits.py", ["train.steps=7"]).to_dict()
    assert load_config("digits", ["train.steps=7"]).to_dict() == by_file
    assert load_config("digits.py", ["train.steps=7"]).to_dict() == by_file


def test_list_configs_names_every_recipe_with_its_purpose(capsys):
    with pytest.raises(SystemExit) as done:  # no --workdir needed, as with --version
        main(["train", "--list-configs"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == RECIPES
    for line in lines:
        name, shown = line.split(maxsplit=1)
        doc = " ".join(ast.get_docstring(ast.parse((ROOT / "configs" / f"{name}.py")
                                                   .read_text())).split())
        assert doc.startswith(shown.rstrip(".")) and len(shown) <= 120, (name, shown)
    digits = next(line for line in lines if line.startswith("digits "))
    assert digits.split(maxsplit=1)[1] == ("The demo: a small ViT trained from scratch on the "
                                           "bundled 8x8 digits (scikit-learn).")


def test_an_unknown_recipe_name_is_one_line_with_the_nearest(run_vit, tmp_path):
    code, err = run_vit(["train", "--config", "digit", "--workdir", tmp_path / "w"])
    assert code == 2 and len(err) == 1
    assert "did you mean digits?" in err[0] and "--list-configs" in err[0]
    assert not (tmp_path / "w").exists()


# -- the wheel ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The package's wheel, built offline from a copy of the sources (the checkout's own
    build/ folder is left alone)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("vit", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w", str(out),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return next(out.glob("vit-*.whl"))


def test_the_wheel_holds_every_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"vit/recipes/builtin/{r}.py" for r in RECIPES} <= names
    assert "vit/cli.py" in names and "vit/assets/imagenet1k_labels.txt" in names


@pytest.mark.slow
def test_the_installed_wheel_trains_a_recipe_by_name_outside_the_repository(wheel,
                                                                            tmp_path):
    """`pip install` of the wheel into a fresh venv, then `vit train --config digits` in an
    empty folder: the command, the package and the recipe all come from the install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True)
    # The dependencies from the repo venv's site-packages (a path, not a site dir: its
    # editable-install hook, which would map `vit` to this checkout, is not run).
    deps = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "repo_deps.pth").write_text(deps.stdout.strip() + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "--no-deps", "--no-index", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([str(python), "-c", "import vit; print(vit.__file__)"], cwd=work,
                           capture_output=True, text=True, env=env)
    assert where.stdout.startswith(str(venv)), where
    listed = subprocess.run(["vit", "train", "--list-configs"], cwd=work, capture_output=True,
                            text=True, env=env)
    assert listed.returncode == 0 and "digits" in listed.stdout, listed.stderr
    run = subprocess.run(["vit", "train", "--config", "digits", "--set", "train.steps=20",
                          "--workdir", "run"], cwd=work, capture_output=True, text=True,
                         env=env, timeout=580)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done: 20 steps" in run.stdout
    assert (work / "run" / "checkpoints" / "20").is_dir()
    assert any((work / "run" / "tb").glob("*tfevents*"))


def test_the_training_guide_lists_every_recipe_as_list_configs_does():
    """docs/training.md shows `vit train --list-configs`' output: it must be that output, so a
    new recipe cannot be left out of the guide."""
    from vit.recipes.shipped import listing

    guide = (ROOT / "docs" / "training.md").read_text()
    block = guide.split("$ vit train --list-configs\n", 1)[1].split("```", 1)[0]
    assert block.rstrip("\n") == listing(), (
        "docs/training.md's --list-configs block differs from `vit train --list-configs`; "
        "paste its output there")
    assert [line.split()[0] for line in block.splitlines()] == RECIPES
