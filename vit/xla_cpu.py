"""XLA:CPU's dot emitter for our matmuls, set when `vit` is imported (before jax starts).

jax 0.10's CPU backend hands matmuls to YNNPACK fusions by default. On ViT's dense layers XLA's
own dot emitter is faster: 1.14x over qkv, proj, fc1 and fc2 at ViT-B/16's batch-8 shapes
(`scripts/bench_gemm.py` -> benchmarks/bench_gemm.json), and 1.16x on the whole float32 forward
(median of 4 rounds, `scripts/bench_inference.py --ynn`). So `import vit` adds
`--xla_cpu_experimental_ynn_fusion_type=` (no YNNPACK fusions) to `XLA_FLAGS`, only:

- on the jaxlib versions it was measured on (XLA stops the process on a flag it does not know,
  so a new jaxlib goes without until it is measured again);
- when `XLA_FLAGS` does not already set that flag (yours wins), and `VIT_XLA_DOTS` is not `0`
  (`VIT_XLA_DOTS=0` keeps jax's own default);
- before jax creates its CPU backend: XLA reads `XLA_FLAGS` once, so importing `vit` after a
  first jax computation leaves the backend as it is.

It only concerns the CPU backend; GPU and TPU compiles never read it. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import os

FLAG = "--xla_cpu_experimental_ynn_fusion_type="
MEASURED_JAXLIB = ("0.10.",)
OPT_OUT = "VIT_XLA_DOTS"


def use_xla_dots() -> bool:
    """Adds `FLAG` to `XLA_FLAGS` where it applies (see the module docstring); True if added."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" in flags or os.environ.get(OPT_OUT) == "0":
        return False
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False
    if not jaxlib.startswith(MEASURED_JAXLIB):
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return True
