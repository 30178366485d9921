"""Position embeddings: fixed 2-D sin-cos, and resizing learned ones to another grid.

Checkpoint sources resize differently, and the difference shows in the logits, so each
convention is reproduced exactly, as a separable interpolation matrix per axis:

- `"linear"`: vit_jax and big_vision, `scipy.ndimage.zoom(grid, zoom, order=1)`: linear with the
  corner samples aligned (output i reads input i * (n_in - 1) / (n_out - 1)).
- `"bicubic"`: transformers, `torch.nn.functional.interpolate(mode="bicubic",
  align_corners=False, antialias=False)`: Keys' cubic with a = -0.75, half-pixel centres, border
  samples clamped. (This is not `jax.image.resize`'s cubic, which uses a = -0.5.)
- `"bicubic_antialias"`: timm (`resample_abs_pos_embed`, at another image size and under
  `dynamic_img_size`), the same call with `antialias=True`: Pillow's resampling, a cubic with
  a = -0.5 stretched over the input pixels a downscaled one covers, the taps beyond the border
  dropped and the weights renormalised.

Class and register rows are kept apart and never interpolated.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

METHODS = ("linear", "bicubic", "bicubic_antialias")
# Which convention each checkpoint family uses.
METHOD_OF_SOURCE = {"vit_jax": "linear", "big_vision": "linear", "timm": "bicubic_antialias",
                    "hf": "bicubic", "vit": "bicubic"}


def sincos_2d(grid: tuple[int, int], width: int, temperature: float = 10_000.0) -> jnp.ndarray:
    """big_vision's `posemb_sincos_2d`: `[1, h*w, width]`, float32."""
    h, w = grid
    y, x = np.mgrid[:h, :w]
    omega = np.arange(width // 4) / (width // 4 - 1)
    omega = 1.0 / temperature**omega
    y = np.einsum("m,d->md", y.ravel(), omega)
    x = np.einsum("m,d->md", x.ravel(), omega)
    pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return jnp.asarray(pe[None], jnp.float32)


def _linear_corners_matrix(n_in: int, n_out: int) -> np.ndarray:
    if n_out == 1 or n_in == 1:
        src = np.zeros(n_out)
    else:
        src = np.arange(n_out) * (n_in - 1) / (n_out - 1)
    lo = np.clip(np.floor(src).astype(int), 0, n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    t = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1.0 - t)
    np.add.at(m, (np.arange(n_out), hi), t)
    return m


def _cubic(d: np.ndarray, a: float = -0.75) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _bicubic_torch_matrix(n_in: int, n_out: int) -> np.ndarray:
    # torch: src = (dst + 0.5) * n_in / n_out - 0.5, not clamped for cubic; taps clamped.
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    base = np.floor(src).astype(int)
    t = src - base
    m = np.zeros((n_out, n_in))
    for tap in range(-1, 3):
        idx = np.clip(base + tap, 0, n_in - 1)
        np.add.at(m, (np.arange(n_out), idx), _cubic(t - tap))
    return m


def _bicubic_antialias_torch_matrix(n_in: int, n_out: int) -> np.ndarray:
    # ATen's _compute_weights_aa (UpSample.h) with its bicubic aa_filter (a = -0.5).
    scale = n_in / n_out
    support = 2.0 * scale if scale >= 1.0 else 2.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        taps = np.arange(lo, hi)
        w = _cubic((taps - center + 0.5) * invscale, a=-0.5)
        m[i, lo:hi] = w / w.sum() if w.sum() != 0 else w
    return m


def interpolation_matrix(n_in: int, n_out: int, method: str) -> np.ndarray:
    """`[n_out, n_in]` float64 weights of a 1-D resize; the identity when sizes agree."""
    if method not in METHODS:
        raise ValueError(f"posemb resize method {method!r} is not one of {', '.join(METHODS)}")
    if n_in == n_out:
        return np.eye(n_in)
    return {"linear": _linear_corners_matrix, "bicubic": _bicubic_torch_matrix,
            "bicubic_antialias": _bicubic_antialias_torch_matrix}[method](n_in, n_out)


def resize_grid(grid_emb, new_grid: tuple[int, int], method: str):
    """Resizes a `[h, w, d]` embedding grid to `new_grid`; keeps the input's array type."""
    h, w, _ = grid_emb.shape
    mh = interpolation_matrix(h, new_grid[0], method)
    mw = interpolation_matrix(w, new_grid[1], method)
    xp = np if isinstance(grid_emb, np.ndarray) else jnp
    out = xp.einsum("ih,hwd,jw->ijd", mh.astype(np.float32), xp.asarray(grid_emb, np.float32),
                    mw.astype(np.float32))
    return out.astype(grid_emb.dtype)


def resize_posemb(posemb, old_grid: tuple[int, int], new_grid: tuple[int, int],
                  num_prefix: int, method: str):
    """Resizes `[1, num_prefix + h*w, d]` to `new_grid`; the prefix rows pass through."""
    if tuple(old_grid) == tuple(new_grid):
        return posemb
    prefix, grid = posemb[:, :num_prefix], posemb[0, num_prefix:]
    grid = grid.reshape(old_grid[0], old_grid[1], -1)
    grid = resize_grid(grid, new_grid, method).reshape(1, new_grid[0] * new_grid[1], -1)
    xp = np if isinstance(posemb, np.ndarray) else jnp
    return xp.concatenate([prefix, grid], axis=1)
