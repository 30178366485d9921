"""Flash attention in Pallas: tiled online-softmax forward, two-kernel backward.

Arrays are `[batch, seq, heads, head_dim]`, as in `jax.nn.dot_product_attention`.

Why this lowering. On NVIDIA GPUs the kernel is written in the Triton style of Pallas: a grid
over (query block, batch, head), each program holding one query block and looping over key
blocks with `lax.fori_loop`, like jax's own `pallas/ops/gpu/attention.py`. It lowers through
Pallas' Triton backend on Ampere and Hopper (deprecated from jax 0.11, but still working), not
Mosaic GPU, because the very same kernel also runs in Pallas' interpret mode on CPU, where it is
tested, and lowers for TPU: the program the tests check is the one that ships. On TPU the same
kernel body lowers through Mosaic: the wrapper moves heads before sequence so the last two
block dimensions are `(block, head_dim)`, and `kv_len` arrives by scalar prefetch.

What the wrapper does around the kernel. ViT lengths (50, 197, 257, 577, 1025) are rarely
tile multiples. Tiles are chosen from the sequence length (`default_block_sizes`), the inputs are
zero-padded to a multiple of every kernel's tiles, and each kernel touches only the blocks that
hold a real row: its grid covers `cdiv(seq, tile)` blocks and its key loop stops at the last
block holding a key below `kv_len`, so tiles made entirely of padding cost nothing. Full key
blocks run unmasked; only the last, partial one masks its padded or beyond-`kv_len` keys, with
`jnp.where` (never a multiplication by a 0/1 mask, since padding may hold NaN and 0 * NaN = NaN)
from a finite running max, so no row is ever fully masked into inf - inf. Head dims are padded to
a power of two on the Triton path (80 and 96 -> 128). The softmax statistics and accumulator are
float32 whatever the input dtype; the output has the input dtype.

Backward: a `jax.custom_vjp` over the caller's unpadded arrays. It saves q, k, v, the output and
the log-sum-exp (base 2); padded copies exist only while a kernel runs. Probabilities are
recomputed from the log-sum-exp, with one kernel over key blocks for dK/dV and one over query
blocks for dQ (no atomics); delta = rowsum(dO * O) is a fused XLA reduction.

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
# Tile fitting (GPU): a tile shrinks, halving, while its padding exceeds this share of the
# sequence. The resident tile (the rows a program keeps: queries in the forward and dQ kernels,
# keys in dK/dV) stays >= 64 rows, the M of Hopper's warpgroup MMA; the streamed tile (the loop's
# rows) stays >= 32, so the per-block softmax rescale stays small next to the matmuls. These are
# first guesses: the block sweep of scripts/gpu_check.sh measures the alternatives.
_MAX_PAD_SHARE = 1 / 16
_MIN_RESIDENT = 64
_MIN_STREAMED = 32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """(query rows, key rows) per tile, and Triton warps, for the forward, dK/dV and dQ kernels."""

    fwd: tuple[int, int]
    dkv: tuple[int, int]
    dq: tuple[int, int]
    warps: tuple[int, int, int] = (4, 4, 4)  # num_warps of the fwd, dkv and dq kernels
    num_stages: int = 2


def default_block_sizes(platform: str, head_dim: int, seq_q: int | None = None,
                        seq_k: int | None = None) -> BlockSizes:
    """The tiles `flash_attention` uses: the largest per head_dim, fitted to the lengths if given.

    The largest tiles follow Triton's fused-attention tutorial. The backward kernels keep a large
    block resident and stream small blocks of the other operand: dK/dV holds 128 keys and streams
    32 queries, dQ the reverse. The warps are chosen so that no kernel spills registers on sm_90
    (`python -m benchmarks kernels` compiles every tile this function picks, on any host): with 4
    warps the dK/dV kernel spills at head_dim 64, with 8 it does not.

    With `seq_q`/`seq_k` (GPU), each tile is fitted to its length (`_fit_tile`): 197 tokens keep
    128-query forward tiles (256 rows, unavoidable at >= 64) but stream 32 keys (224 rows, not
    256), so less of the forward's work is padding.
    """
    if platform == "tpu":
        blocks = BlockSizes(fwd=(128, 128), dkv=(128, 128), dq=(128, 128))
    elif head_dim <= 32:
        blocks = BlockSizes(fwd=(128, 64), dkv=(32, 128), dq=(128, 32), warps=(4, 4, 4))
    elif head_dim <= 64:
        blocks = BlockSizes(fwd=(128, 64), dkv=(32, 128), dq=(128, 32), warps=(8, 8, 8))
    elif head_dim <= 128:
        blocks = BlockSizes(fwd=(128, 64), dkv=(32, 64), dq=(64, 32), warps=(8, 8, 8))
    else:
        # dQ keeps 16 queries: 64 spill with kv_len (a masked, dynamic key loop), 32 without.
        blocks = BlockSizes(fwd=(64, 32), dkv=(16, 32), dq=(16, 32), warps=(8, 8, 8))
    if seq_q is None or seq_k is None:
        return blocks
    if platform == "tpu":
        fit_q = fit_k = lambda b, _: b
    else:
        fit_q = lambda b, resident: _fit_tile(b, seq_q, resident)
        fit_k = lambda b, resident: _fit_tile(b, seq_k, resident)
    return dataclasses.replace(
        blocks,
        fwd=(fit_q(blocks.fwd[0], True), fit_k(blocks.fwd[1], False)),
        dkv=(fit_q(blocks.dkv[0], False), fit_k(blocks.dkv[1], True)),
        dq=(fit_q(blocks.dq[0], True), fit_k(blocks.dq[1], False)),
    )


def _fit_tile(largest: int, seq: int, resident: bool) -> int:
    """The largest power-of-two tile <= `largest` whose padding of `seq` is within
    `_MAX_PAD_SHARE`; failing that, the one (not below the floor) that pads least."""
    floor = _MIN_RESIDENT if resident else _MIN_STREAMED
    top = min(largest, max(_MIN_TRITON_BLOCK, pl.next_power_of_2(seq)))
    tiles = [top]
    while tiles[-1] // 2 >= max(floor, _MIN_TRITON_BLOCK):
        tiles.append(tiles[-1] // 2)
    for tile in tiles:
        if _round_up(seq, tile) - seq <= seq * _MAX_PAD_SHARE:
            return tile
    return min(tiles, key=lambda t: (_round_up(seq, t), -t))


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
    """Everything static about one call: lengths, layout, tiles, lowering."""

    tpu: bool  # Mosaic TPU layout [batch, heads, seq, dim]; else Triton's [batch, seq, heads, dim]
    interpret: Any  # False, True, or a pltpu.InterpretParams
    blocks: BlockSizes
    scale: float
    seq_q: int  # the caller's lengths and head_dim
    seq_k: int
    head_dim: int
    pad_q: int  # padded lengths: multiples of every kernel's query (key) tile
    pad_k: int
    dim: int  # padded head_dim
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

    def key_limit(self, ref):
        """Keys this program may attend to: kv_len (TPU: the whole [batch] array, scalar-
        prefetched to SMEM; Triton: a 0-d block), or the static length when none was given."""
        if not self.zero_keys:
            return self.seq_k
        return ref[pl.program_id(0)] if self.tpu else ref[()]

    def masks_keys(self, block_k: int) -> bool:
        """Whether a kernel streaming `block_k` keys may meet a partial key block."""
        return self.zero_keys or self.seq_k % block_k != 0

    def pad(self, x, seq: int):
        """Zero-pads a caller's [batch, seq, heads, head_dim] array to this plan's kernel layout."""
        x = jnp.pad(x, ((0, 0), (0, seq - x.shape[1]), (0, 0), (0, self.dim - self.head_dim)))
        return x.transpose(0, 2, 1, 3) if self.tpu else x

    def unpad(self, x, seq: int):
        x = x.transpose(0, 2, 1, 3) if self.tpu else x
        return x[:, :seq, :, : self.head_dim]

    def seq_spec(self, block: int, *, blocked: bool = True) -> pl.BlockSpec:
        """`block` rows of one (batch, head) of a q/k/v-like array; `blocked=False` pins row 0."""

        def index_map(*g):
            b, h, i = self._bhi(g)
            i = i if blocked else 0
            return (b, h, i, 0) if self.tpu else (b, i, h, 0)

        shape = (None, None, block, self.dim) if self.tpu else (None, block, None, self.dim)
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


def _real_keys(shape, first_key, limit, axis):
    return first_key + lax.broadcasted_iota(jnp.int32, shape, axis) < limit


def _keys(x, first_key, limit, plan):
    """Zeroes rows of a K/V tile beyond kv_len: with NaN there, p == 0 still gives p @ v = NaN."""
    if not plan.zero_keys:
        return x  # the wrapper's own padding is zeros
    return jnp.where(_real_keys(x.shape, first_key, limit, 0), x, jnp.zeros_like(x))


def _key_loops(body, limit, block_k, init, plan):
    """Runs `body(j, carry, masked)` over the key blocks below `limit`: the full blocks unmasked,
    then the partial last one, if any, masked. Blocks wholly beyond `limit` never run."""
    full = _div(limit, block_k)
    carry = lax.fori_loop(0, full, functools.partial(body, masked=False), init)
    if plan.masks_keys(block_k):
        carry = lax.fori_loop(full, _div(limit + block_k - 1, block_k),
                              functools.partial(body, masked=True), carry)
    return carry


def _div(a, b: int):
    """a // b for a static or a traced non-negative int."""
    return a // b if isinstance(a, int) else lax.div(a, jnp.int32(b))


