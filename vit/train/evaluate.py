"""Evaluation: top-1 / top-5 / per-class accuracy, loss and the confusion matrix."""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vit.train import parallel


def make_logits_fn(graphdef, mesh):
    """A jitted `(params, images) -> float32 logits`, batch sharded over the mesh."""
    rep, sharded = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    return jax.jit(lambda params, images: nnx.merge(graphdef, params)(images),
                   in_shardings=(rep, sharded), out_shardings=rep)


def evaluate(logits_fn, params, batches: Iterable[dict], num_classes: int, mesh) -> dict:
    """Runs `logits_fn` over padded batches (`mask` 0 on padding); returns the figures."""
    confusion = np.zeros((num_classes, num_classes), np.int64)
    top5_hits, loss_sum, n = 0, 0.0, 0
    k = min(5, num_classes)
    for batch in batches:
        images = parallel.to_global({"image": batch["image"]}, mesh)["image"]
        logits = np.asarray(logits_fn(params, images), np.float32)
        keep = batch["mask"] > 0
        logits, labels = logits[keep], batch["label"][keep].astype(np.int64)
        np.add.at(confusion, (labels, logits.argmax(-1)), 1)
        topk = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
        top5_hits += int((topk == labels[:, None]).any(-1).sum())
        loss_sum += float(optax.softmax_cross_entropy_with_integer_labels(
            jnp.asarray(logits), jnp.asarray(labels)).sum())
        n += len(labels)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(1), 1)
    return {"accuracy": float(confusion.diagonal().sum() / max(n, 1)),
            "top5_accuracy": top5_hits / max(n, 1), "loss": loss_sum / max(n, 1),
            "num_examples": n, "per_class_accuracy": per_class.tolist(),
            "confusion": confusion.tolist()}


def save_confusion_png(confusion, class_names: list[str], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confusion = np.asarray(confusion)
    n = len(class_names)
    size = min(4 + 0.35 * n, 20)
    fig, ax = plt.subplots(figsize=(size, size))
    rows = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90)
        ax.set_yticks(range(n), class_names)
        for i in range(n):
            for j in range(n):
                if confusion[i, j]:
                    ax.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if rows[i, j] > 0.5 else "black")
    ax.set(xlabel="predicted", ylabel="true", title="confusion matrix (row-normalised colour)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
