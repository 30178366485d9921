"""Pretrained classification: load any checkpoint, classify image files and folders (top-k).

`load_pretrained(path)` gives `(model, preprocess, labels)`; `Predictor` runs a jitted forward
at one fixed batch size (the last batch is padded, so nothing recompiles) while a thread pool
decodes the next batch. A file that cannot be read becomes `{"image", "error"}` and the rest
carry on.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vit.errors import CheckpointError, DataError
from vit.preprocess import IMAGE_SUFFIXES, Preprocessing, open_image


def load_pretrained(path, *, image_size: int | None = None, labels=None, **overrides):
    """`(model, preprocess, labels)` from any checkpoint `vit.checkpoints` reads.

    `labels` is an optional file of display names (one per line); otherwise the checkpoint's
    own names (ImageNet-1k for 1000-class Google and timm weights), or None. Loader notices (such
    as an all-zero head) are issued as Python warnings.
    """
    from vit.checkpoints import load_checkpoint

    loaded = load_checkpoint(path, image_size=image_size, **overrides)
    for message in loaded.warnings:
        warnings.warn(message, stacklevel=2)
    names = loaded.labels
    if labels is not None:
        from vit.checkpoints.labels import read_labels
        names = read_labels(labels, loaded.config.num_classes)
    return loaded.build_model(), loaded.preprocessing, names


def collect_images(inputs: Iterable) -> list[Path]:
    """Files as given, folders walked (sorted) for image files; hidden entries skipped."""
    out = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out.extend(Path(root) / f for f in sorted(files)
                           if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES)
        else:
            out.append(path)  # a missing file is reported per image, like a bad one
    return out


class Predictor:
    """Top-k classification of images with one compiled forward pass."""

    def __init__(self, model, preprocess: Preprocessing, labels: list[str] | None = None, *,
                 top_k: int = 5, batch_size: int = 32, workers: int | None = None):
        import jax
        from flax import nnx

        cfg = model.config
        if not cfg.num_classes:
            raise CheckpointError("this checkpoint has no classification head (num_classes=0); "
                                  "fine-tune it first (vit train --init CHECKPOINT)")
        if labels is not None and len(labels) != cfg.num_classes:
            raise DataError(f"{len(labels)} labels for {cfg.num_classes} classes; give one name "
                            "per class")
        self.preprocess, self.labels = preprocess, labels
        self.batch_size, self.top_k = batch_size, min(top_k, cfg.num_classes)
        self.workers = workers or min(8, os.cpu_count() or 1)
        graphdef, state = nnx.split(model)
        k = self.top_k

        @jax.jit
        def forward(state, images):
            logits = nnx.merge(graphdef, state)(images)
            return jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)

        self._state, self._forward = state, forward

    def predict_arrays(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`[n, h, w, c]` preprocessed images -> (probs, indices), each `[n, top_k]`."""
        n = len(images)
        padded = np.zeros((self.batch_size, *images.shape[1:]), np.float32)
        padded[:n] = images
        probs, idx = self._forward(self._state, padded)
        return np.asarray(probs)[:n], np.asarray(idx)[:n]

    def _load(self, path: Path) -> np.ndarray | str:
        try:
            return self.preprocess(open_image(path))
        except DataError as err:
            return str(err)
        except (OSError, ValueError) as err:  # a decoder failing late, inside resize/convert
            return f"{path}: not a readable image ({err})"

    def predict_files(self, paths: list[Path], progress=None) -> Iterator[dict]:
        """One result dict per path, in order; `progress` (a tqdm bar) is advanced per image."""
        batches = [paths[i:i + self.batch_size] for i in range(0, len(paths), self.batch_size)]
        with ThreadPoolExecutor(self.workers) as pool:
            pending = list(pool.map(self._load, batches[0])) if batches else []
            for b, batch in enumerate(batches):
                loaded = pending
                if b + 1 < len(batches):  # decode the next batch while this one runs
                    upcoming = [pool.submit(self._load, p) for p in batches[b + 1]]
                good = [i for i, x in enumerate(loaded) if isinstance(x, np.ndarray)]
                results = {i: {"image": str(batch[i]), "error": loaded[i]}
                           for i in range(len(batch)) if i not in good}
                if good:
                    probs, idx = self.predict_arrays(np.stack([loaded[i] for i in good]))
                    for row, i in enumerate(good):
                        results[i] = {"image": str(batch[i]),
                                      "top_k": self._top_k(probs[row], idx[row])}
                yield from (results[i] for i in range(len(batch)))
                if progress is not None:
                    progress.update(len(batch))
                if b + 1 < len(batches):
                    pending = [f.result() for f in upcoming]

    def _top_k(self, probs: np.ndarray, idx: np.ndarray) -> list[dict]:
        return [{"index": int(i), "label": self.labels[int(i)] if self.labels else None,
                 "prob": float(p)} for p, i in zip(probs, idx, strict=True)]
