"""The training step computes what it claims: its loss and gradients against a plain
`jax.grad` of the same objective, written here from the formula rather than taken from
vit.training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from vit import device_mesh
from vit.cpu import xla_options
from vit.models.config import variant_config
from vit.training.losses import softmax_xent
from vit.training.model import fresh_params
from vit.training.placement import Placement
from vit.training.step import make_train_step

# Compiles whole models or imports torch: with the slow set.
pytestmark = pytest.mark.slow

# An "optimiser" that keeps the gradient it is given in its state and moves nothing.
KEEP_GRADS = optax.GradientTransformation(
    lambda p: {"grad": jax.tree.map(jnp.zeros_like, p)},
    lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), {"grad": g}))


def _setup(dtype="float32", smoothing=0.1):
    cfg = variant_config("Ti/16", num_classes=10, image_size=16, width=48, depth=2, num_heads=3,
                     mlp_dim=96, dtype=dtype)
    graphdef, params = fresh_params(cfg, 0)
    rng = np.random.default_rng(0)
    # A head with weights (fresh heads are zero) so every gradient is exercised.
    params["head"]["kernel"] = jnp.asarray(rng.normal(size=(48, 10)) * 0.2, jnp.float32)
    labels = rng.integers(0, 10, 6)
    target = np.full((6, 10), smoothing / 10, np.float32)
    target[np.arange(6), labels] += 1 - smoothing
    batch = {"image": rng.normal(size=(6, 16, 16, 3)).astype(np.float32),
             "label": labels.astype(np.int32), "target": target}
    return graphdef, params, batch


def _reference(graphdef, params, batch, pieces=1, options=None):
    """Cross-entropy against the smoothed targets, from log-softmax, differentiated by jax.
    `pieces`: the batch mean written as the mean of that many equal slices' means (the same
    loss; the sums in the order a step split into micro-batches adds them). `options`: jitted
    with these XLA:CPU options (the step's: the same dot engine, so the same summation order
    in each product) instead of run op by op."""
    def slice_loss(p, images, target):
        logits = nnx.merge(graphdef, p)(images, train=True, rng=jax.random.key(0))
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        return -(logp * target).sum(-1).mean()

    def loss(p):
        images = jnp.asarray(batch["image"]).reshape(pieces, -1, *batch["image"].shape[1:])
        target = jnp.asarray(batch["target"]).reshape(pieces, -1, batch["target"].shape[-1])
        return sum(slice_loss(p, images[i], target[i]) for i in range(pieces)) / pieces

    grad_fn = jax.value_and_grad(loss)
    if options is not None:
        grad_fn = jax.jit(grad_fn, **xla_options.jit_options(options))
    value, grads = grad_fn(params)
    return float(value), grads


def _max_relative_error(got, want) -> list[tuple[str, float]]:
    """Per parameter: the largest difference over the largest reference entry."""
    out = []
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got),
                            strict=True):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        scale = np.abs(w).max()
        assert scale > 0, path  # every parameter gets a gradient
        out.append((jax.tree_util.keystr(path), np.abs(g - w).max() / scale))
    return out


def _step(graphdef, params, batch, ema_decay=0.0, pieces=1, hlo=None,
          compute_dtype="float32"):
    mesh = device_mesh.make_mesh(1)
    step = make_train_step(graphdef, KEEP_GRADS, Placement.of(mesh, params, KEEP_GRADS),
                           accum_steps=pieces, ema_decay=ema_decay, loss_fn=softmax_xent,
                           compute_dtype=compute_dtype)
    p = jax.tree.map(jnp.array, params)
    ema = jax.tree.map(jnp.array, params) if ema_decay else None
    args = (p, KEEP_GRADS.init(p), ema, device_mesh.to_global(batch, mesh), 0, 0)
    if hlo is not None:
        hlo.append(step.lower(*args).as_text())
    _, state, _, metrics = step(*args)
    return float(metrics["loss"]), state["grad"]


# pieces=3: the 6 examples of 2 tokens each (one patch, the class token) in three micro-batches
# of 4 tokens, as a CPU step splits a large batch for its cache (train.micro_tokens=4).
@pytest.mark.parametrize("pieces", [1, 3])
def test_one_steps_loss_and_gradients_equal_plain_jax_grad(pieces):
    graphdef, params, batch = _setup()
    # The whole step against jax.grad compiled as the step is (XLA's own dots on a CPU).
    want_loss, want = _reference(graphdef, params, batch, pieces,
                                 options=xla_options.TRAINING if pieces == 1 else None)
    hlo = []
    got_loss, got = _step(graphdef, params, batch, ema_decay=0.99, pieces=pieces, hlo=hlo)
    # The split runs its micro-batches in a loop; the whole batch at once has none.
    assert ("while" in hlo[0]) == (pieces > 1)
    assert want_loss > 0.1
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    errors = _max_relative_error(got, want)
    assert len(errors) > 20
    # The step in micro-batches: other products (fewer rows each) and a loop, so float32
    # rounds differently: 1.1e-6 at most here against either reference, 8.7e-7 against the
    # step without the split, 7.4e-7 under jax's default XLA:CPU options. The whole step:
    # 2.8e-7 on a Xeon with AVX-512.
    assert max(e for _, e in errors) <= (1e-6 if pieces == 1 else 2e-6), errors
    if pieces == 1:  # and against jax.grad run op by op, through jax's default dots: another
        # summation order in each product (1.2e-6 on the Xeon, 7.9e-7 on an AMD EPYC)
        _, eager = _reference(graphdef, params, batch)
        assert max(e for _, e in _max_relative_error(got, eager)) <= 2e-6
    if pieces > 1:  # and against one jax.grad of the whole batch's mean
        _, whole = _reference(graphdef, params, batch)
        assert max(e for _, e in _max_relative_error(got, whole)) <= 2e-6


@pytest.mark.parametrize("dtype", ["bfloat16"])
@pytest.mark.parametrize("pieces", [1, 3])
def test_mixed_precision_step_keeps_float32_gradients_near_the_float32_ones(dtype, pieces):
    """bfloat16 compute, float32 master weights: the gradients come back float32, and close to
    the float32 model's (bfloat16 keeps 8 bits: a few per cent of each tensor's scale), whole
    or split into micro-batches for the CPU's cache."""
    graphdef, params, batch = _setup()
    _, want = _reference(graphdef, params, batch)
    graphdef16, params16, _ = _setup(dtype)
    hlo = []
    loss16, got = _step(graphdef16, params16, batch, pieces=pieces, hlo=hlo,
                        compute_dtype=dtype)
    assert np.isfinite(loss16)
    assert ("while" in hlo[0]) == (pieces > 1)
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got),
                            strict=True):
        assert g.dtype == jnp.float32, path
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err <= 0.08, (jax.tree_util.keystr(path), err)
