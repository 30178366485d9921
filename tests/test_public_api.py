"""What users hold on to keeps working when the code is moved: the names `import vit` exports,
the CLI's commands and flags, and a workdir written by release 0.1.0. (A module or name inside
the package moves without an alias before 1.0: CHANGELOG.md says where it went.)

The expected names and flags below are the public surface as released in 0.1.0, written out
here (not read from the code) so that a rename or a dropped flag fails this test.
`tests/data/workdir_0_1_0` is a real `vit train` workdir written by that release (a tiny digits
model, 40 steps, checkpoints at 20 and 40): today's code must evaluate it to the validation
accuracy that release recorded, predict with it, and resume it.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.timeout(300)

OLD_WORKDIR = Path(__file__).parent / "data" / "workdir_0_1_0"
# The `--set`s that made OLD_WORKDIR from configs/digits.py.
OLD_SETS = ["train.steps=40", "train.eval_every=20", "train.checkpoint_every=20",
            "model.width=16", "model.depth=1", "model.mlp_dim=32", "model.num_heads=2",
            "train.batch_size=32", "train.log_every=20", "optim.warmup_steps=5", "optim.lr=0.01"]

EXPORTS = ["TextConfig", "VARIANTS", "ViTConfig", "VisionTransformer", "create_model",
           "dot_product_attention", "load_checkpoint", "load_pretrained",
           "model_info", "tokenize", "train"]

# command -> (positional arguments, long flags)
COMMANDS = {
    "convert": (["src", "dst"], ["--format", "--image-size"]),
    "eval": ([], ["--batch-size", "--checkpoint", "--data", "--data-dir", "--dtype",
                  "--heldout-split", "--json", "--no-cache", "--out", "--split", "--workdir"]),
    "explain-eval": ([], ["--batch-size", "--checkpoint", "--data", "--data-dir",
                          "--discard-ratio", "--head-fusion", "--json", "--limit", "--method",
                          "--metric", "--seed", "--split", "--steps", "--substrate"]),
    "info": (["name"], ["--image-size", "--json", "--num-classes", "--set"]),
    "predict": (["inputs"], ["--batch-size", "--checkpoint", "--dtype", "--image-size", "--json",
                             "--labels", "--no-cache", "--prompt", "--set", "--template",
                             "--text-embeddings", "--top-k", "--zero-shot"]),
    "rollout": (["inputs"], ["--alpha", "--batch-size", "--checkpoint", "--class", "--cmap",
                             "--data", "--data-dir", "--discard-ratio", "--dtype",
                             "--head-fusion", "--html", "--image-size", "--limit", "--method",
                             "--no-cache", "--out", "--prompt", "--split"]),
    "train": ([], ["--config", "--coordinator", "--init", "--list-configs", "--num-processes",
                   "--process-id", "--set", "--workdir"]),
}


def test_every_released_name_still_comes_from_import_vit():
    import vit

    missing = [name for name in EXPORTS if not callable(getattr(vit, name, None))
               and not isinstance(getattr(vit, name, None), dict)]
    assert not missing, f"`import vit` lost: {missing}"
    assert set(EXPORTS) <= set(vit.__all__)


# What 0.2.0 added to `import vit`: name -> (module, attribute) of the real thing.
ADDED_0_2_0 = {
    "save_checkpoint": ("vit.checkpoints.api", "save_checkpoint"),
    "variant_config": ("vit.models.config", "variant_config"),
    **{name: ("vit.errors", name) for name in ("VitError", "ConfigError", "CheckpointError",
                                               "DataError", "OutOfSpace", "OutOfMemory")},
}


def test_the_added_names_are_the_real_things_and_listed():
    import importlib

    import vit

    for name, (module, attribute) in ADDED_0_2_0.items():
        assert getattr(vit, name) is getattr(importlib.import_module(module), attribute), name
        assert name in vit.__all__, name
    assert vit.__version__ == "0.2.0"
    assert not hasattr(vit, "get_config")  # no compatibility names before 1.0
    errors = importlib.import_module("vit.errors")
    assert all(issubclass(getattr(vit, n), errors.VitError) for n in ADDED_0_2_0
               if n[0].isupper())


def test_vit_explain_is_the_function_whatever_is_imported(make_tiny):
    """`vit.explain` is `vit.explanations.maps.explain`, a plain function, before and after the
    package's modules are imported; `vit.train` is callable and `vit.training.loop` imports."""
    import jax.numpy as jnp

    import vit

    first = vit.explain
    import vit.explanations.maps as maps
    import vit.training.loop

    assert vit.explain is first is maps.explain and "explain" in vit.__all__
    assert callable(vit.train)
    model = make_tiny().build_model()
    images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 8, 3)), jnp.float32)
    ours = vit.explain(model, images, "rollout")
    assert ours.maps.shape == (2, 2, 2) and float(jnp.ptp(ours.maps)) > 0