def _fwd_kernel(kv_len_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, plan):
    block_q, block_k = plan.blocks.fwd
    limit = plan.key_limit(kv_len_ref)
    q = q_ref[...]

    def body(j, carry, masked):
        acc, row_max, row_sum = carry
        start = pl.multiple_of(j * block_k, block_k)
        k, v = k_ref[pl.ds(start, block_k), :], v_ref[pl.ds(start, block_k), :]
        if masked:
            v = _keys(v, start, limit, plan)  # NaN logits are masked below; NaN values are not
        s = _logits2(q, k, plan)
        if masked:
            s = jnp.where(_real_keys(s.shape, start, limit, 1), s, _MASK_VALUE)
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
    acc, row_max, row_sum = _key_loops(body, limit, block_k, init, plan)
    if plan.zero_keys:
        # kv_len == 0: no block ran, row_sum == 0; the row's output is 0 and its lse unused.
        has_keys = row_sum > 0
        o_ref[...] = (acc / jnp.where(has_keys, row_sum, 1.0)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(has_keys, row_max + jnp.log2(row_sum), 0.0)
    else:
        # row_sum >= 1: the row max contributes exp2(0).
        o_ref[...] = (acc / row_sum).astype(o_ref.dtype)
        lse_ref[...] = row_max + jnp.log2(row_sum)


def _dkv_kernel(kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                *, plan):
    block_q, block_k = plan.blocks.dkv
    limit = plan.key_limit(kv_len_ref)
    first_key = plan.block_index() * block_k
    masked = plan.masks_keys(block_k)
    k = _keys(k_ref[...], first_key, limit, plan)
    v = _keys(v_ref[...], first_key, limit, plan)

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        # Padded query rows carry q = dO = delta = lse = 0: they add exactly 0 below.
        p = jnp.exp2(_logits2(q, k, plan) - lse_ref[rows, :])
        if masked:
            # Select after the exp: masked logits minus lse may overflow, and must give p == 0.
            p = jnp.where(_real_keys(p.shape, first_key, limit, 1), p, 0.0)
        dv = dv + _dot(p.astype(do.dtype).T, do, plan)
        ds = p * (_dot_t(do, v, plan) - delta_ref[rows, :])
        dk = dk + _dot(ds.astype(q.dtype).T, q, plan)
        return dk, dv

    n_blocks = pl.cdiv(plan.seq_q, block_q)
    if plan.zero_keys:  # a key block wholly beyond kv_len gets zero gradients, for free
        # (0 or 1) * n, not jnp.where: Triton's scalar select would give the bound type i1.
        n_blocks = (first_key < limit).astype(jnp.int32) * n_blocks
    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, n_blocks, body, (zeros, zeros))
    dk_ref[...] = (dk * plan.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, plan):
    _, block_k = plan.blocks.dq
    limit = plan.key_limit(kv_len_ref)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def body(j, dq, masked):
        start = pl.multiple_of(j * block_k, block_k)
        k, v = k_ref[pl.ds(start, block_k), :], v_ref[pl.ds(start, block_k), :]
        p = jnp.exp2(_logits2(q, k, plan) - lse)
        if masked:
            k, v = _keys(k, start, limit, plan), _keys(v, start, limit, plan)
            p = jnp.where(_real_keys(p.shape, start, limit, 1), p, 0.0)
        ds = p * (_dot_t(do, v, plan) - delta)
        return dq + _dot(ds.astype(k.dtype), k, plan)

    dq = _key_loops(body, limit, block_k, jnp.zeros(q.shape, jnp.float32), plan)
    dq_ref[...] = (dq * plan.scale).astype(dq_ref.dtype)


