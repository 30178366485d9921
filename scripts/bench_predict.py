"""Benchmark `vit predict` against the transformers image-classification pipeline.

Both classify the same folder of generated images with the same random-weight ViT-B/16, saved
once as a Hugging Face folder (nothing is downloaded), on the CPU, in the same run. Each side
gets one untimed warm-up pass (our compile, torch's first-call setup); the timed pass covers
decode, preprocessing, forward and top-k. Writes benchmarks/bench_predict.json.

    .venv/bin/python scripts/bench_predict.py [--images 32] [--batch-size 16] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402


def make_images(folder: Path, n: int) -> list[Path]:
    rng = np.random.RandomState(0)
    paths = []
    for i in range(n):
        h, w = rng.randint(180, 480, size=2)
        path = folder / f"img_{i:03d}.jpg"
        Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def time_best(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/bench_predict.json")
    args = parser.parse_args()

    import jax
    import torch
    import transformers

    from vit.predict import Predictor, collect_images, load_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        torch.manual_seed(0)
        hf_model = transformers.ViTForImageClassification(transformers.ViTConfig())  # B/16
        hf_model.save_pretrained(tmp / "model")
        transformers.ViTImageProcessor().save_pretrained(tmp / "model")
        (tmp / "images").mkdir()
        paths = make_images(tmp / "images", args.images)
        files = collect_images([tmp / "images"])
        assert len(files) == len(paths)

        model, preprocess, labels = load_pretrained(tmp / "model")
        predictor = Predictor(model, preprocess, labels, top_k=5, batch_size=args.batch_size)
        ours_rows = []

        def ours():
            ours_rows[:] = list(predictor.predict_files(files))

        pipe = transformers.pipeline("image-classification", model=str(tmp / "model"),
                                     device=-1)
        theirs_rows = []

        def theirs():
            theirs_rows[:] = pipe([str(p) for p in files], top_k=5, batch_size=args.batch_size)

        ours_s = time_best(ours, args.repeats)
        theirs_s = time_best(theirs, args.repeats)
        label2id = hf_model.config.label2id
        agree = np.mean([o["top_k"][0]["index"] == label2id[t[0]["label"]]
                         for o, t in zip(ours_rows, theirs_rows, strict=True)])

    n = len(files)
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "jax_devices": [str(d) for d in jax.devices()],
                    "torch_threads": torch.get_num_threads()},
        "versions": {"jax": jax.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "task": f"top-5 classification of {n} JPEGs (180-480 px) with random-weight ViT-B/16 "
                f"at 224 px, batch {args.batch_size}, after one warm-up pass, best of "
                f"{args.repeats}",
        "vit_images_per_s": n / ours_s,
        "transformers_pipeline_images_per_s": n / theirs_s,
        "ratio_vit_over_transformers": theirs_s / ours_s,
        "top1_agreement": float(agree),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
