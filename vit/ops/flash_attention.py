"""Flash attention in Pallas: tiled online-softmax forward, two-kernel backward.

Arrays are `[batch, seq, heads, head_dim]`, as in `jax.nn.dot_product_attention`.

Why this lowering. On NVIDIA GPUs the kernel is written in the Triton style of Pallas: a grid
over (query block, batch, head), each program holding one query block and looping over key
blocks with `lax.fori_loop`, like jax's own `pallas/ops/gpu/attention.py`. It lowers through
Pallas' Triton backend on Ampere and Hopper (deprecated from jax 0.11, but still working). We
chose it over Mosaic GPU because the very same kernel also runs in Pallas' generic interpret
mode on CPU, where it is tested every day, and lowers for TPU; a Mosaic GPU kernel (warpgroup
MMAs, TMA, barriers) targets Hopper-class hardware and its interpreter handles a single-block
grid only, so CPU tests would check a different program from the one that ships. Mosaic GPU
would likely be faster on Hopper; this kernel is the portable, testable one. On TPU the same
kernel body lowers through Mosaic: the wrapper moves heads before sequence so the last two
block dimensions are `(block, head_dim)`, and `kv_len` arrives by scalar prefetch.

What the wrapper does around the kernel. ViT lengths (50, 197, 257, 577, 1025) are rarely
block multiples, so sequences are padded to the block multiple and sliced back; padded or
`kv_len`-masked keys are removed with `jnp.where` (never a multiplication by a 0/1 mask, since
padding may hold NaN and 0 * NaN = NaN) and the running max starts finite, so no row is ever
fully masked into inf - inf. Head dims are padded to a power of two on the Triton path
(80 and 96 -> 128). The softmax statistics and accumulator are float32 whatever the input
dtype; the output has the input dtype.

Backward: a `jax.custom_vjp` that recomputes probabilities from the log-sum-exp saved by the
forward (base 2), with one kernel over key blocks for dK/dV and one over query blocks for dQ
(no atomics); delta = rowsum(dO * O) is a fused XLA reduction.

A row whose `kv_len` is 0 attends to nothing: its output and all gradients through it are 0.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

__all__ = ["BlockSizes", "default_block_sizes", "flash_attention", "flash_attention_supported"]

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
MAX_HEAD_DIM = 256
_LOG2E = math.log2(math.e)
# Finite, so that masked - max stays finite when every key of a block is masked.
_MASK_VALUE = -1e30
# Triton's `tl.dot` needs every matmul dimension to be at least 16.
_MIN_TRITON_BLOCK = 16
# TPU blocks are multiples of 16 rows: one bfloat16 (16, 128) tile.
_TPU_ROWS = 16
# On TPU each program holds whole-sequence K/V (or Q/dO) in VMEM, double-buffered.
_TPU_VMEM_BUDGET = 12 * 2**20


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """(query rows, key rows) per tile, and Triton warps, for the forward, dK/dV and dQ kernels."""

    fwd: tuple[int, int]
    dkv: tuple[int, int]
    dq: tuple[int, int]
    warps: tuple[int, int, int] = (4, 4, 4)  # num_warps of the fwd, dkv and dq kernels
    num_stages: int = 2


def default_block_sizes(platform: str, head_dim: int) -> BlockSizes:
    """Default tiles, after Triton's fused-attention tutorial; not yet timed on a GPU.

    The backward kernels keep a large block resident and stream small blocks of the other
    operand: dK/dV holds 128 keys and streams 32 queries, dQ the reverse. The warps are chosen
    so that no kernel spills registers on sm_90 (`scripts/kernel_resources.py` compiles them on
    any host): with 4 warps the dK/dV kernel spills at head_dim 64, with 8 it does not.
    """
    if platform == "tpu":
        return BlockSizes(fwd=(128, 128), dkv=(128, 128), dq=(128, 128))
    if head_dim <= 32:
        return BlockSizes(fwd=(128, 64), dkv=(32, 128), dq=(128, 32), warps=(4, 4, 4))
    if head_dim <= 64:
        return BlockSizes(fwd=(128, 64), dkv=(32, 128), dq=(128, 32), warps=(8, 8, 8))
    if head_dim <= 128:
        return BlockSizes(fwd=(128, 64), dkv=(32, 64), dq=(64, 32), warps=(8, 8, 8))
    return BlockSizes(fwd=(64, 32), dkv=(16, 32), dq=(64, 16), warps=(8, 8, 8))


def flash_attention_supported(q_shape, k_shape, dtype, platform: str) -> tuple[bool, str]:
    """Whether `flash_attention` applies to these shapes here, and why (or why not)."""
    if len(q_shape) != 4 or len(k_shape) != 4:
        return False, "flash attention takes [batch, seq, heads, head_dim] arrays"
    (b, sq, h, d), (bk, sk, hk, dk) = q_shape, k_shape
    if (b, h, d) != (bk, hk, dk):
        return False, "q and k/v differ in batch, heads or head_dim"
    if min(b, sq, h, d, sk) == 0:
        return False, "empty arrays"
    if jnp.dtype(dtype) not in DTYPES:
        return False, f"dtype {jnp.dtype(dtype).name} is not bfloat16, float16 or float32"
    if d > MAX_HEAD_DIM:
        return False, f"head_dim {d} > {MAX_HEAD_DIM}"
    if platform == "gpu":
        return True, "Pallas Triton kernel"
    if platform == "tpu":
        if jnp.dtype(dtype) == jnp.float16:
            return False, "float16 is not supported on TPU"
        seq = _round_up(max(sq, sk), 128)
        if 4 * seq * _round_up(d, 128) * jnp.dtype(dtype).itemsize > _TPU_VMEM_BUDGET:
            return False, f"sequence {max(sq, sk)} does not fit the kernel's VMEM budget"
        return True, "Pallas Mosaic TPU kernel"
    if platform == "cpu":
        return True, "Pallas interpret mode (slow; meant for tests)"
    return False, f"no Pallas lowering for platform {platform!r}"


def _platform() -> str:
    return jax.default_backend()


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _triton_compiler_params(num_warps: int, num_stages: int):
    # The class moved between jax releases; the Triton backend itself is deprecated from 0.11.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from jax.experimental.pallas import triton as pltriton

            cls = pltriton.CompilerParams
        except (ImportError, AttributeError):
            from jax.experimental.pallas import gpu as plgpu

            cls = getattr(plgpu, "TritonCompilerParams", None) or plgpu.CompilerParams
    return cls(num_warps=num_warps, num_stages=num_stages)


def _is_tpu_interpret(interpret) -> bool:
    if interpret is None or isinstance(interpret, bool):
        return False
    try:
        from jax.experimental.pallas import tpu as pltpu
    except ImportError:
        return False
    return isinstance(interpret, pltpu.InterpretParams)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one call: layout, tiles, lowering."""

    tpu: bool  # Mosaic TPU layout [batch, heads, seq, dim]; else Triton's [batch, seq, heads, dim]
    interpret: Any  # False, True, or a pltpu.InterpretParams
    blocks: BlockSizes
    scale: float
    mask_keys: bool  # some key columns are padding or beyond kv_len
    zero_keys: bool  # the caller gave kv_len: K/V rows beyond it may hold anything, NaN included
    precision: Any  # HIGHEST for float32 inputs, so Triton does not drop to TF32

    # Grid order: Triton launches axis 0 fastest, TPU iterates the last axis innermost; either
    # way consecutive programs share a (batch, head) and so reuse its K/V.
    def grid(self, batch: int, heads: int, n_blocks: int) -> tuple[int, int, int]:
        return (batch, heads, n_blocks) if self.tpu else (n_blocks, batch, heads)

    def _bhi(self, g):
        return (g[0], g[1], g[2]) if self.tpu else (g[1], g[2], g[0])

    def block_index(self):
        return pl.program_id(2 if self.tpu else 0)

    def kv_len(self, ref):
        # TPU: the whole [batch] array, scalar-prefetched to SMEM; Triton: a 0-d block.
        return ref[pl.program_id(0)] if self.tpu else ref[()]

    def seq_spec(self, block: int, dim: int, *, blocked: bool = True) -> pl.BlockSpec:
        """`block` rows of one (batch, head) of a q/k/v-like array; `blocked=False` pins row 0."""

        def index_map(*g):
            b, h, i = self._bhi(g)
            i = i if blocked else 0
            return (b, h, i, 0) if self.tpu else (b, i, h, 0)

        shape = (None, None, block, dim) if self.tpu else (None, block, None, dim)
        return pl.BlockSpec(shape, index_map)

    def row_spec(self, block: int, *, blocked: bool = True) -> pl.BlockSpec:
        """Per-row statistics (lse, delta), stored [batch, heads, seq, 1] on every backend."""

        def index_map(*g):
            b, h, i = self._bhi(g)
            return (b, h, i if blocked else 0, 0)

        return pl.BlockSpec((None, None, block, 1), index_map)

    def call(self, kernel, *, n_blocks, in_specs, out_specs, out_shape, name, kv_len, args,
             warps):
        batch, heads = (args[0].shape[0], args[0].shape[1 if self.tpu else 2])
        grid = self.grid(batch, heads, n_blocks)
        kernel = functools.partial(kernel, plan=self)
        if self.tpu:
            from jax.experimental.pallas import tpu as pltpu

            params = getattr(pltpu, "CompilerParams", None) or pltpu.TPUCompilerParams
            return pl.pallas_call(
                kernel,
                grid_spec=pltpu.PrefetchScalarGridSpec(
                    num_scalar_prefetch=1, grid=grid, in_specs=in_specs, out_specs=out_specs
                ),
                out_shape=out_shape,
                compiler_params=params(dimension_semantics=("parallel",) * 3),
                interpret=self.interpret,
                name=name,
            )(kv_len, *args)
        kv_len_spec = pl.BlockSpec((None,), lambda *g: (self._bhi(g)[0],))
        return pl.pallas_call(
            kernel,
            grid=grid,
            in_specs=[kv_len_spec, *in_specs],
            out_specs=out_specs,
            out_shape=out_shape,
            compiler_params=_triton_compiler_params(warps, self.blocks.num_stages),
            interpret=self.interpret,
            name=name,
        )(kv_len, *args)


