"""Training objectives: `(logits, batch) -> (scalar loss, {metric: scalar})`, chosen by name.

The step differentiates whichever one it is given and averages its metrics over accumulated
micro-batches, so a new objective (a multi-label sigmoid loss, say) is a function here plus an
entry in `LOSSES`; neither the step nor the loop changes. Metrics are batch means of scalars.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit.errors import ConfigError

LossFn = Callable[[jax.Array, dict], tuple[jax.Array, dict]]


def softmax_xent(logits, batch) -> tuple[jax.Array, dict]:
    """Cross-entropy against `batch["target"]` (one-hot, possibly smoothed or mixed), top-1
    accuracy against `batch["label"]`."""
    loss = optax.softmax_cross_entropy(logits, batch["target"]).mean()
    return loss, {"accuracy": (logits.argmax(-1) == batch["label"]).mean()}


def sigmoid_xent(logits, batch) -> tuple[jax.Array, dict]:
    """Multi-label: a sigmoid per class against the multi-hot `batch["target"]`, summed over
    classes (big_vision's `sigmoid_xent`). Accuracy is the exact match of the predicted set."""
    loss = optax.sigmoid_binary_cross_entropy(logits, batch["target"]).sum(-1).mean()
    exact = jnp.all((logits > 0) == (batch["target"] > 0.5), axis=-1)
    return loss, {"accuracy": exact.mean()}


def prompt_xent(logits, batch) -> tuple[jax.Array, dict]:
    """Prompt matching: `logits [batch]` that each prompt is true, against `batch["answer"]`."""
    answer = batch["answer"].astype(jnp.float32)
    loss = optax.sigmoid_binary_cross_entropy(logits, answer).mean()
    return loss, {"accuracy": ((logits > 0) == (answer > 0.5)).mean()}


class WithPatchLoss:
    """`loss_fn` on the image's logits plus `weight` times the per-patch readout's softmax
    cross-entropy (`ViTConfig.patch_classes`, the last class "nothing") against what lies on
    each patch: `batch["where"] [batch, H', W']` holds a class index (-1: nothing) per cell of
    a grid over the image, and each patch takes the cell under its centre.
    The model is called `with_patches` (the step reads `reads_patches`)."""

    reads_patches = True

    def __init__(self, loss_fn: LossFn, weight: float, grid: tuple[int, int]):
        self.loss_fn, self.weight, self.grid = loss_fn, weight, grid

    def patch_labels(self, where: jax.Array, classes: int) -> jax.Array:
        """`[batch, H', W']` -> `[batch, patches]` class indices, "nothing" the last: each
        patch takes the cell under its centre, whatever the two grids' sizes."""
        (gh, gw), (h, w) = self.grid, where.shape[1:3]
        rows = ((np.arange(gh) + 0.5) * h / gh).astype(np.int32)
        cols = ((np.arange(gw) + 0.5) * w / gw).astype(np.int32)
        at = where[:, rows][:, :, cols].reshape(where.shape[0], -1).astype(jnp.int32)
        return jnp.where(at < 0, classes - 1, at)

    def __call__(self, outputs, batch) -> tuple[jax.Array, dict]:
        logits, patch_logits = outputs
        loss, metrics = self.loss_fn(logits, batch)
        labels = self.patch_labels(batch["where"], patch_logits.shape[-1])
        patch = optax.softmax_cross_entropy_with_integer_labels(patch_logits, labels).mean()
        metrics = {**metrics, "patch_loss": patch,
                   "patch_accuracy": (patch_logits.argmax(-1) == labels).mean()}
        return loss + self.weight * patch, metrics


LOSSES: dict[str, LossFn] = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent,
                             "prompt_xent": prompt_xent}
# Losses whose batches carry prompts (`text`, `text_mask`, `answer`) for the model to read.
TEXT_LOSSES = ("prompt_xent",)
DEFAULT = "softmax_xent"


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(f"train.loss={name!r}; use one of {sorted(LOSSES)}") from None
