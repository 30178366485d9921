"""Registers, spills and shared memory of our flash-attention kernels compiled for Hopper
(sm_90) on any host by pip's triton and ptxas; exit 1 when one does not fit."""

from __future__ import annotations

import contextlib
import functools
import glob
import itertools
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import warnings
from unittest import mock

import jax
import jax.numpy as jnp

from benchmarks import common, tables

KERNELS = ("flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq")
CAPABILITY, DEVICE_KIND = 90, "NVIDIA H100"
MAX_SHARED = 227 * 1024  # the largest shared memory of one block on sm_90


def triton_ir(head_dim: int, dtype, seq: int, kv_len: bool = False) -> dict[str, str]:
    """Triton IR of the forward and both backward kernels, by kernel name."""
    from jax._src.pallas.triton import lowering  # where jax turns a kernel into Triton IR

    from vit.ops.flash_attention import flash_attention

    captured, original = {}, lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = original(*args, **kwargs)
        result.module.operation.verify()  # raises on IR that Triton would reject
        text = result.module.operation.get_asm(enable_debug_info=False)
        captured[re.search(r"module @(\w+)", text).group(1)] = text
        return result

    spec = jax.ShapeDtypeStruct((2, seq, 4, head_dim), dtype)
    lens = jax.ShapeDtypeStruct((2,), jnp.int32)

    def step(q, k, v, do, lens):
        attention = functools.partial(flash_attention, interpret=False,
                                      kv_len=lens if kv_len else None)
        out, vjp = jax.vjp(attention, q, k, v)
        return out, vjp(do)

    target = contextlib.nullcontext()
    if jax.default_backend() != "gpu":  # lowered for an abstract H100 on any other host
        from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

        device = AbstractDevice(device_kind=DEVICE_KIND, num_cores=None, platform="gpu")
        target = use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device))
    with mock.patch.object(lowering, "lower_jaxpr_to_triton_module", capture), target:
        jax.jit(step).trace(spec, spec, spec, spec, lens).lower(lowering_platforms=("cuda",))
    if missing := set(KERNELS) - set(captured):
        raise RuntimeError(f"kernels not lowered: {sorted(missing)}")
    return captured


def compile_resources(ir: str, warps: int, stages: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default; silences a notice
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp, "kernel.ttir")
        path.write_text(ir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel = triton.compile(str(path), target=GPUTarget("cuda", CAPABILITY, 32),
                                    options={"num_warps": warps, "num_stages": stages})
        ptx = pathlib.Path(tmp, "kernel.ptx")
        ptx.write_text(kernel.asm["ptx"])
        report = _ptxas_report(ptx)
    return dict(registers=int(re.search(r"Used (\d+) registers", report).group(1)),
                spill_bytes=int(re.search(r"(\d+) bytes spill stores", report).group(1)),
                shared_bytes=int(kernel.metadata.shared),
                wgmma="wgmma.mma_async" in kernel.asm["ptx"])


def _ptxas_report(ptx: pathlib.Path) -> str:
    import triton

    errors = []
    for tool in sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__),
                                              "backends", "nvidia", "bin", "ptxas*"))):
        proc = subprocess.run([tool, "-v", f"-arch=sm_{CAPABILITY}a", str(ptx), "-o", os.devnull],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            return proc.stdout + proc.stderr
        errors.append(f"{os.path.basename(tool)}: {proc.stderr.strip().splitlines()[0:1]}")
    raise RuntimeError(f"no bundled ptxas accepted the PTX: {errors or 'none found'}")


def measure(head_dims, dtypes, seqs) -> list[dict]:
    from vit.ops.flash_attention import default_block_sizes

    rows = []
    # Each length with its own tiles; then kv_len (a dynamic key loop) at the first one.
    for dtype_name, head_dim, (seq, kv_len) in itertools.product(
            dtypes, head_dims, [*((s, False) for s in seqs), (seqs[0], True)]):
        blocks = default_block_sizes("gpu", head_dim, seq, seq)
        irs = triton_ir(head_dim, jnp.dtype(dtype_name), seq, kv_len=kv_len)
        for index, name in enumerate(KERNELS):
            row = dict(kernel=name, head_dim=head_dim, dtype=dtype_name, seq=seq, kv_len=kv_len,
                       tile=list(getattr(blocks, name.rsplit("_", 1)[1])),
                       warps=blocks.warps[index], stages=blocks.num_stages)
            try:
                row.update(compile_resources(irs[name], row["warps"], row["stages"]))
                # Spills cost speed only: flagged for 16-bit kernels.
                row["ok"] = (row["shared_bytes"] <= MAX_SHARED
                             and (row["spill_bytes"] == 0 or dtype_name == "float32"))
            except Exception as exc:  # recorded; the other kernels still report
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
            rows.append(row)
    return rows


def readme_table(rows: list[dict], dtype: str = "bfloat16", head_dims=(64, 128)) -> list[str]:
    """Per head_dim and length, without kv_len: each kernel's tile, warps, registers, memory."""
    cells: dict = {}
    for r in rows:
        if (r["dtype"] == dtype and not r["kv_len"] and "error" not in r
                and r["head_dim"] in head_dims):
            spill = f", {r['spill_bytes']} B spill" if r["spill_bytes"] else ""
            cells.setdefault((r["head_dim"], r["seq"]), {})[r["kernel"]] = (
                f"{'x'.join(map(str, r['tile']))}, {r['warps']}w: {r['registers']} regs, "
                f"{r['shared_bytes'] // 1024} KiB{spill}")
    return tables.table(["head_dim", "tokens", "forward", "dK/dV", "dQ"],
                        [[hd, seq, *(cell.get(k, "-") for k in KERNELS)]
                         for (hd, seq), cell in sorted(cells.items())])


def table(r: dict) -> list[str]:
    kernels = r["kernels"]
    bf16 = [k for k in kernels if k["dtype"] == "bfloat16"]
    dims = [k["head_dim"] for k in kernels]
    return [f"{r['target']}, bfloat16; each cell is the tile (queries x keys), warps, registers "
            "per thread and shared memory:", "", *readme_table(kernels), "",
            f"{sum(k['ok'] for k in kernels)} of {len(kernels)} kernels fit (head_dim "
            f"{min(dims)}-{max(dims)}, bfloat16 and float32, with and without `kv_len`); "
            f"{sum(k.get('spill_bytes', 0) > 0 for k in bf16)} bfloat16 kernels spill; "
            f"{sum(k.get('wgmma', False) for k in bf16)} of {len(bf16)} bfloat16 kernels use "
            "`wgmma`."]


def main(argv: list[str]) -> int:
    args = common.parser("kernels", __doc__, str(common.RECORDS), head_dims=[32, 64, 128, 256],
                         dtypes={"nargs": "+", "default": ["bfloat16", "float32"],
                                 "choices": ["bfloat16", "float16", "float32"]},
                         seqs=[197, 577, 1025, 50, 257]).parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("kernels: needs pip's triton (`pip install triton`)", file=sys.stderr)
        return 2
    rows = measure(args.head_dims, args.dtypes, args.seqs)
    common.write_record("kernel_resources", {
        "target": f"sm_{CAPABILITY}", "max_shared_bytes": MAX_SHARED,
        "note": "compiled by pip's triton, not XLA's; indicative of fit, not of speed",
        "kernels": rows, "readme_table": readme_table(rows)}, argv=argv, mode="kernels",
        out=pathlib.Path(args.out) / "kernel_resources.json")
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} kernels fit")
    return 1 if bad else 0
