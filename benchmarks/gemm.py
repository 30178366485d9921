"""ViT-B/16's dense layers alone, XLA's variants against torch's `linear`.

Times one dense layer (matmul + bias, and the exact GELU after fc1, as the model runs them) at
ViT-B/16's shapes for batch 8 (1576 tokens): qkv 768->2304, proj 768->768, fc1 768->3072,
fc2 3072->768. Contestants, interleaved call by call in one process per library:

- XLA (jax.jit) as shipped: dots in YNNPACK fusions (jax's CPU default);
- XLA with YNNPACK fusions off (`xla_cpu_experimental_ynn_fusion_type=""`: XLA's own dots);
- XLA in bfloat16 (inputs and weights bfloat16, the weights stored so, float32
  accumulation), default fusions (YNNPACK's dots, which use bfloat16 hardware where it exists);
- XLA with its experimental oneDNN dot fusions (`xla_cpu_use_onednn` with
  `xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT`). Not shipped: on the whole
  model XLA aborts with SIGILL ("partition compile failed") when it fuses the softmax's
  normalising multiply into the value product, so it is measured on the dense layers only;
- torch `nn.functional.linear` in float32 and bfloat16, threads = cores, inference mode.

Also once with one thread each (torch.set_num_threads(1); for the jax side
`--xla_cpu_multi_thread_eigen=false` and a one-core affinity). The median of `--iters` calls
per contestant, the contestants alternating call by call (`common.interleave`); the record is
`gemm`.

With all the threads, each worker also times its library's whole ViT-B/16 forward (random
weights, batch 8; ours compiled as `vit predict` compiles it, transformers'
ViTForImageClassification with its default attention, SDPA), interleaved with the layers.
From these, `ceiling`: the ratio to transformers our forward would reach if everything but the
dense layers (attention core, LayerNorm, residuals, patch embedding) took no time at all, with
our dense layers as measured and with torch's.

And `peak`: what the machine can do at all. Each worker times one large square float32 matrix
product (`--peak-size`, 2048), the best call of `--iters`; the faster library's rate
is the machine's float32 peak as far as either library can reach it. Against it, each forward's
matrix-product FLOPs (counted here from the shapes, and XLA's own count of our compiled
forward beside it) give its fraction of that peak, the ratio our forward would reach running
at the peak, and the fraction of the peak a given ratio to transformers (1.1) needs.

    python -m benchmarks gemm [--iters 10]
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks import common

TOKENS = 8 * 197
ONEDNN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_onednn": True,
               "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
SHAPES = {"qkv": (768, 2304, False), "proj": (768, 768, False), "fc1": (768, 3072, True),
          "fc2": (3072, 768, False)}


def _images():
    import numpy as np

    return np.random.RandomState(0).randn(8, 224, 224, 3).astype(np.float32)


def forward_flops(class_token_last_block: bool, batch: int = 8, depth: int = 12) -> int:
    """Matrix-product FLOPs (2 per multiply-add) of the ViT-B/16 forward at `SHAPES`' batch:
    patch embedding, then per block the four dense layers, q k^T and attention x v. With
    `class_token_last_block` the last block computes queries onward for the class token alone,
    as our class-token head does (vit/models/blocks.py); transformers runs it in full."""
    tokens, width = TOKENS // batch, SHAPES["proj"][0]

    def block(queries: int) -> int:
        rows = {name: TOKENS if name == "qkv" else batch * queries for name in SHAPES}
        dense = sum(2 * rows[name] * k * n for name, (k, n, _) in SHAPES.items())
        return dense + 2 * 2 * batch * queries * tokens * width  # keys/values: every token

    embed = 2 * batch * (tokens - 1) * (16 * 16 * 3) * width
    last = block(1 if class_token_last_block else tokens)
    return embed + (depth - 1) * block(tokens) + last


def _best_rate(call, flops: int, iters: int) -> float:
    """GFLOP/s of the fastest of `iters` calls (after one untimed call)."""
    return flops / common.time_call(call, warmup=1, repeats=iters)["min_s"] / 1e9


def _our_forward():
    """Our ViT-B/16 forward at batch 8, compiled as `vit predict` compiles it, and its args."""
    import jax
    from flax import nnx

    import vit
    from vit.cpu.xla_options import compile_for_inference

    graphdef, state = nnx.split(vit.create_model("vit_b16"))
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
    x = jax.numpy.asarray(_images())
    return compile_for_inference(forward.lower(state, x)), (state, x)


def side_jax(iters: int, threads: int, forward: bool, peak_size: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from vit.models.blocks import activation

    exact_gelu = activation("gelu")

    variants = {"xla_default": ({}, jnp.float32),
                "xla_ynn_off": ({"xla_cpu_experimental_ynn_fusion_type": ""}, jnp.float32),
                "xla_bfloat16": ({}, jnp.bfloat16),
                "xla_onednn": (ONEDNN_DOTS, jnp.float32)}
    out = {}
    for name, (k, n, gelu) in SHAPES.items():
        rng = np.random.RandomState(0)
        x = rng.randn(TOKENS, k).astype(np.float32)
        w = (rng.randn(k, n) / np.sqrt(k)).astype(np.float32)
        b = rng.randn(n).astype(np.float32)
        compiled = {}
        for v, (options, dtype) in variants.items():
            def layer(x, w, b, dtype=dtype, gelu=gelu):
                y = jnp.dot(x.astype(dtype), w.astype(dtype),
                            preferred_element_type=jnp.float32) + b
                return exact_gelu(y) if gelu else y

            # The weight in the compute dtype, as an inference model holds it
            # (vit/inference/weights.py): no conversion inside the timed call.
            args = [jnp.asarray(x), jnp.asarray(w).astype(dtype), jnp.asarray(b)]
            compiled[v] = (jax.jit(layer).lower(*args).compile(options), args)
        if forward and name == "qkv":  # timed with the first layer, call by call
            compiled["forward"] = _our_forward()
        # Call by call, the forward with the first layer.
        timed = common.interleave({v: (lambda c=c, args=args: c(*args))
                                   for v, (c, args) in compiled.items()}, rounds=iters)
        times = {v: t["median_s"] for v, t in timed.items()}
        if "forward" in times:
            ours = compiled["forward"][0]
            out["forward"] = {"ours_float32": times.pop("forward") * 1e3,
                              "ours_xla_flops": float(ours.cost_analysis()["flops"])}
        out[name] = {v: t * 1e3 for v, t in times.items()}
    if forward:
        a = jnp.asarray(np.random.RandomState(0).randn(peak_size, peak_size).astype(np.float32))
        square = jax.jit(jnp.dot).lower(a, a).compile(variants["xla_ynn_off"][0])
        out["peak_gflop_s"] = {"xla": _best_rate(lambda: square(a, a).block_until_ready(),
                                                 2 * peak_size ** 3, iters)}
    return out


def _hf_forward():
    """transformers' ViT-B/16 (SDPA attention) at batch 8, random weights, and its input."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(ViTConfig()).eval()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    x = torch.from_numpy(_images().transpose(0, 3, 1, 2).copy())
    return lambda: model(pixel_values=x)


