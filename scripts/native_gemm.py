"""Experiment: `vit train`'s float32 layer products through MKL (the BLAS torch's CPU build
uses), to measure what the step would gain from torch's product speed. Not part of `vit`.

scripts/bench_train.py `--mkl-products` times ours once more with this installed. On the hosts
these records come from, XLA's CPU dots run ViT's products at 0.77-0.93 of torch's rate
(docs/benchmarks.md#training-step); this asks how much of the step that explains. Every dense
product of the step (forward, input gradient and weight gradient of qkv, proj, fc1, fc2, the
head) becomes an XLA FFI call into `cblas_sgemm` (scripts/native/mkl_gemm.cc, built here with
the C++ compiler against jaxlib's FFI headers); everything else is the step as shipped.

Needs a C++ compiler and MKL's runtime: `pip install mkl` (it lands in the environment's lib/;
`MKL_LIB_DIR` points elsewhere). MKL runs its own OpenMP threads beside XLA's: GNU OpenMP,
waiting passively, so its idle threads do not spin on the cores XLA's threads need.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "native" / "mkl_gemm.cc"
TARGET = "vit_experiment_mkl_sgemm"
# Before MKL loads: GNU OpenMP threads that sleep when idle.
THREAD_ENV = {"MKL_THREADING_LAYER": "GNU", "OMP_WAIT_POLICY": "PASSIVE"}


def mkl_runtime() -> Path:
    """libmkl_rt from `pip install mkl` (or MKL_LIB_DIR)."""
    dirs = [os.environ.get("MKL_LIB_DIR", ""), os.path.join(sys.prefix, "lib")]
    for d in filter(None, dirs):
        found = sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")))
        if found:
            return Path(found[0])
    raise SystemExit("--mkl-products: no libmkl_rt.so in this environment's lib/; "
                     "run `pip install mkl` (or set MKL_LIB_DIR)")


def build() -> Path:
    """The handler's shared library, built once per source and jaxlib (cached in tmp)."""
    import jax

    key = hashlib.sha256(SOURCE.read_bytes() + jax.__version__.encode()).hexdigest()[:16]
    lib = Path(tempfile.gettempdir()) / f"vit_mkl_gemm_{key}.so"
    if not lib.exists():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC",
               "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"--mkl-products: building {SOURCE.name} failed:\n"
                             f"{proc.stderr[-2000:]}")
        os.replace(tmp, lib)
    return lib


def _register() -> None:
    import jax

    for key, value in THREAD_ENV.items():
        os.environ.setdefault(key, value)
    ctypes.CDLL(str(mkl_runtime()), mode=ctypes.RTLD_GLOBAL)
    handler = ctypes.CDLL(str(build()))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler.MklSgemm), platform="cpu")


def sgemm(a, b, ta: bool = False, tb: bool = False):
    """`op(a) @ op(b)` for 2-D float32 `a`, `b`, op a transpose where asked, by MKL."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32))(
        a, b, ta=np.bool_(ta), tb=np.bool_(tb))


def _product():
    import jax

    @jax.custom_vjp
    def product(x, w):
        return sgemm(x, w)

    def forward(x, w):
        return sgemm(x, w), (x, w)

    def backward(res, g):
        x, w = res
        return sgemm(g, w, tb=True), sgemm(x, g, ta=True)

    product.defvjp(forward, backward)
    return product


def einsum(spec: str, x, kernel, product):
    """`jnp.einsum(spec, x, kernel)` for a layer's product (every index of x and kernel in
    another of the three, no batch index shared by both) as one 2-D product: x's free indices
    by the contracted ones, those by the kernel's free ones; transposes where the layouts ask."""
    import jax.numpy as jnp
    import numpy as np

    ins, out = spec.split("->")
    a, b = ins.split(",")
    con = [c for c in a if c in b and c not in out]
    xf, kf = [c for c in a if c not in con], [c for c in b if c not in con]
    if sorted(xf + kf) != sorted(out):
        raise ValueError(f"{spec}: not a layer's product")
    xt = jnp.transpose(x, [a.index(c) for c in xf + con])
    kt = jnp.transpose(kernel, [b.index(c) for c in con + kf])
    rows = int(np.prod(xt.shape[:len(xf)]))
    inner = int(np.prod(xt.shape[len(xf):]))
    y = product(xt.reshape(rows, inner), kt.reshape(inner, -1))
    y = y.reshape(*xt.shape[:len(xf)], *kt.shape[len(con):])
    return jnp.transpose(y, [(xf + kf).index(c) for c in out])


