"""PyTorch's tensor layout (`weight` `[out, in]`, convolutions OIHW), shared by the timm and
Hugging Face readers and writers."""

from __future__ import annotations

import numpy as np


def transposed(w: np.ndarray, rows: int = 256) -> np.ndarray:
    """`w.T` of a torch-layout `[out, in]` matrix as a contiguous `[in, out]` copy, made a band
    of rows at a time, which keeps each band in cache where numpy's strided copy of a whole
    matrix does not; a checkpoint load transposes every linear layer."""
    out = np.empty(w.shape[::-1], w.dtype)
    for i in range(0, w.shape[0], rows):
        out[:, i:i + rows] = w[i:i + rows].T
    return out


def linear_of(weight: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Our dense layer (`kernel` `[in, out]`) from a torch `weight` and optional `bias`."""
    out = {"kernel": transposed(weight)}
    if bias is not None:
        out["bias"] = bias
    return out


def patch_kernel_of(conv: np.ndarray) -> np.ndarray:
    """Our patch kernel `[ph, pw, in, out]` from a torch OIHW patch convolution (anything but
    a 4-d array, such as a missing key's empty placeholder, passes through unchanged)."""
    if conv.ndim != 4:
        return conv
    return np.ascontiguousarray(conv.transpose(2, 3, 1, 0))


def conv_of(patch_kernel) -> np.ndarray:
    """The torch OIHW patch convolution of our `[ph, pw, in, out]` patch kernel."""
    return np.asarray(patch_kernel).transpose(3, 2, 0, 1)


def torch_readers(get):
    """`linear(name, bias=True)` and `norm(name)` reading our dense and LayerNorm parameters
    from the torch tensors `get(key)` returns (`{name}.weight`, `{name}.bias`)."""

    def linear(name: str, bias: bool = True) -> dict[str, np.ndarray]:
        return linear_of(get(f"{name}.weight"), get(f"{name}.bias") if bias else None)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {"scale": get(f"{name}.weight"), "bias": get(f"{name}.bias")}

    return linear, norm


def torch_writers(out: dict, prefix: str = ""):
    """`put_linear(name, dense)` and `put_norm(name, norm)` writing torch-layout tensors
    (`weight` transposed to `[out, in]`) into `out`, the inverse of `torch_readers`."""

    def put_linear(name: str, dense: dict) -> None:
        out[f"{prefix}{name}.weight"] = np.asarray(dense["kernel"]).T
        if "bias" in dense:
            out[f"{prefix}{name}.bias"] = dense["bias"]

    def put_norm(name: str, norm: dict) -> None:
        out[f"{prefix}{name}.weight"], out[f"{prefix}{name}.bias"] = norm["scale"], norm["bias"]

    return put_linear, put_norm
