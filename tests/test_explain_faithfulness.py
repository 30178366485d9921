"""Deletion / insertion curves, areas and bootstrap intervals."""

import numpy as np
import pytest

from vit.explanations import faithfulness as fa

pytestmark = pytest.mark.timeout(300)


def test_deletion_removes_patches_in_map_order_and_insertion_reveals_them():
    images = np.arange(2 * 4 * 4 * 1, dtype=np.float32).reshape(2, 4, 4, 1) + 1
    fill = np.zeros_like(images)
    order = fa.ranking(np.array([[[0.1, 0.9], [0.5, 0.2]], [[1, 2], [3, 4]]]))
    np.testing.assert_array_equal(order, [[1, 2, 3, 0], [3, 2, 1, 0]])
    stack = fa.perturbed_images(images, fill, order, (2, 2), steps=4, metric="deletion")
    assert stack.shape == (2, 5, 4, 4, 1)
    np.testing.assert_array_equal(stack[:, 0], images)
    assert np.all(stack[:, -1] == 0)
    # After one step, image 0 lost its top-right patch (patch index 1) only.
    removed = stack[0, 1, ..., 0] == 0
    np.testing.assert_array_equal(removed, [[0, 0, 1, 1], [0, 0, 1, 1], [0] * 4, [0] * 4])
    inserted = fa.perturbed_images(images, fill, order, (2, 2), steps=4, metric="insertion")
    np.testing.assert_array_equal(inserted[0, 1, ..., 0] != 0, removed)
    assert np.all(inserted[:, 0] == 0)


def test_area_is_the_trapezoid_over_fractions():
    curve = np.array([[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(fa.area(curve), [0.5, 1.0])


def probs_of_patch_zero(x):
    # A "model" whose class-1 probability is the mean of the top-left 2x2 patch.
    p = x[:, :2, :2, 0].mean((1, 2))
    return np.stack([1 - p, p], -1)


def test_a_faithful_ranking_beats_random_and_a_wrong_one_loses():
    rng = np.random.default_rng(0)
    images = np.ones((50, 6, 6, 1), np.float32)
    fill = np.zeros_like(images)
    classes = np.ones(50, int)
    good = np.tile(np.arange(9), (50, 1))  # patch 0 first
    bad = good[:, ::-1]
    rand = fa.random_ranking(50, 9, rng)
    auc = {name: fa.area(fa.curves(probs_of_patch_zero, images, classes, order, fill, (2, 2),
                                   9, "deletion"))
           for name, order in [("good", good), ("bad", bad), ("random", rand)]}
    # Deletion with the true patch first drops to 0 after 1/9 of the way.
    np.testing.assert_allclose(auc["good"], 0.5 / 9)
    np.testing.assert_allclose(auc["bad"], 1 - 0.5 / 9)
    lo_g, hi_g = fa.bootstrap_ci(auc["good"])
    lo_r, hi_r = fa.bootstrap_ci(auc["random"])
    assert hi_g < lo_r and auc["random"].mean() < auc["bad"].mean()


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_more_images():
    rng = np.random.default_rng(1)
    small, big = rng.normal(size=20), rng.normal(size=2000)
    lo, hi = fa.bootstrap_ci(small)
    assert lo < small.mean() < hi
    lo2, hi2 = fa.bootstrap_ci(big)
    assert hi2 - lo2 < (hi - lo) / 4


def test_substrates():
    images = np.random.default_rng(2).normal(size=(2, 8, 8, 3)).astype(np.float32)
    mean = np.array([0.1, 0.2, 0.3], np.float32)
    np.testing.assert_allclose(fa.substrate(images, "mean", mean=mean)[1, 3, 4], mean)
    np.testing.assert_allclose(fa.substrate(images, "zero", black=-mean)[0, 0, 0], -mean)
    blurred = fa.substrate(images, "blur")
    assert blurred.shape == images.shape and blurred.std() < images.std()
    with pytest.raises(ValueError):
        fa.substrate(images, "noise")


@pytest.mark.slow
def test_evaluate_reports_paired_differences_and_mean_curves():
    import jax
    from flax import nnx

    import vit

    model = vit.create_model("Ti/16", width=16, depth=1, mlp_dim=32, num_heads=2, patch_size=4,
                             image_size=8, num_classes=3, attention_impl="xla",
                             rngs=nnx.Rngs(0))
    k = model.head.kernel
    k[...] = jax.random.normal(jax.random.key(1), k.shape)
    images = np.random.default_rng(3).normal(size=(6, 8, 8, 3)).astype(np.float32)
    report = fa.evaluate(model, [images], ["rollout"], metric="deletion",
                         steps=4, mean=np.zeros(3, np.float32), bootstrap_samples=200)
    rollout, rand = report["results"]["rollout"], report["results"]["random"]
    # Paired differences: their mean is the difference of the means; random against itself is 0.
    np.testing.assert_allclose(rollout["vs_random"]["mean"], rollout["auc"] - rand["auc"],
                               atol=1e-9)
    assert rand["vs_random"] == {"mean": 0.0, "ci95": [0.0, 0.0]}
    # The mean curve starts at the clean images' top probability and ends on the all-substrate
    # image's probability of that class, computed here straight from the model.
    probs = np.asarray(jax.nn.softmax(model(images), -1))
    blank = np.asarray(jax.nn.softmax(model(np.zeros_like(images)), -1))
    top = probs.argmax(-1)
    assert len(rollout["curve"]) == 5
    np.testing.assert_allclose(rollout["curve"][0], probs.max(-1).mean(), atol=1e-4)
    np.testing.assert_allclose(rollout["curve"][-1], blank[np.arange(6), top].mean(), atol=1e-4)
    assert abs(rollout["curve"][0] - rollout["curve"][-1]) > 1e-3  # the path moves something