def side_torch(iters: int, threads: int, forward: bool, peak_size: int) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    out = {}
    if forward:
        hf = _hf_forward()
    for name, (k, n, gelu) in SHAPES.items():
        rng = np.random.RandomState(0)
        x = torch.from_numpy(rng.randn(TOKENS, k).astype(np.float32))
        w = torch.from_numpy((rng.randn(n, k) / np.sqrt(k)).astype(np.float32))
        b = torch.from_numpy(rng.randn(n).astype(np.float32))
        calls = {}
        for v, dtype in (("torch_float32", torch.float32), ("torch_bfloat16", torch.bfloat16)):
            args = (x.to(dtype), w.to(dtype), b.to(dtype))

            def call(args=args, gelu=gelu):
                y = torch.nn.functional.linear(*args)
                return torch.nn.functional.gelu(y) if gelu else y

            calls[v] = call
        if forward and name == "qkv":  # timed with the first layer, call by call
            calls["forward"] = hf
        with torch.inference_mode():
            times = {v: t["median_s"] for v, t in common.interleave(calls, rounds=iters).items()}
        if "forward" in times:
            out["forward"] = {"transformers_float32": times.pop("forward") * 1e3}
        out[name] = {v: t * 1e3 for v, t in times.items()}
    if forward:
        a = torch.from_numpy(np.random.RandomState(0).randn(peak_size, peak_size)
                             .astype(np.float32))
        with torch.inference_mode():
            out["peak_gflop_s"] = {"torch": _best_rate(lambda: torch.mm(a, a),
                                                       2 * peak_size ** 3, iters)}
    return out


