"""Training: exact resume, crash safety, divergence, data parallelism, optimiser recipes,
`--init` adaptation, and eval-vs-predict consistency. Tiny models on the bundled digits."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import tiny_program, tiny_recipe, tiny_recipe_sets

from vit.checkpoints import orbax_format
from vit.recipes.load import load_config
from vit.training.checkpointing import UNFINISHED
from vit.training.metrics import read_metrics

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).parent.parent
# The --set items of this file's runs: the tiny recipe over eight steps, validated and saved at
# 4 and 8, with the stochastic parts (drop path, EMA) on, so a resume has them to replay.
RUN_SETS = tiny_recipe_sets("model.patch_size=2", "train.batch_size=16", "train.steps=8",
                        "train.eval_every=4", "train.checkpoint_every=4",
                        "optim.warmup_steps=2", "model.drop_path=0.1", "train.ema_decay=0.9")


def tiny(*extra):
    return tiny_recipe(*RUN_SETS, *extra)


def train_losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(Path(workdir) / "metrics.jsonl")
            if r["split"] == "train"}


def restore_params(workdir, step, item=orbax_format.PARAMS):
    import orbax.checkpoint as ocp

    path = Path(workdir) / orbax_format.CHECKPOINTS_DIR / str(step) / item
    return ocp.StandardCheckpointer().restore(path.absolute())


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    from vit.training.loop import train

    workdir = tmp_path_factory.mktemp("straight")
    result = train(tiny(), workdir)
    return workdir, result


@pytest.mark.slow
def test_resumed_run_matches_uninterrupted_run_step_for_step(straight_run, tmp_path, capsys):
    from vit.training.loop import train

    workdir, result = straight_run
    train(tiny(), tmp_path, stop_after=3)  # "interrupted" after step 3 (saved there)
    assert (tmp_path / "checkpoints" / "3").is_dir()
    train(tiny(), tmp_path)
    assert "resumed from step 3" in capsys.readouterr().out
    want, got = train_losses(workdir), train_losses(tmp_path)
    assert sorted(got) == list(range(1, 9))
    np.testing.assert_allclose([got[s] for s in range(1, 9)], [want[s] for s in range(1, 9)],
                               rtol=1e-6)
    for item in (orbax_format.PARAMS, orbax_format.EMA_PARAMS):
        a, b = restore_params(workdir, 8, item), restore_params(tmp_path, 8, item)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b)
    # Artefacts: curves, best.json pointing at a kept step, metrics with validation records.
    assert (workdir / "curves.png").stat().st_size > 1000
    best = json.loads((workdir / "checkpoints" / "best.json").read_text())
    assert (workdir / "checkpoints" / str(best["step"])).is_dir()
    assert best["val_accuracy"] == result["best_val_accuracy"]


def test_a_run_writes_where_its_time_went_into_its_metrics_file(straight_run):
    """`timing` records beside the training and validation ones (which keep their fields):
    start-up, compile, each of the 8 steps, the validations and saves at 4 and 8, and the exit,
    each a part of the call's time that no other part overlaps."""
    from vit.training.timings import run_timings

    workdir, _ = straight_run
    rows = read_metrics(workdir / "metrics.jsonl")
    assert {r["split"] for r in rows} == {"train", "validation", "timing"}
    assert all(set(r) == {"step", "split", "loss", "accuracy", "lr", "images_per_s",
                          "data_wait"} for r in rows if r["split"] == "train")
    t = run_timings(workdir / "metrics.jsonl")
    assert len(t["step_s"]) == 8 and all(s > 0 for s in t["step_s"]), t
    assert t["startup_s"] > 0 and t["compile_s"] > 0 and t["process_start_s"] > 0
    assert [e["step"] for e in t["evaluations"]] == [4, 8] == [c["step"] for c in
                                                               t["checkpoints"]]
    parts = (t["startup_s"] + t["compile_s"] + sum(t["step_s"]) + t["exit_s"]
             + sum(e["seconds"] for e in t["evaluations"] + t["checkpoints"]))
    assert parts <= t["end_at_s"] + 1e-3, (parts, t)


