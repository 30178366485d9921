"""Flash-attention kernel against a plain softmax reference, in Pallas interpret mode on CPU.

With VIT_TEST_BACKEND=gpu (scripts/gpu_check.sh sets it, with JAX_PLATFORMS=cuda) the same tests
run compiled on the GPU, and every test fails unless jax really runs there (tests/conftest.py).
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

COMPILED = os.environ.get("VIT_TEST_BACKEND", "cpu") != "cpu"
ROOT = pathlib.Path(__file__).resolve().parents[1]
# Per element: |kernel - reference| <= ATOL + RTOL * |reference|, the reference in float32 from
# the same (rounded) inputs. 16-bit: the kernel rounds p and dS to the input dtype before its
# matmuls, as every flash kernel does. The bounds leave a margin of a few times the worst error
# the default-run cases show on the CPU, so a real loss of precision still fails.
ATOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2, jnp.float16: 2e-3}
RTOL = {jnp.float32: 5e-5, jnp.bfloat16: 2e-2, jnp.float16: 2e-3}


def test_runs_on_the_expected_backend():
    assert jax.default_backend() == os.environ.get("VIT_TEST_BACKEND", "cpu")


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


def _assert_close(actual, expected, dtype, what, nonzero=True):
    expected = np.asarray(expected, np.float32)
    if nonzero:
        assert np.abs(expected).max() > 0.05, f"{what}: the reference is ~0, nothing compared"
    np.testing.assert_allclose(np.asarray(actual, np.float32), expected, atol=ATOL[dtype],
                               rtol=RTOL[dtype], err_msg=what)


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
@pytest.mark.slow
def test_matches_reference(seq_q, seq_k, head_dim, dtype, block):
    q, k, v, do = _inputs(seq_q, seq_k, head_dim, dtype)
    got = _kernel_and_grads(q, k, v, do, block_q=block, block_k=block)
    want = _reference_and_grads(q, k, v, do)
    assert got[0].dtype == dtype
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape, name
        # With one key the softmax is constant: dq and dk are exactly 0.
        _assert_close(a, b, dtype, name, nonzero=seq_k > 1 or name in ("out", "dv"))


@pytest.mark.slow
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


@pytest.mark.slow
def test_kv_len_zero_gives_zeros_not_nan():
    # Example 0 attends to nothing; example 1 to 3 of 50 keys. NaN everywhere beyond kv_len.
    q, k, v, do = _inputs(5, 50, 64, jnp.float32)
    kv_len = jnp.array([0, 3])
    valid = (jnp.arange(50) < kv_len[:, None])[:, :, None, None]
    k_nan, v_nan = (jnp.where(valid, x, jnp.nan) for x in (k, v))
    got = _kernel_and_grads(q, k_nan, v_nan, do, kv_len, block_q=16, block_k=16)
    for name, a in zip(("out", "dq", "dk", "dv"), got, strict=True):
        assert bool(jnp.isfinite(a).all()), name
        np.testing.assert_array_equal(a[0], 0, err_msg=f"{name} of the empty example")
    # Example 1 by value, gradients included, against the reference on that example alone.
    want = _reference_and_grads(q[1:], k[1:], v[1:], do[1:], kv_len[1:])
    for name, a, b in zip(("out", "dq"), got[:2], want[:2], strict=True):
        _assert_close(a[1:], b, jnp.float32, name)
    for name, a, b in zip(("dk", "dv"), got[2:], want[2:], strict=True):
        _assert_close(a[1:, :3], b[:, :3], jnp.float32, name)
        np.testing.assert_array_equal(a[1:, 3:], 0, err_msg=f"{name} beyond kv_len")


def test_padded_query_rows_by_value():
    # A caller's padded queries (zeros, zero cotangent) next to real ones, with masked keys.
    q, k, v, do = _inputs(50, 50, 64, jnp.bfloat16)
    real_q = (jnp.arange(50) < 20)[None, :, None, None]
    q, do = jnp.where(real_q, q, 0), jnp.where(real_q, do, 0)
    kv_len = jnp.array([20, 7])
    got = _kernel_and_grads(q, k, v, do, kv_len, block_q=16, block_k=16)
    want = _reference_and_grads(q, k, v, do, kv_len)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert bool(jnp.isfinite(a.astype(jnp.float32)).all()), name
        _assert_close(a, b, jnp.bfloat16, name)
    np.testing.assert_array_equal(np.asarray(jnp.where(real_q, 0, got[1]), np.float32), 0,
                                  err_msg="padded queries got a gradient")


@pytest.mark.slow
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


def _padded_work(seq_q, seq_k, tile):
    """Rows x columns a kernel computes with `tile`, over the real rows x columns."""
    bq, bk = tile
    return (-(-seq_q // bq) * bq) * (-(-seq_k // bk) * bk) / (seq_q * seq_k)


@pytest.mark.parametrize("seq,old_waste,max_waste", [(197, 1.69, 1.5), (577, 1.23, 1.18)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tiles_fit_the_sequence(seq, old_waste, max_waste, head_dim):
    """The tile policy: padding to the largest tile (128) multiplies the forward's work by
    `old_waste` (counted by `_padded_work`); tiles fitted to the length cost less in every
    kernel, and the
    resident tile (queries in fwd/dQ, keys in dK/dV) keeps >= 64 rows for Hopper's wgmma."""
    assert _padded_work(seq, seq, (128, 128)) == pytest.approx(old_waste, abs=0.01)
    blocks = fa.default_block_sizes("gpu", head_dim, seq, seq)
    largest = fa.default_block_sizes("gpu", head_dim)
    assert _padded_work(seq, seq, blocks.fwd) <= max_waste
    for name, resident in (("fwd", 0), ("dkv", 1), ("dq", 0)):
        tile, top = getattr(blocks, name), getattr(largest, name)
        assert _padded_work(seq, seq, tile) < old_waste, (name, tile)
        assert all(t & (t - 1) == 0 and 16 <= t <= m for t, m in zip(tile, top, strict=True))
        assert tile[resident] >= min(64, top[resident]), (name, tile)
    # Short sequences get one tile, not a 128-row block of padding.
    assert fa.default_block_sizes("gpu", 64, 5, 20).fwd == (16, 32)


