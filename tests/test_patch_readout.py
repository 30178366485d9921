"""The per-patch readout (`model.patch_classes`, `train.patch_loss`): what lies where in a
fashion_scenes scene, each patch's label, the loss, the model's readout and the training step."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.builders import tiny_model, tiny_program
from vit.data import fashion_scenes
from vit.errors import ConfigError
from vit.training.losses import WithPatchLoss, sigmoid_xent


def _photos(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(30, 255, (n, 28, 28), dtype=np.uint8), np.arange(n) % 10


def test_where_says_which_photo_covers_each_block_centre():
    data = fashion_scenes.generate("train", 40, photos=_photos())
    assert data.where.shape == (40, 16, 16)
    for where, cells, boxes in zip(data.where, data.scenes, data.boxes, strict=True):
        for a in range(16):
            for b in range(16):
                y, x = 4 * a + 2, 4 * b + 2  # the block's centre pixel
                inside = [c for c, (y0, x0, y1, x1) in zip(cells, boxes, strict=True)
                          if c >= 0 and y0 <= y < y1 and x0 <= x < x1]
                assert where[a, b] == (inside[0] if inside else -1)
        # a 28-pixel photo covers 7 block centres per side, wherever it is shifted
        for c in cells[cells >= 0]:
            assert (where == c).sum() == 49


@pytest.mark.parametrize("grid,shape", [((4, 4), (16, 16)), ((2, 2), (16, 16)),
                                        ((16, 16), (16, 16)), ((4, 2), (12, 8)),
                                        ((3, 5), (16, 16)), ((32, 32), (16, 16))])
def test_each_patch_takes_the_label_at_its_centre(grid, shape):
    where = np.random.default_rng(1).integers(-1, 10, (3, *shape)).astype(np.int8)
    labels = np.asarray(WithPatchLoss(sigmoid_xent, 1.0, grid).patch_labels(where, 11))
    (gh, gw), (h, w) = grid, shape
    for b in range(3):
        for i in range(gh):
            for j in range(gw):
                cell = where[b, math.floor((i + 0.5) * h / gh), math.floor((j + 0.5) * w / gw)]
                assert labels[b, i * gw + j] == (10 if cell < 0 else cell)


def test_the_patch_loss_adds_each_patches_cross_entropy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 5)).astype(np.float32)
    patch_logits = rng.normal(size=(4, 4, 6)).astype(np.float32)
    where = rng.integers(-1, 5, (4, 2, 2)).astype(np.int8)
    batch = {"target": (rng.random((4, 5)) > 0.5).astype(np.float32), "where": where}
    loss, metrics = WithPatchLoss(sigmoid_xent, 0.5, (2, 2))((logits, patch_logits), batch)
    labels = np.where(where < 0, 5, where).reshape(4, 4)
    p = np.exp(patch_logits) / np.exp(patch_logits).sum(-1, keepdims=True)
    ce = -np.log(np.take_along_axis(p, labels[..., None], -1)).mean()
    scene = np.mean(np.sum(np.logaddexp(0, logits) - batch["target"] * logits, -1))
    np.testing.assert_allclose(float(metrics["patch_loss"]), ce, rtol=1e-5)
    np.testing.assert_allclose(float(loss), scene + 0.5 * ce, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["patch_accuracy"]),
                               (patch_logits.argmax(-1) == labels).mean())


def test_the_readout_scores_each_final_patch_token():
    model = tiny_model(head_scale=1.0, patch_classes=7)
    k = model.patch_head.kernel
    k[...] = jax.random.normal(jax.random.key(5), k.shape)
    model.patch_head.bias[...] = jax.random.normal(jax.random.key(6), (7,))
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
    logits, patch_logits = model(x, with_patches=True)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model(x)), rtol=1e-5, atol=1e-5)
    final = np.asarray(model.features(x), np.float64)[:, model.num_prefix_tokens:]
    want = final @ np.asarray(k[...], np.float64) + np.asarray(model.patch_head.bias[...])
    assert patch_logits.shape == (2, 16, 7)
    np.testing.assert_allclose(np.asarray(patch_logits), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="no per-patch readout"):
        tiny_model()(x, with_patches=True)


@pytest.mark.slow
def test_a_step_trains_the_readout_from_where_things_lie():
    program, batch = tiny_program("model.patch_classes=3", "train.patch_loss=1.0",
                                  "train.steps=100", "optim.lr=1e-2")
    # 8x8 digits in 4x4 patches: a 2x2 grid; the patch's class is a function of its pixels
    images = np.asarray(batch["image"])
    where = (images[..., 0].reshape(-1, 2, 4, 2, 4).mean((2, 4)) > 0).astype(np.int8)
    where[:, 0, 0] = -1  # and one patch holds nothing, the last class
    batch = program.put({**batch, "where": where})
    first = program(batch)
    # the readout starts at zero: every patch's three classes equally likely
    np.testing.assert_allclose(float(first["patch_loss"]), math.log(3), rtol=1e-5)
    for _ in range(80):
        last = program(batch)
    assert float(last["patch_loss"]) < 0.5 * math.log(3)
    assert float(last["patch_accuracy"]) > 0.9


def test_a_patch_loss_needs_a_readout_and_images_as_they_lie():
    with pytest.raises(ConfigError, match="set model.patch_classes"):
        tiny_program("train.patch_loss=1.0")
    with pytest.raises(ConfigError, match="input.flip=False"):
        tiny_program("model.patch_classes=3", "train.patch_loss=1.0", "input.flip=True")


def test_a_patch_loss_beside_prompts_is_refused_before_any_stage(tmp_path):
    from pathlib import Path

    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types
    from vit.training.stages import train_stages

    recipe = Path(__file__).parents[1] / "configs" / "promptshapes.py"
    config = load_config(recipe, ["train.patch_loss=1.0"], model_field_types=model_field_types)
    with pytest.raises(ConfigError, match="stages.text.train.patch_loss=1.0 with "
                                          "stages.text.train.loss=prompt_xent"):
        train_stages(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the first stage made anything


def test_a_patch_loss_on_data_that_does_not_say_where_is_one_line(tmp_path, capsys):
    from vit.cli import main

    run = tmp_path / "run"
    assert main(["train", "--config", "digits", "--workdir", str(run), "--set",
                 "train.patch_loss=1.0", "--set", "model.patch_classes=3", "--set",
                 "train.steps=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vit train: error: train.patch_loss=1.0: digits does not say")
    assert "set train.patch_loss=0" in err[-1] and "Traceback" not in "\n".join(err)
    assert not run.exists()


@pytest.mark.parametrize("head", ["placed", "things"])
def test_the_placed_heads_refuse_another_grid(head):
    from tests.builders import tiny_text_model

    model = tiny_text_model(text={"head": head}, dynamic_image_size=True)
    tokens, mask = (jnp.zeros((1, 24), jnp.int32), jnp.zeros((1, 24), bool))
    # Jitted: eagerly each operation would compile on its own.
    answer = nnx.jit(lambda m, x: m(x, text=tokens, text_mask=mask))
    answer(model, jnp.zeros((1, 16, 16, 3)))  # its own grid answers
    with pytest.raises(ValueError, match="knows 16 patch positions"):
        answer(model, jnp.zeros((1, 24, 24, 3)))

