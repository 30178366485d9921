"""Inference speed: our ViT (float32 and bfloat16, compiled as `vit predict` compiles it) against
transformers' in float32 and bfloat16, from one Hugging Face folder (random weights from
`peers.save_random`, or `--checkpoint DIR`); each side a process of its own, the order rotated
round by round, each claim the median of the per-round ratios. The first round also measures
top-1 agreement with transformers float32. `--baseline DIR`: our float32 model from an export
of an older commit (`git archive REV | tar -x -C runs/before`), timed in the same rounds.

    python -m benchmarks inference [--rounds 3] [--iters 8] [--ynn] [--baseline DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import common, peers, tables


def inputs(n: int, size: int, seed: int):
    import numpy as np

    return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)  # NHWC


def _save(path: str, probs) -> None:
    import numpy as np

    np.save(path, probs.astype(np.float32), allow_pickle=False)


def side_ours(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int,
              agree_images: int, probs_out: str) -> dict:
    import numpy as np

    x = inputs(batch, image_size, 0)
    forward = common.our_forward(checkpoint, dtype, x)
    timing = common.time_call(lambda: forward(x), warmup=1, repeats=iters)
    if agree_images:
        xs = inputs(agree_images, image_size, 1)
        _save(probs_out, np.concatenate([np.asarray(forward(xs[i:i + batch]))
                                         for i in range(0, len(xs), batch)]))
    return timing


def side_hf(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int,
            agree_images: int, probs_out: str) -> dict:
    import torch

    model = peers.load(checkpoint, dtype)
    x = peers.pixels(inputs(batch, image_size, 0), model.dtype)
    with torch.inference_mode():
        timing = common.time_call(lambda: model(pixel_values=x), warmup=1, repeats=iters)
    if agree_images:
        _save(probs_out, peers.probabilities(model, inputs(agree_images, image_size, 1),
                                             batch=batch, float64=False))
    return timing


def run(kind: str, args, folder: str, agree: bool) -> float:
    """Images/s of contestant `kind`, from its own process."""
    ours = not kind.startswith("hf")
    timing = common.run_side(
        f"benchmarks.inference:{'side_ours' if ours else 'side_hf'}",
        {"checkpoint": os.path.join(folder, "model"), "batch": args.batch,
         "dtype": "bfloat16" if kind in ("ours_bfloat16", "hf_bfloat16") else "float32",
         "image_size": args.image_size, "iters": args.iters,
         "agree_images": args.agree_images if agree else 0,
         "probs_out": os.path.join(folder, f"{kind}.npy")},
        # jax's default XLA:CPU dots (vit/cpu/xla_options.py) for `ours_float32_ynn`
        env={"VIT_XLA_DOTS": "0"} if kind == "ours_float32_ynn" else {},
        pythonpath=args.baseline if kind == "baseline" else None, cwd=folder)
    return args.batch / timing["median_s"]


def agreement(folder: str, kinds) -> dict:
    import numpy as np

    load = lambda kind: np.load(os.path.join(folder, f"{kind}.npy"), allow_pickle=False)  # noqa: E731
    ref = load("hf")
    out = {kind: {"top1_agreement_with_transformers": float(np.mean(
                      load(kind).argmax(1) == ref.argmax(1))),
                  "max_prob_error": float(np.abs(load(kind) - ref).max())} for kind in kinds}
    if "ours_bfloat16" in kinds:
        a, b = load("ours_float32"), load("ours_bfloat16")
        out["bfloat16_vs_float32"] = {"top1_agreement": float(np.mean(a.argmax(1) ==
                                                                      b.argmax(1))),
                                      "max_prob_error": float(np.abs(a - b).max())}
    top2 = np.sort(ref, axis=1)[:, -2:]
    return {**out, "images": int(len(ref)), "distinct_top1": len(set(ref.argmax(1).tolist())),
            "near_ties": int(np.sum(top2[:, 1] - top2[:, 0] < 0.01))}  # top-2 within 0.01


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
    ours = [f"ours_{d}" for d in args.dtypes.split(",") if d] + (
        ["ours_float32_ynn"] if args.ynn else [])
    peer = ["hf"] + (["hf_bfloat16"] if "ours_bfloat16" in ours else [])
    kinds = ours + (["baseline"] if args.baseline else []) + peer
    rounds, agree = [], None
    with tempfile.TemporaryDirectory() as folder:
        if args.checkpoint:
            os.symlink(os.path.abspath(args.checkpoint), os.path.join(folder, "model"))
        else:
            common.run_side("benchmarks.peers:save_random",
                            {"folder": os.path.join(folder, "model"), "variant": args.model,
                             "image_size": args.image_size})
        for i in range(args.rounds):
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            r = {kind: run(kind, args, folder, agree=i == 0 and args.agree_images > 0)
                 for kind in order}
            r.update({f"{kind}_ratio": r[kind] / r["hf"] for kind in kinds if kind != "hf"})
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
        commit = subprocess.run(["git", "-C", args.baseline, "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        result["baseline"] = {"dir": args.baseline, "commit": commit or None}
        result["ratio_to_baseline_median"] = med("ratio_to_baseline")
    common.write_record("inference", result, argv=argv, out=args.out)


def table(r: dict) -> list[str]:
    s, speed, ratio, agree = (r["setup"], r["img_s_median"], r["ratio_to_transformers_median"],
                              r["agreement"])
    n, num = agree["images"], tables.num

    def agreed(kind: str) -> list[str]:
        a = agree.get(kind)
        return ([f"{round(a['top1_agreement_with_transformers'] * n)} of {n}",
                 f"{a['max_prob_error']:.1e}"] if a else ["", ""])

    rows = [[f"vit, {d}", num(speed[f"ours_{d}"]), num(ratio[f"ours_{d}"]), *agreed(f"ours_{d}")]
            for d in ("float32", "bfloat16") if f"ours_{d}" in speed]
    rows.append(["transformers, float32", num(speed["hf"]), "1.00", "", ""])
    if "hf_bfloat16" in speed:
        rows.append(["transformers, bfloat16", num(speed["hf_bfloat16"]),
                     num(ratio["hf_bfloat16"]), *agreed("hf_bfloat16")])
    tail = []
    like = r.get("ours_bfloat16_ratio_to_hf_bfloat16_median")
    if like is not None:
        tail.append(f"bfloat16 against bfloat16: vit {num(like)}x transformers; vit's bfloat16 "
                    f"forward {num(speed['ours_bfloat16'] / speed['ours_float32'])}x its "
                    "float32 one.")
        spread = {k: [x[k] for x in r["rounds"]] for k in ("ours_bfloat16", "hf_bfloat16")}
        tail.append("Images/s by round, " + ", ".join(
            f"{who} bfloat16 {num(min(v), 1)}-{num(max(v), 1)}" for who, v in
            zip(("vit", "transformers"), spread.values(), strict=True)) + ".")
    base = r.get("ratio_to_baseline_median")
    if base is not None:
        by_round = [x["ours_float32"] / x["baseline"] for x in r["rounds"]]
        tail.append(f"vit float32 against `--baseline` (the older code): {num(base)}x, the median "
                    "of the per-round ratios (" + ", ".join(num(x) for x in by_round) + ").")
    return [f"`{s['model']}`, batch {s['batch']}, {s['image_size']} px, median of "
            f"{s['rounds']} rounds:", "",
            *tables.table(["model", "images/s", "vs transformers", "top-1 = transformers'",
                           "largest probability difference"], rows), *([""] + tail if tail else [])]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    ratio = r["ratio_to_transformers_median"]
    like = r.get("ours_bfloat16_ratio_to_hf_bfloat16_median")
    out = [("float32 forward at least 1.10x transformers float32",
            f"{ratio['ours_float32']:.2f}x", ratio["ours_float32"] >= 1.1)]
    if "ours_bfloat16" in ratio:
        out.append(("bfloat16 forward at least 1.50x transformers float32",
                    f"{ratio['ours_bfloat16']:.2f}x", ratio["ours_bfloat16"] >= 1.5))
    if like is not None:
        out.append(("bfloat16 forward at least 1.00x transformers bfloat16", f"{like:.2f}x",
                    like >= 1.0))
    return out
