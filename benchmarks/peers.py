"""The PyTorch peers: transformers' `ViTForImageClassification` (default attention), torch with
a thread per core, each run in its own process (`common.run_side`)."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np


def load(folder: str | Path, dtype: str = "float32", *, train: bool = False):
    """A Hugging Face ViT folder as transformers' model, in `dtype` (cast with `.to`)."""
    import torch
    from transformers import ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    model = ViTForImageClassification.from_pretrained(folder)
    model = model.train() if train else model.eval()
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def pixels(images: np.ndarray, dtype):
    """NHWC float images as the NCHW tensor of `dtype` transformers takes."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(dtype)


def probabilities(model, images: np.ndarray) -> np.ndarray:
    """Softmax over `images` (NHWC), in float64."""
    import torch

    with torch.inference_mode():
        logits = model(pixel_values=pixels(images, model.dtype)).logits
        return torch.softmax(logits.to(torch.float64), -1).numpy()


def save_random(folder: str | Path, *, variant: str | None = None, image_size: int = 224) -> None:
    """A random `ViTForImageClassification` (seed 0) and its `ViTImageProcessor` saved to
    `folder`: transformers' default ViT-B/16, or `variant`'s layout with variance-preserving
    weights (matrices N(0, 1/fan_in), vectors N(base, 0.3^2))."""
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
    transformers.ViTImageProcessor().save_pretrained(folder)


def adamw(model, *, lr: float, b1: float, b2: float, weight_decay: float):
    """torch's AdamW decaying the weight matrices only, as `vit.training.optim` does."""
    import torch

    params = dict(model.named_parameters())
    groups: dict[bool, list] = {True: [], False: []}
    for name, p in params.items():
        groups[name.endswith(".weight") and p.ndim >= 2].append(p)
    return torch.optim.AdamW([{"params": groups[True], "weight_decay": weight_decay},
                              {"params": groups[False], "weight_decay": 0.0}],
                             lr=lr, betas=(b1, b2), eps=1e-8)


def update(model, opt, images, labels, *, label_smoothing: float, clip: float | None):
    """One PyTorch training step with label smoothing and clipping: (float32 logits, loss)."""
    import torch

    opt.zero_grad(set_to_none=True)
    logits = model(pixel_values=images).logits.float()
    loss = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return logits, loss


def train_classifier(*, dataset: str, steps: int, batch: int, lr: float, warmup: int,
                     weight_decay: float, clip: float, label_smoothing: float, shift: float,
                     rotate: float, config_file: str, init: str | None, out_dir: str,
                     workers: int = 2, seed: int = 0) -> dict:
    """A PyTorch user's training script on a `vit.data.real_sets` set (from `init`, else fresh
    from `config_file`), then the test split and a save: test accuracy and where time went
    (start-up from the process's start, as `vit train`'s is; `in_process_s`, from the process's
    start to the return, lets the caller count the exit too)."""
    from vit.training.timings import process_age_s

    t0, age = time.perf_counter(), process_age_s()
    import torch
    from transformers import ViTConfig, ViTForImageClassification, get_cosine_schedule_with_warmup

    from vit.data.real_sets import LOADERS
    from vit.data.transforms import random_affine

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(seed)  # the order; the augmentation is unseeded, as a user's script has it
    (train_x, train_y, _), (test_x, test_y, _) = (LOADERS[dataset](s) for s in ("train", "test"))
    model = (load(init, train=True) if init else
             ViTForImageClassification(ViTConfig.from_json_file(config_file)).train())
    opt = adamw(model, lr=lr, b1=0.9, b2=0.999, weight_decay=weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, warmup, steps)

    def to_model(images: np.ndarray):  # uint8 [b, h, w] -> NCHW in [-1, 1], grey as RGB
        x = (images.astype(np.float32) / 255.0 - 0.5) / 0.5
        return torch.from_numpy(np.repeat(x[:, None], 3, 1))

    def collate(index):
        images = train_x[np.array(index)][..., None]
        if shift or rotate:
            images = random_affine(images, np.random.default_rng(), shift=shift, rotate=rotate)
        return to_model(images[..., 0]), torch.from_numpy(train_y[np.array(index)])

    loader = torch.utils.data.DataLoader(
        range(len(train_y)), batch_size=batch, shuffle=True, drop_last=True,
        num_workers=workers, collate_fn=collate, persistent_workers=workers > 0)
    t1 = time.perf_counter()
    for x, y in itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), steps):
        update(model, opt, x, y, label_smoothing=label_smoothing, clip=clip)
        sched.step()
    t2 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(pixel_values=to_model(test_x[i:i + 256])).logits.argmax(-1)
                           .numpy() == test_y[i:i + 256]).sum())
                      for i in range(0, len(test_y), 256))
    t3 = time.perf_counter()
    model.save_pretrained(out_dir)
    t4 = time.perf_counter()
    return {"test_accuracy": round(correct / len(test_y), 4),
            "torch_threads": torch.get_num_threads(),
            "split": {"startup_s": round(age + t1 - t0, 1), "steps_s": round(t2 - t1, 1),
                      "step_ms": round(1000 * (t2 - t1) / steps, 1),
                      "final_eval_s": round(t3 - t2, 1), "save_s": round(t4 - t3, 1)},
            "in_process_s": age + time.perf_counter() - t0}
