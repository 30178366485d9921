"""The PyTorch peers the benchmarks measure against: transformers' `ViTForImageClassification`
(its default attention, SDPA), torch with a thread per core. Each side runs in a process of its
own (`common.run_side`), so torch's threads and allocator never share one with XLA's.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def load(folder: str | Path, dtype: str = "float32", *, train: bool = False):
    """A Hugging Face ViT folder as transformers' model, in `dtype` (bfloat16: the model cast
    with `.to(torch.bfloat16)`, weights too, as people run torch in bfloat16)."""
    import torch
    from transformers import ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    model = ViTForImageClassification.from_pretrained(folder)
    model = model.train() if train else model.eval()
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def pixels(images: np.ndarray, dtype=None):
    """NHWC float images as the NCHW tensor transformers takes."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    return x.to(dtype) if dtype is not None else x


def probabilities(model, images: np.ndarray, *, batch: int | None = None,
                  float64: bool = True) -> np.ndarray:
    """Softmax over `images` (NHWC), `batch` at a time (default all), in float64 or float32."""
    import torch

    batch, dtype = batch or len(images), torch.float64 if float64 else torch.float32
    with torch.inference_mode():
        return torch.cat([torch.softmax(model(pixel_values=pixels(
            images[i:i + batch], model.dtype)).logits.to(dtype), -1)
            for i in range(0, len(images), batch)]).numpy()


def save_random(folder: str | Path, *, variant: str | None = None, image_size: int = 224,
                processor: bool = False) -> None:
    """A `ViTForImageClassification` with random weights (torch seed 0), saved to `folder`:
    transformers' default ViTConfig (ViT-B/16 at 224 px, its own initialisation), or the
    layout of `variant` (a vit model name) with variance-preserving weights: every matrix
    N(0, 1/fan_in), vectors and LayerNorms perturbed by N(0, 0.3^2), which stays decided at
    depth 12 where every tensor at N(0, 0.3^2) gives one-hot attention that rounding flips.
    `processor`: its `ViTImageProcessor` too, for the pipeline."""
    import torch
    import transformers

    config = transformers.ViTConfig()
    if variant:
        import vit

        c = vit.variant_config(variant, image_size=image_size)
        config = transformers.ViTConfig(
            hidden_size=c.width, num_hidden_layers=c.depth, num_attention_heads=c.num_heads,
            intermediate_size=c.mlp_dim, image_size=image_size, patch_size=c.patch_size[0],
            num_labels=c.num_classes)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config).eval()
    if variant:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim >= 2:
                    p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
                else:
                    base = 1.0 if ("layernorm" in name and name.endswith("weight")) else 0.0
                    p.copy_(base + 0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    if processor:
        transformers.ViTImageProcessor().save_pretrained(folder)


def adamw(model, *, lr: float, b1: float, b2: float, weight_decay: float):
    """torch's AdamW decaying the weight matrices only, as `vit.training.optim`'s mask does
    (not biases, norms, position embeddings or the class token)."""
    import torch

    params = dict(model.named_parameters())
    groups: dict[bool, list] = {True: [], False: []}
    for name, p in params.items():
        groups[name.endswith(".weight") and p.ndim >= 2].append(p)
    return torch.optim.AdamW([{"params": groups[True], "weight_decay": weight_decay},
                              {"params": groups[False], "weight_decay": 0.0}],
                             lr=lr, betas=(b1, b2), eps=1e-8)
