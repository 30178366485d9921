"""Training objectives: `(logits, batch) -> (scalar loss, {metric: scalar})`, chosen by name.

The step differentiates whichever one it is given and averages its metrics over accumulated
micro-batches, so a new objective (a multi-label sigmoid loss, say) is a function here plus an
entry in `LOSSES`; neither the step nor the loop changes. Metrics are batch means of scalars.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
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
