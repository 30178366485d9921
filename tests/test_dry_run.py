"""`vit train --dry-run`: the recipe's real model and step at its full size, compiled and
described, and nothing written."""

from pathlib import Path

import pytest
from builders import tiny_recipe, tiny_recipe_sets

from vit.recipes.load import load_config

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))


def _vit_params(width, depth, mlp, patch, tokens, classes, class_token=True):
    """A ViT's parameter count from its shapes: patch embedding, position embedding, class
    token, per block two LayerNorms, q/k/v/out projections and the two MLP layers, the final
    LayerNorm and the head."""
    block = 2 * 2 * width + 4 * (width * width + width) + (width * mlp + mlp) + (mlp * width
                                                                                 + width)
    return (patch * patch * 3 * width + width + tokens * width + width * class_token
            + depth * block + 2 * width + width * classes + classes)


def test_a_dry_run_describes_the_step_and_writes_nothing(capsys, tmp_path, file_tree,
                                                         monkeypatch):
    from vit.cli import main

    work = tmp_path / "w"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    before = file_tree(tmp_path)
    code = main(["train", "--config", "digits", "--workdir", str(work), "--dry-run",
                 *[a for s in tiny_recipe_sets() for a in ("--set", s)]])
    out = capsys.readouterr().out
    assert code == 0, out
    assert file_tree(tmp_path) == before
    # digits: 8x8 images in 4x4 patches, no class token, a GAP head over 10 classes.
    expected = _vit_params(16, 1, 32, 4, 4, 10, class_token=False)
    assert f"{expected:,} parameters (10 classes)" in out
    assert "FLOPs per step:" in out and "memory per device (XLA's plan):" in out
    assert "one step:" in out and "fits" in out


def test_without_dry_run_the_workdir_is_still_required(run_vit):
    code, err = run_vit(["train", "--config", "digits"])
    assert code == 2 and len(err) == 1 and "--workdir" in err[0] and "--dry-run" in err[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_compiles_at_full_size(name):
    """Each recipe's own model, batch and accumulation, as `vit train` would run them here.
    The one step runs where it is short (`MEASURE_LIMIT_S`)."""
    from vit.training.dry_run import dry_run

    config = load_config(name)
    results = dry_run(config, out=lambda line: None)
    assert results and all(r["fits"] for r in results), results
    for r in results:
        assert r["parameters"] > 0 and r["flops_per_step"] > 0
        # The plan holds at least the parameters themselves (float32).
        assert r["argument_bytes"] >= 4 * r["parameters"]
    if name == "cifar10_finetune":
        # ViT-B/16 at 384 px: the published count, 86.86M with a 1,000-class head (what the
        # dry run assumes where CIFAR-10 is not prepared), 86.09M with CIFAR-10's 10 classes.
        assert results[0]["parameters"] in (_vit_params(768, 12, 3072, 16, 577, 1000),
                                            _vit_params(768, 12, 3072, 16, 577, 10))
        assert _vit_params(768, 12, 3072, 16, 577, 1000) == 86_859_496
        # A training step is about three times the forward's products: 2 FLOPs per weight per token,
        # plus attention's two [577 x 577] products per head, per image, for 512 images.
        weights = 12 * (4 * 768 * 768 + 2 * 768 * 3072)
        forward = 2 * weights * 577 + 12 * 2 * 2 * 577 * 577 * 768
        ratio = results[0]["flops_per_step"] / (3 * forward * 512)
        assert 0.85 < ratio < 1.15, ratio


def test_the_whole_run_estimate_adds_every_part_from_injected_timings():
    """Start-up and compile as given, the steps at the median of the timed ones (the first, a
    warm-up, left out) within their fastest and slowest, each validation a forward pass per
    image at a third of a step's per-image time plus one forward compile at a third of the
    step's, and the last save waited for."""
    from vit.training.dry_run import describe_estimate, estimate_run

    e = estimate_run(steps=100, step_times=[0.5, 0.1, 0.12, 0.08, 0.1], startup_s=3.0,
                     compile_s=3.0, batch_size=10, evaluations=(2, 60), saves=4, save_s=1.5,
                     load=(1.0, 2))
    parts = e["parts"]
    assert parts["steps_s"] == pytest.approx(10.0)  # 100 x the median 0.1
    # Two validations of 60 images at a third of the step's per-image time, and a third of
    # its compile.
    assert parts["evaluations_s"] == pytest.approx(2 * 60 * (0.1 / 10) / 3 + 3.0 / 3)
    assert parts["checkpoints_s"] == 1.5 and parts["startup_s"] == parts["compile_s"] == 3.0
    assert e["total_s"] == pytest.approx(3 + 3 + 10 + 1.4 + 1.5)
    # The range scales what the steps' speed sets (steps and evaluations) by 0.08 / 0.1 and
    # 0.12 / 0.1; the measured parts stay.
    assert e["low_s"] == pytest.approx(7.5 + 11.4 * 0.8)
    assert e["high_s"] == pytest.approx(7.5 + 11.4 * 1.2)
    assert e["spread"] == pytest.approx(0.4) and e["timed_steps"] == 4 and not e["busy"]
    line = describe_estimate(e)
    assert line.startswith("whole run: about 19 s (17 s to 21 s; range from the spread of 4 "
                           "timed steps (40%)): "), line
    assert ("start-up 3 s, compile 3 s, 100 steps 10 s at 0.100 s, 2 validations of 60 "
            "images 1 s (estimated), 4 checkpoints 2 s (one timed; the last is waited for)"
            ) in line, line


def test_the_estimate_says_what_it_could_not_count_and_a_busy_host():
    from vit.training.dry_run import describe_estimate, estimate_run

    e = estimate_run(steps=10, step_times=[2.0], startup_s=1.0, compile_s=4.0, batch_size=8,
                     evaluations=(3, None), saves=2, save_s=None, load=(5.0, 2))
    assert e["total_s"] == pytest.approx(1 + 4 + 20) == e["low_s"] == e["high_s"]
    line = describe_estimate(e)
    assert "one timed step: no spread to judge by" in line
    assert "busy while they ran (load 5.0 on 2 CPUs)" in line
    assert "3 validations not counted (the split is not on this machine)" in line
    assert "2 checkpoints not counted (no save could be timed)" in line
    none = estimate_run(steps=10, step_times=[0.3, 0.2], startup_s=0.0, compile_s=1.0,
                        batch_size=8, evaluations=(0, 0), saves=0, save_s=0.5)
    assert none["parts"]["evaluations_s"] == 0 and none["parts"]["checkpoints_s"] == 0
    assert "no validation" in describe_estimate(none)


def test_the_dry_run_prints_the_whole_run_estimate(capsys):
    """The estimate's line from the real timings of a tiny step; its figures are checked
    above, with injected timings, never here."""
    from vit.training.dry_run import dry_run

    lines = []
    (result,) = dry_run(tiny_recipe("train.steps=40", "train.eval_every=20"), out=lines.append)
    whole = next(line for line in lines if line.startswith("whole run: about "))
    assert "40 steps" in whole and "2 validations of 144 images" in whole, whole
    assert "40 checkpoints" in whole and "one timed" in whole, whole
    assert result["estimate"]["timed_steps"] >= 1 and result["estimate"]["save_measured"]
