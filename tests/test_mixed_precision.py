"""bfloat16 compute with float32 accumulation: the products, their gradients, and the one-line
note where bfloat16 cannot pay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit.cpu import features as cpu_features
from vit.models.blocks import Linear
from vit.ops import matmul

BF16_EPS = 2.0 ** -8  # bfloat16 keeps 8 significant bits


def _rounded(x):
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_dense_in_bfloat16_accumulates_in_float32_and_rounds_once():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 64)).astype(np.float32)
    k = rng.normal(size=(64, 24)).astype(np.float32)
    b = rng.normal(size=(24,)).astype(np.float32)
    out = jax.jit(lambda x, k, b: matmul.dense(x, k, b, jnp.bfloat16))(x, k, b)
    assert out.dtype == jnp.bfloat16
    # The exact product of the bfloat16-rounded operands, plus the float32 bias, rounded once.
    want = _rounded(x) @ _rounded(k) + b
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=BF16_EPS,
                               atol=BF16_EPS * np.abs(want).max() * 0.01)
    hlo = jax.jit(lambda x, k: matmul.dense(x, k, None, jnp.bfloat16)).lower(x, k).as_text()
    # bfloat16 operands, float32 result: the product the hardware runs fast.
    assert any("dot_general" in line and "bf16>, tensor" in line and "xf32>" in line.split("->")[-1]
               for line in hlo.splitlines()), hlo


def test_dense_gradients_are_the_analytic_ones_with_a_float32_weight_gradient():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 32)).astype(np.float32)
    k = rng.normal(size=(32, 16)).astype(np.float32)
    g = rng.normal(size=(4, 16)).astype(np.float32)

    def f(x, k):
        return (matmul.dense(x, k, None, jnp.bfloat16).astype(jnp.float32) * g).sum()

    dx, dk = jax.grad(f, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(k))
    assert dx.dtype == jnp.float32 and dk.dtype == jnp.float32
    gb = _rounded(g)
    np.testing.assert_allclose(np.asarray(dk, np.float64), _rounded(x).T @ gb,
                               rtol=2 * BF16_EPS, atol=2 * BF16_EPS * 4)
    np.testing.assert_allclose(np.asarray(dx, np.float64), gb @ _rounded(k).T,
                               rtol=2 * BF16_EPS, atol=2 * BF16_EPS * 4)


def test_linear_keeps_nnx_parameters_and_float32_path():
    from flax import nnx

    layer = Linear(8, 4, dtype=jnp.float32, rngs=nnx.Rngs(0))
    assert set(nnx.to_pure_dict(nnx.state(layer, nnx.Param))) == {"kernel", "bias"}
    x = jnp.ones((2, 8))
    np.testing.assert_allclose(layer(x), x @ layer.kernel[...] + layer.bias[...], rtol=1e-6)
    narrow = Linear(8, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert narrow(x).dtype == jnp.bfloat16


@pytest.mark.parametrize("features, noted", [((), True), (("avx512_bf16",), False),
                                             (("amx_bf16", "avx512_bf16"), False)])
def test_bfloat16_note_only_on_a_cpu_without_bfloat16_arithmetic(monkeypatch, features, noted):
    monkeypatch.setattr(cpu_features, "cpu_bfloat16_features", lambda: features)
    assert (cpu_features.bfloat16_note() is not None) == noted


def test_cpu_features_are_read_from_cpuinfo():
    from pathlib import Path

    flags = Path("/proc/cpuinfo").read_text()
    want = tuple(f for f in cpu_features.BF16_FLAGS if f" {f}" in flags.replace("\t", " "))
    assert cpu_features.cpu_bfloat16_features() == want


def test_training_in_bfloat16_prints_one_note_where_it_cannot_pay(monkeypatch, capsys):
    from vit.training import model

    monkeypatch.setattr(cpu_features, "cpu_bfloat16_features", lambda: ())
    model._note_dtype("bfloat16")
    model._note_dtype("float32")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vit train: note: bfloat16 is no faster")
    assert "--set model.dtype=float32" in err[0]  # how to choose what it recommends
    monkeypatch.setattr(cpu_features, "cpu_bfloat16_features", lambda: ("amx_bf16",))
    model._note_dtype("bfloat16")
    assert capsys.readouterr().err == ""


# -- inference weights and the fused projection --------------------------------------------------
def test_narrow_kernels_store_kernels_narrow_on_a_copy_with_bit_identical_outputs(make_tiny):
    from flax import nnx

    from vit.inference.weights import narrow_kernels

    loaded = make_tiny(dtype="bfloat16")  # random weights everywhere, the head included
    model = loaded.build_model()
    x = np.random.RandomState(0).randn(3, *loaded.preprocessing.size, 3).astype(np.float32)
    want = np.asarray(model(x), np.float32)
    assert np.ptp(want) > 0.1  # a real comparison: not a constant (zero-head) output
    narrow = narrow_kernels(model)
    kernels = {"/".join(map(str, path)): leaf.dtype for path, leaf in
               jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(narrow)))[0]
               if "kernel" in str(path[-1])}
    assert kernels and all(d == jnp.bfloat16 for d in kernels.values()), kernels
    # The caller's model is unchanged, and every output bit is the same.
    assert all(leaf.dtype != jnp.bfloat16 for leaf in jax.tree.leaves(nnx.state(model)))
    np.testing.assert_array_equal(np.asarray(narrow(x), np.float32), want)
    f32 = make_tiny().build_model()
    assert narrow_kernels(f32) is f32  # nothing narrow: the same model back


def test_fused_qkv_projection_gives_the_three_products_values():
    """A narrow dtype on the CPU projects q, k and v as one product (`_fused_qkv`); it must
    give what the three per-head products give, in both layouts."""
    from flax import nnx

    from vit.models import variant_config
    from vit.models.blocks import Attention

    cfg = variant_config("Ti/16", width=64, num_heads=4, mlp_dim=128, depth=1,
                         dtype="bfloat16")
    attn = Attention(cfg, nnx.Rngs(0))
    attn.qkv.bias.set_value(jax.random.normal(jax.random.key(1), attn.qkv.bias.shape))
    x = jax.random.normal(jax.random.key(2), (2, 9, 64)).astype(jnp.bfloat16)
    for layout, heads in (("bhsd", "bhnd"), ("bshd", "bnhd")):
        fused = attn._fused_qkv(x, layout)
        three = attn._three_products(x, layout, heads, None)
        # Independent reference: the float64 product of the same bfloat16 values, per head.
        k = np.asarray(attn.qkv.kernel[...].astype(jnp.bfloat16), np.float64).reshape(64, 3, 4, 16)
        ref = np.einsum("bnc,cihd->ibnhd", np.asarray(x, np.float64), k)
        ref = ref + np.asarray(attn.qkv.bias[...], np.float64).reshape(3, 1, 1, 4, 16)
        if layout == "bhsd":
            ref = ref.transpose(0, 1, 3, 2, 4)
        for i, (a, b) in enumerate(zip(fused, three, strict=True)):
            assert a.shape == b.shape == ref[i].shape and a.dtype == jnp.bfloat16
            for got in (a, b):  # one bfloat16 rounding of the exact value
                np.testing.assert_allclose(np.asarray(got, np.float64), ref[i],
                                           rtol=BF16_EPS, atol=1e-6)


def test_merged_heads_projection_is_the_per_head_product():
    """A narrow dtype on a CPU with bfloat16 arithmetic projects the attention output over
    merged heads (`_merged_proj`); it must give the per-head product's value in both layouts,
    with the heads in the order the weight's rows name them."""
    from flax import nnx

    from vit.models import variant_config
    from vit.models.blocks import Attention

    cfg = variant_config("Ti/16", width=64, num_heads=4, mlp_dim=128, depth=1,
                         dtype="bfloat16")
    attn = Attention(cfg, nnx.Rngs(0))
    attn.proj.bias.set_value(jax.random.normal(jax.random.key(1), attn.proj.bias.shape))
    heads = np.asarray(jax.random.normal(jax.random.key(2), (2, 4, 9, 16)), np.float32)  # bhnd
    # Independent reference: the float64 sum over heads of each head's rows of the weight.
    w = np.asarray(attn.proj.kernel[...].astype(jnp.bfloat16), np.float64).reshape(4, 16, 64)
    exact = np.asarray(heads.astype(jnp.bfloat16), np.float64)
    ref = np.einsum("bhnd,hdc->bnc", exact, w) + np.asarray(attn.proj.bias[...], np.float64)
    assert np.abs(ref).max() > 0.5  # a real comparison, not zeros on both sides
    for layout, out in (("bhsd", heads), ("bshd", heads.transpose(0, 2, 1, 3))):
        got = attn._merged_proj(jnp.asarray(out, jnp.bfloat16), layout)
        assert got.shape == (2, 9, 64) and got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=BF16_EPS, atol=1e-6)