# ----------------------------------------------------------------------------- kernel math


def _dot(a, b, plan):
    return lax.dot(a, b, precision=plan.precision, preferred_element_type=jnp.float32)


def _dot_t(a, b, plan):
    """a @ b.T without materialising the transpose."""
    return lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), precision=plan.precision,
        preferred_element_type=jnp.float32,
    )


def _logits2(q, k, plan):
    """Scaled logits in base 2: exp2 is cheaper than exp, and log2(e) folds into the scale."""
    return _dot_t(q, k, plan) * (plan.scale * _LOG2E)


def _real_keys(shape, first_key, kv_len, axis):
    return first_key + lax.broadcasted_iota(jnp.int32, shape, axis) < kv_len


def _keys(x, first_key, kv_len, plan):
    """Zeroes rows of a K/V tile beyond kv_len: with NaN there, p == 0 still gives p @ v = NaN."""
    if not plan.zero_keys:
        return x
    return jnp.where(_real_keys(x.shape, first_key, kv_len, 0), x, jnp.zeros_like(x))


def _probs(q, k, lse, first_key, kv_len, plan):
    """Probabilities recomputed from the saved log-sum-exp (base 2)."""
    p = jnp.exp2(_logits2(q, k, plan) - lse)
    if plan.mask_keys:
        # Select after the exp: a kv_len == 0 row has lse ~ _MASK_VALUE, and must get p == 0.
        p = jnp.where(_real_keys(p.shape, first_key, kv_len, 1), p, 0.0)
    return p


