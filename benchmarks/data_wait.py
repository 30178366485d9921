"""The share of `vit train`'s wall time spent waiting for input (`data_wait`), on the digits
recipe and on generated JPEGs, with the pipeline's rate alone. Target: at most five percent."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks import common
from benchmarks import tables as T

FOLDER_SETS = ["model.name=Ti/16", "input.image_size=96", "train.batch_size=32",
               "model.dtype=float32"]


def make_photos(root: Path, per_class: int = 200) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("cats", "dogs"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = rng.integers(0, 255, (1, 1, 3))
            img = np.clip(base + rng.normal(0, 40, (240, 320, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / name / f"{i}.jpg", quality=90)
    return root


def train(recipe: str, workdir: Path, steps: int, sets: list[str]) -> dict:
    run = common.vit_train(recipe, workdir, [
        *sets, f"train.steps={steps}", f"train.log_every={max(steps // 6, 1)}",
        f"train.eval_every={steps}", f"train.checkpoint_every={steps}"])
    rows = common.metrics(workdir, "train")
    later = rows[1:] or rows
    return {"recipe": recipe, "overrides": sets, "steps": steps, "wall_s": run["wall_s"],
            "data_wait_per_window": [round(r["data_wait"], 4) for r in rows],
            "data_wait_median_after_first": statistics.median(r["data_wait"] for r in later),
            "images_per_s_median_after_first": statistics.median(r["images_per_s"]
                                                                 for r in later),
            "pipeline_alone_images_per_s": pipeline_rate(recipe, sets)}


def pipeline_rate(recipe: str, sets: list[str], batches: int = 15) -> float:
    from vit.data import open_source, train_iterator
    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types
    from vit.training.from_recipe import augment_of, preprocessing_of

    cfg = load_config(recipe, sets, model_field_types=model_field_types)
    src = open_source(cfg.data.name, cfg.data.train_split)
    it = train_iterator(src, preprocessing_of(cfg), augment_of(cfg),
                        batch_size=cfg.train.batch_size, seed=0,
                        num_classes=len(src.class_names), num_threads=cfg.data.num_threads)
    per_batch = common.time_call(lambda: next(it), repeats=1, number=batches)["median_s"]
    return cfg.train.batch_size / per_batch


def main(argv: list[str]) -> None:
    args = common.parser("data_wait", __doc__, digits_steps=300, folder_steps=60).parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder_sets = [f"data.name={make_photos(tmp / 'photos')}", *FOLDER_SETS]
        runs = {"digits": train("digits", tmp / "digits", args.digits_steps, []),
                "folder": train("imagefolder", tmp / "folder", args.folder_steps, folder_sets)}
        runs["folder"]["overrides"] = ["data.name=<400 generated 320x240 JPEGs>", *FOLDER_SETS]
    common.write_record("data_wait", {"target": "data_wait <= 0.05", "runs": runs}, argv=argv,
                        out=args.out)


def table(r: dict) -> list[str]:
    rows = [[name, run["recipe"], run["steps"],
             " / ".join(T.pct(x) for x in run["data_wait_per_window"]),
             T.pct(run["data_wait_median_after_first"]),
             T.num(run["images_per_s_median_after_first"], 1),
             T.num(run["pipeline_alone_images_per_s"], 0)] for name, run in r["runs"].items()]
    return ["The share of `vit train`'s wall time spent waiting for the input pipeline, per "
            f"logging window (target: {r['target']}):", "",
            *T.table(["run", "recipe", "steps", "waiting, by window", "median after the first",
                      "training img/s", "pipeline alone img/s"], rows), "",
            f"Load average while measured: {r['machine']['load_average'][0]:.1f} (the machine "
            "was shared)."]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    return [(f"{name}: at most 5.0% of the wall time waiting for data",
             T.pct(run["data_wait_median_after_first"]),
             run["data_wait_median_after_first"] <= 0.05) for name, run in r["runs"].items()]
