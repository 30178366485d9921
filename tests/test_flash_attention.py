"""Flash-attention kernel against a plain softmax reference, in Pallas interpret mode on CPU.

With VIT_TEST_COMPILED=1 (scripts/gpu_check.sh sets it) the same tests must run compiled on a
GPU/TPU; they fail rather than quietly fall back to the interpreter on CPU.
"""

import contextlib
import functools
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit.ops import flash_attention as fa

pytestmark = pytest.mark.timeout(300)

COMPILED = os.environ.get("VIT_TEST_COMPILED") == "1"
ROOT = pathlib.Path(__file__).resolve().parents[1]
TOL = {jnp.float32: 1e-4, jnp.bfloat16: 3e-2, jnp.float16: 1e-2}


def setup_module():
    if COMPILED and jax.default_backend() == "cpu":
        pytest.fail("VIT_TEST_COMPILED=1 but jax runs on CPU: the kernel would be interpreted")


def reference_attention(q, k, v, kv_len=None, scale=None):
    """Materialised softmax attention in float32, independent of the kernel."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * scale
    if kv_len is not None:
        valid = jnp.arange(k.shape[1]) < kv_len[:, None]
        logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision="highest")


def _inputs(seq_q, seq_k, head_dim, dtype, batch=2, heads=2, seed=0):
    kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(kq, (batch, seq_q, heads, head_dim), jnp.float32)
    k = jax.random.normal(kk, (batch, seq_k, heads, head_dim), jnp.float32)
    v = jax.random.normal(kv, (batch, seq_k, heads, head_dim), jnp.float32)
    do = jax.random.normal(kd, (batch, seq_q, heads, head_dim), jnp.float32)
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def _with_vjp(attention, q, k, v, do):
    out, vjp = jax.vjp(attention, q, k, v)
    return (out, *vjp(do))


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _kernel_and_grads(q, k, v, do, kv_len=None, block_q=None, block_k=None):
    attention = functools.partial(
        fa.flash_attention, kv_len=kv_len, block_q=block_q, block_k=block_k
    )
    return _with_vjp(attention, q, k, v, do)


@jax.jit
def _reference_and_grads(q, k, v, do, kv_len=None):
    attention = functools.partial(reference_attention, kv_len=kv_len)
    return _with_vjp(attention, *(x.astype(jnp.float32) for x in (q, k, v, do)))


def _assert_close(actual, expected, dtype, what):
    # Gradients grow with the sequence; compare relative to the reference's magnitude.
    scale = max(1.0, float(jnp.max(jnp.abs(expected))))
    tol = TOL[dtype] * scale
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32),
        atol=tol, rtol=TOL[dtype], err_msg=what,
    )


# A covering subset of seq {1, 5, 50, 197, 257} (equal and unequal q/kv), head_dim {32, 64, 80}
# and dtypes; small tiles make 197/257 span several blocks with a ragged tail.
CASES = [
    # seq_q, seq_k, head_dim, dtype, block (None: defaults)
    (197, 197, 64, jnp.float32, 32),
    (257, 50, 80, jnp.float32, 32),
    (5, 257, 32, jnp.float32, 64),
    (1, 1, 32, jnp.float32, None),
    (50, 5, 64, jnp.bfloat16, 16),
    (197, 197, 80, jnp.bfloat16, None),
    (50, 50, 64, jnp.float16, 16),
]


@pytest.mark.parametrize(
    "seq_q,seq_k,head_dim,dtype,block", CASES,
    ids=[f"q{c[0]}-k{c[1]}-d{c[2]}-{jnp.dtype(c[3]).name}-b{c[4]}" for c in CASES],
)
def test_matches_reference(seq_q, seq_k, head_dim, dtype, block):
    q, k, v, do = _inputs(seq_q, seq_k, head_dim, dtype)
    got = _kernel_and_grads(q, k, v, do, block_q=block, block_k=block)
    want = _reference_and_grads(q, k, v, do)
    assert got[0].dtype == dtype
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape, name
        _assert_close(a, b, dtype, name)


def test_kv_len_masks_nan_poisoned_padding():
    seq_q, seq_k = 50, 197
    q, k, v, do = _inputs(seq_q, seq_k, 32, jnp.float32)
    kv_len = jnp.array([seq_k, 60])
    valid = (jnp.arange(seq_k) < kv_len[:, None])[:, :, None, None]
    k_nan, v_nan = (jnp.where(valid, x, jnp.nan) for x in (k, v))

    got = _kernel_and_grads(q, k_nan, v_nan, do, kv_len, block_q=32, block_k=32)
    want = _reference_and_grads(q, k, v, do, kv_len)
    for name, a in zip(("out", "dq", "dk", "dv"), got, strict=True):
        assert bool(jnp.isfinite(a).all()), f"NaN leaked into {name}"
    _assert_close(got[0], want[0], jnp.float32, "out")
    _assert_close(got[1], want[1], jnp.float32, "dq")
    for name, a, b in zip(("dk", "dv"), got[2:], want[2:], strict=True):
        _assert_close(jnp.where(valid, a, 0), jnp.where(valid, b, 0), jnp.float32, name)
        assert not bool(jnp.any(jnp.where(valid, 0, a))), f"{name} nonzero beyond kv_len"


def test_kv_len_zero_gives_zeros_not_nan():
    q, k, v, do = _inputs(5, 50, 64, jnp.float32)
    kv_len = jnp.array([0, 3])
    valid = (jnp.arange(50) < kv_len[:, None])[:, :, None, None]
    k, v = (jnp.where(valid, x, jnp.nan) for x in (k, v))
    out, dq, dk, dv = _kernel_and_grads(q, k, v, do, kv_len, block_q=16, block_k=16)
    for name, a in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), strict=True):
        assert bool(jnp.isfinite(a).all()), name
        assert not bool(jnp.any(a[0])), f"{name} of the empty row is not zero"
    want = reference_attention(q[1:], jnp.nan_to_num(k[1:]), jnp.nan_to_num(v[1:]), kv_len[1:])
    _assert_close(out[1:], want, jnp.float32, "out")


def test_padded_query_rows_stay_finite():
    # A caller's padded queries (zeros, zero cotangent) next to real ones, with masked keys.
    q, k, v, do = _inputs(50, 50, 64, jnp.bfloat16)
    real_q = (jnp.arange(50) < 20)[None, :, None, None]
    q, do = jnp.where(real_q, q, 0), jnp.where(real_q, do, 0)
    kv_len = jnp.array([20, 7])
    got = _kernel_and_grads(q, k, v, do, kv_len, block_q=16, block_k=16)
    for name, a in zip(("out", "dq", "dk", "dv"), got, strict=True):
        assert bool(jnp.isfinite(a.astype(jnp.float32)).all()), name
    assert not bool(jnp.any(jnp.where(real_q, 0, got[1]))), "padded queries got a gradient"


def test_composes_with_jit_vmap_grad_remat():
    # vmap over a leading axis of two independent [batch=3, ...] problems.
    q, k, v, do = (jnp.stack([x, x[::-1] * 0.5]) for x in _inputs(33, 20, 32, jnp.float32, 3))
    kv_len = jnp.array([[20, 9, 1], [13, 20, 5]])

    def loss(attention, q, k, v, kv_len, do):
        return jnp.sum(attention(q, k, v, kv_len=kv_len) * do)

    def grad(attention):
        return jax.grad(jax.checkpoint(functools.partial(loss, attention)), argnums=(0, 1, 2))

    kernel = functools.partial(fa.flash_attention, block_q=16, block_k=16)
    got = jax.jit(jax.vmap(grad(kernel)))(q, k, v, kv_len, do)
    want = jax.vmap(grad(reference_attention))(q, k, v, kv_len, do)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        _assert_close(a, b, jnp.float32, name)


def test_scale_and_validation():
    q, k, v, _ = _inputs(20, 20, 32, jnp.float32, batch=1, heads=1)
    got = fa.flash_attention(q, k, v, scale=0.3, block_q=16, block_k=16)
    _assert_close(got, reference_attention(q, k, v, scale=0.3), jnp.float32, "out")
    with pytest.raises(ValueError, match="power of two"):
        fa.flash_attention(q, k, v, block_q=24)
    with pytest.raises(ValueError, match="kv_len"):
        fa.flash_attention(q, k, v, kv_len=jnp.array([1, 2]))
    with pytest.raises(ValueError, match="share"):
        fa.flash_attention(q, k.astype(jnp.bfloat16), v)
    with pytest.raises(ValueError, match="num_warps"):
        fa.flash_attention(q, k, v, num_warps=3)


def test_supported():
    ok, reason = fa.flash_attention_supported((2, 197, 12, 64), (2, 197, 12, 64), "bfloat16",
                                              "gpu")
    assert ok and reason
    for q_shape, dtype, platform, why in [
        ((2, 197, 12, 512), jnp.bfloat16, "gpu", "head_dim"),
        ((2, 197, 12, 64), jnp.int8, "gpu", "dtype"),
        ((2, 197, 12, 64), jnp.float16, "tpu", "float16"),
        ((2, 2**16, 12, 128), jnp.bfloat16, "tpu", "VMEM"),
        ((2, 197, 12, 64), jnp.bfloat16, "metal", "platform"),
    ]:
        ok, reason = fa.flash_attention_supported(q_shape, q_shape, dtype, platform)
        assert not ok and why in reason, (q_shape, reason)
    assert fa.flash_attention_supported((2, 197, 12, 64), (2, 50, 12, 64), jnp.float32, "cpu")[0]


def _target_device(platform):
    """Names the GPU to lower for when there is none: from jax 0.11 the Triton lowering reads
    the compute capability off the device, else off the abstract mesh's device."""
    if platform != "gpu" or jax.default_backend() == "gpu":
        return contextlib.nullcontext()
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    device = AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
    return use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("platform,target,kernel_call", [
    ("gpu", "cuda", "custom_call @__gpu$xla.gpu.triton("),
    ("tpu", "tpu", "custom_call @tpu_custom_call("),
])
def test_lowers_for_accelerators(monkeypatch, platform, target, kernel_call, dtype):
    """Lowers (not runs) the compiled kernels for GPU (Triton) and TPU (Mosaic) on any host.

    This catches primitives or block shapes a backend cannot lower; compiling the Triton/Mosaic
    IR to machine code and running it still needs the hardware (scripts/gpu_check.sh).
    """
    monkeypatch.setattr(fa, "_platform", lambda: platform)
    spec = jax.ShapeDtypeStruct((2, 577, 12, 80), dtype)  # pads to 640 rows, 128 (GPU) dims
    kv_len = jax.ShapeDtypeStruct((2,), jnp.int32)

    def step(q, k, v, do, kv_len):
        return _with_vjp(functools.partial(fa.flash_attention, kv_len=kv_len, interpret=False),
                         q, k, v, do)

    with _target_device(platform):
        lowered = jax.jit(step).trace(spec, spec, spec, spec, kv_len).lower(
            lowering_platforms=(target,))
    text = lowered.as_text()
    assert text.count(kernel_call) == 3  # forward, dK/dV and dQ kernels
    if platform == "gpu":  # each Triton call carries its kernel's warps
        warps = sorted(int(w) for w in re.findall(r"num_warps = (\d+)", text))
        assert warps == sorted(fa.default_block_sizes("gpu", 80).warps)


