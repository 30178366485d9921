"""The ViT family: architecture, options, numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import tiny_model
from flax import nnx

import vit
from vit.errors import ConfigError
from vit.models.info import count_macs, count_params, model_info

pytestmark = pytest.mark.timeout(300)

# Parameter counts of the standard architecture (timm and transformers), 1000 classes, 224 px.
STANDARD_PARAMS = {
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_h14": 632_045_800,
}


def randomise_head(model, seed=1):
    # The head is zero-initialised (as vit_jax); give it weights so gradients flow upstream.
    k = model.head.kernel
    k[...] = jax.random.normal(jax.random.key(seed), k.shape) * 0.1


# Jitted entry points: one compile beats op-by-op dispatch on tiny models.
forward = nnx.jit(lambda m, x: m(x))
grad_of_sum = nnx.jit(nnx.grad(lambda m, x: m(x).sum()))


@pytest.mark.parametrize("name,expected", sorted(STANDARD_PARAMS.items()))
def test_parameter_counts_match_standard_architecture(name, expected):
    assert count_params(vit.variant_config(name)) == expected


def test_big_vision_names_are_aliases_and_timm_names_timms_models():
    assert vit.variant_config("B/16") == vit.variant_config("vit_b16")
    # timm's name is the same architecture, with timm's way of resizing position embeddings
    timm_b16 = vit.variant_config("vit_base_patch16_224")
    assert timm_b16.posemb_resize == "bicubic_antialias"
    assert timm_b16 == vit.variant_config("vit_b16", posemb_resize="bicubic_antialias")
    assert vit.variant_config("vit_large_patch16_384").image_size == (384, 384)
    clip = vit.variant_config("vit_base_patch16_clip_224")  # not the plain ViT of its size
    assert clip.pre_norm and not clip.patch_bias and clip.layer_norm_eps == 1e-5


@pytest.mark.parametrize("name", list(vit.VARIANTS))
def test_every_variant_shapes_at_small_image_size(name):
    cfg = vit.variant_config(name)
    size = 2 * cfg.patch_size[0]
    model = nnx.eval_shape(lambda: vit.create_model(name, num_classes=7, image_size=size))
    images = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
    logits = nnx.eval_shape(lambda m, x: m(x), model, images)
    assert logits.shape == (2, 7)
    tokens = nnx.eval_shape(lambda m, x: m.features(x), model, images)
    assert tokens.shape == (2, 1 + 4, cfg.width)


def test_gmacs_match_timm_figures():
    # timm's published GMACs (fvcore count of matmuls) for B/16 and Ti/16 at 224 px.
    assert count_macs(vit.variant_config("vit_b16")) / 1e9 == pytest.approx(17.58, abs=0.03)
    assert count_macs(vit.variant_config("vit_ti16")) / 1e9 == pytest.approx(1.26, abs=0.01)
    info = model_info("vit_s16")
    assert info["tokens"] == 197 and info["params"] == STANDARD_PARAMS["vit_s16"]


def test_same_seed_same_model_and_logits():
    x = jax.random.normal(jax.random.key(3), (2, 16, 16, 3))
    a, b, c = tiny_model(), tiny_model(), tiny_model(seed=1)
    for m in (a, b, c):
        randomise_head(m)
    np.testing.assert_array_equal(forward(a, x), forward(b, x))
    assert not np.allclose(forward(a, x), forward(c, x))


@pytest.mark.slow
def test_gradients_reach_every_parameter():
    model = tiny_model(classifier="map", num_registers=2, qk_norm=True, layer_scale=0.1,
                 representation_size=16)
    randomise_head(model)
    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    y = jnp.array([1, 3])

    def loss_fn(m):
        logits = m(x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    grads = nnx.jit(nnx.grad(loss_fn))(model)
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(grads, nnx.Param))[0]
    assert len(flat) > 20
    for path, g in flat:
        assert float(jnp.abs(g).max()) > 0, f"no gradient reaches {jax.tree_util.keystr(path)}"


def test_bfloat16_compute_close_to_float32():
    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    f32 = tiny_model()
    randomise_head(f32)
    bf16 = tiny_model(dtype="bfloat16")
    nnx.update(bf16, nnx.state(f32, nnx.Param))
    for p in jax.tree.leaves(nnx.state(bf16, nnx.Param)):
        assert p.dtype == jnp.float32  # parameters stay float32
    a, b = forward(f32, x), forward(bf16, x)
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=5e-2, rtol=5e-2)
    assert float(jnp.abs(a - b).max()) > 0  # really ran in bfloat16


@pytest.mark.slow
def test_classifiers_registers_and_headless_backbone():
    x = jnp.ones((3, 16, 16, 3))
    for kw in (dict(classifier="gap", class_token=False), dict(classifier="map"),
               dict(num_registers=4), dict(posemb="sincos2d"),
               dict(qk_norm=True, layer_scale=1e-5, act_layer="gelu_tanh", layer_norm_eps=1e-12)):
        assert forward(tiny_model(**kw), x).shape == (3, 5)
    backbone = tiny_model(num_classes=0, num_registers=4)
    assert forward(backbone, x).shape == (3, 32)
    tokens, inter = nnx.jit(lambda m, x: m.features(x, return_intermediates=True))(backbone, x)
    assert tokens.shape == (3, 1 + 4 + 16, 32) and len(inter) == 2
    assert inter[-1].shape == tokens.shape


def test_gap_pools_patch_tokens_only():
    model = tiny_model(classifier="gap", num_registers=2)
    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    tokens, pooled = nnx.jit(lambda m, x: (m.features(x), m.pool(m.features(x))))(model, x)
    np.testing.assert_allclose(pooled, tokens[:, 3:].mean(1), rtol=1e-5, atol=1e-6)


def test_non_square_images_and_dynamic_size():
    model = tiny_model(image_size=(16, 24))
    features = nnx.jit(lambda m, x: m.features(x))
    assert features(model, jnp.ones((1, 16, 24, 3))).shape == (1, 1 + 4 * 6, 32)
    with pytest.raises(ValueError, match="patch grid"):
        forward(model, jnp.ones((1, 16, 16, 3)))
    dyn = tiny_model(dynamic_image_size=True)
    assert forward(dyn, jnp.ones((1, 24, 32, 3))).shape == (1, 5)


@pytest.mark.slow
def test_dropout_and_drop_path_only_in_training_and_keyed():
    model = tiny_model(dropout=0.2, drop_path=0.2, attention_dropout=0.1)
    randomise_head(model)
    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    training = nnx.jit(lambda m, x, key: m(x, train=True, rng=key))
    np.testing.assert_array_equal(forward(model, x), forward(model, x))
    t1 = training(model, x, jax.random.key(1))
    t1b = training(model, x, jax.random.key(1))
    t2 = training(model, x, jax.random.key(2))
    np.testing.assert_array_equal(t1, t1b)
    assert not np.allclose(t1, t2) and not np.allclose(t1, forward(model, x))
    with pytest.raises(ValueError, match="needs a key"):
        nnx.jit(lambda m, x: m(x, train=True))(model, x)


@pytest.mark.slow
def test_remat_gives_same_gradients():
    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    plain, remat = tiny_model(), tiny_model(remat=True)
    randomise_head(plain)
    randomise_head(remat)
    g1 = grad_of_sum(plain, x)
    g2 = grad_of_sum(remat, x)
    for a, b in zip(jax.tree.leaves(nnx.state(g1, nnx.Param)),
                    jax.tree.leaves(nnx.state(g2, nnx.Param)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_class_token_head_computes_the_last_block_for_the_class_token_only():
    """`model(x)` skips the last block's work on tokens a class-token head never reads; the
    logits and gradients equal those of the all-token path, and the work really is smaller."""
    model = tiny_model(drop_path=0.3, num_registers=1)
    randomise_head(model)
    x = jax.random.normal(jax.random.key(4), (3, 16, 16, 3))
    key = jax.random.key(7)  # drop_path masks are per example, so both paths draw the same
    graphdef, state = nnx.split(model)

    def full(s):
        m = nnx.merge(graphdef, s)
        return m.head_logits(m.pool(m.features(x, train=True, rng=key)))

    def short(s):
        return nnx.merge(graphdef, s)(x, train=True, rng=key)

    def run(fn):  # -> logits, gradients of sum(logits^2), compiled FLOPs (forward+backward)
        loss = lambda s: (lambda out: ((out ** 2).sum(), out))(fn(s))  # noqa: E731
        compiled = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(state).compile()
        (_, logits), grads = compiled(state)
        return logits, grads, compiled.cost_analysis()["flops"]

    want, g_full, flops_full = run(full)
    got, g_short, flops_short = run(short)
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_short), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    assert flops_short < 0.8 * flops_full  # 2 blocks: the last one nearly all skipped
    tokens, every = jax.jit(lambda s: (nnx.merge(graphdef, s).features(x, head_tokens=1),
                                       nnx.merge(graphdef, s).features(x)))(state)
    assert tokens.shape == (3, 1, 32)
    np.testing.assert_allclose(tokens, every[:, :1], rtol=1e-5, atol=1e-5)


def test_exact_gelu_matches_the_erf_formula_in_float64():
    from scipy.special import erf

    from vit.models.blocks import activation

    x = np.concatenate([np.linspace(-12, 12, 20001), [-80.0, -6.5, 0.0, 1e-8, 6.5, 80.0]])
    want = 0.5 * x * (1 + erf(x / np.sqrt(2)))
    got = np.asarray(activation("gelu")(jnp.asarray(x, jnp.float32)), np.float64)
    assert np.all(np.isfinite(got))
    # float32 rounding of values up to 80 in size, and no more
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=2e-6)
    assert np.abs(got - want)[np.abs(x) < 3].max() < 5e-7
    half = activation("gelu")(jnp.asarray(x, jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), want, rtol=1e-2, atol=1e-1)


def test_exact_gelu_derivative_is_gelus_own_in_both_modes():
    # d/dx [x Phi(x)] = Phi(x) + x phi(x), in float64 from scipy; reverse and forward mode.
    from scipy.special import erf

    from vit.models.blocks import activation

    x = np.concatenate([np.linspace(-12, 12, 20001), [-80.0, 0.0, 80.0]])
    want = 0.5 * (1 + erf(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    xs = jnp.asarray(x, jnp.float32)
    reverse = np.asarray(jax.vmap(jax.grad(activation("gelu")))(xs), np.float64)
    _, forward = jax.jvp(activation("gelu"), (xs,), (jnp.ones_like(xs),))
    for got in (reverse, np.asarray(forward, np.float64)):
        assert np.all(np.isfinite(got))
        assert np.abs(got - want).max() < 1e-6
        assert np.abs(got - want)[np.abs(x) < 3].max() < 5e-7
    half = jax.grad(lambda v: activation("gelu")(v).astype(jnp.float32).sum())(
        jnp.asarray(x, jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), want, atol=2e-2)


def test_matches_independent_plain_jnp_forward():
    """The whole forward pass against a from-scratch jnp implementation on the same weights."""
    model = tiny_model(num_registers=1)
    randomise_head(model)
    x = jax.random.normal(jax.random.key(5), (2, 16, 16, 3))
    p = nnx.state(model, nnx.Param)

    def ln(v, s):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / jnp.sqrt(var + 1e-6) * s["scale"][...] + s["bias"][...]

    def lin(v, s):
        return v @ s["kernel"][...] + s["bias"][...]

    b = x.shape[0]
    patches = jnp.stack([x[:, i:i + 4, j:j + 4, :].reshape(b, -1)
                         for i in range(0, 16, 4) for j in range(0, 16, 4)], 1)
    h = patches @ p["patch_kernel"][...].reshape(48, 32) + p["patch_bias"][...]
    h = jnp.concatenate([jnp.zeros((b, 1, 32)) + p["cls_token"][...], h], 1)
    h = h + p["pos_embed"][...]
    h = jnp.concatenate([h[:, :1], jnp.broadcast_to(p["reg_tokens"][...], (b, 1, 32)), h[:, 1:]],
                        1)
    for blk in p["blocks"].values():
        y = ln(h, blk["norm1"])
        qkv = lin(y, blk["attn"]["qkv"]).reshape(b, -1, 3, 4, 8)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(8), -1)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(b, -1, 32)
        h = h + lin(y, blk["attn"]["proj"])
        y = ln(h, blk["norm2"])
        h = h + lin(jax.nn.gelu(lin(y, blk["mlp"]["fc1"]), approximate=False), blk["mlp"]["fc2"])
    h = ln(h, p["norm"])
    expected = lin(h[:, 0], p["head"])
    np.testing.assert_allclose(forward(model, x), expected, rtol=1e-5, atol=1e-5)


def test_mistyped_names_and_overrides_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"unknown model 'vit_b61'.*vit_b16") as e:
        vit.create_model("vit_b61")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"unknown model field 'num_head'.*num_heads"):
        vit.create_model("vit_ti16", num_head=3)
    with pytest.raises(ConfigError, match="classifier='avg'.*token, gap, map"):
        vit.create_model("vit_ti16", classifier="avg")
    with pytest.raises(ConfigError, match="attention_impl"):
        vit.create_model("vit_ti16", attention_impl="flash")


def test_import_vit_stays_light():
    import subprocess
    import sys

    code = ("import sys, vit; m = vit.create_model; "
            "heavy = [n for n in ('grain', 'tensorflow_datasets', 'orbax', 'ml_collections', "
            "'torch', 'vit.cli', 'vit.training', 'vit.data') if n in sys.modules]; "
            "print(heavy); assert not heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