def test_type_checkers_see_every_lazy_name_where_it_loads_from():
    """vit/__init__.py's `if TYPE_CHECKING:` imports (what an IDE follows) name the same
    modules as the lazy table that loads them at run time."""
    import ast
    import importlib

    import vit

    tree = ast.parse(Path(vit.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert typed == vit._LAZY
    for name, module in typed.items():
        assert getattr(importlib.import_module(module), name) is getattr(vit, name), name


def test_every_released_command_keeps_its_arguments_and_flags():
    from vit.cli import build_parser

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    for name, (positionals, flags) in COMMANDS.items():
        assert name in sub.choices, f"vit {name} is gone"
        actions = sub.choices[name]._actions
        have_flags = {o for a in actions for o in a.option_strings}
        have_positionals = [a.dest for a in actions if not a.option_strings]
        assert set(flags) <= have_flags, f"vit {name} lost {sorted(set(flags) - have_flags)}"
        assert have_positionals == positionals, f"vit {name}: {have_positionals}"


@pytest.fixture
def old_workdir(tmp_path):
    work = tmp_path / "run"
    shutil.copytree(OLD_WORKDIR, work)
    return work


def _recorded_validation_accuracy(work: Path, step: int) -> float:
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    return next(r["accuracy"] for r in rows if r["step"] == step and r["split"] == "validation")


def test_an_old_workdir_evaluates_to_the_accuracy_its_release_recorded(old_workdir, capsys):
    from vit.cli import main

    assert main(["eval", "--workdir", str(old_workdir), "--split", "validation", "--json",
                 "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The best step (40) by the release's own validation run: 23 of 144 images.
    assert report["accuracy"] == pytest.approx(_recorded_validation_accuracy(old_workdir, 40))


def test_an_old_checkpoint_predicts(old_workdir, tmp_path, capsys):
    from vit.cli import main

    image = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8, 3), np.uint8)).save(image)
    assert main(["predict", str(image), "--checkpoint", str(old_workdir / "checkpoints" / "40"),
                 "--json", "--top-k", "3", "--no-cache"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    probs = [t["prob"] for t in row["top_k"]]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1


@pytest.mark.slow
def test_an_old_workdir_resumes_where_it_stopped(old_workdir, capsys):
    from vit.cli import main

    root = Path(__file__).resolve().parents[1]
    sets = [s for s in OLD_SETS if not s.startswith("train.steps=")] + ["train.steps=60"]
    args = ["train", "--config", str(root / "configs" / "digits.py"),
            "--workdir", str(old_workdir)]
    assert main(args + [a for s in sets for a in ("--set", s)]) == 0
    rows = [json.loads(line) for line in (old_workdir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    # The release's records stay, the run went on from step 40 (no step re-run), and the new
    # step-60 checkpoint is there beside the old ones.
    assert train_steps == [20, 40, 60]
    # The shipped recipe's stem came after the release: the run went on without one, and
    # its config.json says so.
    assert "model.stem=[32] is not in the recipe step 40" in capsys.readouterr().err
    assert "stem" not in json.loads((old_workdir / "config.json").read_text())["model"]
    assert (old_workdir / "checkpoints" / "60").is_dir()
    # TensorBoard's curves hold the release's records too (it wrote no events of its own).
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(old_workdir / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [20, 40, 60]
