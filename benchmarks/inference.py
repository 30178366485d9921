"""Inference speed: our ViT as `vit predict` compiles it against transformers', float32 and
bfloat16, from one folder of random weights, each side in its own process, rounds rotated."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile

from benchmarks import common, peers, tables

MODEL, BATCH, IMAGE_SIZE = "vit_b16", 8, 224


def _images(batch: int, size: int):
    import numpy as np

    return np.random.RandomState(0).randn(batch, size, size, 3).astype(np.float32)  # NHWC


def side_ours(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int) -> dict:
    x = _images(batch, image_size)
    forward = common.our_forward(checkpoint, dtype, x)
    return common.time_call(lambda: forward(x), warmup=1, repeats=iters)


def side_hf(checkpoint: str, dtype: str, batch: int, image_size: int, iters: int) -> dict:
    import torch

    model = peers.load(checkpoint, dtype)
    x = peers.pixels(_images(batch, image_size), model.dtype)
    with torch.inference_mode():
        return common.time_call(lambda: model(pixel_values=x), warmup=1, repeats=iters)


def run(kind: str, args, folder: str) -> float:
    return BATCH / common.run_side(
        f"benchmarks.inference:{'side_hf' if kind.startswith('hf') else 'side_ours'}",
        {"checkpoint": os.path.join(folder, "model"), "batch": BATCH,
         "dtype": "bfloat16" if kind.endswith("bfloat16") else "float32",
         "image_size": IMAGE_SIZE, "iters": args.iters},
        pythonpath=args.baseline if kind == "baseline" else None, cwd=folder)["median_s"]


def main(argv: list[str]) -> None:
    args = common.parser("inference", __doc__, iters=8, rounds=3, baseline=(
        None, "also our float32 model from this copy of an earlier commit")).parse_args(argv)
    kinds = ["ours_float32", "ours_bfloat16", *(["baseline"] if args.baseline else []), "hf",
             "hf_bfloat16"]
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        common.run_side("benchmarks.peers:save_random",
                        {"folder": os.path.join(folder, "model"), "variant": MODEL,
                         "image_size": IMAGE_SIZE})
        for i in range(args.rounds):
            r = {kind: run(kind, args, folder) for kind in kinds[i % len(kinds):]
                 + kinds[:i % len(kinds)]}
            r.update({f"{kind}_ratio": r[kind] / r["hf"] for kind in kinds if kind != "hf"})
            r["ours_bfloat16_ratio_to_hf_bfloat16"] = r["ours_bfloat16"] / r["hf_bfloat16"]
            if args.baseline:
                r["ratio_to_baseline"] = r["ours_float32"] / r["baseline"]
            rounds.append(r)
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    result = {
        "setup": {"model": MODEL, "batch": BATCH, "image_size": IMAGE_SIZE, "iters": args.iters,
                  "rounds": args.rounds},
        "rounds": rounds, "img_s_median": {k: med(k) for k in kinds},
        "ratio_to_transformers_median": {k: med(f"{k}_ratio") for k in kinds if k != "hf"},
        "ours_bfloat16_ratio_to_hf_bfloat16_median": med("ours_bfloat16_ratio_to_hf_bfloat16")}
    if args.baseline:
        commit = subprocess.run(["git", "-C", args.baseline, "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        result.update(baseline={"dir": args.baseline, "commit": commit or None},
                      ratio_to_baseline_median=med("ratio_to_baseline"))
    common.write_record("inference", result, argv=argv, out=args.out)


def table(r: dict) -> list[str]:
    s, speed, ratio, num = (r["setup"], r["img_s_median"], r["ratio_to_transformers_median"],
                            tables.num)
    rows = [[label, num(speed[kind]), "1.00" if kind == "hf" else num(ratio[kind])]
            for label, kind in (("vit, float32", "ours_float32"),
                                ("vit, bfloat16", "ours_bfloat16"),
                                ("transformers, float32", "hf"),
                                ("transformers, bfloat16", "hf_bfloat16"))]
    like = r["ours_bfloat16_ratio_to_hf_bfloat16_median"]
    tail = [f"bfloat16 against bfloat16: vit {num(like)}x transformers; vit's bfloat16 forward "
            f"{num(speed['ours_bfloat16'] / speed['ours_float32'])}x its float32 one.",
            "Images/s by round, " + ", ".join(
                f"{who} bfloat16 {num(min(v), 1)}-{num(max(v), 1)}" for who, v in
                (("vit", [x["ours_bfloat16"] for x in r["rounds"]]),
                 ("transformers", [x["hf_bfloat16"] for x in r["rounds"]]))) + "."]
    if "ratio_to_baseline_median" in r:
        by_round = [x["ours_float32"] / x["baseline"] for x in r["rounds"]]
        tail.append(f"vit float32 against `--baseline` (the older code): "
                    f"{num(r['ratio_to_baseline_median'])}x, the median of the per-round ratios ("
                    + ", ".join(num(x) for x in by_round) + ").")
    return [f"`{s['model']}`, batch {s['batch']}, {s['image_size']} px, median of "
            f"{s['rounds']} rounds:", "",
            *tables.table(["model", "images/s", "vs transformers"], rows), "", *tail]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    ratio, like = r["ratio_to_transformers_median"], r["ours_bfloat16_ratio_to_hf_bfloat16_median"]
    return [("float32 forward at least 1.10x transformers float32",
             f"{ratio['ours_float32']:.2f}x", ratio["ours_float32"] >= 1.1),
            ("bfloat16 forward at least 1.50x transformers float32",
             f"{ratio['ours_bfloat16']:.2f}x", ratio["ours_bfloat16"] >= 1.5),
            ("bfloat16 forward at least 1.00x transformers bfloat16", f"{like:.2f}x", like >= 1.0)]