def _fwd_kernel(kv_len_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, plan):
    block_q, block_k = plan.blocks.fwd
    kv_len = plan.kv_len(kv_len_ref)
    q = q_ref[...]

    def body(j, carry):
        acc, row_max, row_sum = carry
        start = pl.multiple_of(j * block_k, block_k)
        k = _keys(k_ref[pl.ds(start, block_k), :], start, kv_len, plan)
        v = _keys(v_ref[pl.ds(start, block_k), :], start, kv_len, plan)
        s = _logits2(q, k, plan)
        if plan.mask_keys:
            s = jnp.where(_real_keys(s.shape, start, kv_len, 1), s, _MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp2(row_max - new_max)
        p = jnp.exp2(s - new_max)
        row_sum = alpha * row_sum + jnp.sum(p, axis=1, keepdims=True)
        acc = alpha * acc + _dot(p.astype(v.dtype), v, plan)
        return acc, new_max, row_sum

    init = (
        jnp.zeros((block_q, q.shape[1]), jnp.float32),
        jnp.full((block_q, 1), _MASK_VALUE, jnp.float32),
        jnp.zeros((block_q, 1), jnp.float32),
    )
    acc, row_max, row_sum = lax.fori_loop(0, k_ref.shape[0] // block_k, body, init)
    # row_sum >= 1: the row max contributes exp2(0).
    o_ref[...] = (acc / row_sum).astype(o_ref.dtype)
    lse_ref[...] = row_max + jnp.log2(row_sum)


def _dkv_kernel(kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                *, plan):
    block_q, block_k = plan.blocks.dkv
    kv_len = plan.kv_len(kv_len_ref)
    first_key = plan.block_index() * block_k
    k = _keys(k_ref[...], first_key, kv_len, plan)
    v = _keys(v_ref[...], first_key, kv_len, plan)

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        p = _probs(q, k, lse_ref[rows, :], first_key, kv_len, plan)
        dv = dv + _dot(p.astype(do.dtype).T, do, plan)
        ds = p * (_dot_t(do, v, plan) - delta_ref[rows, :])
        dk = dk + _dot(ds.astype(q.dtype).T, q, plan)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // block_q, body, (zeros, zeros))
    dk_ref[...] = (dk * plan.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, plan):
    _, block_k = plan.blocks.dq
    kv_len = plan.kv_len(kv_len_ref)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def body(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        k = _keys(k_ref[pl.ds(start, block_k), :], start, kv_len, plan)
        v = _keys(v_ref[pl.ds(start, block_k), :], start, kv_len, plan)
        p = _probs(q, k, lse, start, kv_len, plan)
        ds = p * (_dot_t(do, v, plan) - delta)
        return dq + _dot(ds.astype(k.dtype), k, plan)

    dq = lax.fori_loop(0, k_ref.shape[0] // block_k, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * plan.scale).astype(dq_ref.dtype)


# ----------------------------------------------------------------------------- pallas calls


def _seq_len(plan, x):
    return x.shape[2 if plan.tpu else 1]


def _forward(plan, q, k, v, kv_len):
    block_q, _ = plan.blocks.fwd
    sq, sk, d = _seq_len(plan, q), _seq_len(plan, k), q.shape[-1]
    batch, heads = q.shape[0], q.shape[1 if plan.tpu else 2]
    return plan.call(
        _fwd_kernel,
        n_blocks=sq // block_q,
        in_specs=[
            plan.seq_spec(block_q, d),
            plan.seq_spec(sk, d, blocked=False),
            plan.seq_spec(sk, d, blocked=False),
        ],
        out_specs=[plan.seq_spec(block_q, d), plan.row_spec(block_q)],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, sq, 1), jnp.float32),
        ],
        name="flash_attention_fwd",
        warps=plan.blocks.warps[0],
        kv_len=kv_len,
        args=(q, k, v),
    )


def _backward(plan, q, k, v, kv_len, o, lse, do):
    sq, sk, d = _seq_len(plan, q), _seq_len(plan, k), q.shape[-1]
    # delta = rowsum(dO * O), stored like lse.
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    delta = (delta if plan.tpu else delta.transpose(0, 2, 1))[..., None]
    whole_q = [plan.seq_spec(sq, d, blocked=False)]
    whole_kv = [plan.seq_spec(sk, d, blocked=False)] * 2
    whole_rows = [plan.row_spec(sq, blocked=False)] * 2

    _, block_k = plan.blocks.dkv
    kv_tile = plan.seq_spec(block_k, d)
    dk, dv = plan.call(
        _dkv_kernel,
        n_blocks=sk // block_k,
        in_specs=[*whole_q, kv_tile, kv_tile, *whole_q, *whole_rows],
        out_specs=[kv_tile, kv_tile],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2,
        name="flash_attention_dkv",
        warps=plan.blocks.warps[1],
        kv_len=kv_len,
        args=(q, k, v, do, lse, delta),
    )

    block_q, _ = plan.blocks.dq
    q_tile, row_tile = plan.seq_spec(block_q, d), plan.row_spec(block_q)
    dq = plan.call(
        _dq_kernel,
        n_blocks=sq // block_q,
        in_specs=[q_tile, *whole_kv, q_tile, row_tile, row_tile],
        out_specs=q_tile,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        name="flash_attention_dq",
        warps=plan.blocks.warps[2],
        kv_len=kv_len,
        args=(q, k, v, do, lse, delta),
    )
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan, q, k, v, kv_len):
    return _forward(plan, q, k, v, kv_len)[0]