@pytest.mark.skipif(COMPILED or jax.default_backend() != "cpu",
                    reason="TPU interpreter check; runs on the CPU test host")
def test_tpu_variant_in_tpu_interpret_mode():
    from jax.experimental.pallas import tpu as pltpu

    q, k, v, do = _inputs(20, 40, 64, jnp.float32)
    kv_len = jnp.array([40, 17])
    attention = functools.partial(fa.flash_attention, kv_len=kv_len, block_q=16, block_k=16,
                                  interpret=pltpu.InterpretParams())
    got = jax.jit(_with_vjp, static_argnums=0)(attention, q, k, v, do)
    want = _reference_and_grads(q, k, v, do, kv_len)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        _assert_close(a, b, jnp.float32, name)


@pytest.mark.slow
@pytest.mark.parametrize("seq", [197, 577, 1025])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
def test_vit_lengths_all_head_dims(seq, head_dim):
    q, k, v, do = _inputs(seq, seq, head_dim, jnp.bfloat16, batch=1, heads=1)
    got = _kernel_and_grads(q, k, v, do)
    want = _reference_and_grads(q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        _assert_close(a, b, jnp.bfloat16, name)


@pytest.mark.skipif(COMPILED, reason="on a GPU the kernels are compiled and run for real")
def test_gpu_kernels_fit_registers_and_shared_memory_on_sm90(tmp_path):
    """Compiles the three kernels' Triton IR for Hopper with pip's triton: no register spills
    and shared memory within the 227 KiB a block may use, at the default tiles."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), "--head-dims", "32",
         "64", "80", "128", "--dtypes", "bfloat16", "--out", str(tmp_path)],
        cwd=ROOT, env=env, timeout=280, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "kernel_resources.json").read_text())["kernels"]
    assert len(rows) == 12 and {r["kernel"] for r in rows} == {
        "flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq"}
    for r in rows:
        assert r["spill_bytes"] == 0 and 0 < r["shared_bytes"] <= 227 * 1024, r
        assert r["registers"] <= 255, r


def test_gpu_check_dry_run(tmp_path):
    """scripts/gpu_check.sh --dry-run: collects the GPU tests, runs the benchmark on tiny shapes."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(tmp_path)],
        cwd=ROOT, env=env, timeout=300, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check: PASSED" in proc.stdout
    assert " tests collected" in (tmp_path / "flash_attention_tests.log").read_text()
    result = json.loads((tmp_path / "bench_attention.json").read_text())
    assert {"command", "machine", "versions", "flop_convention", "correctness", "attention",
            "train_step", "block_sweep"} <= set(result)
    assert {"platform", "device_kind"} <= set(result["machine"])
    assert {"jax", "jaxlib"} <= set(result["versions"])
    assert all(c["ok"] for c in result["correctness"]), result["correctness"]
    ours = [r for r in result["attention"] if r["impl"] == "pallas"]
    assert ours and all(r.get("tflops", 0) > 0 for r in ours), ours
    assert {"fwd", "fwd_bwd"} == {r["mode"] for r in ours}
    assert any(r.get("images_per_s", 0) > 0 for r in result["train_step"]["runs"]), result
    assert all(r.get("tflops", 0) > 0 for r in result["block_sweep"]), result["block_sweep"]
