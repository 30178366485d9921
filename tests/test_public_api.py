"""What users hold on to keeps working when the code is moved: the names `import vit` exports,
the CLI's commands and flags, the names of moved modules, and a workdir written by release
0.1.0.

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


def test_vit_explain_is_both_the_function_and_the_package(make_tiny):
    """`vit.explain(model, images)` runs `vit.explain.maps.explain`, and `vit.explain.maps` is
    still the module, whichever is touched first."""
    import jax.numpy as jnp

    import vit
    import vit.explain.maps as maps

    assert "explain" in vit.__all__ and vit.explain.maps is maps
    model = make_tiny().build_model()
    images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 8, 3)), jnp.float32)
    ours, direct = vit.explain(model, images, "rollout"), maps.explain(model, images, "rollout")
    assert ours.maps.shape == (2, 2, 2) and float(jnp.ptp(ours.maps)) > 0
    np.testing.assert_array_equal(ours.maps, direct.maps)


# Where a moved name now lives: old module and name -> new module and name. CHANGELOG.md lists
# the same pairs; a user's import of the old one keeps working and gives the same object.
COMPATIBILITY = {
    ("vit.train.state", "build_model"): ("vit.train.model", "build_model"),
    ("vit.train.state", "fresh_params"): ("vit.train.model", "fresh_params"),
    ("vit.train.state", "abstract_params"): ("vit.train.model", "abstract_params"),
    ("vit.train.state", "start_from_init"): ("vit.train.model", "start_from_init"),
    ("vit.train.state", "Model"): ("vit.train.model", "Model"),
    ("vit.train.state", "TRAINING_FIELDS"): ("vit.train.model", "TRAINING_FIELDS"),
    ("vit.train.state", "model_fields"): ("vit.train.from_recipe", "model_fields"),
    ("vit.train.state", "augment_of"): ("vit.train.from_recipe", "augment_of"),
    ("vit.train.state", "preprocessing_of"): ("vit.train.from_recipe", "preprocessing_of"),
    ("vit.train.state", "check_resume"): ("vit.train.resume", "check_resume"),
    ("vit.train.state", "changed_keys"): ("vit.train.resume", "changed_keys"),
    ("vit.train.state", "FIXED_ON_RESUME"): ("vit.train.resume", "FIXED_ON_RESUME"),
    ("vit.train.state", "SHAPE_STATE"): ("vit.train.resume", "SHAPE_STATE"),
    ("vit.train.state", "iterator_states"): ("vit.train.iterator_records", "iterator_states"),
    ("vit.train.state", "iterator_state_of_process"): ("vit.train.iterator_records",
                                                        "iterator_state_of_process"),
    ("vit.train.loop", "write_config"): ("vit.train.workdir", "write_config"),
    ("vit.train.loop", "has_finished_step"): ("vit.train.workdir", "has_finished_step"),
    ("vit.host_allocator", "reexec"): ("vit.cpu.huge_pages", "reexec"),
    ("vit.host_allocator", "environment"): ("vit.cpu.huge_pages", "environment"),
    ("vit.host_allocator", "wanted"): ("vit.cpu.huge_pages", "wanted"),
    ("vit.host_allocator", "TUNABLE"): ("vit.cpu.huge_pages", "TUNABLE"),
    ("vit.host_allocator", "THP_MODE"): ("vit.cpu.huge_pages", "THP_MODE"),
    ("vit.host_allocator", "MIN_GLIBC"): ("vit.cpu.huge_pages", "MIN_GLIBC"),
    ("vit.host_allocator", "glibc_version"): ("vit.cpu.huge_pages", "glibc_version"),
    ("vit.host_allocator", "huge_pages_on_request"): ("vit.cpu.huge_pages",
                                                      "huge_pages_on_request"),
    ("vit.inference.xla_cpu", "OPTIONS"): ("vit.cpu.xla_options", "INFERENCE"),
    ("vit.inference.xla_cpu", "INFERENCE"): ("vit.cpu.xla_options", "INFERENCE"),
    ("vit.inference.xla_cpu", "TRAINING"): ("vit.cpu.xla_options", "TRAINING"),
    ("vit.inference.xla_cpu", "SCHEDULE"): ("vit.cpu.xla_options", "SCHEDULE"),
    ("vit.inference.xla_cpu", "OPT_OUT"): ("vit.cpu.xla_options", "OPT_OUT"),
    ("vit.inference.xla_cpu", "compile_for_inference"): ("vit.cpu.xla_options",
                                                         "compile_for_inference"),
    ("vit.inference.xla_cpu", "jit_options"): ("vit.cpu.xla_options", "jit_options"),
    ("vit.inference.xla_cpu", "inference_options"): ("vit.cpu.xla_options",
                                                     "inference_options"),
    ("vit.inference.xla_cpu", "training_options"): ("vit.cpu.xla_options", "training_options"),
    ("vit.ops.matmul", "bfloat16_note"): ("vit.cpu.features", "bfloat16_note"),
    ("vit.ops.matmul", "cpu_bfloat16_features"): ("vit.cpu.features",
                                                  "cpu_bfloat16_features"),
    ("vit.ops.matmul", "narrow_on_bfloat16_cpu"): ("vit.cpu.features",
                                                   "narrow_on_bfloat16_cpu"),
    ("vit.ops.matmul", "BF16_FLAGS"): ("vit.cpu.features", "BF16_FLAGS"),
}


def test_every_moved_name_is_importable_from_where_it_was():
    import importlib

    for (old, name), (new, new_name) in COMPATIBILITY.items():
        assert getattr(importlib.import_module(old), name) is getattr(
            importlib.import_module(new), new_name), f"{old}.{name}"


def test_the_changelog_lists_every_compatibility_name():
    changelog = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()
    missing = [f"{old}.{name}" for old, name in COMPATIBILITY
               if f"`{old}.{name}`" not in changelog]
    assert not missing, f"CHANGELOG.md does not list: {missing}"


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
def test_an_old_workdir_resumes_where_it_stopped(old_workdir):
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
    assert (old_workdir / "checkpoints" / "60").is_dir()
    # TensorBoard's curves hold the release's records too (it wrote no events of its own).
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(old_workdir / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [20, 40, 60]