def install() -> None:
    """Route every float32 layer product of models built after this through MKL."""
    import jax.numpy as jnp

    from vit.models import blocks
    from vit.ops import matmul

    _register()
    product = _product()
    shipped = matmul.einsum_dense

    def einsum_dense(spec, x, kernel, bias, dtype):
        if jnp.dtype(dtype) != jnp.float32:
            return shipped(spec, x, kernel, bias, dtype)
        y = einsum(spec, x.astype(jnp.float32), kernel.astype(jnp.float32), product)
        return y if bias is None else y + bias.astype(jnp.float32)

    def linear(self, inputs, out_sharding=None):
        bias = self.bias[...] if self.bias is not None else None
        return matmul.dense(inputs, self.kernel[...], bias, self.dtype or jnp.float32)

    matmul.einsum_dense = einsum_dense
    blocks.Linear.__call__ = linear


# ViT-B/16's layer products at batch 8 (1,576 tokens): name -> (inputs, outputs).
SHAPES = {"qkv": (768, 2304), "proj": (768, 768), "fc1": (768, 3072), "fc2": (3072, 768)}
TOKENS = 1576


def product_rates(iters: int) -> list[dict]:
    """GFLOP/s of each product (forward, input gradient, weight gradient) through XLA's dots
    (the float32 step's compile options), through MKL by the FFI call, and in torch; best of
    `iters` calls, alternating, in one process."""
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from vit.inference.xla_cpu import TRAINING

    torch.set_num_threads(os.cpu_count() or 1)
    _register()
    rng = np.random.default_rng(0)
    rows = []
    for name, (k, n) in SHAPES.items():
        x, w, g = (rng.standard_normal(s, np.float32) for s in ((TOKENS, k), (k, n), (TOKENS, n)))
        cases = {  # kind: (XLA, MKL, torch, operands)
            "forward": (lambda a, b: a @ b, lambda a, b: sgemm(a, b), (x, w)),
            "input gradient": (lambda a, b: a @ b.T, lambda a, b: sgemm(a, b, tb=True), (g, w)),
            "weight gradient": (lambda a, b: a.T @ b, lambda a, b: sgemm(a, b, ta=True),
                                (x, g))}
        for kind, (plain, mkl, (a, b)) in cases.items():
            xla_fn = jax.jit(plain, compiler_options=TRAINING)
            mkl_fn = jax.jit(mkl)
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            want = np.asarray(xla_fn(ja, jb))
            err = float(np.abs(np.asarray(mkl_fn(ja, jb)) - want).max() / np.abs(want).max())
            runs = {"xla": (xla_fn, ja, jb), "mkl": (mkl_fn, ja, jb), "torch": (plain, ta, tb)}
            best = dict.fromkeys(runs, float("inf"))
            for _ in range(iters + 1):  # the first call of each compiles or warms up
                for side, (fn, p, q) in runs.items():
                    start = time.perf_counter()
                    out = fn(p, q)
                    if side != "torch":  # torch's call returns when done; jax's is async
                        out.block_until_ready()
                    best[side] = min(best[side], time.perf_counter() - start)
            flop = 2 * TOKENS * k * n
            rows.append({"layer": name, "product": kind, "m_k_n": [TOKENS, k, n],
                         "gflop_s": {s: flop / t / 1e9 for s, t in best.items()},
                         "mkl_relative_difference": err})
            print(name, kind, {s: round(flop / t / 1e9) for s, t in best.items()}, flush=True)
    return rows


def main() -> None:
    import argparse

    import records

    parser = argparse.ArgumentParser(description="ViT-B/16's float32 layer products: XLA's "
                                     "dots, MKL through an XLA FFI call, torch")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default=records.default_out("native_gemm_products"))
    args = parser.parse_args()
    rows = product_rates(args.iters)
    records.write(args.out, {
        "benchmark": "ViT-B/16 float32 layer products (batch 8, 1,576 tokens), GFLOP/s, best "
                     f"of {args.iters}: XLA's dots (the float32 step's compile options), MKL "
                     "cblas_sgemm through an XLA FFI call (scripts/native_gemm.py), torch",
        "threading": THREAD_ENV, "products": rows}, extra_packages=("torch", "mkl"))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