# ----------------------------------------------------------------------------- pallas calls


def _forward(plan, q, k, v, kv_len):
    """o and lse (base 2, [batch, heads, pad_q, 1]) for padded q, k, v; rows of blocks past
    seq_q are left unwritten."""
    block_q, _ = plan.blocks.fwd
    batch, heads = q.shape[0], q.shape[1 if plan.tpu else 2]
    whole_kv = plan.seq_spec(plan.pad_k, blocked=False)
    return plan.call(
        _fwd_kernel,
        n_blocks=pl.cdiv(plan.seq_q, block_q),
        in_specs=[plan.seq_spec(block_q), whole_kv, whole_kv],
        out_specs=[plan.seq_spec(block_q), plan.row_spec(block_q)],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, plan.pad_q, 1), jnp.float32),
        ],
        name="flash_attention_fwd",
        warps=plan.blocks.warps[0],
        kv_len=kv_len,
        args=(q, k, v),
    )


def _backward(plan, q, k, v, kv_len, lse, delta, do):
    """dq, dk, dv for padded inputs; lse and delta are zero on padded query rows."""
    whole_q = plan.seq_spec(plan.pad_q, blocked=False)
    whole_kv = plan.seq_spec(plan.pad_k, blocked=False)
    whole_rows = plan.row_spec(plan.pad_q, blocked=False)

    _, block_k = plan.blocks.dkv
    kv_tile = plan.seq_spec(block_k)
    dk, dv = plan.call(
        _dkv_kernel,
        n_blocks=pl.cdiv(plan.seq_k, block_k),
        in_specs=[whole_q, kv_tile, kv_tile, whole_q, whole_rows, whole_rows],
        out_specs=[kv_tile, kv_tile],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2,
        name="flash_attention_dkv",
        warps=plan.blocks.warps[1],
        kv_len=kv_len,
        args=(q, k, v, do, lse, delta),
    )

    block_q, _ = plan.blocks.dq
    q_tile, row_tile = plan.seq_spec(block_q), plan.row_spec(block_q)
    dq = plan.call(
        _dq_kernel,
        n_blocks=pl.cdiv(plan.seq_q, block_q),
        in_specs=[q_tile, whole_kv, whole_kv, q_tile, row_tile, row_tile],
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
    return _attention_fwd(plan, q, k, v, kv_len)[0]


def _attention_fwd(plan, q, k, v, kv_len):
    o, lse = _forward(plan, plan.pad(q, plan.pad_q), plan.pad(k, plan.pad_k),
                      plan.pad(v, plan.pad_k), kv_len)
    o = plan.unpad(o, plan.seq_q)
    # The caller's unpadded arrays and the output itself: no padded copy outlives the kernel.
    return o, (q, k, v, kv_len, o, lse)


def _attention_bwd(plan, res, do):
    q, k, v, kv_len, o, lse = res
    real_rows = (jnp.arange(plan.pad_q) < plan.seq_q)[:, None]
    # Rows past seq_q: the forward left some unwritten; 0 makes their p finite, and with
    # dO = delta = 0 there they add nothing.
    lse = jnp.where(real_rows, lse, 0.0)
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)  # [b, s, h]
    delta = jnp.pad(delta, ((0, 0), (0, plan.pad_q - plan.seq_q), (0, 0)))
    delta = delta.transpose(0, 2, 1)[..., None]  # stored like lse: [b, h, s, 1]
    dq, dk, dv = _backward(plan, plan.pad(q, plan.pad_q), plan.pad(k, plan.pad_k),
                           plan.pad(v, plan.pad_k), kv_len, lse, delta, plan.pad(do, plan.pad_q))
    return (plan.unpad(dq, plan.seq_q), plan.unpad(dk, plan.seq_k), plan.unpad(dv, plan.seq_k),
            None)


