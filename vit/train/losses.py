"""Training objectives: `(logits, batch) -> (scalar loss, {metric: scalar})`, chosen by name.

The step differentiates whichever one it is given and averages its metrics over accumulated
micro-batches, so a new objective (a multi-label sigmoid loss, say) is a function here plus an
entry in `LOSSES`; neither the step nor the loop changes. Metrics are batch means of scalars.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from vit.errors import ConfigError

LossFn = Callable[[jax.Array, dict], tuple[jax.Array, dict]]


def softmax_xent(logits, batch) -> tuple[jax.Array, dict]:
    """Cross-entropy against `batch["target"]` (one-hot, possibly smoothed or mixed), top-1
    accuracy against `batch["label"]`."""
    loss = optax.softmax_cross_entropy(logits, batch["target"]).mean()
    return loss, {"accuracy": (logits.argmax(-1) == batch["label"]).mean()}


LOSSES: dict[str, LossFn] = {"softmax_xent": softmax_xent}
DEFAULT = "softmax_xent"


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(f"train.loss={name!r}; use one of {sorted(LOSSES)}") from None
