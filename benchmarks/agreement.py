"""How far `--dtype bfloat16` moves trained models' predictions from float32's (and each from
transformers'), on the test digits: `--checkpoint` and a ViT-Ti/16 layout trained here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import common, peers, tables


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    same = a.argmax(1) == b.argmax(1)
    return {"top1_agreement": float(same.mean()), "top1_disagreements": int((~same).sum()),
            "max_prob_error": float(np.abs(a - b).max()),
            "mean_prob_error": float(np.abs(a - b).mean())}


def measure(path, name: str) -> dict:
    """Our float32 and bfloat16 probabilities on the test digits, and transformers' float32."""
    from PIL import Image

    from vit.checkpoints import load_checkpoint, save_checkpoint
    from vit.data import open_source
    from vit.errors import VitError

    loaded, src = load_checkpoint(path), open_source("digits", "test")
    x = np.stack([loaded.preprocessing(Image.fromarray(src[i]["image"])) for i in range(len(src))])
    y = np.asarray(src.labels)
    f32, bf16 = (np.asarray(common.our_forward(path, dtype, x)(x), np.float64)
                 for dtype in ("float32", "bfloat16"))
    margin = np.diff(np.sort(f32, axis=1)[:, -2:], axis=1)[:, 0]  # float32's top two apart
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
                                "below_bfloat16_max_error": int(
                                    (margin < np.abs(bf16 - f32).max()).sum())},
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:  # the writer raises, naming what the folder cannot hold
            save_checkpoint(loaded, Path(tmp) / "hf", "hf")
        except VitError as e:
            out["transformers_float32"] = {"skipped": str(e)}
        else:
            theirs = peers.probabilities(peers.load(Path(tmp) / "hf"), x)
            out["transformers_float32"] = {"test_accuracy": float(np.mean(theirs.argmax(1) == y)),
                                           "float32_vs_transformers": compare(f32, theirs),
                                           "bfloat16_vs_transformers": compare(bf16, theirs)}
    return out


def train_ti(workdir: Path, steps: int = 400) -> dict:
    sets = {"model.width": 192, "model.depth": 12, "model.num_heads": 3,  # ViT-Ti/16's layout
            "model.mlp_dim": 768, "model.class_token": True, "model.classifier": "token",
            "train.steps": steps, "train.eval_every": steps, "train.checkpoint_every": steps,
            "optim.lr": 1e-3, "optim.warmup_steps": max(1, steps // 10),
            # Clean images: twelve blocks learn too slowly under the demo's augmentation.
            "input.shift": 0.0, "input.rotate": 0.0, "input.scale": 0.0}
    run = common.vit_train("configs/digits.py", workdir, [f"{k}={v}" for k, v in sets.items()])
    return {"recipe": "configs/digits.py", "overrides": sets, "steps": steps,
            "batch_size": 64, "train_seconds": run["wall_s"]}


def main(argv: list[str]) -> None:
    args = common.parser("agreement", __doc__, checkpoint=(
        None, "a trained checkpoint taking 8x8 digits")).parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    results = []
    if args.checkpoint:
        results.append(measure(Path(args.checkpoint), "given checkpoint"))
    with tempfile.TemporaryDirectory() as tmp:
        training = train_ti(Path(tmp) / "ti_digits")
        result = measure(Path(tmp) / "ti_digits", "ViT-Ti/16 layout, patch 2, trained on digits")
        results.append({**result, "checkpoint": "(a temporary workdir, deleted)",
                        "training": training})
    common.write_record("bfloat16_agreement", {"results": results}, argv=argv,
                        mode="agreement", out=args.out)


def table(r: dict) -> list[str]:
    rows = []
    for res in r["results"]:
        lay, acc, vs = res["layout"], res["test_accuracy"], res["bfloat16_vs_float32"]
        peer = res["transformers_float32"]
        peer_cell = (f"top-1 {tables.pct(peer['float32_vs_transformers']['top1_agreement'])}, "
                     f"largest {peer['float32_vs_transformers']['max_prob_error']:.1e}"
                     if "skipped" not in peer else
                     "not measured: " + peer["skipped"].split(":")[0])
        name = res["name"] if res["checkpoint"].startswith("(") else f"`{res['checkpoint']}`"
        rows.append([f"{name} (width {lay['width']}, {lay['depth']} blocks, "
                     f"`{lay['classifier']}` head)",
                     f"{acc['float32']:.3f} / {acc['bfloat16']:.3f}",
                     f"{round(vs['top1_agreement'] * res['images'])} of {res['images']}",
                     f"{vs['max_prob_error']:.3f} (mean {vs['mean_prob_error']:.4f})", peer_cell])
    return tables.table(["model", "test accuracy, float32 / bfloat16",
                         "bfloat16 top-1 = float32's", "largest probability difference",
                         "float32 vs transformers"], rows)


def targets(r: dict) -> list[tuple[str, str, bool]]:
    return [(f"bfloat16 top-1 agrees with float32's on at least 99.0% of images ({res['name']})",
             tables.pct(res["bfloat16_vs_float32"]["top1_agreement"]),
             res["bfloat16_vs_float32"]["top1_agreement"] >= 0.99) for res in r["results"]]