_attention.defvjp(_attention_fwd, _attention_bwd)


# ----------------------------------------------------------------------------- wrapper


def _check_tile(name: str, b: int, tpu: bool) -> None:
    if tpu and (b <= 0 or b % _TPU_ROWS):
        raise ValueError(f"{name}={b} must be a positive multiple of {_TPU_ROWS} on TPU")
    if not tpu and (b < _MIN_TRITON_BLOCK or b & (b - 1)):
        raise ValueError(f"{name}={b} must be a power of two >= {_MIN_TRITON_BLOCK}")


def _resolve_blocks(tpu, head_dim, seq_q, seq_k, block_q, block_k, block_sizes) -> BlockSizes:
    """The caller's `BlockSizes`, else tiles fitted to the lengths with `block_q`/`block_k`
    (if given) replacing every kernel's query/key tile; all clamped to short sequences."""
    if block_sizes is not None:
        blocks = block_sizes
        for kernel in ("fwd", "dkv", "dq"):
            for name, b in zip(("block_q", "block_k"), getattr(blocks, kernel), strict=True):
                _check_tile(f"{kernel} {name}", b, tpu)
    else:
        blocks = default_block_sizes("tpu" if tpu else "gpu", head_dim, seq_q, seq_k)
        for name, b in (("block_q", block_q), ("block_k", block_k)):
            if b is not None:
                _check_tile(name, b, tpu)

    def fit(b, seq):
        if tpu:
            return min(b, _round_up(seq, _TPU_ROWS))
        return min(b, max(_MIN_TRITON_BLOCK, pl.next_power_of_2(seq)))

    def tile(pair):
        return fit(block_q or pair[0], seq_q), fit(block_k or pair[1], seq_k)

    if block_sizes is not None:
        block_q = block_k = None
    return dataclasses.replace(
        blocks, fwd=tile(blocks.fwd), dkv=tile(blocks.dkv), dq=tile(blocks.dq)
    )


