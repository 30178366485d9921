"""Inference speed: our ViT (float32 and bfloat16) against Hugging Face transformers' PyTorch
ViT in float32 and in bfloat16 (the model cast with `.to(torch.bfloat16)`), with the same
weights: like against like (`ours_bfloat16_ratio_to_hf_bfloat16`) beside the float32 pair. The
record names the CPU's bfloat16 features (records.py).

One checkpoint is made first: a transformers ViTForImageClassification with random
variance-preserving weights (every matrix N(0, 1/fan_in), biases and LayerNorm perturbed by
N(0, 0.3^2)), saved with `save_pretrained`; both sides load that folder. `--checkpoint DIR`
uses a Hugging Face ViT folder you have instead (trained weights give the meaningful bfloat16
agreement: random deep transformers give near-ties). Each measurement runs in its own
process (contestants alternate round by round, so drifts in machine load hit all of them), and
each claim is the median of the per-round ratios. The first round also classifies
`--agree-images` images on every side and reports the top-1 agreement and the largest
probability difference against transformers. Writes JSON under benchmarks/.

    python scripts/bench_inference.py                          # ViT-B/16, batch 8, 224 px
    python scripts/bench_inference.py --rounds 5 --iters 10
    python scripts/bench_inference.py --baseline /tmp/before   # also an older copy of ours

`--baseline DIR` adds our model imported from DIR (an export of an earlier commit, e.g.
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
import time

import records


def inputs(n: int, size: int, seed: int):
    import numpy as np

    return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)  # NHWC


def worker_ours(args, dtype: str):
    import jax
    import numpy as np
    from flax import nnx

    from vit.checkpoints import load_checkpoint

    model = load_checkpoint(args.checkpoint, dtype=dtype).build_model()
    try:  # what `vit predict` does to a narrow model's kernels (an older copy may not)
        from vit.inference.weights import narrow_kernels

        model = narrow_kernels(model)
    except ImportError:
        pass
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x: jax.nn.softmax(nnx.merge(graphdef, s)(x), -1))
    x = inputs(args.batch, args.image_size, 0)
    # Compiled as `vit predict` compiles it (XLA:CPU options: vit/inference/xla_cpu.py); a
    # --baseline copy of the package may keep that module elsewhere, or not have it.
    try:
        from vit.inference.xla_cpu import compile_for_inference
    except ImportError:
        try:
            from vit.xla_cpu import compile_for_inference
        except ImportError:
            compile_for_inference = lambda lowered, dtype=None: lowered.compile()  # noqa: E731
    takes_dtype = "dtype" in inspect.signature(compile_for_inference).parameters
    forward = compile_for_inference(forward.lower(state, x), *([dtype] if takes_dtype else []))
    forward(state, x).block_until_ready()
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        forward(state, x).block_until_ready()
        times.append(time.perf_counter() - t)
    probs = None
    if args.agree_images:
        xs = inputs(args.agree_images, args.image_size, 1)
        probs = np.concatenate([np.asarray(forward(state, xs[i:i + args.batch]))
                                for i in range(0, len(xs), args.batch)])
    return times, probs


def worker_hf(args, dtype: str = "float32"):
    import torch
    from transformers import ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    model = ViTForImageClassification.from_pretrained(args.checkpoint).eval()
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    x = torch.from_numpy(inputs(args.batch, args.image_size, 0).transpose(0, 3, 1, 2).copy())
    x = x.to(model.dtype)
    times, probs = [], None
    with torch.inference_mode():
        model(pixel_values=x)  # warm-up
        for _ in range(args.iters):
            t = time.perf_counter()
            model(pixel_values=x)
            times.append(time.perf_counter() - t)
        if args.agree_images:
            xs = torch.from_numpy(inputs(args.agree_images, args.image_size, 1)
                                  .transpose(0, 3, 1, 2).copy()).to(model.dtype)
            probs = torch.cat([torch.softmax(
                model(pixel_values=xs[i:i + args.batch]).logits.float(), -1)
                               for i in range(0, len(xs), args.batch)]).numpy()
    return times, probs


def make_checkpoint(folder: str, args) -> None:
    import torch
    import transformers

    import vit

    cfg = vit.get_config(args.model, image_size=args.image_size)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_dim, image_size=args.image_size, patch_size=cfg.patch_size[0],
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


def run_worker(kind: str, args, folder: str, agree: bool):
    env = dict(os.environ)
    if kind == "baseline":  # our float32 worker, with `vit` imported from the baseline copy
        env["PYTHONPATH"] = args.baseline
    if kind == "ours_float32_ynn":  # jax's default XLA:CPU dots (see vit/inference/xla_cpu.py)
        env["VIT_XLA_DOTS"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--model", args.model,
           "--batch", str(args.batch), "--image-size", str(args.image_size),
           "--iters", str(args.iters), "--checkpoint", os.path.join(folder, "model"),
           "--agree-images", str(args.agree_images if agree else 0),
           "--probs-out", os.path.join(folder, f"{kind}.npy")]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env)
    if out.returncode:
        sys.exit(f"worker {kind} failed:\n{out.stderr[-3000:]}")
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return args.batch / statistics.median(times)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_b16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="our compute dtypes to time (comma-separated)")
    parser.add_argument("--agree-images", type=int, default=64,
                        help="images for the agreement check in the first round (0: none)")
    parser.add_argument("--out", default=records.default_out("bench_inference"))
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="also time our float32 model from this copy (an earlier commit)")
    parser.add_argument("--ynn", action="store_true",
                        help="also time our float32 model with jax's default XLA:CPU dots "
                             "(YNNPACK; VIT_XLA_DOTS=0, see vit/inference/xla_cpu.py), in the "
                             "same rounds")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", default=None, metavar="DIR",
                        help="a Hugging Face ViT folder both sides load (default: random "
                             "weights made here; --model and --image-size must match it)")
    parser.add_argument("--probs-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import numpy as np

        if args.worker in ("hf", "hf_bfloat16"):
            times, probs = worker_hf(args, "bfloat16" if args.worker == "hf_bfloat16"
                                     else "float32")
        else:
            dtype = ("float32" if args.worker in ("baseline", "ours_float32_ynn")
                     else args.worker.split("_", 1)[1])
            times, probs = worker_ours(args, dtype)
        if probs is not None:
            np.save(args.probs_out, np.asarray(probs, np.float32), allow_pickle=False)
        print(json.dumps(times))
        return
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
            make_checkpoint(os.path.join(folder, "model"), args)
        agree = None
        for i in range(args.rounds):
            # Rotate the order, so no contestant always meets a warmer or cooler machine.
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            r = {kind: run_worker(kind, args, folder, agree=i == 0 and args.agree_images > 0)
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
        "benchmark": "inference",
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
    records.write(args.out, result, extra_packages=("torch", "transformers"))
    print(json.dumps({k: result[k] for k in ("img_s_median", "ratio_to_transformers_median",
                                             "ours_bfloat16_ratio_to_hf_bfloat16_median",
                                             "ratio_to_baseline_median", "agreement")
                      if k in result}, indent=1))


if __name__ == "__main__":
    main()