class _LoopPlan:
    def __init__(self, masked_tail):
        self.masked_tail = masked_tail

    def masks_keys(self, block_k):
        return self.masked_tail


@pytest.mark.parametrize("limit,block,masked_tail,want", [
    (197, 32, True, (6, 1)),  # 6 full blocks, the partial 7th masked; the 8th never runs
    (192, 32, False, (6, 0)),
    (60, 16, True, (3, 1)),
    (64, 16, True, (4, 0)),  # kv_len on a block edge: no masked block at all
    (0, 16, True, (0, 0)),  # kv_len == 0: no block runs
])
@pytest.mark.parametrize("traced", [False, True])
def test_key_loop_skips_padding_blocks(limit, block, masked_tail, want, traced):
    """Key blocks past the last real key never run, and only the partial block is masked."""

    def body(j, carry, masked):
        full, tail, last = carry
        return (full + (not masked), tail + masked, j)

    def run(limit):
        return fa._key_loops(body, limit, block, (0, 0, -1), _LoopPlan(masked_tail))

    full, tail, last = jax.jit(run)(jnp.int32(limit)) if traced else run(limit)
    assert (int(full), int(tail)) == want
    assert int(last) == sum(want) - 1  # the loops cover blocks 0 .. n-1 in order


@pytest.mark.parametrize("seq,head_dim,kv_len", [(197, 80, None), (50, 64, (50, 3))])
def test_backward_keeps_no_padded_copies(seq, head_dim, kv_len):
    """The residuals saved for the backward are the caller's unpadded q, k, v and the output
    (and the small float32 log-sum-exp), not copies padded to the tile or head_dim 128."""
    x = jax.ShapeDtypeStruct((2, seq, 3, head_dim), jnp.bfloat16)
    lens = None if kv_len is None else jnp.array(kv_len)
    attention = functools.partial(fa.flash_attention, kv_len=lens)
    vjp_fn = jax.eval_shape(lambda q, k, v: jax.vjp(attention, q, k, v)[1], x, x, x)
    saved = [leaf for leaf in jax.tree.leaves(vjp_fn) if leaf.size > 2]
    big = [leaf for leaf in saved if leaf.dtype == jnp.bfloat16]
    assert len(big) == 4 and all(leaf.shape == x.shape for leaf in big), saved
    assert all(leaf.dtype == jnp.float32 and leaf.size < x.size / 8
               for leaf in saved if leaf.dtype != jnp.bfloat16), saved


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
    spec = jax.ShapeDtypeStruct((2, 577, 12, 80), dtype)  # ragged tiles; 128 (GPU) dims
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
@pytest.mark.slow
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
@pytest.mark.parametrize("seq", [577, 1025])
@pytest.mark.parametrize("head_dim", [96, 128])
def test_vit_lengths(seq, head_dim):
    """Real ViT shapes (/16 models at 384 and 512 px; head_dim 96 and 128, where the Triton path
    pads 96 to 128) at the default tiles, gradients included. Slow set: interpreted on the CPU;
    scripts/gpu_check.sh runs it compiled, within its own limit."""
    q, k, v, do = _inputs(seq, seq, head_dim, jnp.bfloat16, batch=2, heads=2)
    got = _kernel_and_grads(q, k, v, do)
    want = _reference_and_grads(q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        _assert_close(a, b, jnp.bfloat16, name)


@pytest.mark.slow
@pytest.mark.skipif(COMPILED, reason="on a GPU the kernels are compiled and run for real")
def test_gpu_kernels_fit_registers_and_shared_memory_on_sm90(tmp_path):
    """Compiles the three kernels' Triton IR for Hopper with pip's triton at the tiles the
    wrapper picks for 197 and 577 tokens, and with kv_len: no register spills and shared memory
    within the 227 KiB a block may use. Slow set: 18 Triton compiles in a fresh interpreter;
    test_lowers_for_accelerators lowers the same kernels in the default set."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "kernels", "--head-dims", "64",
         "128", "--seqs", "197", "577", "--dtypes", "bfloat16", "--out", str(tmp_path)],
        cwd=ROOT, env=env, timeout=280, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "kernel_resources.json").read_text())
    rows = result["kernels"]
    assert len(rows) == 18 and {r["kernel"] for r in rows} == {
        "flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq"}
    for r in rows:
        want = fa.default_block_sizes("gpu", r["head_dim"], r["seq"], r["seq"])
        assert r["tile"] == list(getattr(want, r["kernel"].rsplit("_", 1)[1])), r
        assert r["spill_bytes"] == 0 and 0 < r["shared_bytes"] <= 227 * 1024, r
        assert r["registers"] <= 255, r
    assert len(result["readme_table"]) == 2 + 4  # header + (64, 128) x (197, 577)


def _gpu_check(tmp_path, *args, **env):
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args, str(tmp_path)],
        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable, **env},
        timeout=600, capture_output=True, text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_check_dry_run(tmp_path):
    """scripts/gpu_check.sh --dry-run: collects the compiled and the real-shape tests, runs the
    benchmark on tiny shapes, every row measured and passing. Slow set: a minute of
    benchmarks; the default set runs the script's --quick dry run and its exit statuses."""
    proc = _gpu_check(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check: PASSED in" in proc.stdout
    assert " tests collected" in (tmp_path / "flash_attention_tests.log").read_text()
    # The real ViT shapes: 577 and 1025 tokens at head_dim 96 and 128, all selected.
    shapes = (tmp_path / "vit_shapes_tests.log").read_text()
    assert re.search(r"\b4/\d+ tests collected", shapes), shapes[-500:]
    result = json.loads((tmp_path / "bench_attention.json").read_text())
    assert {"command", "machine", "versions", "flop_convention", "attention",
            "status"} <= set(result)
    assert {"platform", "device_kind"} <= set(result["machine"])
    assert {"jax", "jaxlib"} <= set(result["versions"])
    assert result["status"]["failed"] == result["status"]["skipped"] == 0, result["status"]
    ours = [r for r in result["attention"] if r["impl"] == "pallas"]
    assert ours and all(r.get("tflops", 0) > 0 for r in ours), ours
    assert {"fwd", "fwd_bwd"} == {r["mode"] for r in ours}


@pytest.mark.slow
def test_gpu_check_quick_dry_run_keeps_skipped_apart(tmp_path):
    """--quick: the compiled tests and the seq-577 attention rows only. With no time budget
    every row is skipped, not failed: the JSON says so and the exit status is 3, not 1."""
    proc = _gpu_check(tmp_path, "--quick", "--dry-run", GPU_CHECK_BENCH_BUDGET_S="0")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASSED, INCOMPLETE" in proc.stdout
    assert not (tmp_path / "vit_shapes_tests.log").exists()
    result = json.loads((tmp_path / "bench_attention.json").read_text())
    assert result["quick"]
    assert result["attention"] and all(r["status"] == "skipped" for r in result["attention"])
    assert result["status"] == {"ok": 0, "failed": 0, "skipped": len(result["attention"])}


def test_gpu_check_fails_without_a_gpu(tmp_path):
    """Outside --dry-run the check asks jax for CUDA: on a CPU host it fails, it never
    measures the CPU."""
    proc = _gpu_check(tmp_path, "--quick")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "JAX_PLATFORMS=cuda" in proc.stdout and "gpu_check: FAILED" in proc.stdout
    assert not (tmp_path / "bench_attention.json").exists()


def test_bench_exit_status_fails_on_a_failed_row(tmp_path, monkeypatch):
    """A benchmark row that raises is "failed" in the JSON, and the exit status is 1."""
    from benchmarks import attention as bench

    def broken(q, k, v):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(bench, "attention_impls", lambda interpret: {"broken": broken})
    assert bench.main(["--dry-run", "--quick", "--out", str(tmp_path)]) == 1
    result = json.loads((tmp_path / "bench_attention.json").read_text())
    assert result["status"] == {"ok": 0, "failed": 2, "skipped": 0}
    assert all("kernel launch failed" in r["error"] for r in result["attention"])
    assert [bench.exit_code(dict(ok=1, failed=f, skipped=s)) for f, s in
            [(0, 0), (0, 2), (1, 2), (1, 0)]] == [0, 3, 1, 1]