def _attention_fwd(plan, q, k, v, kv_len):
    o, lse = _forward(plan, q, k, v, kv_len)
    return o, (q, k, v, kv_len, o, lse)


def _attention_bwd(plan, res, do):
    q, k, v, kv_len, o, lse = res
    return (*_backward(plan, q, k, v, kv_len, o, lse, do), None)


_attention.defvjp(_attention_fwd, _attention_bwd)


# ----------------------------------------------------------------------------- wrapper


def _resolve_blocks(tpu, head_dim, seq_q, seq_k, block_q, block_k) -> BlockSizes:
    """Defaults or the caller's tiles (used by all three kernels), clamped to short sequences."""
    blocks = default_block_sizes("tpu" if tpu else "gpu", head_dim)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b is None:
            continue
        if tpu and (b <= 0 or b % _TPU_ROWS):
            raise ValueError(f"{name}={b} must be a positive multiple of {_TPU_ROWS} on TPU")
        if not tpu and (b < _MIN_TRITON_BLOCK or b & (b - 1)):
            raise ValueError(f"{name}={b} must be a power of two >= {_MIN_TRITON_BLOCK}")

    def fit(b, seq):
        if tpu:
            return min(b, _round_up(seq, _TPU_ROWS))
        return min(b, max(_MIN_TRITON_BLOCK, pl.next_power_of_2(seq)))

    def tile(default):
        bq, bk = block_q or default[0], block_k or default[1]
        return fit(bq, seq_q), fit(bk, seq_k)

    return dataclasses.replace(
        blocks, fwd=tile(blocks.fwd), dkv=tile(blocks.dkv), dq=tile(blocks.dq)
    )


