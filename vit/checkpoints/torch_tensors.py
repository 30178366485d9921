"""PyTorch's tensor layout, shared by the timm and Hugging Face writers."""

from __future__ import annotations

import numpy as np


def torch_writers(out: dict, prefix: str = ""):
    """`put_linear(name, dense)` and `put_norm(name, norm)` writing PyTorch-layout tensors
    (`weight` transposed to `[out, in]`) into `out`, for the timm and Hugging Face writers."""

    def put_linear(name: str, dense: dict) -> None:
        out[f"{prefix}{name}.weight"] = np.asarray(dense["kernel"]).T
        if "bias" in dense:
            out[f"{prefix}{name}.bias"] = dense["bias"]

    def put_norm(name: str, norm: dict) -> None:
        out[f"{prefix}{name}.weight"], out[f"{prefix}{name}.bias"] = norm["scale"], norm["bias"]

    return put_linear, put_norm
