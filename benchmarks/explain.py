"""XLA's compiled memory of `explain` (`rollout`, `relevancy`) on ViT-L/14 at 518 px against
keeping every layer's attention, at several batch sizes; nothing runs."""

from __future__ import annotations

import time

from benchmarks import common, tables

GB = 1e9


def compiled_bytes(model, batch: int, size: int, what: str) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from vit.explanations import capture
    from vit.explanations.maps import explain_core

    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)
    cls = jax.ShapeDtypeStruct((batch,), jnp.int32)

    def run(state, x, cls):
        m = nnx.merge(graphdef, state)
        if what == "keep-every-layer":
            return capture.attention_grads.__wrapped__(m, x, jnp.maximum(cls, 0))
        return explain_core(m, x, cls, method=what, head_fusion="mean", discard_ratio=0.0)

    start = time.time()
    stats = jax.jit(run).lower(state, x, cls).compile().memory_analysis()
    sizes = {f"{k}_bytes": int(getattr(stats, f"{k}_size_in_bytes"))
             for k in ("temp", "output", "argument")}
    return {"batch": batch, **sizes,
            "total_gb": round((sizes["temp_bytes"] + sizes["output_bytes"]) / GB, 3),
            "compile_seconds": round(time.time() - start, 1)}


def main(argv: list[str]) -> None:
    args = common.parser("explain", __doc__).parse_args(argv)
    name, size = "L/14", 518
    import jax
    from flax import nnx

    import vit

    # An abstract model: shapes only, so ViT-L's weights are never allocated.
    model = nnx.eval_shape(lambda: vit.create_model(
        name, num_classes=1000, image_size=size, attention_impl="xla", rngs=nnx.Rngs(0)))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    # XLA's buffer assignment is not linear in the batch: each batch size is compiled.
    results = {what: {"compiled": [compiled_bytes(model, b, size, what) for b in (1, 2, 4)]}
               for what in ("rollout", "relevancy", "keep-every-layer")}
    cfg = model.config
    common.write_record("explain_memory", {
        "model": name, "image_size": size, "tokens": cfg.num_tokens,
        "depth": cfg.depth, "heads": cfg.num_heads, "parameters": int(params),
        "parameter_gb_float32": round(params * 4 / GB, 3),
        "measure": "temp_size_in_bytes + output_size_in_bytes of the compiled program "
                   "(arguments, i.e. the weights and images, excluded)",
        "results": results}, argv=argv, mode="explain", out=args.out)


def table(r: dict) -> list[str]:
    res = r["results"]
    batches = [c["batch"] for c in next(iter(res.values()))["compiled"]]
    rows = [[f"`{name}`" if name != "keep-every-layer" else "every layer's attention kept",
             *(tables.num(c["total_gb"]) for c in v["compiled"])] for name, v in res.items()]
    return [f"ViT-{r['model']} at {r['image_size']} px ({r['tokens']} tokens), XLA's compiled "
            "memory in GB (temporaries and outputs, the weights and images excluded):", "",
            *tables.table(["method", *(f"batch {b}" for b in batches)], rows)]
