"""`vit predict` against the transformers image-classification pipeline on the same random
ViT-B/16 and JPEGs, passes interleaved; and one image's start-up (`predict_startup`)."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import common, peers, tables


def make_images(folder: Path, n: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    folder.mkdir()
    for i in range(n):
        h, w = rng.randint(180, 480, size=2)
        Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(
            folder / f"img_{i:03d}.jpg", quality=90)
    return folder


HF_FIRST_PREDICTION = """
import sys, time
start = time.perf_counter()
from transformers import pipeline
pipe = pipeline("image-classification", model=sys.argv[1], device=-1)
pipe([sys.argv[2]], top_k=5)
print(time.perf_counter() - start)
"""


def start_up(model: Path, image: Path, cache: Path, rounds: int) -> dict:
    """One image, process start to exit, median of `rounds` from an empty cache: cold, JAX's
    compile cache only, warm, and transformers' pipeline in a fresh process."""
    os.environ.pop("JAX_ENABLE_COMPILATION_CACHE", None)  # the cache folder alone decides
    ours = ["vit", "predict", str(image), "--checkpoint", str(model), "--top-k", "5"]
    theirs = [sys.executable, "-c", HF_FIRST_PREDICTION, str(model), str(image)]
    times, logs = {}, {}
    for _ in range(rounds):
        shutil.rmtree(cache, ignore_errors=True)
        for key, cmd in (("vit_cold", ours), ("vit_warm", ours),
                         ("vit_compile_cache_only", ours), ("transformers", theirs)):
            if key == "vit_compile_cache_only":
                shutil.rmtree(cache / "prepared", ignore_errors=True)
            done = common.run_cli(cmd, env={"VIT_CACHE_DIR": str(cache)}, capture=True)
            times.setdefault(f"{key}_s", []).append(done["wall_s"])
            logs[key] = next((x for x in done["stderr"].splitlines() if "ready in" in x), None)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {**median, "rounds": times, **{
        f"{a.removeprefix('vit_')}_over_{b.removeprefix('vit_')}":
            median[f"{a}_s"] / median[f"{b}_s"] for a, b in (
                ("vit_cold", "vit_warm"), ("vit_cold", "vit_compile_cache_only"),
                ("transformers", "vit_warm"), ("transformers", "vit_cold"))},
            "vit_ready_lines": {k: v for k, v in logs.items() if k != "transformers"},
            "cache_files": sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                                  if p.is_file())}


def main(argv: list[str]) -> None:
    args = common.parser("predict", __doc__, images=64, batch_size=16, repeats=3,
                         start_up_rounds=3).parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import torch
    import transformers

    from vit.checkpoints import load_checkpoint
    from vit.images import list_images
    from vit.inference.predictor import Predictor

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        peers.save_random(tmp / "model")
        files = list_images([make_images(tmp / "images", args.images)])
        fns = {}
        for dtype in ("float32", "bfloat16"):
            loaded = load_checkpoint(tmp / "model", dtype=dtype)
            predictor = Predictor(loaded.build_model(), loaded.preprocessing, loaded.labels,
                                  top_k=5, batch_size=args.batch_size)
            fns[f"vit_{dtype}"] = lambda p=predictor: list(p.predict_files(files))
        pipe = transformers.pipeline("image-classification", model=str(tmp / "model"),
                                     device=-1)
        fns["transformers"] = lambda: pipe([str(p) for p in files], top_k=5,
                                           batch_size=args.batch_size)
        timed = common.interleave(fns, rounds=args.repeats)
        times = {k: v["times_s"] for k, v in timed.items()}
        startup = start_up(tmp / "model", files[0], tmp / "cache", args.start_up_rounds)
    n = len(files)
    path = common.write_record("predict", {
        "torch_threads": torch.get_num_threads(),
        "task": f"top-5 classification of {n} JPEGs (180-480 px) with random-weight ViT-B/16 "
                f"at 224 px, batch {args.batch_size}, after one warm-up pass, "
                f"{args.repeats} interleaved rounds of one pass each",
        "images_per_s": {k: n / v["min_s"] for k, v in timed.items()},
        "ratio_median_of_rounds": {
            k: statistics.median(t / o for t, o in zip(times["transformers"], v, strict=True))
            for k, v in times.items() if k != "transformers"},
        "pass_seconds": times}, argv=argv, out=args.out)
    common.write_record("predict_startup", {"start_up_one_image": startup}, argv=argv,
                        mode="predict", out=path.with_name("predict_startup.json"))


def table(r: dict) -> list[str]:
    """`predict` (throughput) or `predict_startup`."""
    num = tables.num
    if r["benchmark"] == "predict_startup":
        start = r["start_up_one_image"]
        ready = start["vit_ready_lines"]
        rows = [[label, num(start[f"{key}_s"], 1), f"`{ready[key]}`" if key in ready else ""]
                for key, label in (("vit_cold", "`vit predict`, cold (empty cache)"),
                                   ("vit_compile_cache_only",
                                    "`vit predict`, JAX's compile cache only"),
                                   ("vit_warm", "`vit predict`, warm (prepared classifier)"),
                                   ("transformers", "transformers, first prediction"))]
        return ["One image, process start to exit, median of "
                f"{len(start['rounds']['vit_cold_s'])} rounds (seconds):", "",
                *tables.table(["", "seconds", "`ready` line"], rows)]
    speed, median = r["images_per_s"], r["ratio_median_of_rounds"]
    rows = [[f"`vit predict`, {d}", num(speed[f"vit_{d}"]), num(median[f"vit_{d}"])]
            for d in ("float32", "bfloat16")]
    rows.append(["transformers pipeline, float32", num(speed["transformers"]), "1.00"])
    return [f"{r['task'][0].upper()}{r['task'][1:]}:", "",
            *tables.table(["", "images/s (best pass)", "vs transformers (median of rounds)"],
                          rows)]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    if r["benchmark"] == "predict_startup":
        gain = r["start_up_one_image"]["cold_over_warm"]
        return [("`vit predict` on one image: warm at least 2.00x faster than cold",
                 f"{gain:.2f}x", gain >= 2)]
    ratio = {k.removeprefix("vit_"): v for k, v in r["ratio_median_of_rounds"].items()}
    return [(f"`vit predict` in {dtype} at least {need:.2f}x the pipeline in float32",
             f"{ratio[dtype]:.2f}x", ratio[dtype] >= need)
            for dtype, need in (("float32", 1.1), ("bfloat16", 1.5))]