def flash_attention(q, k, v, *, kv_len=None, scale=None, block_q=None, block_k=None,
                    num_warps=None, interpret=None):
    """Softmax attention `softmax(q k^T * scale) v` with a Pallas flash-attention kernel.

    Args:
      q: `[batch, q_len, heads, head_dim]`, bfloat16, float16 or float32.
      k, v: `[batch, kv_len_max, heads, head_dim]`, same dtype; kv length may differ from q's.
      kv_len: optional int array `[batch]`: keys at positions >= kv_len[b] are ignored (their
        contents may be anything, NaN included). Clipped to [0, kv_len_max]; a row with 0
        valid keys returns zeros.
      scale: static float; defaults to 1/sqrt(head_dim).
      block_q, block_k: tile rows for queries and keys, for all three kernels (defaults:
        `default_block_sizes`). Powers of two >= 16 on GPU/CPU, multiples of 16 on TPU.
      num_warps: Triton warps for all three kernels on GPU (default: per kernel and head_dim).
      interpret: None runs interpreted exactly on CPU; True/False force it; a
        `pltpu.InterpretParams` runs the TPU (Mosaic) variant in the TPU interpreter.

    Returns:
      `[batch, q_len, heads, head_dim]` in q's dtype. Differentiable in q, k, v.
    """
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"expected [batch, seq, heads, head_dim]; got {q.shape=}, "
                         f"{k.shape=}, {v.shape=}")
    batch, seq_q, heads, head_dim = q.shape
    seq_k = k.shape[1]
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, heads, head_dim):
        raise ValueError(f"q and k/v differ in batch, heads or head_dim: {q.shape=}, {k.shape=}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one of bfloat16/float16/float32; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")

    platform = _platform()
    tpu = platform == "tpu" or _is_tpu_interpret(interpret)
    interpret = platform == "cpu" if interpret is None else interpret
    blocks = _resolve_blocks(tpu, head_dim, seq_q, seq_k, block_q, block_k)
    if num_warps is not None:
        if num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={num_warps} must be one of 1, 2, 4, 8, 16")
        blocks = dataclasses.replace(blocks, warps=(num_warps,) * 3)
    pad_q = math.lcm(blocks.fwd[0], blocks.dkv[0], blocks.dq[0])
    pad_k = math.lcm(blocks.fwd[1], blocks.dkv[1], blocks.dq[1])
    sq, sk = _round_up(seq_q, pad_q), _round_up(seq_k, pad_k)
    # Triton tiles need power-of-two sizes; Mosaic takes a whole head_dim as is.
    d = head_dim if tpu else max(_MIN_TRITON_BLOCK, pl.next_power_of_2(head_dim))

    zero_keys = kv_len is not None
    if kv_len is None:
        kv_len = jnp.full((batch,), seq_k, jnp.int32)
    else:
        kv_len = jnp.asarray(kv_len)
        if kv_len.shape != (batch,):
            raise ValueError(f"kv_len must have shape ({batch},); got {kv_len.shape}")
        kv_len = jnp.clip(kv_len.astype(jnp.int32), 0, seq_k)

    plan = _Plan(
        tpu=tpu,
        interpret=interpret,
        blocks=blocks,
        scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
        mask_keys=zero_keys or sk != seq_k,
        zero_keys=zero_keys,
        precision=lax.Precision.HIGHEST if q.dtype == jnp.float32 else None,
    )

    def prepare(x, seq):
        x = jnp.pad(x, ((0, 0), (0, seq - x.shape[1]), (0, 0), (0, d - head_dim)))
        return x.transpose(0, 2, 1, 3) if tpu else x

    o = _attention(plan, prepare(q, sq), prepare(k, sk), prepare(v, sk), kv_len)
    o = o.transpose(0, 2, 1, 3) if tpu else o
    return o[:, :seq_q, :, :head_dim]
