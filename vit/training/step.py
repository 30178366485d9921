"""The jitted training step: forward, loss, gradient accumulation, update, EMA.

Everything the step depends on comes in as an argument (the optimiser, the objective, the
trainable mask, the shardings), never from the config, so a caller can build one step per
training stage. Randomness is a pure function of (seed, step): a resumed run replays the same
dropout and drop-path masks as an uninterrupted one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit import device_mesh
from vit.cpu.xla_options import jit_options, training_options
from vit.training.losses import LossFn, softmax_xent
from vit.training.placement import Placement


def make_train_step(graphdef, tx: optax.GradientTransformation, place: Placement, *,
                    accum_steps: int, ema_decay: float, loss_fn: LossFn = softmax_xent,
                    trainable=None, compute_dtype: str = "float32"):
    """`step(params, opt_state, ema, batch, seed, step) -> (params, opt_state, ema, metrics)`.

    `metrics` holds the loss, `loss_fn`'s metrics (means over the batch) and `finite`.
    `accum_steps` splits the batch into that many micro-batches, run one after the other, one
    update from their mean gradient (a run's count is `vit.training.program.micro_batches`:
    the recipe's `train.accum_steps`, each split further on one CPU device by
    `train.micro_tokens`). `ema` is None to keep no EMA. `trainable` is a bool tree like the
    params (None: all): frozen leaves get no backward pass and never move, whatever `tx` does.
    `place` (`Placement.of`) gives the shardings of the state, the batch and the metrics:
    replicated or fsdp-sharded state, the same step. `compute_dtype` is the model's: a float32
    step compiles on the CPU with XLA's own dots and YNNPACK's reductions
    (`vit.cpu.xla_options.TRAINING`), faster there than jax's defaults; other dtypes keep
    jax's fusions, which run a narrow product on CPUs with bfloat16 arithmetic. Every step on
    the CPU takes XLA's memory-optimised schedule (`SCHEDULE`): less scratch memory.
    """
    batch_sharding = place.batch
    patches = {"with_patches": True} if getattr(loss_fn, "reads_patches", False) else {}

    def objective(params, batch, key):
        params = device_mesh.gathered_for_use(params, place.mesh)
        if trainable is not None:
            params = jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p),
                                  params, trainable)
        # A batch with prompts trains the prompt head; one without, the classifier.
        # `with_patches`: the per-patch readout too, for a loss that scores it.
        logits = nnx.merge(graphdef, params)(batch["image"], text=batch.get("text"),
                                             text_mask=batch.get("text_mask"), train=True,
                                             rng=key, **patches)
        # Per-example outputs stay split like the batch.
        logits = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding),
                              logits)
        return loss_fn(logits, batch)

    grad_fn = jax.value_and_grad(objective, has_aux=True)

    def step_fn(params, opt_state, ema, batch, seed, step):
        key = jax.random.fold_in(jax.random.key(seed), step)
        if accum_steps == 1:
            (loss, aux), grads = grad_fn(params, batch, key)
        else:  # gradient accumulation: micro-batches in sequence, one update
            micro = jax.tree.map(
                lambda x: x.reshape((accum_steps, -1) + x.shape[1:]), batch)

            # The gradients summed in the carry; each micro-batch's loss and metrics stacked
            # (scalars), so the carry's shape is known without tracing the model once more.
            def body(grads, xs):
                i, mb = xs
                (loss, aux), g = grad_fn(params, mb, jax.random.fold_in(key, i))
                return jax.tree.map(jnp.add, grads, g), (loss, aux)

            grads, (loss, aux) = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params),
                                              (jnp.arange(accum_steps), micro))
            grads = jax.tree.map(lambda x: x / accum_steps, grads)
            loss, aux = jax.tree.map(lambda x: x.mean(0), (loss, aux))
        updates, opt_state = tx.update(grads, opt_state, params)
        if trainable is not None:
            updates = jax.tree.map(lambda u, t: u if t else jnp.zeros_like(u),
                                   updates, trainable)
        params = optax.apply_updates(params, updates)
        if ema is not None:
            # EMA with warm-up (timm): early steps average over fewer updates.
            decay = jnp.minimum(ema_decay, (1.0 + step) / (10.0 + step))
            ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        # An update can overflow the weights while this step's loss is still finite: check
        # both, so a checkpoint never holds non-finite weights.
        # Checked on the device; the loop reads the flag before every save and log.
        finite = jnp.all(jnp.array([jnp.isfinite(x).all() for x in jax.tree.leaves(params)]))
        return params, opt_state, ema, {"loss": loss, **aux, "finite": finite}

    state = (place.params, place.opt_state, place.ema if ema_decay > 0 else None)
    return jax.jit(step_fn, in_shardings=(*state, place.batch, None, None),
                   out_shardings=(*state, place.metrics), donate_argnums=(0, 1, 2),
                   **jit_options(training_options(compute_dtype)))