# A fresh interpreter running the tiny recipe, recording whether matplotlib was imported when the
# step's compile (its trace first) began.
MATPLOTLIB_ORDER = r"""
import sys
from vit.training import program
compile_ = program.TrainProgram.compile
seen = []
def compile(self, batch):
    seen.append("matplotlib" in sys.modules)
    return compile_(self, batch)
program.TrainProgram.compile = compile
from vit.training.loop import train
from builders import tiny_recipe
train(tiny_recipe(*sys.argv[2:]), sys.argv[1])
print("REPORT", seen, "matplotlib.figure" in sys.modules)
"""


def test_matplotlib_loads_after_the_steps_trace_and_before_the_curves(tmp_path):
    """The step's trace is Python, as is matplotlib's import: loaded side by side they slow
    each other, so matplotlib loads once the step is compiled, for the curves at the end."""
    proc = subprocess.run([sys.executable, "-c", MATPLOTLIB_ORDER, str(tmp_path / "run"),
                           *RUN_SETS], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REPORT [False] True" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0


def test_the_timings_read_are_the_last_runs_of_a_resumed_workdir(tmp_path):
    from vit.training.timings import SPLIT, run_timings

    def timing(step, **figures):
        return {"step": step, "split": SPLIT, **figures, "at_s": 1.0}

    rows = [timing(0, startup_s=5.0, process_start_s=2.0), timing(0, compile_s=9.0),
            {"step": 2, "split": "train", "loss": 1.0}, timing(2, step_s=[0.5, 0.4]),
            timing(2, checkpoint_s=0.3), timing(3, step_s=[0.4]), timing(3, exit_s=0.2),
            timing(2, startup_s=4.0, process_start_s=1.0), timing(2, compile_s=8.0),
            timing(4, step_s=[0.3, 0.2]), timing(4, evaluation_s=0.6),
            timing(4, checkpoint_s=0.1), timing(4, exit_s=0.1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_timings(tmp_path / "metrics.jsonl") == {
        "process_start_s": 1.0, "startup_s": 4.0, "compile_s": 8.0, "step_s": [0.3, 0.2],
        "evaluations": [{"step": 4, "seconds": 0.6, "at_s": 1.0}],
        "checkpoints": [{"step": 4, "seconds": 0.1, "at_s": 1.0}], "exit_s": 0.1,
        "end_at_s": 1.0}


def test_checkpoint_layout_and_retention(straight_run):
    import orbax.checkpoint as ocp

    workdir, _ = straight_run
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert 8 in steps and len(steps) <= 3  # last 2 plus the best, latest never deleted
    step_dir = (workdir / "checkpoints" / "8").absolute()
    for item in (orbax_format.PARAMS, orbax_format.META, orbax_format.OPT_STATE,
                 orbax_format.DATA_ITER, orbax_format.TRAIN_STATE, orbax_format.EMA_PARAMS):
        assert (step_dir / item).exists(), item
    meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(step_dir / orbax_format.META)
    assert meta["format"] == orbax_format.FORMAT and meta["step"] == 8
    assert meta["labels"] == [str(d) for d in range(10)]
    assert meta["preprocessing"]["size"] == [8, 8]
    assert meta["model_config"]["num_classes"] == 10


@pytest.mark.slow
def test_a_run_keeping_an_ema_is_validated_and_read_as_its_ema(tmp_path):
    """train.ema_decay > 0: the validation record scores the EMA weights, not the raw ones,
    and a reader of the step gets the EMA arrays. 30 steps at a high rate, so the two differ."""
    import dataclasses

    from flax import nnx

    from vit.checkpoints import load_checkpoint
    from vit.data import eval_batches, open_source
    from vit.training.loop import train

    workdir = tmp_path
    train(tiny("train.steps=30", "train.eval_every=30", "train.checkpoint_every=30",
               "optim.lr=0.01", "train.ema_decay=0.95", "model.drop_path=0.0"), workdir)
    ema, raw = (restore_params(workdir, 30, item)
                for item in (orbax_format.EMA_PARAMS, orbax_format.PARAMS))
    loaded = load_checkpoint(str(workdir / "checkpoints" / "30"))
    assert "EMA" in loaded.source

    def by_name(tree):
        return {tuple(str(k.key) for k in path): np.asarray(leaf)
                for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}

    got, want = by_name(loaded.params), by_name(ema)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert any(not np.allclose(a, b)
               for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(raw), strict=True))

    def xent(params):  # mean softmax cross-entropy over the validation split, in numpy
        model = dataclasses.replace(loaded, params=params).build_model()
        forward = nnx.jit(lambda m, x: m(x))
        losses = []
        for batch in eval_batches(open_source("digits", "validation"), loaded.preprocessing,
                                  batch_size=64):
            z = np.asarray(forward(model, batch["image"]), np.float64)
            z = z - z.max(-1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
            keep = np.asarray(batch.get("mask", np.ones(len(z), bool)), bool)
            losses.append(-logp[np.arange(len(z)), np.asarray(batch["label"])][keep])
        return float(np.concatenate(losses).mean())

    recorded = next(r["loss"] for r in read_metrics(workdir / "metrics.jsonl")
                    if r["split"] == "validation" and r["step"] == 30)
    of_ema, of_raw = xent(ema), xent(raw)
    # The two models' losses differ far beyond float32 evaluation noise (~1e-6); the record
    # lies within a tenth of that difference of the EMA's.
    assert abs(of_ema - of_raw) > 1e-4, (of_ema, of_raw)
    assert abs(recorded - of_ema) < 0.1 * abs(of_ema - of_raw), (recorded, of_ema, of_raw)


@pytest.mark.slow
def test_eval_on_arrays_matches_predict_on_exported_pngs(trained_digits, tmp_path, capsys):
    """On the shared trained digits model (tests/conftest.py), whose answers have margins."""
    from PIL import Image

    from vit.cli import main
    from vit.data import open_source

    workdir = trained_digits
    assert main(["eval", "--workdir", str(workdir), "--split", "test", "--json",
                 "--out", str(tmp_path / "ev")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_examples"] == 360 and 0 <= report["accuracy"] <= 1
    assert report["top5_accuracy"] >= report["accuracy"]
    assert (tmp_path / "ev" / "confusion.png").exists()
    # Predictions of the same checkpoint on 6 test digits: arrays (eval path) vs PNG files.
    from flax import nnx

    from vit.checkpoints import load_checkpoint
    from vit.data import eval_batches

    loaded = load_checkpoint(str(workdir))
    model = loaded.build_model()
    test = open_source("digits", "test")
    batch = next(eval_batches(test, loaded.preprocessing, batch_size=6))
    eval_top1 = np.asarray(nnx.jit(lambda m, x: m(x))(model, batch["image"])).argmax(-1)
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray(test[i]["image"]).save(paths[-1])
    assert main(["predict", *paths, "--checkpoint", str(workdir), "--json", "--top-k", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    by_image = {Path(x["image"]).name: x["top_k"][0]["index"] for x in lines}
    assert [by_image[f"digit{i}.png"] for i in range(6)] == eval_top1.tolist()


@pytest.mark.slow
def test_init_replaces_head_and_resizes_posemb(straight_run, tmp_path):
    from vit.checkpoints import load_checkpoint
    from vit.training.loop import train
    from vit.training.model import start_from_init

    workdir, _ = straight_run
    src = load_checkpoint(str(workdir))
    folder = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for c in ("a", "b", "c"):
        (folder / c).mkdir(parents=True)
        for i in range(6):
            from PIL import Image
            Image.fromarray(rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)).save(
                folder / c / f"{i}.png")
    config = tiny(f"data.name={folder}", "input.image_size=16", "train.steps=2",
                  "train.eval_every=2", "train.checkpoint_every=2", "train.eval_batch_size=6",
                  "train.batch_size=8")
    model_config, params, pre = start_from_init(str(workdir), config, num_classes=3)
    assert model_config.num_classes == 3 and model_config.image_size == (16, 16)
    assert not np.any(np.asarray(params["head"]["kernel"])) and params["head"]["kernel"].shape \
        == (16, 3)
    np.testing.assert_array_equal(params["blocks"][0]["mlp"]["fc1"]["kernel"],
                                  src.params["blocks"][0]["mlp"]["fc1"]["kernel"])
    # torch's bicubic (a = -0.75, half-pixel centres, clamped taps) from 4 to 8, worked out
    # by hand: output i samples input i/2 - 1/4, so the taps alternate t = 3/4 and t = 1/4.
    m = np.array([[283, -27, 0, 0], [198, 67, -9, 0], [58, 225, -27, 0], [-27, 225, 67, -9],
                  [-9, 67, 225, -27], [0, -27, 225, 58], [0, -9, 67, 198], [0, 0, -27, 283]],
                 np.float64) / 256
    grid = np.asarray(src.params["pos_embed"], np.float64).reshape(4, 4, -1)
    want = np.einsum("ih,hwd,jw->ijd", m, grid, m).reshape(1, 64, -1)
    np.testing.assert_allclose(params["pos_embed"], want, rtol=1e-5, atol=1e-6)
    assert pre.size == (16, 16) and pre.mean == src.preprocessing.mean
    result = train(config, tmp_path / "ft", init=str(workdir))
    assert result["step"] == 2 and np.isfinite(result["loss"])


def test_adapt_params_zero_head_and_shape_errors():
    from vit.checkpoints.fit import adapt_params
    from vit.errors import CheckpointError
    from vit.models.config import variant_config
    from vit.training.model import abstract_params

    src_cfg = variant_config("Ti/16", width=16, depth=1, mlp_dim=32, num_heads=2, patch_size=4,
                         image_size=16, num_classes=5, representation_size=8)
    dst_cfg = src_cfg.replace(num_classes=3, representation_size=None, image_size=(24, 24))
    _, src = abstract_params(src_cfg)
    src = jax.tree.map(lambda s: np.ones(s.shape, np.float32), src)
    _, dst = abstract_params(dst_cfg)
    out = adapt_params(src, src_cfg, dst_cfg, dst_template=dst)
    assert "pre_logits" not in out and out["head"]["kernel"].shape == (16, 3)
    assert not out["head"]["kernel"].any()
    assert out["pos_embed"].shape == (1, 1 + 36, 16)
    np.testing.assert_allclose(out["pos_embed"], 1.0, rtol=1e-5)  # constant stays constant
    wrong = variant_config("Ti/16", width=32, depth=1, mlp_dim=32, num_heads=2, patch_size=4,
                       image_size=16, num_classes=5)
    _, wrong_tpl = abstract_params(wrong)
    with pytest.raises(CheckpointError, match="has shape"):
        adapt_params(src, src_cfg, wrong, dst_template=wrong_tpl)


def test_optimizer_recipes():
    import ml_collections
    import optax

    from vit.training.optim import layer_id, make_optimizer, path_names

    params = {"patch_kernel": jnp.ones((2, 2, 3, 4)), "pos_embed": jnp.ones((1, 5, 4)),
              "blocks": {0: {"norm1": {"scale": jnp.ones(4)}, "mlp": {"fc1": {
                  "kernel": jnp.ones((4, 4)), "bias": jnp.ones(4)}}}},
              "head": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)}}
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    base = dict(name="adamw", lr=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5,
                b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0, trainable=".*")
    # Weight decay only on kernels: a zero gradient moves kernels, nothing else.
    tx, _ = make_optimizer(ml_collections.ConfigDict(base), params, depth=1, steps=10)
    updates, _ = jax.jit(tx.update)(zero_grads, tx.init(params), params)
    moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
    assert moved["patch_kernel"] and moved["blocks"][0]["mlp"]["fc1"]["kernel"]
    assert not moved["pos_embed"] and not moved["blocks"][0]["mlp"]["fc1"]["bias"]
    assert not moved["blocks"][0]["norm1"]["scale"] and not moved["head"]["bias"]
    # By hand: with a zero gradient Adam's step is 0, so a kernel moves by -lr * wd * p = -0.05.
    decayed = {"patch_kernel", "blocks/0/mlp/fc1/kernel", "head/kernel"}
    for u, n in zip(jax.tree.leaves(updates), jax.tree.leaves(path_names(params)), strict=True):
        np.testing.assert_allclose(u, -0.05 if n in decayed else 0.0, atol=1e-7, err_msg=n)
    # And with a unit gradient (clipped, but Adam's first step is g / |g| = 1 whatever the scale):
    # -lr * (1 + wd * p) = -0.15 on kernels, -0.1 on the rest.
    updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    for u, n in zip(jax.tree.leaves(updates), jax.tree.leaves(path_names(params)), strict=True):
        np.testing.assert_allclose(u, -0.15 if n in decayed else -0.1, rtol=1e-5, err_msg=n)
    # Freezing: only the head trains.
    tx, _ = make_optimizer(ml_collections.ConfigDict({**base, "trainable": "head/.*"}), params,
                           depth=1, steps=10)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    assert all(not jnp.any(u) for u in jax.tree.leaves({k: v for k, v in updates.items()
                                                         if k != "head"}))
    assert jnp.all(updates["head"]["kernel"] != 0)
    # Layer-wise decay: SGD updates scale by decay ** (depth + 1 - layer).
    sgd = {**base, "name": "sgd", "momentum": 0.0, "clip_norm": 0.0, "layer_decay": 0.5}
    tx, _ = make_optimizer(ml_collections.ConfigDict(sgd), params, depth=1, steps=10)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    # By hand, depth 1: embeddings are layer 0 (0.5 ** 2), block 0 layer 1 (0.5), the head 2.
    factor = {"patch_kernel": 0.25, "pos_embed": 0.25, "blocks/0/norm1/scale": 0.5,
              "blocks/0/mlp/fc1/kernel": 0.5, "blocks/0/mlp/fc1/bias": 0.5,
              "head/kernel": 1.0, "head/bias": 1.0}
    names = path_names(params)
    assert sorted(jax.tree.leaves(names)) == sorted(factor)
    for u, n in zip(jax.tree.leaves(updates), jax.tree.leaves(names), strict=True):
        np.testing.assert_allclose(u, -0.1 * factor[n], rtol=1e-6, err_msg=n)
    assert layer_id("blocks/0/mlp/fc1/kernel", 1) == 1 and layer_id("pos_embed", 1) == 0
    # The vit_jax schedule: warmup then cosine to 0.
    _, lr = make_optimizer(ml_collections.ConfigDict({**sgd, "schedule": "cosine",
                                                      "warmup_steps": 5}), params, 1, 105)
    np.testing.assert_allclose([lr(0), lr(5), lr(55), lr(105)], [0, 0.1, 0.05, 0], atol=1e-7)
    assert isinstance(tx, optax.GradientTransformation)


def test_cpu_step_splits_a_large_batch_into_micro_batches_of_enough_tokens():
    """cache_splits: the most equal pieces that each keep `min_tokens` tokens (worked by hand:
    ViT-S/16 batch 32 has 32 x 197 = 6,304 tokens, four pieces of 1,576)."""
    from vit.recipes.defaults import DEFAULTS
    from vit.training.program import cache_splits

    assert DEFAULTS["train.micro_tokens"].default == 1536
    assert cache_splits(32, 197, 1536) == 4  # 8 x 197 = 1,576; 4 x 197 = 788 is too few
    assert cache_splits(64, 197, 1536) == 8
    assert cache_splits(30, 197, 1536) == 3  # 10 each; 6 each (1,182) is too few
    assert cache_splits(8, 197, 1536) == 1  # ViT-B/16 batch 8: 1,576 tokens, one piece
    assert cache_splits(7, 197, 1536) == 1  # 1,379 tokens in all: nothing to split
    assert cache_splits(64, 17, 1536) == 1  # the digits demo: 1,088 tokens
    assert cache_splits(12, 257, 1536) == 2
    assert cache_splits(32, 197, None) == 1 == cache_splits(32, 197, 0)  # never split


def test_the_recipe_decides_the_micro_batches_a_step_runs():
    """`train.accum_steps`, each split on one CPU device by `train.micro_tokens` (32 px images
    in 16 px patches, no class token: 4 tokens an image; batch 64 in 4 accumulation steps of
    16 images, 64 tokens, so pieces of at least 32 tokens are 2 per micro-batch); 0 leaves them
    whole, as does float16."""
    from vit.training import parallel
    from vit.training.model import build_model
    from vit.training.program import micro_batches

    config = tiny_recipe("input.image_size=32", "model.patch_size=16", "train.batch_size=64",
                         "train.accum_steps=4", "train.micro_tokens=32")
    model, _, _ = build_model(config, 10)
    mesh = parallel.mesh_from_config(config)
    assert model.config.num_tokens == 4 and jax.devices()[0].platform == "cpu"
    assert micro_batches(config, model.config, mesh) == 4 * 2
    config.train.micro_tokens = 0
    assert micro_batches(config, model.config, mesh) == 4
    config.train.micro_tokens = 32
    assert micro_batches(config, model.config.replace(dtype="float16"), mesh) == 4


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
    outs = []
    for accum in (1, 4):  # no warmup: the first step moves the weights
        program, batch = tiny_program(*RUN_SETS, "model.drop_path=0.0", "optim.warmup_steps=0",
                                      f"train.accum_steps={accum}")
        m = program(batch)
        assert program.micro_batches == accum
        outs.append((program.state.params, float(m["loss"])))
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 outs[0][0], outs[1][0])



@pytest.mark.slow
def test_trainable_mask_freezes_in_the_step_and_losses_are_chosen_by_name():
    """A mask given to the step freezes what it says even under an optimiser that would move
    everything (AdamW decays kernels), and trains the rest exactly as freezing by optimiser."""
    from vit.errors import ConfigError
    from vit.training.losses import get_loss, softmax_xent
    from vit.training.optim import path_names

    sets = (*RUN_SETS, "model.drop_path=0.0", "optim.warmup_steps=0", "train.accum_steps=2")
    everything, batch = tiny_program(*sets)  # AdamW over every parameter
    params = jax.tree.map(np.asarray, everything.state.params)  # a step donates the state
    mask = jax.tree.map(lambda n: n.startswith("head/"), path_names(params))
    head_only, _ = tiny_program(*sets, "optim.trainable=head/.*")  # frozen by the optimiser
    outs = []
    for program in (everything.variant(trainable=mask), head_only):
        m = program(batch)
        assert set(m) == {"loss", "accuracy", "finite"}
        outs.append(program.state.params)
    for got, want, orig, train in zip(*map(jax.tree.leaves, (*outs, params, mask)),
                                      strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert np.array_equal(got, orig) != train  # frozen: untouched; trainable: moved
    assert get_loss("softmax_xent") is softmax_xent
    with pytest.raises(ConfigError, match="softmax_xent"):
        get_loss("nope")

TWO_DEVICE_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from vit.recipes.load import load_config
from vit.models.config import variant_config
from vit import device_mesh
from vit.training.from_recipe import model_fields
from vit.training.model import fresh_params
from vit.training.step import make_train_step
from vit.training.optim import make_optimizer
from vit.training.placement import Placement
assert jax.device_count() == 2, jax.devices()
config = load_config("configs/digits.py", %r)
cfg = variant_config("Ti/16", num_classes=10, image_size=8, **model_fields(config))
graphdef, params = fresh_params(cfg, 0)
tx, _ = make_optimizer(config.optim, params, cfg.depth, 8)
rng = np.random.default_rng(0)
batch = {"image": rng.normal(size=(8, 8, 8, 3)).astype(np.float32),
         "label": rng.integers(0, 10, 8)}
batch["target"] = np.eye(10, dtype=np.float32)[batch["label"]]
out = []
for n in (1, 2):
    mesh = device_mesh.make_mesh(devices=jax.devices()[:n])
    step = make_train_step(graphdef, tx, Placement.of(mesh, params, tx), accum_steps=1,
                           ema_decay=0.9)
    p = jax.device_put(jax.tree.map(jnp.array, params), device_mesh.replicated(mesh))
    gb = device_mesh.to_global(batch, mesh)
    assert len(gb["image"].sharding.device_set) == n
    p, _, e, m = step(p, tx.init(p), jax.tree.map(jnp.copy, p), gb, 0, 0)
    out.append((jax.tree.map(np.asarray, p), float(m["loss"])))
np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5)
jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
             out[0][0], out[1][0])
print("OK", out[0][1], out[1][1])
"""


@pytest.mark.slow
def test_two_device_data_parallel_step_equals_one_device_step():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", TWO_DEVICE_SCRIPT % (RUN_SETS,)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


def test_nan_loss_stops_with_a_clear_message_and_keeps_good_checkpoint(tmp_path):
    from vit.training.checkpointing import Diverged
    from vit.training.loop import train

    config = tiny("optim.name=sgd", "optim.lr=1e30", "optim.clip_norm=0.0",
                  "optim.warmup_steps=0", "optim.schedule=constant", "train.checkpoint_every=1",
                  "train.steps=50")
    with pytest.raises(Diverged, match="(loss became (nan|inf)|weights became non-finite)") as err:
        train(config, tmp_path)
    assert "last good checkpoint" in str(err.value) and "\n" not in str(err.value)
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert steps, "no checkpoint kept"
    params = restore_params(tmp_path, steps[-1])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def _vit_train(workdir, *extra):
    cmd = [sys.executable, "-m", "vit.cli", "train", "--config", "configs/digits.py",
           "--workdir", str(workdir)]
    for item in RUN_SETS + list(extra):
        cmd += ["--set", item]
    return cmd


# `vit train` whose save of a step, once three steps are finished, says so from inside the save
# (a file naming the latest finished step, written as orbax begins the step's arrays in its
# temporary folder) and is held there: a kill then lands mid-save, by construction.
# argv: SIGNAL_FILE VIT_ARGS...
HELD_SAVE = r"""
import sys, time
from pathlib import Path
import orbax.checkpoint as ocp
from vit.step_folders import finished_steps
signal_file, argv = Path(sys.argv[1]), sys.argv[2:]
async_save = ocp.StandardCheckpointHandler.async_save
def held(self, directory, *args, **kwargs):
    steps = finished_steps(Path(argv[argv.index("--workdir") + 1]) / "checkpoints")
    if len(steps) >= 3 and not signal_file.exists():
        signal_file.write_text(str(steps[-1]))
        time.sleep(600)
    return async_save(self, directory, *args, **kwargs)
ocp.StandardCheckpointHandler.async_save = held
from vit.cli import main
sys.exit(main(argv))
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sigterm_saves_and_sigkill_mid_save_leaves_a_usable_checkpoint(tmp_path):
    """Real signals to a real `vit train` process. Slow set: three fresh interpreters and a
    4-block model saved every step."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    long_run = ["train.steps=100000", "train.eval_every=100000", "model.width=64",
                "model.mlp_dim=256", "model.depth=4"]
    # SIGTERM: saves the current step and exits 0.
    work = tmp_path / "term"
    proc = subprocess.Popen(_vit_train(work, *long_run, "train.checkpoint_every=1000"),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 240
    while not (work / "metrics.jsonl").exists() and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM: saved step" in err
    saved = [p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1
    # SIGKILL in the middle of a save (saving every step): the step being written stays
    # invisible, the newest complete checkpoint restores and resumes.
    work, saving = tmp_path / "kill", tmp_path / "saving"
    vit_args = _vit_train(work, *long_run, "train.checkpoint_every=1",
                          "train.keep_checkpoints=3")[3:]
    proc = subprocess.Popen([sys.executable, "-c", HELD_SAVE, str(saving), *vit_args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not saving.exists():  # the save's own signal that it is under way
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    assert any(p.name[0].isdigit() and UNFINISHED in p.name
               for p in (work / "checkpoints").iterdir()), "no step was being written"
    proc.kill()
    proc.communicate()
    from vit.training.checkpointing import TrainCheckpoints

    latest = TrainCheckpoints(work).latest_step()
    assert latest == int(saving.read_text())  # the half-written step is no checkpoint
    params = restore_params(work, latest)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    resumed = subprocess.run(_vit_train(work, *long_run[1:], f"train.steps={latest + 1}"),
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {latest}" in resumed.stdout


@pytest.mark.parametrize("recipe", ["cifar10_finetune", "pets_finetune", "imagefolder"])
@pytest.mark.slow
def test_finetune_recipes_smoke(recipe, straight_run, tiny_tfds, tmp_path):
    """The big recipes as shipped (SGD, inception crop, flip, accumulation), shrunk with --set
    to two steps on a tiny TFDS dataset, starting from a tiny checkpoint."""
    from vit.training.loop import train

    workdir, _ = straight_run
    config = load_config(ROOT / "configs" / f"{recipe}.py", [
        "data.name=tfds:tiny_shapes", f"data.data_dir={tiny_tfds}",
        "data.train_split=train[:50%]", "data.val_split=test", "input.image_size=8",
        "train.steps=2", "train.batch_size=4", "train.accum_steps=2", "train.eval_every=2",
        "train.checkpoint_every=2", "train.eval_batch_size=8", "train.log_every=1",
        "optim.warmup_steps=1", "data.num_threads=1", "model.attention_impl=xla"])
    result = train(config, tmp_path / "run", init=str(workdir))
    assert result["step"] == 2 and np.isfinite(result["loss"])
    assert (tmp_path / "run" / "checkpoints" / "2").is_dir()
