"""How faithful is a map? Deletion and insertion curves (Petsiuk et al. 2018, RISE).

Patches are removed (deletion) or revealed (insertion) in the order a map ranks them, most
important first, and replaced by a substrate; the curve is the probability of the class the
model predicted on the clean image, and its score the trapezoid area over the fraction of
patches changed. Lower deletion and higher insertion areas mean a more faithful map. A `random`
ranking is always scored as the baseline, and every area gets a bootstrap interval over
images (the central 0.95 of the resampled means).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from flax import nnx
from scipy import ndimage

from vit.explanations.maps import explain

METRICS = ("deletion", "insertion")
SUBSTRATES = ("mean", "zero", "blur")


def default_steps(num_patches: int) -> int:
    return min(num_patches, 20)


def ranking(maps: np.ndarray) -> np.ndarray:
    """`[batch, rows, cols]` maps -> `[batch, patches]` patch indices, most important first."""
    flat = np.asarray(maps, np.float64).reshape(len(maps), -1)
    return np.argsort(-flat, axis=1, kind="stable")


def random_ranking(batch: int, num_patches: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([rng.permutation(num_patches) for _ in range(batch)])


def substrate(images: np.ndarray, kind: str, *, mean: np.ndarray | None = None,
              black: np.ndarray | None = None, sigma: float = 2.0) -> np.ndarray:
    """What a removed patch shows: the dataset `mean` per channel, `zero` (black pixels, given
    in model input space as `black`), or a `blur` of the image itself."""
    if kind == "mean":
        return np.broadcast_to(mean, images.shape).astype(np.float32)
    if kind == "zero":
        return np.broadcast_to(black, images.shape).astype(np.float32)
    if kind == "blur":
        return ndimage.gaussian_filter(images, sigma=(0, sigma, sigma, 0)).astype(np.float32)
    raise ValueError(f"substrate {kind!r} is not one of {', '.join(SUBSTRATES)}")


def perturbed_images(images: np.ndarray, fill: np.ndarray, order: np.ndarray,
                     patch: tuple[int, int], steps: int, metric: str) -> np.ndarray:
    """`[batch, steps+1, h, w, c]`: step k changes the first round(k/steps * patches) patches."""
    b, h, w, _ = images.shape
    ph, pw = patch
    gh, gw = h // ph, w // pw
    counts = np.round(np.linspace(0, 1, steps + 1) * gh * gw).astype(int)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None], axis=1)
    changed = rank[:, None, :] < counts[None, :, None]  # [b, steps+1, patches]
    changed = changed.reshape(b, steps + 1, gh, gw).repeat(ph, 2).repeat(pw, 3)[..., None]
    if metric == "insertion":
        changed = ~changed
    elif metric != "deletion":
        raise ValueError(f"metric {metric!r} is not one of {', '.join(METRICS)}")
    return np.where(changed, fill[:, None], images[:, None])


def area(curve: np.ndarray) -> np.ndarray:
    """Trapezoid area of `[batch, steps+1]` curves over the fraction of patches in [0, 1]."""
    x = np.linspace(0.0, 1.0, curve.shape[1])
    return np.trapezoid(curve, x, axis=1)


def bootstrap_ci(values: np.ndarray, *, samples: int = 1000, seed: int = 0) -> list[float]:
    """The central 0.95 percentile interval of the mean, resampling images with replacement."""
    values = np.asarray(values, np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (samples, len(values)))].mean(1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


_probabilities = nnx.jit(lambda m, x: jax.nn.softmax(m(x), axis=-1))


def curves(probs_fn: Callable[[np.ndarray], np.ndarray], images: np.ndarray,
           classes: np.ndarray, order: np.ndarray, fill: np.ndarray, patch: tuple[int, int],
           steps: int, metric: str) -> np.ndarray:
    """`[batch, steps+1]` probability of each image's class along its perturbation path."""
    stack = perturbed_images(images, fill, order, patch, steps, metric)
    flat = stack.reshape(-1, *images.shape[1:])
    probs = np.asarray(probs_fn(flat)).reshape(len(images), steps + 1, -1)
    return np.take_along_axis(probs, classes[:, None, None], axis=2)[..., 0]


def evaluate(model, batches, methods: list[str], *, metric: str = "deletion",
             steps: int | None = None, substrate_kind: str = "mean", mean=None, black=None,
             explain_options: dict | None = None, seed: int = 0,
             bootstrap_samples: int = 1000) -> dict:
    """Scores `methods` (plus `random`) over `batches` of preprocessed NHWC images.

    Returns `{"metric": ..., "results": {method: {"auc", "ci95", "vs_random", "curve"}}}`:
    `vs_random` is the mean per-image difference from the random ranking on the same images
    with its interval (the central 0.95; paired, so it is tighter than comparing the two
    `ci95`s), and `curve` the mean probability at each step (the start and end show what the
    substrate alone and the clean image give).
    """
    patch = tuple(model.config.patch_size)
    probs_fn = lambda x: _probabilities(model, x)  # noqa: E731
    rng = np.random.default_rng(seed)
    areas: dict[str, list[np.ndarray]] = {m: [] for m in [*methods, "random"]}
    paths: dict[str, list[np.ndarray]] = {m: [] for m in areas}
    for images in batches:
        images = np.asarray(images, np.float32)
        gh, gw = model.grid_for(images.shape[1:3])
        n_steps = steps or default_steps(gh * gw)
        fill = substrate(images, substrate_kind, mean=mean, black=black)
        classes = np.argmax(np.asarray(probs_fn(images)), -1)
        orders = {m: ranking(explain(model, images, m, classes, **(explain_options or {})).maps)
                  for m in methods}
        orders["random"] = random_ranking(len(images), gh * gw, rng)
        for name, order in orders.items():
            curve = curves(probs_fn, images, classes, order, fill, patch, n_steps, metric)
            areas[name].append(area(curve))
            paths[name].append(curve)
    random_areas = np.concatenate(areas["random"])
    results = {}
    for name, chunks in areas.items():
        values = np.concatenate(chunks)
        diff = values - random_areas
        results[name] = {"auc": float(values.mean()),
                         "ci95": bootstrap_ci(values, samples=bootstrap_samples, seed=seed),
                         "vs_random": {"mean": float(diff.mean()), "ci95": bootstrap_ci(
                             diff, samples=bootstrap_samples, seed=seed)},
                         "curve": [round(float(c), 4)
                                   for c in np.concatenate(paths[name]).mean(0)]}
    return {"metric": metric, "results": results}
