"""Attention maps: rules against hand computation, explain mode against the model, memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import tiny_model
from flax import nnx

from vit.explanations import capture, rules
from vit.explanations.maps import METHODS, explain, explain_core, rollout_of
from vit.explanations.tokens import TokenLayout

pytestmark = pytest.mark.timeout(600)


def images(n, size=16, seed=2):
    return jax.random.normal(jax.random.key(seed), (n, size, size, 3))


def random_attention(rng, b, h, n):
    a = rng.random((b, h, n, n)) ** 3
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def np_rollout_layer(a, fusion="mean", discard=0.0, protect=True):
    fused = {"mean": np.mean, "max": np.max, "min": np.min}[fusion](a, axis=1)
    fused = fused.copy()
    n = fused.shape[-1]
    for bi in range(fused.shape[0]):
        for row in fused[bi]:
            candidates = [j for j in range(n) if not (protect and j == 0)]
            lowest = sorted(candidates, key=lambda j: row[j])[: int(n * discard)]
            row[lowest] = 0.0
    out = 0.5 * fused + 0.5 * np.eye(n)
    return out / out.sum(-1, keepdims=True)


# -- rules -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fusion,discard", [("mean", 0.0), ("max", 0.0), ("min", 0.3)])
def test_rollout_of_two_layers_is_the_hand_computed_product(fusion, discard):
    rng = np.random.default_rng(0)
    a1, a2 = random_attention(rng, 2, 3, 5), random_attention(rng, 2, 3, 5)
    want = np.einsum("bqk,bkn->bqn", np_rollout_layer(a2, fusion, discard),
                     np_rollout_layer(a1, fusion, discard))
    got = rollout_of([a1, a2], fusion, discard)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The order matters: the product the other way round is a different matrix.
    assert not np.allclose(got, np.einsum("bqk,bkn->bqn", np_rollout_layer(a1, fusion, discard),
                                          np_rollout_layer(a2, fusion, discard)), atol=1e-4)


def test_discard_is_per_row_and_protects_the_class_token():
    fused = jnp.array([[[0.01, 0.5, 0.3, 0.19], [0.4, 0.3, 0.2, 0.1]]])
    out = np.asarray(rules.discard_lowest(fused, 0.5, protect_first=True))
    np.testing.assert_allclose(out, [[[0.01, 0.5, 0.0, 0.0], [0.4, 0.3, 0.0, 0.0]]])
    out = np.asarray(rules.discard_lowest(fused, 0.5, protect_first=False))
    np.testing.assert_allclose(out, [[[0.0, 0.5, 0.3, 0.0], [0.4, 0.3, 0.0, 0.0]]])


def test_identity_attention_gives_a_uniform_map():
    layout = TokenLayout(class_token=False, num_registers=1, grid=(2, 3), classifier="gap")
    eye = np.broadcast_to(np.eye(7, dtype=np.float32), (1, 2, 7, 7))
    product = rollout_of([eye, eye, eye], class_token=False)
    np.testing.assert_allclose(product[0], np.eye(7), atol=1e-6)
    row = jnp.einsum("bq,bqk->bk", layout.fixed_readout(1), product)
    np.testing.assert_allclose(layout.patch_grid(row)[0], np.full((2, 3), 1 / 6), atol=1e-6)


def test_uniform_attention_gives_a_uniform_map_from_the_class_token():
    layout = TokenLayout(class_token=True, num_registers=0, grid=(3, 3), classifier="token")
    uniform = np.full((1, 2, 10, 10), 0.1, np.float32)
    row = jnp.einsum("bq,bqk->bk", layout.fixed_readout(1), rollout_of([uniform] * 3))
    grid = np.asarray(layout.patch_grid(row)[0])
    np.testing.assert_allclose(grid, np.full((3, 3), grid[0, 0]), rtol=1e-5)


def test_layout_maps_tokens_to_patches_without_guessing_a_square():
    layout = TokenLayout(class_token=True, num_registers=2, grid=(2, 3), classifier="token")
    row = jnp.arange(9.0)[None]
    np.testing.assert_array_equal(layout.patch_grid(row)[0], [[3, 4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(layout.fixed_readout(1)[0], np.eye(9)[0])


def test_cross_attention_rule_is_zero_while_gates_are_zero_and_matches_numpy():
    rng = np.random.default_rng(1)
    r_ss = (np.eye(4)[None] + rng.random((1, 4, 4)) * 0.3).astype(np.float32)
    r_qq = (np.eye(3)[None] + rng.random((1, 3, 3)) * 0.3).astype(np.float32)
    r_sq = np.zeros((1, 4, 3))
    closed = rules.cross_attention_update(r_ss, r_sq, r_qq, np.zeros((1, 4, 3)))
    assert np.all(np.asarray(closed) == 0.0)

    def bar(r):
        off = r[0] - np.eye(len(r[0]))
        return off / off.sum(-1, keepdims=True) + np.eye(len(r[0]))

    abar = rng.random((1, 4, 3))
    want = bar(r_ss).T @ abar[0] @ bar(r_qq)
    got = rules.cross_attention_update(r_ss, r_sq, r_qq, abar)
    np.testing.assert_allclose(got[0], want, rtol=1e-5)


# -- explain mode on a model ------------------------------------------------------------------

MODELS = {
    "token": dict(),
    "gap-registers": dict(classifier="gap", class_token=False, num_registers=2),
    "map-nonsquare": dict(classifier="map", class_token=False, image_size=(16, 12)),
}


def reference_rows(model, x, method, classes, fusion="mean"):
    """Readout rows from the keep-everything capture, full matrices, forward order."""
    cfg = model.config
    layout = TokenLayout.for_model(model, x.shape[1:3])
    if method in ("grad-rollout", "relevancy"):
        logits, probs, grads = capture.attention_grads(model, x, classes)
    else:
        logits, probs = capture.attention_probs(model, x)
    probs = [np.asarray(p, np.float64) for p in probs]
    n = layout.num_tokens
    if method == "attention":
        product = {"mean": np.mean, "max": np.max, "min": np.min}[fusion](probs[-1], axis=1)
    elif method == "rollout":
        product = np.broadcast_to(np.eye(n), (x.shape[0], n, n))
        for a in probs:
            product = np.einsum("bqk,bkn->bqn", np_rollout_layer(a, fusion), product)
    else:
        product = np.broadcast_to(np.eye(n), (x.shape[0], n, n))
        for a, g in zip(probs, grads, strict=True):
            pos = np.maximum(a * np.asarray(g, np.float64), 0.0)
            if method == "relevancy":  # Chefer: R <- R + Abar R
                product = product + np.einsum("bqk,bkn->bqn", pos.mean(1), product)
            else:
                product = np.einsum("bqk,bkn->bqn", np_rollout_layer(pos, fusion), product)
    if cfg.classifier == "map":
        tokens = nnx.jit(lambda m, x: m.features(x))(model, x)
        from vit.explanations.tokens import map_readout
        readout = np.asarray(map_readout(model.map_head, tokens), np.float64)
    else:
        readout = np.asarray(layout.fixed_readout(x.shape[0]), np.float64)
    row = np.einsum("bq,bqk->bk", readout, product)
    return np.asarray(layout.patch_grid(jnp.asarray(row))), logits


# Every method on the class-token model; the forward and backward paths on the others.
CASES = [("token", m) for m in METHODS] + [
    (c, m) for c in ("gap-registers", "map-nonsquare") for m in ("rollout", "relevancy")]


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(name):
        if name not in cache:
            model = tiny_model(head_scale=0.5, **MODELS[name])
            h, w = model.config.image_size
            x = jax.random.normal(jax.random.key(2), (3, h, w, 3))
            cache[name] = model, x, nnx.jit(lambda m, x: m(x))(model, x)
        return cache[name]

    return get


@pytest.mark.parametrize("name,method", CASES)
@pytest.mark.slow
def test_streaming_maps_match_the_full_reference_and_logits_match_the_model(built, name, method):
    model, x, logits = built(name)
    out = explain(model, x, method)
    np.testing.assert_allclose(out.logits, logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out.class_index, np.argmax(logits, -1))
    want, _ = reference_rows(model, x, method, jnp.argmax(logits, -1))
    assert out.maps.shape == (3, *model.grid_for(x.shape[1:3]))
    np.testing.assert_allclose(out.maps, want, rtol=1e-4, atol=1e-6)
    assert np.abs(want).max() > 0  # a real signal, not two zero maps agreeing


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.slow
def test_a_batch_gives_each_image_the_map_it_gets_alone(built, method):
    # The MAP head's readout depends on the image: the strictest case.
    model, x, _ = built("map-nonsquare")
    together = explain(model, x, method)
    alone = explain(model, x[2:], method)
    np.testing.assert_allclose(together.maps[2], alone.maps[0], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_gradients_pair_with_their_own_layer():
    model = tiny_model(head_scale=0.5, depth=3)
    x = images(2)
    cls = jnp.array([1, 3])
    _, probs, grads = capture.attention_grads(model, x, cls)
    # Finite differences of the class logit along a random direction in one layer's attention.
    layer = 1
    direction = jax.random.normal(jax.random.key(5), probs[layer].shape)

    @nnx.jit
    def logit_with(m, x, eps):
        hook = lambda i, p: p + eps * direction if i == layer else p
        out = m.head_logits(m.pool(m.features(x, probs_hook=hook)))
        return jnp.take_along_axis(out, cls[:, None], 1).sum()

    eps = 1e-2
    numeric = (logit_with(model, x, eps) - logit_with(model, x, -eps)) / (2 * eps)
    np.testing.assert_allclose(float(jnp.sum(grads[layer] * direction)), float(numeric),
                               rtol=2e-2)
    # Another layer's gradient would not fit: the pairing is observable.
    assert abs(float(jnp.sum(grads[0] * direction)) - float(numeric)) > 0.05 * abs(float(numeric))
    # And the streaming relevancy equals the reference built from these per-layer pairs.
    out = explain(model, x, "relevancy", class_index=cls)
    layout = TokenLayout.for_model(model, (16, 16))
    r = np.broadcast_to(np.eye(17), (2, 17, 17))
    for a, g in zip(probs, grads, strict=True):
        r = r + np.einsum("bqk,bkn->bqn", np.maximum(np.asarray(a) * np.asarray(g), 0).mean(1), r)
    np.testing.assert_allclose(out.maps, np.asarray(layout.patch_grid(jnp.asarray(r[:, 0]))),
                               rtol=1e-4, atol=1e-7)
    # The same pairs in reversed layer order give a different map.
    swapped = np.broadcast_to(np.eye(17), (2, 17, 17))
    for a, g in zip(probs, grads[::-1], strict=True):
        pos = np.maximum(np.asarray(a) * np.asarray(g), 0).mean(1)
        swapped = swapped + np.einsum("bqk,bkn->bqn", pos, swapped)
    assert not np.allclose(out.maps, layout.patch_grid(jnp.asarray(swapped[:, 0])), rtol=1e-3)


def _jaxpr_text(fn, model, *args):
    graphdef, state = nnx.split(model)
    return str(jax.make_jaxpr(lambda s, *a: fn(nnx.merge(graphdef, s), *a))(state, *args))


@pytest.mark.slow
def test_explain_on_a_pallas_model_gives_the_pallas_forward_logits_and_the_reference_maps():
    """The claim: whatever backend the model was built with, explain recomputes attention on the
    materialising path and its logits equal the model's own forward pass. Here the forward pass
    runs our Pallas kernel (interpret mode on CPU), explain does not, and the two must agree."""
    import vit.ops.flash_attention  # noqa: F401  (our own module: missing is a failure)
    model = tiny_model(head_scale=0.5, attention_impl="pallas")
    x = images(2)
    assert "pallas_call" in _jaxpr_text(lambda m, x: m(x), model, x)
    normal = np.asarray(nnx.jit(lambda m, x: m(x))(model, x))
    assert np.abs(normal).max() > 0.1 and np.ptp(normal, axis=-1).min() > 1e-2
    cls = jnp.argmax(normal, -1)
    for method in ("rollout", "relevancy"):
        core = lambda m, x, method=method: explain_core(  # noqa: E731
            m, x, cls, method=method, head_fusion="mean", discard_ratio=0.0)
        assert "pallas_call" not in _jaxpr_text(core, model, x)
        out = explain(model, x, method)
        np.testing.assert_allclose(out.logits, normal, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out.class_index, np.asarray(cls))
        want, _ = reference_rows(model, x, method, cls)
        np.testing.assert_allclose(out.maps, want, rtol=1e-4, atol=1e-6)
        assert np.abs(want).max() > 0


def compiled_bytes(model, x, method=None, naive=False):
    graphdef, state = nnx.split(model)
    cls = jnp.full((x.shape[0],), -1, jnp.int32)

    def run(state, x):
        m = nnx.merge(graphdef, state)
        if naive:
            return capture.attention_grads.__wrapped__(m, x, jnp.zeros_like(cls))
        return explain_core(m, x, cls, method=method, head_fusion="mean", discard_ratio=0.0)

    stats = jax.jit(run).lower(state, x).compile().memory_analysis()
    return stats.temp_size_in_bytes + stats.output_size_in_bytes


@pytest.mark.slow
def test_memory_does_not_grow_as_layers_times_tokens_squared():
    # 65 tokens, 4 heads, width 16: one layer's attention (b*h*N^2) dwarfs its tokens (b*N*D).
    shape = dict(width=16, mlp_dim=32, num_heads=4, image_size=32)
    x = images(2, size=32)
    per_layer = 2 * 4 * 65 * 65 * 4
    shallow = tiny_model(head_scale=0.5, depth=2, **shape)
    deep = tiny_model(head_scale=0.5, depth=6, **shape)
    for method in ("rollout", "relevancy"):
        growth = compiled_bytes(deep, x, method) - compiled_bytes(shallow, x, method)
        assert growth < 4 * per_layer / 2, (method, growth, per_layer)
    # The keep-everything capture does grow so: the measurement can tell.
    naive = compiled_bytes(deep, x, naive=True) - compiled_bytes(shallow, x, naive=True)
    assert naive > 4 * per_layer


@pytest.mark.slow
def test_forward_rollout_memory_stays_flat_at_larger_batches_and_token_counts():
    # Unrolled over the layers, XLA would keep every layer's attention at this size (batch 4,
    # 1,025 tokens), which it does not at the 65 tokens of the test above.
    shape = dict(width=16, mlp_dim=32, num_heads=4, image_size=128)
    x = images(4, size=128)
    per_layer = 4 * 4 * 1025 * 1025 * 4
    growth = (compiled_bytes(tiny_model(head_scale=0.5, depth=6, **shape), x, "rollout")
              - compiled_bytes(tiny_model(head_scale=0.5, depth=2, **shape), x, "rollout"))
    assert growth < 4 * per_layer / 2, (growth, per_layer)
