"""Inference speed: our ViT (float32 and bfloat16) against Hugging Face transformers' PyTorch
ViT in float32 and in bfloat16 (the model cast with `.to(torch.bfloat16)`), with the same
weights: like against like (`ours_bfloat16_ratio_to_hf_bfloat16`) beside the float32 pair.

One checkpoint is made first: a transformers ViTForImageClassification with random
variance-preserving weights (every matrix N(0, 1/fan_in), biases and LayerNorm perturbed by
N(0, 0.3^2)), saved with `save_pretrained`; both sides load that folder. `--checkpoint DIR`
uses a Hugging Face ViT folder you have instead (trained weights give the meaningful bfloat16
agreement: random deep transformers give near-ties). Each measurement is a side in its own
process (contestants rotate round by round, so drifts in machine load hit all of them), and
each claim is the median of the per-round ratios. The first round also classifies
`--agree-images` images on every side and reports the top-1 agreement and the largest
probability difference against transformers.

    python -m benchmarks inference                          # ViT-B/16, batch 8, 224 px
    python -m benchmarks inference --rounds 5 --iters 10
    python -m benchmarks inference --baseline /tmp/before   # also an older copy of ours

`--baseline DIR` adds our model imported from DIR (an export of an older commit, e.g.
`git archive HEAD | tar -x -C DIR`), float32, so a change to the hot path is measured against
the code before it on the same machine in the same run (`ratio_to_baseline_median`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import common


def inputs(n: int, size: int, seed: int):
    import numpy as np

    return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)  # NHWC


def side_ours(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int,
              agree_images: int, probs_out: str) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from vit.checkpoints import load_checkpoint

    model = load_checkpoint(checkpoint, dtype=dtype).build_model()
    try:  # what `vit predict` does to a narrow model's kernels (an older copy may not)
        from vit.inference.weights import narrow_kernels

        model = narrow_kernels(model)
    except ImportError:
        pass
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x: jax.nn.softmax(nnx.merge(graphdef, s)(x), -1))
    x = inputs(batch, image_size, 0)
    # Compiled as `vit predict` compiles it; a --baseline copy of the package may keep that
    # function elsewhere, or not have it.
    try:
        from vit.cpu.xla_options import compile_for_inference
    except ImportError:
        try:
            from vit.inference.xla_cpu import compile_for_inference
        except ImportError:
            compile_for_inference = lambda lowered, dtype=None: lowered.compile()  # noqa: E731
    takes_dtype = "dtype" in inspect.signature(compile_for_inference).parameters
    forward = compile_for_inference(forward.lower(state, x), *([dtype] if takes_dtype else []))
    timing = common.time_call(lambda: forward(state, x), warmup=1, repeats=iters)
    if agree_images:
        xs = inputs(agree_images, image_size, 1)
        probs = np.concatenate([np.asarray(forward(state, xs[i:i + batch]))
                                for i in range(0, len(xs), batch)])
        np.save(probs_out, probs.astype(np.float32), allow_pickle=False)
    return timing


def side_hf(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int,
            agree_images: int, probs_out: str) -> dict:
    import numpy as np
    import torch
    from transformers import ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    model = ViTForImageClassification.from_pretrained(checkpoint).eval()
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    x = torch.from_numpy(inputs(batch, image_size, 0).transpose(0, 3, 1, 2).copy())
    x = x.to(model.dtype)
    with torch.inference_mode():
        timing = common.time_call(lambda: model(pixel_values=x), warmup=1, repeats=iters)
        if agree_images:
            xs = torch.from_numpy(inputs(agree_images, image_size, 1)
                                  .transpose(0, 3, 1, 2).copy()).to(model.dtype)
            probs = torch.cat([torch.softmax(
                model(pixel_values=xs[i:i + batch]).logits.float(), -1)
                               for i in range(0, len(xs), batch)]).numpy()
            np.save(probs_out, probs.astype(np.float32), allow_pickle=False)
    return timing


def make_checkpoint(folder: str, model_name: str, image_size: int) -> None:
    import torch
    import transformers

    import vit

    cfg = vit.variant_config(model_name, image_size=image_size)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_dim, image_size=image_size, patch_size=cfg.patch_size[0],
        num_labels=cfg.num_classes)).eval()
    # Variance-preserving random weights. (The parity fixture's recipe, every tensor N(0, 0.3^2),
    # is chaotic at depth 12: one-hot attention that a bfloat16 rounding flips.)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            else:
                base = 1.0 if ("layernorm" in name and name.endswith("weight")) else 0.0
                p.copy_(base + 0.3 * torch.randn_like(p))
    model.save_pretrained(folder)


def run(kind: str, args, folder: str, agree: bool) -> float:
    """Images/s of contestant `kind`, from its own process."""
    env, pythonpath = {}, None
    if kind == "baseline":  # our float32 side, with `vit` imported from the baseline copy
        pythonpath = args.baseline
    if kind == "ours_float32_ynn":  # jax's default XLA:CPU dots (see vit/cpu/xla_options.py)
        env["VIT_XLA_DOTS"] = "0"
    ours = not kind.startswith("hf")
    dtype = ("bfloat16" if kind in ("ours_bfloat16", "hf_bfloat16") else "float32")
    timing = common.run_side(
        f"benchmarks.inference:{'side_ours' if ours else 'side_hf'}",
        {"checkpoint": os.path.join(folder, "model"), "dtype": dtype, "batch": args.batch,
         "image_size": args.image_size, "iters": args.iters,
         "agree_images": args.agree_images if agree else 0,
         "probs_out": os.path.join(folder, f"{kind}.npy")},
        env=env, pythonpath=pythonpath, cwd=folder)
    return args.batch / timing["median_s"]


def agreement(folder: str, kinds) -> dict:
    import numpy as np

    ref = np.load(os.path.join(folder, "hf.npy"), allow_pickle=False)
    out = {}
    for kind in kinds:
        probs = np.load(os.path.join(folder, f"{kind}.npy"), allow_pickle=False)
        out[kind] = {"top1_agreement_with_transformers": float(np.mean(
                         probs.argmax(1) == ref.argmax(1))),
                     "max_prob_error": float(np.abs(probs - ref).max())}
    if "ours_bfloat16" in kinds:
        a = np.load(os.path.join(folder, "ours_float32.npy"), allow_pickle=False)
        b = np.load(os.path.join(folder, "ours_bfloat16.npy"), allow_pickle=False)
        out["bfloat16_vs_float32"] = {"top1_agreement": float(np.mean(a.argmax(1) ==
                                                                      b.argmax(1))),
                                      "max_prob_error": float(np.abs(a - b).max())}
    out["images"] = int(len(ref))
    out["distinct_top1"] = int(len(set(ref.argmax(1).tolist())))
    top2 = np.sort(ref, axis=1)[:, -2:]
    out["near_ties"] = int(np.sum(top2[:, 1] - top2[:, 0] < 0.01))  # top-2 within 0.01
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks inference",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_b16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="our compute dtypes to time (comma-separated)")
    parser.add_argument("--agree-images", type=int, default=64,
                        help="images for the agreement check in the first round (0: none)")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="also time our float32 model from this copy (an earlier commit)")
    parser.add_argument("--ynn", action="store_true",
                        help="also time our float32 model with jax's default XLA:CPU dots "
                             "(YNNPACK; VIT_XLA_DOTS=0), in the same rounds")
    parser.add_argument("--checkpoint", default=None, metavar="DIR",
                        help="a Hugging Face ViT folder both sides load (default: random "
                             "weights made here; --model and --image-size must match it)")
    args = parser.parse_args(argv)
    ours = [f"ours_{d}" for d in args.dtypes.split(",") if d]
    if args.ynn:
        ours.append("ours_float32_ynn")
    peers = ["hf"] + (["hf_bfloat16"] if "ours_bfloat16" in ours else [])
    kinds = ours + (["baseline"] if args.baseline else []) + peers
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        if args.checkpoint:
            os.symlink(os.path.abspath(args.checkpoint), os.path.join(folder, "model"))
        else:
            make_checkpoint(os.path.join(folder, "model"), args.model, args.image_size)
        agree = None
        for i in range(args.rounds):
            # Rotate the order, so no contestant always meets a warmer or cooler machine.
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            r = {kind: run(kind, args, folder, agree=i == 0 and args.agree_images > 0)
                 for kind in order}
            for kind in kinds:
                if kind != "hf":
                    r[f"{kind}_ratio"] = r[kind] / r["hf"]
            if "hf_bfloat16" in r:  # like against like
                r["ours_bfloat16_ratio_to_hf_bfloat16"] = r["ours_bfloat16"] / r["hf_bfloat16"]
            if args.baseline:
                r["ratio_to_baseline"] = r["ours_float32"] / r["baseline"]
            rounds.append(r)
            print(f"round {i}: " + ", ".join(f"{k} {r[k]:.2f} img/s" for k in kinds),
                  file=sys.stderr)
            if i == 0 and args.agree_images:
                agree = agreement(folder, [k for k in kinds if k != "hf"])
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    result = {
        "setup": {"model": args.model, "batch": args.batch, "image_size": args.image_size,
                  "iters": args.iters, "rounds": args.rounds,
                  "weights": args.checkpoint or "one transformers ViTForImageClassification "
                             "with random variance-preserving weights, save_pretrained; both "
                             "sides load it",
                  "ours": "vit.checkpoints.load_checkpoint(dtype=...) + jax.jit forward + "
                          "softmax",
                  "peer": "transformers ViTForImageClassification float32 (hf) and cast with "
                          ".to(torch.bfloat16) (hf_bfloat16), torch.inference_mode, default "
                          "SDPA attention, threads = cores"},
        "rounds": rounds,
        "img_s_median": {k: med(k) for k in kinds},
        "ratio_to_transformers_median": {k: med(f"{k}_ratio") for k in kinds if k != "hf"},
        "ours_bfloat16_ratio_to_hf_bfloat16_median": (
            med("ours_bfloat16_ratio_to_hf_bfloat16") if "hf_bfloat16" in kinds else None),
        "agreement": agree,
    }
    if args.baseline:
        base = subprocess.run(["git", "-C", args.baseline, "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        result["baseline"] = {"dir": args.baseline, "commit": base or None}
        result["ratio_to_baseline_median"] = med("ratio_to_baseline")
    path = common.write_record("inference", result, argv=argv, out=args.out)
    print(json.dumps({k: result[k] for k in ("img_s_median", "ratio_to_transformers_median",
                                             "ours_bfloat16_ratio_to_hf_bfloat16_median",
                                             "ratio_to_baseline_median", "agreement")
                      if k in result}, indent=1))
    print(f"-> {path}")
