"""The training input pipeline on its own: its cost per image and the share of a step a
consumer waits for it.

For each case (the digits recipe; image folders of generated JPEGs at two sizes, with the
imagefolder recipe's augmentation at 224 px, each JPEG decoded in full and as training decodes
it), one thread's CPU milliseconds per image (`next()` back to back, nothing else running in
the process), then `--threads` threads feeding a consumer that spends `--step-ms` per step away
from Python (as a device step does): the share of its time spent in `next()`, which is what
`vit train` reports as `data_wait`.

    python scripts/bench_input.py                     # writes benchmarks/bench_input.json
    python scripts/bench_input.py --quick --out /tmp/input.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import records
from PIL import Image

sys.path.insert(0, str(records.ROOT))
from vit.data import Augment, open_source, train_iterator  # noqa: E402
from vit.data.sources import FolderSource  # noqa: E402
from vit.preprocess import Preprocessing  # noqa: E402

DIGITS_AUG = Augment(shift=1.0, rotate=8.0, scale=0.08, label_smoothing=0.1)  # configs/digits.py
FOLDER_AUG = Augment(inception_crop=True, crop_area=(0.25, 1.0), flip=True, label_smoothing=0.1)


def photos(root: Path, side: tuple[int, int], count: int) -> Path:
    """`count` JPEGs (quality 90) of `side` (w, h) in 4 classes: gradients and blotches, which
    compress like photos rather than like noise."""
    rng = np.random.default_rng(0)
    w, h = side
    y, x = np.mgrid[0:h, 0:w]
    for i in range(count):
        folder = root / f"c{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        blotches = rng.normal(0, 25, (h // 8 + 1, w // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)
        pixels = np.stack([x * 255 / w, y * 255 / h, (x + y + 60 * i) % 255], -1)
        Image.fromarray(np.clip(pixels + blotches[:h, :w], 0, 255).astype(np.uint8)).save(
            folder / f"{i}.jpg", quality=90)
    return root


def cpu_ms_per_image(source, pre, aug, batch: int, batches: int) -> float:
    it = train_iterator(source, pre, aug, batch_size=batch, seed=0, num_classes=10,
                        num_threads=0)
    next(it)
    start = time.process_time()
    for _ in range(batches):
        next(it)
    spent = time.process_time() - start
    it.close()
    return spent / (batches * batch) * 1000


def wait_share(source, pre, aug, batch: int, batches: int, threads: int, step_s: float) -> float:
    it = train_iterator(source, pre, aug, batch_size=batch, seed=0, num_classes=10,
                        num_threads=threads)
    for _ in range(3):  # the buffer's first fill is start-up, not the steady state
        next(it)
    waited, start = 0.0, time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        next(it)
        waited += time.perf_counter() - t
        time.sleep(step_s)
    share = waited / (time.perf_counter() - start)
    it.close()  # its threads stop filling the buffer: the next case runs alone
    return share


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4, help="data.num_threads for the folders")
    ap.add_argument("--step-ms", type=float, nargs="+", default=[5.0, 50.0, 200.0])
    ap.add_argument("--quick", action="store_true", help="fewer batches (a smoke run)")
    ap.add_argument("--out", default=records.default_out("bench_input"))
    args = ap.parse_args(argv)
    n = 3 if args.quick else 10
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("digits", open_source("digits", "train"), Preprocessing(size=(8, 8)),
                  DIGITS_AUG, 64, 1, n * 10)]
        for w, h in ((500, 375), (2000, 1500)):
            root = photos(Path(tmp) / f"{w}x{h}", (w, h), 32 if args.quick else 64)
            source = open_source(str(root), "train", val_fraction=0.0)
            for decode in ("full", "as training decodes"):
                if decode == "full":  # the pipeline would hand it a reduced copy: refuse that
                    source = _full(source)
                cases.append((f"folder {w}x{h} JPEG, {decode}", source,
                              Preprocessing(size=(224, 224)), FOLDER_AUG, 32, args.threads, n))
                source = open_source(str(root), "train", val_fraction=0.0)
        for name, source, pre, aug, batch, threads, batches in cases:
            row = {"case": name, "batch": batch, "threads": threads,
                   "cpu_ms_per_image": round(cpu_ms_per_image(source, pre, aug, batch, batches),
                                             3)}
            for step_ms in args.step_ms:
                share = wait_share(source, pre, aug, batch, batches, threads, step_ms / 1000)
                row[f"wait_share_at_{step_ms:g}_ms_steps"] = round(share, 4)
            print(row, flush=True)
            results.append(row)
        time.sleep(2)  # a closed iterator's last running batch ends before its files go
    print(records.write(args.out, {"results": results}, extra_packages=("grain", "pillow")))


class _FullDecode(FolderSource):
    """A folder source that ignores the training decode hint: every JPEG read in full."""

    def decoding_at_least(self, min_side: int) -> FolderSource:
        return self


def _full(source: FolderSource) -> FolderSource:
    out = _FullDecode.__new__(_FullDecode)
    out.__dict__.update(source.__dict__)
    return out


if __name__ == "__main__":
    main()
