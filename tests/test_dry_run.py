"""`vit train --dry-run`: the recipe's real model and step at its full size, compiled and
described, and nothing written."""

from pathlib import Path

import pytest

from vit.recipes.load import load_config

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))
TINY = ["model.width=16", "model.mlp_dim=32", "model.depth=1", "model.num_heads=2",
        "model.patch_size=4", "train.batch_size=8"]


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
                 *[a for s in TINY for a in ("--set", s)]])
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
    from vit.train.dry_run import dry_run

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
