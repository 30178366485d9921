"""The attention dispatcher, and the ViT on the Pallas kernel against the XLA path."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import vit
from vit.ops import attention
from vit.ops import flash_attention as fa

pytestmark = pytest.mark.timeout(600)


def test_runs_on_the_expected_backend():
    """scripts/gpu_check.sh runs this file with VIT_TEST_BACKEND=gpu: the ViT-on-kernel checks
    below must then run compiled on the GPU, not on a CPU."""
    assert jax.default_backend() == os.environ.get("VIT_TEST_BACKEND", "cpu")


def _pick(impl, shape=(2, 197, 12, 64), dtype=jnp.float32, **kw):
    return attention.choose_impl(
        impl, shape, shape, dtype, **{"has_mask": False, "dropout": False, **kw})[0]


def test_choices_and_fallbacks_on_cpu(monkeypatch):
    monkeypatch.setattr(attention, "_platform", lambda: "cpu")
    assert _pick("auto") == "xla"  # CPU: auto never picks the interpreter
    assert _pick("pallas") == "pallas"  # explicit: the kernel in interpret mode
    assert _pick("cudnn") == "xla"  # no cuDNN on CPU: fall back, never fail
    assert _pick("pallas", has_mask=True) == "xla"  # the kernel takes kv_len, not masks
    assert _pick("pallas", dropout=True) == "xla"
    with pytest.raises(ValueError, match="not one of"):
        _pick("flash")


def test_choices_and_fallbacks_on_accelerators(monkeypatch):
    """The decisions a GPU/TPU host makes, checked on any host by naming the platform."""
    monkeypatch.setattr(attention, "_platform", lambda: "gpu")
    assert _pick("auto", dtype=jnp.bfloat16) == "pallas"
    assert _pick("cudnn", dtype=jnp.bfloat16) == "cudnn"
    assert _pick("cudnn", dtype=jnp.float32) == "xla"  # cuDNN flash needs 16-bit inputs
    assert _pick("auto", dtype=jnp.bfloat16, has_mask=True) == "xla"  # cuDNN takes no mask here
    assert _pick("auto", shape=(2, 197, 2, 512), dtype=jnp.bfloat16) == "xla"  # head_dim 512
    assert _pick("auto", dtype=jnp.int8) == "xla"
    monkeypatch.setattr(attention, "_platform", lambda: "tpu")
    assert _pick("auto", dtype=jnp.bfloat16) == "pallas"
    assert _pick("auto", dtype=jnp.float16) == "xla"  # no float16 kernel on TPU, no cuDNN
    assert _pick("cudnn", dtype=jnp.bfloat16) == "xla"


def test_choice_is_logged_once(caplog):
    q = jnp.ones((1, 5, 2, 8))
    attention._log_choice.cache_clear()
    with caplog.at_level(logging.INFO, logger="vit.ops.attention"):
        for _ in range(3):
            attention.dot_product_attention(q, q, q, impl="cudnn")
    lines = [r.message for r in caplog.records if "attention impl=cudnn" in r.message]
    assert len(lines) == 1 and "xla" in lines[0]


def test_xla_reference_matches_jax_nn():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (2, 7, 3, 16)) for key in (k1, k2, k3))
    mask = jnp.tril(jnp.ones((7, 7), bool))[None, None]
    with jax.default_matmul_precision("highest"):  # on GPU, float32 matmuls default to TF32
        ours = attention.reference_attention(q, k, v, mask=mask)
        theirs = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def _pair(**kw):
    cfg = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=4, image_size=(20, 16),
               num_classes=5, num_registers=1, **kw)
    xla = vit.create_model("Ti/16", attention_impl="xla", rngs=nnx.Rngs(0), **cfg)
    pallas = vit.create_model("Ti/16", attention_impl="pallas", rngs=nnx.Rngs(0), **cfg)
    head = jax.random.normal(jax.random.key(1), xla.head.kernel.shape) * 0.3
    xla.head.kernel[...] = head
    pallas.head.kernel[...] = head
    return xla, pallas


@pytest.mark.slow
def test_vit_forward_on_pallas_equals_xla():
    xla, pallas = _pair()  # 1 + 1 + 20 = 22 tokens: ragged against every block size
    x = jax.random.normal(jax.random.key(2), (2, 20, 16, 3))
    fwd = nnx.jit(lambda m, x: m(x))
    with jax.default_matmul_precision("highest"):  # on GPU, float32 matmuls default to TF32
        np.testing.assert_allclose(fwd(pallas, x), fwd(xla, x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_one_training_step_on_pallas_equals_xla():
    xla, pallas = _pair()
    x = jax.random.normal(jax.random.key(3), (2, 20, 16, 3))
    y = jnp.array([0, 3])

    @nnx.jit
    def step(model, opt):
        def loss_fn(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    losses, params = [], []
    for model in (xla, pallas):
        # SGD: Adam's first step is sign(g), which turns rounding noise near zero into +-lr.
        opt = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
        with jax.default_matmul_precision("highest"):
            losses.append(step(model, opt))
        params.append(nnx.state(model, nnx.Param))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1]), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("platform,dtype,impl,want", [
    # The float32 policy: on GPU, auto sends float32 to XLA (TF32 dots), 16-bit to the kernel.
    ("gpu", jnp.float32, "auto", "xla"),
    ("gpu", jnp.bfloat16, "auto", "pallas"),
    ("gpu", jnp.float16, "auto", "pallas"),
    ("gpu", jnp.float32, "pallas", "pallas"),  # asked for by name: the exact float32 kernel
    ("gpu", jnp.float32, "cudnn", "xla"),
    ("tpu", jnp.float32, "auto", "pallas"),
    ("tpu", jnp.bfloat16, "auto", "pallas"),
    ("cpu", jnp.float32, "auto", "xla"),
    ("cpu", jnp.bfloat16, "auto", "xla"),
])
def test_dtype_policy_per_platform(monkeypatch, platform, dtype, impl, want):
    monkeypatch.setattr(attention, "_platform", lambda: platform)
    assert _pick(impl, dtype=dtype) == want


def test_mask_reason_on_gpu_names_kv_len(monkeypatch):
    monkeypatch.setattr(attention, "_platform", lambda: "gpu")
    shape = (2, 197, 12, 64)
    chosen, reason = attention.choose_impl("pallas", shape, shape, jnp.bfloat16, has_mask=True,
                                           dropout=False)
    assert chosen == "xla" and "kv_len" in reason


def test_a_replaced_backend_warns_once():
    q = jnp.ones((1, 5, 2, 8))
    attention._log_choice.cache_clear()
    with pytest.warns(RuntimeWarning, match="impl='cudnn' is not used here") as record:
        for _ in range(3):
            attention.dot_product_attention(q, q, q, impl="cudnn")
    assert sum("impl='cudnn'" in str(w.message) for w in record) == 1


def test_cudnn_refusing_at_trace_time_falls_back_to_xla(monkeypatch):
    monkeypatch.setattr(attention, "_platform", lambda: "gpu")

    def refuse(*args, **kwargs):
        raise RuntimeError("cuDNN does not support this GPU")

    monkeypatch.setattr(jax.nn, "dot_product_attention", refuse)
    attention._log_choice.cache_clear()
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 7, 2, 16), jnp.bfloat16)
               for i in range(3))
    with pytest.warns(RuntimeWarning, match="cuDNN refused this call"):
        out = attention.dot_product_attention(q, k, v, impl="cudnn")
    want = attention.reference_attention(q, k, v)
    assert float(jnp.abs(want.astype(jnp.float32)).max()) > 0.05
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def _kernel_cannot_lower_here(monkeypatch):
    """A GPU as far as dispatch can tell, whose Pallas kernel fails to lower: the kernel built
    for a real device (no interpret mode) on this CPU backend, which has no such lowering."""
    monkeypatch.setattr(attention, "_platform", lambda: "gpu")
    monkeypatch.setattr(fa, "_platform", lambda: "gpu")
    attention._log_choice.cache_clear()
    attention._warn_once.cache_clear()
    attention._compile_failure.cache_clear()


def test_auto_falls_back_when_the_kernel_fails_to_lower(monkeypatch):
    _kernel_cannot_lower_here(monkeypatch)
    used = []

    def cudnn(q, k, v, *, scale=None, implementation=None):  # a cuDNN that works, and says so
        used.append(implementation)
        return attention.reference_attention(q, k, v, scale=scale)

    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn)
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 33, 2, 16), jnp.bfloat16)
               for i in range(3))
    with pytest.warns(RuntimeWarning, match="Pallas kernel failed to compile") as record:
        outs = [jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v))(q, k, v)
                for _ in range(2)]
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    assert used == ["cudnn"] * 3  # once when checking that it compiles, then each call
    want = np.asarray(attention.reference_attention(q, k, v), np.float32)
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out, np.float32), want)


def test_auto_falls_to_xla_with_one_warning_when_the_kernel_and_cudnn_both_fail(monkeypatch):
    _kernel_cannot_lower_here(monkeypatch)
    calls = []

    def cudnn(*args, **kwargs):  # a cuDNN that cannot build on this device
        calls.append(kwargs.get("implementation"))
        raise RuntimeError("cuDNN: no kernel for this GPU")

    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn)
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 33, 2, 16), jnp.bfloat16)
               for i in range(3))
    with pytest.warns(RuntimeWarning) as record:
        outs = [jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v))(q, k, v)
                for _ in range(2)]
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "Pallas kernel failed to compile" in messages[0]
    assert "cuDNN attention failed to compile here (RuntimeError: cuDNN: no kernel" in messages[0]
    assert "running 'xla' instead" in messages[0]
    assert calls == ["cudnn"]  # tried once, at the compile check; the step itself runs XLA
    want = np.asarray(attention.reference_attention(q, k, v), np.float32)
    assert np.abs(want).max() > 0.05
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out, np.float32), want)


def test_auto_falls_back_to_xla_when_cudnn_cannot_take_the_call(monkeypatch):
    _kernel_cannot_lower_here(monkeypatch)
    q = jax.random.normal(jax.random.key(0), (2, 9, 2, 16), jnp.bfloat16)
    kv_len = jnp.array([9, 4])  # cuDNN here takes no kv_len: XLA
    with pytest.warns(RuntimeWarning, match="running 'xla' instead"):
        out = attention.dot_product_attention(q, q, q, kv_len=kv_len)
    want = attention.reference_attention(q, q, q, kv_len=kv_len)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def test_pallas_by_name_still_fails_loudly_when_the_kernel_cannot_lower(monkeypatch):
    _kernel_cannot_lower_here(monkeypatch)
    q = jax.random.normal(jax.random.key(0), (2, 9, 2, 16), jnp.bfloat16)
    with pytest.raises(Exception, match="(?i)interpret|lower|cpu"):
        jax.jit(lambda q: attention.dot_product_attention(q, q, q, impl="pallas"))(q)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_heads_first_layout_gives_the_same_attention(impl):
    """layout="bhsd" (what the CPU path hands over) against a plain-jnp softmax attention on
    [batch, seq, heads, head_dim] arrays, with padded keys; the kernel takes it through a
    transpose."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 11, 3, 8)) for i in range(3))
    kv_len = jnp.array([11, 5])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    logits = jnp.where(jnp.arange(11)[None, None, None, :] < kv_len[:, None, None, None],
                       logits, -jnp.inf)
    want = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
    heads_first = [jnp.swapaxes(x, 1, 2) for x in (q, k, v)]
    out = attention.dot_product_attention(*heads_first, kv_len=kv_len, impl=impl, layout="bhsd")
    assert out.shape == (2, 3, 11, 8)
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(np.asarray(jnp.swapaxes(out, 1, 2)), np.asarray(want),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="layout"):
        attention.dot_product_attention(q, k, v, layout="hbsd")