def ceiling(rows: dict, forward: dict, depth: int = 12) -> dict:
    """Upper bounds on our forward's speed ratio to transformers' from the dense layers alone.
    A class-token head runs the last block's proj, fc1 and fc2 for 8 tokens instead of 1576
    (vit/models/blocks.py), so our dense work is `depth - 1` full layers and one qkv."""
    def dense_ms(v):
        return (depth - 1) * sum(r[v] for r in rows.values()) + rows["qkv"][v]

    torch_ms, ours_ms = forward["transformers_float32"], forward["ours_float32"]
    return {"transformers_forward_ms": torch_ms, "ours_forward_ms": ours_ms,
            "ratio_measured": torch_ms / ours_ms,
            "ours_dense_ms": dense_ms("xla_ynn_off"),
            "ratio_if_only_our_dense_layers_took_time": torch_ms / dense_ms("xla_ynn_off"),
            "ratio_if_only_our_onednn_dense_layers_took_time": torch_ms / dense_ms("xla_onednn"),
            "ratio_if_only_dense_layers_at_torch_speed_took_time":
                torch_ms / dense_ms("torch_float32"),
            "transformers_share_in_dense_layers": dense_ms("torch_float32") / torch_ms}


def peak(rates: dict, forward: dict, target: float = 1.1) -> dict:
    """Each forward against the machine's float32 peak (the faster library's large product)."""
    best = max(rates.values())
    ours_flops, theirs_flops = forward_flops(True), forward_flops(False)
    ours_s, theirs_s = forward["ours_float32"] / 1e3, forward["transformers_float32"] / 1e3
    return {"square_product_gflop_s": rates, "peak_gflop_s": best,
            "ours_forward_gflop": ours_flops / 1e9,
            "ours_forward_gflop_xla_count": forward["ours_xla_flops"] / 1e9,
            "transformers_forward_gflop": theirs_flops / 1e9,
            "ours_fraction_of_peak": ours_flops / ours_s / 1e9 / best,
            "transformers_fraction_of_peak": theirs_flops / theirs_s / 1e9 / best,
            "ratio_if_ours_ran_at_peak": theirs_s / (ours_flops / best / 1e9),
            f"fraction_of_peak_ours_needs_for_{target}x":
                ours_flops / (theirs_s / target) / 1e9 / best}


def run(kind: str, iters: int, threads: int, peak_size: int) -> dict:
    """One library's side in its own process; with one thread, a jax side is pinned to core 0
    with one Eigen thread and one device (torch's side sets its own thread count)."""
    env, prefix = {"JAX_PLATFORMS": "cpu"}, []
    if kind == "jax" and threads == 1:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                            " --xla_force_host_platform_device_count=1").strip()
        prefix = ["taskset", "-c", "0"]
    return common.run_side(f"benchmarks.gemm:side_{kind}",
                           {"iters": iters, "threads": threads, "peak_size": peak_size,
                            "forward": threads == os.cpu_count()}, env=env, prefix=prefix)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gemm",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="side of the square product that measures the peak rate")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)

    results = {}
    for threads in (os.cpu_count(), 1):
        jx = run("jax", args.iters, threads, args.peak_size)
        th = run("torch", args.iters, threads, args.peak_size)
        rows = {name: {**jx[name], **th[name]} for name in SHAPES}
        ms = {v: sum(r[v] for r in rows.values()) for v in next(iter(rows.values()))}
        if "forward" in jx:
            results["ceiling"] = ceiling(rows, {**jx["forward"], **th["forward"]})
            results["peak"] = peak({**jx["peak_gflop_s"], **th["peak_gflop_s"]},
                                   {**jx["forward"], **th["forward"]})
        results[f"threads_{threads}"] = {
            "ms_per_layer": rows, "ms_all_four": ms,
            "torch_float32_over_xla_default": ms["xla_default"] / ms["torch_float32"],
            "xla_bfloat16_over_xla_float32": ms["xla_bfloat16"] / ms["xla_default"],
            "torch_bfloat16_over_torch_float32": ms["torch_bfloat16"] / ms["torch_float32"]}
    flops = {name: 2 * TOKENS * k * n for name, (k, n, _) in SHAPES.items()}
    record = {"shapes": {name: {"tokens": TOKENS, "in": k, "out": n, "gelu": g,
                                "gflop": flops[name] / 1e9}
                         for name, (k, n, g) in SHAPES.items()},
              "results": results}
    print(json.dumps(record, indent=2))
    common.write_record("gemm", record, argv=argv, out=args.out)
