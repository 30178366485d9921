"""Records how far `--dtype bfloat16` moves a trained model's predictions from float32's.

On the 360 held-out test digits, for each trained checkpoint: top-1 agreement and the largest
probability difference of our bfloat16 path against our float32 path, and of each against
transformers' `ViTForImageClassification` in float32 (through a Hugging Face folder written by
`save_checkpoint`; skipped, with the writer's reason, for a model that folder cannot hold, such
as a global-average-pooling head). Also float32's own top-2 margins, since top-1 can only flip
where they are within bfloat16's error.

Checkpoints measured:
- `--checkpoint DIR` if given: anything `vit.checkpoints.load_checkpoint` reads whose
  preprocessing takes 8x8 digits (e.g. the demo's workdir runs/record_demo);
- unless `--no-train`: ViT-Ti/16's layout (width 192, depth 12, 3 heads, MLP 768, class token
  and token head, as Hugging Face holds it) with 2x2 patches, trained here by `vit train` on
  the digits recipe (configs/digits.py) for `--steps` steps. Twelve blocks is what lets
  bfloat16 rounding accumulate as it does in a real checkpoint.

The record is `bfloat16_agreement`.

    python -m benchmarks agreement [--checkpoint runs/record_demo] [--steps 400]
        [--workdir DIR] [--no-train]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common

ROOT = common.ROOT
TI_LAYOUT = {"model.width": 192, "model.depth": 12, "model.num_heads": 3, "model.mlp_dim": 768,
             "model.class_token": True, "model.classifier": "token"}


def test_digits(pre) -> tuple[np.ndarray, np.ndarray]:
    """The test split through the checkpoint's own preprocessing (what `vit predict` does)."""
    from PIL import Image

    from vit.data import open_source

    src = open_source("digits", "test")
    x = np.stack([pre(Image.fromarray(src[i]["image"])) for i in range(len(src))])
    return x, np.asarray(src.labels)


def our_probs(path, dtype: str, x: np.ndarray) -> np.ndarray:
    import jax
    from flax import nnx

    from vit.checkpoints import load_checkpoint
    from vit.cpu.xla_options import compile_for_inference
    from vit.inference.weights import narrow_kernels

    # The model and compile as `vit predict --dtype` makes them.
    graphdef, state = nnx.split(narrow_kernels(load_checkpoint(path, dtype=dtype).build_model()))
    forward = jax.jit(lambda s, x: jax.nn.softmax(nnx.merge(graphdef, s)(x)))
    return np.asarray(compile_for_inference(forward.lower(state, x), dtype)(state, x),
                      np.float64)


def transformers_probs(loaded, x: np.ndarray, folder: Path) -> np.ndarray:
    import torch
    from transformers import ViTForImageClassification

    from vit.checkpoints import save_checkpoint

    save_checkpoint(loaded, folder, "hf")  # raises CheckpointError, naming what it cannot hold
    ref = ViTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = ref(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).logits
    return torch.softmax(logits.double(), -1).numpy()


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    same = a.argmax(1) == b.argmax(1)
    return {"top1_agreement": float(same.mean()), "top1_disagreements": int((~same).sum()),
            "max_prob_error": float(np.abs(a - b).max()),
            "mean_prob_error": float(np.abs(a - b).mean())}


def measure(path, name: str) -> dict:
    from vit.checkpoints import load_checkpoint
    from vit.errors import VitError

    loaded = load_checkpoint(path)
    x, y = test_digits(loaded.preprocessing)
    f32, bf16 = our_probs(path, "float32", x), our_probs(path, "bfloat16", x)
    top2 = np.sort(f32, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    error = float(np.abs(bf16 - f32).max())
    cfg = loaded.config
    out = {
        "name": name, "checkpoint": str(path),
        "layout": {k: getattr(cfg, k) for k in ("width", "depth", "num_heads", "mlp_dim",
                                                "classifier", "class_token", "act_layer")}
        | {"patch_size": list(cfg.patch_size), "image_size": list(cfg.image_size)},
        "images": len(y),
        "test_accuracy": {"float32": float(np.mean(f32.argmax(1) == y)),
                          "bfloat16": float(np.mean(bf16.argmax(1) == y))},
        "bfloat16_vs_float32": compare(bf16, f32),
        "float32_top2_margin": {"min": float(margin.min()),
                                "percentile_1": float(np.percentile(margin, 1)),
                                "median": float(np.median(margin)),
                                "below_bfloat16_max_error": int((margin < error).sum())},
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:
            theirs = transformers_probs(loaded, x, Path(tmp) / "hf")
        except VitError as e:
            out["transformers_float32"] = {"skipped": str(e)}
        else:
            out["transformers_float32"] = {"test_accuracy": float(np.mean(theirs.argmax(1) == y)),
                                           "float32_vs_transformers": compare(f32, theirs),
                                           "bfloat16_vs_transformers": compare(bf16, theirs)}
    return out


def train_ti(workdir: Path, steps: int) -> dict:
    """`vit train` on the digits recipe with ViT-Ti/16's layout; returns what it did."""
    sets = {**TI_LAYOUT, "train.steps": steps, "train.eval_every": steps,
            "train.checkpoint_every": steps, "optim.lr": 1e-3,
            "optim.warmup_steps": max(1, steps // 10),
            # Twelve blocks learn too slowly under the demo's shifts, rotations and zooms to
            # reach a decided model in minutes on a CPU: clean images.
            "input.shift": 0.0, "input.rotate": 0.0, "input.scale": 0.0}
    cmd = [sys.executable, "-m", "vit.cli", "train", "--config", "configs/digits.py",
           "--workdir", str(workdir), *[f"--set={k}={v}" for k, v in sets.items()]]
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return {"recipe": "configs/digits.py", "overrides": sets, "steps": steps,
            "batch_size": 64, "train_seconds": round(time.time() - start, 1)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks agreement",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a trained checkpoint taking 8x8 digits")
    parser.add_argument("--steps", type=int, default=400,
                        help="training steps of the Ti-layout model (about 5 minutes here)")
    parser.add_argument("--workdir", help="where to train it (default: a temporary folder)")
    parser.add_argument("--no-train", action="store_true", help="measure --checkpoint only")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.no_train and not args.checkpoint:
        parser.error("--no-train leaves nothing to measure without --checkpoint")

    results = []
    if args.checkpoint:
        results.append(measure(Path(args.checkpoint), "given checkpoint"))
        print(results[-1], flush=True)
    if not args.no_train:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(args.workdir) if args.workdir else Path(tmp) / "ti_digits"
            training = train_ti(workdir, args.steps)
            result = measure(workdir, "ViT-Ti/16 layout, patch 2, trained on digits")
            if not args.workdir:
                result["checkpoint"] = "(a temporary workdir, deleted)"
            results.append({**result, "training": training})
            print(results[-1], flush=True)
    path = common.write_record("bfloat16_agreement", {"results": results}, argv=argv,
                               mode="agreement", out=args.out)
    print(f"wrote {path}")
