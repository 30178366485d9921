"""The tests' shared builders: the tiny things every test that trains, builds a model, runs a
step or reads a checkpoint starts from. A test states only what it needs different
(`tiny_recipe_sets("train.steps=8")`, `tiny_model(depth=3)`). Fixtures stay in conftest.py;
the functions and constants they and the tests share are here, imported by name
(`from builders import tiny_recipe`).

"Tiny" means one thing: the smallest of each kind that still exercises it. Each kind has its
own name: `TINY_RECIPE` (`--set` items of a `vit train` run), `TINY_MODEL` (the ViT built in
memory), `TINY_TEXT` (its text path), `TINY_CHECKPOINT` (the checkpoint written in every
format); `tiny_program` is `vit train`'s own program of the tiny recipe.
"""

import errno
import hashlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS_RECIPE = ROOT / "configs" / "digits.py"


class HalfFullDisk:
    """A file opened as `open(*args)` whose every write stores half its bytes, then fails as a
    full disk does (ENOSPC): patched over `vit.paths.open` to fail a write half-way."""

    def __init__(self, *args):
        self.f = open(*args)  # noqa: SIM115  (closed by __exit__)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def digests(root: Path) -> dict:
    """Every file and folder under `root` (hidden ones too): a file's sha1, a folder "dir"; to
    show that a refused run changed nothing."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


# -- a run: `vit train` on the bundled digits --------------------------------------------------
# Made as small and quick as a run can be: one block of width 16 over four 4x4 patches, two
# steps, a checkpoint at every step, no validation before step 100 (a test that wants one sets
# train.eval_every), one data thread; the plain patch embedding (the recipe's stem is tested
# in test_model_options.py), so a tiny run converts to every format.
TINY_RECIPE = ["model.width=16", "model.mlp_dim=32", "model.depth=1", "model.num_heads=2",
               "model.patch_size=4", "model.stem=[]", "train.batch_size=8", "train.steps=2",
               "train.eval_every=100", "train.checkpoint_every=1", "train.log_every=1",
               "train.eval_batch_size=144", "data.num_threads=1", "optim.warmup_steps=1"]


def tiny_recipe_sets(*extra: str) -> list[str]:
    """`TINY_RECIPE` with `extra` `--set` items over it: a key given again takes the new
    value, in the base key's place."""
    items = {item.split("=", 1)[0]: item for item in TINY_RECIPE}
    for item in extra:
        items[item.split("=", 1)[0]] = item
    return list(items.values())


def tiny_recipe(*extra: str):
    """configs/digits.py loaded with `tiny_recipe_sets(*extra)`: a full, checked recipe."""
    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types

    return load_config(DIGITS_RECIPE, tiny_recipe_sets(*extra),
                       model_field_types=model_field_types)


def tiny_program(*extra: str, num_classes: int = 10, seed: int = 0):
    """`vit train`'s training program (`vit.training.program.build_program`) of
    `tiny_recipe(*extra)`, and one fixed batch for it: random normal images of the recipe's
    size and batch, seeded labels of `num_classes` classes. -> (program, batch); `program(batch)`
    runs a step, as the training loop does, and advances `program.state`."""
    import numpy as np

    from vit.training.program import build_program

    config = tiny_recipe(*extra)
    program = build_program(config, num_classes)
    rng = np.random.default_rng(seed)
    size, count = config.input.image_size, config.train.batch_size
    batch = program.put(program.batch(rng.normal(size=(count, size, size, 3)),
                                      rng.integers(0, num_classes, count)))
    return program, batch


# -- a model, built in memory --------------------------------------------------------------------
# 16x16 inputs in 4x4 patches, two blocks, five classes, the XLA attention (exact on every
# backend).
TINY_MODEL = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4, image_size=16,
                  num_classes=5, attention_impl="xla")


def tiny_model(head_scale: float | None = None, seed: int = 0, **fields):
    """A `VisionTransformer` of `TINY_MODEL` with `fields` over it. Its head is zero at
    initialisation, as vit_jax's; `head_scale` gives it random weights of that scale (so
    gradients and maps see a signal), None keeps it zero."""
    import jax
    from flax import nnx

    from vit.models.vit import create_model

    model = create_model("Ti/16", rngs=nnx.Rngs(seed), **{**TINY_MODEL, **fields})
    if head_scale is not None and model.head is not None:
        k = model.head.kernel
        k[...] = jax.random.normal(jax.random.key(seed + 1), k.shape) * head_scale
    return model


# Its text path: a two-block byte encoder, cross-attention from block 0, every second block.
TINY_TEXT = dict(max_len=24, width=16, depth=2, num_heads=2, mlp_dim=32, xattn_start=0,
                 xattn_every=2)


def tiny_text_model(gates: float | None = None, text: dict | None = None, **fields):
    """`tiny_model` (three blocks) with a text path (`TINY_TEXT`, `text` over it). The prompt
    head gets unit-scale weights (a clear signal for the rules); `gates` sets every
    cross-attention gate to that value (MLP gates 0.5), None keeps them at 0, where the text
    changes nothing."""
    import jax
    import jax.numpy as jnp

    from vit.models.config import TextConfig

    model = tiny_model(**{"depth": 3, **fields}, text=TextConfig(**{**TINY_TEXT, **(text or {})}))
    out = model.prompt_head.out.kernel
    out[...] = jax.random.normal(jax.random.key(3), out.shape)
    if gates is not None:
        for block in model.xattn:
            block.attn_gate[...] = jnp.float32(gates)
            block.mlp_gate[...] = jnp.float32(0.5)
    return model


# -- a checkpoint, in every format ---------------------------------------------------------------
# The tiny model (`TINY_MODEL`) with 8x8 inputs and 10 classes, so the bundled digits fit it
# (eval, rollout --data, train --init). tanh GELU and LayerNorm eps 1e-6: the numerics every
# format can hold (a vit_jax npz always reads back as tanh GELU), so each file is the same
# function.
TINY_CHECKPOINT = dict(TINY_MODEL, image_size=8, num_classes=10, act_layer="gelu_tanh")
TINY_LABELS = [f"digit{i}" for i in range(10)]


def tiny_checkpoint(seed=0, labels=True, **fields):
    """A LoadedCheckpoint of `TINY_CHECKPOINT` (`fields` over it) with random weights in every
    tensor (the head too); another seed gives other weights. No model is built. labels=True
    names the classes (digit0..9, or class 0.. for another class count), None leaves them
    unnamed."""
    import numpy as np

    from vit.checkpoints import LoadedCheckpoint, expected_shapes, nest
    from vit.models.config import variant_config
    from vit.preprocess import INCEPTION

    cfg = variant_config("Ti/16", **{**TINY_CHECKPOINT, **fields})
    rng = np.random.RandomState(seed)
    params = nest({path: rng.randn(*shape).astype(np.float32) * 0.5
                   for path, shape in expected_shapes(cfg).items()})
    if labels is True:
        labels = TINY_LABELS if cfg.num_classes == 10 else [
            f"class {i}" for i in range(cfg.num_classes)]
    return LoadedCheckpoint(cfg, params, INCEPTION.with_size(cfg.image_size), labels or None)