def flash_attention(q, k, v, *, kv_len=None, scale=None, block_q=None, block_k=None,
                    num_warps=None, block_sizes=None, interpret=None):
    """Softmax attention `softmax(q k^T * scale) v` with a Pallas flash-attention kernel.

    Args:
      q: `[batch, q_len, heads, head_dim]`, bfloat16, float16 or float32.
      k, v: `[batch, kv_len_max, heads, head_dim]`, same dtype; kv length may differ from q's.
      kv_len: optional int array `[batch]`: keys at positions >= kv_len[b] are ignored (their
        contents may be anything, NaN included). Clipped to [0, kv_len_max]; a row with 0
        valid keys returns zeros.
      scale: static float; defaults to 1/sqrt(head_dim).
      block_q, block_k: tile rows for queries and keys, for all three kernels (default: fitted
        to the lengths by `default_block_sizes`). Powers of two >= 16 on GPU/CPU, multiples of
        16 on TPU.
      num_warps: Triton warps for all three kernels on GPU (default: per kernel and head_dim).
      block_sizes: a `BlockSizes` giving every kernel's tiles and warps (for tuning); overrides
        `block_q`, `block_k` and the default warps.
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
    blocks = _resolve_blocks(tpu, head_dim, seq_q, seq_k, block_q, block_k, block_sizes)
    if num_warps is not None and block_sizes is None:
        if num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={num_warps} must be one of 1, 2, 4, 8, 16")
        blocks = dataclasses.replace(blocks, warps=(num_warps,) * 3)

    zero_keys = kv_len is not None
    if kv_len is None:
        kv_len = jnp.full((batch,), seq_k, jnp.int32)  # unread: the kernels use seq_k
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
        seq_q=seq_q,
        seq_k=seq_k,
        head_dim=head_dim,
        # All tiles are powers of two (GPU) or multiples of 16 (TPU): one padding serves all.
        pad_q=_round_up(seq_q, math.lcm(blocks.fwd[0], blocks.dkv[0], blocks.dq[0])),
        pad_k=_round_up(seq_k, math.lcm(blocks.fwd[1], blocks.dkv[1], blocks.dq[1])),
        # Triton tiles need power-of-two sizes; Mosaic takes a whole head_dim as is.
        dim=head_dim if tpu else max(_MIN_TRITON_BLOCK, pl.next_power_of_2(head_dim)),
        zero_keys=zero_keys,
        precision=lax.Precision.HIGHEST if q.dtype == jnp.float32 else None,
    )
    return _attention(plan, q, k, v, kv_len)
