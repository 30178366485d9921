"""Records a text-conditioning recipe: trains it, evaluates it, writes the figures.

The recipe trains (all stages) into a fresh workdir, `vit eval --json` evaluates it, and the record
holds the figures and the wall time of each stage and of the whole run. The eval's `questions` hold
every question asked of every test scene (balanced accuracy and AUC for seen questions, held-out
pairs and held-out wordings, false-yes by what the scene shares, yes-rates on never-seen words and
on prompts of unknown words). For `fashion_scenes` the record also holds `pointing`: how often the
relevancy map of a question about a present item (what `vit rollout --prompt` draws) has its
strongest patch on that item.

    python -m benchmarks text                                   # promptshapes -> promptshapes
    python -m benchmarks text --config configs/fashion_scenes.py --record fashion_scenes
    python -m benchmarks text --labels attributes --record promptshapes_attribute_labels
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
LABELS = ("pairs", "attributes")


def recipe_path(config: str) -> Path:
    """`--config`: a recipe's path, or its name in configs/ ("fashion_scenes")."""
    path = Path(config)
    if path.suffix != ".py":
        path = ROOT / "configs" / f"{config}.py"
    if not path.is_file():
        raise SystemExit(f"--config {config}: no such recipe; give a path or a name in configs/")
    return path


def stage_results(workdir: Path) -> dict:
    """Per stage (its folder name; the last stage trains in the workdir itself): the steps
    trained and the last validation record of its metrics.jsonl."""
    out = {}
    for metrics in sorted(workdir.glob("**/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        train = [r for r in rows if r.get("split") == "train"]
        val = [r for r in rows if r.get("split") == "validation"]
        name = metrics.parent.name if metrics.parent != workdir else "final"
        out[name] = {"steps": train[-1]["step"] if train else 0,
                     "last_validation": val[-1] if val else None}
    return out


def open_source_with(labels: str):
    """`vit.data.open_source` with promptshapes' ViT-stage labels set to `labels`, and
    `fashion_scenes` opened where the installed `vit.data` does not name it yet."""
    from vit.data import sources

    plain = sources.open_source

    def open_source(name, split, **kw):
        if name == "promptshapes" and labels != "pairs":
            from vit.data.promptshapes import PromptShapesSource

            return PromptShapesSource(split, labels=labels)
        if name == "fashion_scenes" and name not in sources.BUILT_IN:
            from vit.data.fashion_scenes import FashionScenesSource

            return FashionScenesSource(split, data_dir=kw.get("data_dir"))
        return plain(name, split, **kw)

    return open_source


def vit_with_sources(argv: list[str]) -> int:
    """`python -m benchmarks.text LABELS VIT_ARGS...`: the `vit` command with
    `open_source_with(LABELS)` in place of `vit.data.open_source`, wherever training, the dry
    run and evaluation look it up."""
    import vit.data
    import vit.data.sources
    import vit.train.dry_run
    import vit.train.loop

    opener = open_source_with(argv[0])
    for module in (vit.data, vit.data.sources, vit.train.loop, vit.train.dry_run):
        module.open_source = opener
    from vit.cli import main as vit_main

    return vit_main(argv[1:])


def vit_command(data: str, labels: str) -> list[str]:
    """The `vit` command line for a run: the package's own CLI when it opens the data as the
    recipe asks, else the CLI through `vit_with_sources`."""
    from vit.data.sources import BUILT_IN

    if labels == "pairs" and data in BUILT_IN:
        return [sys.executable, "-m", "vit.cli"]
    return [sys.executable, "-m", "benchmarks.text", labels]


def pointing_prompts(scenes: int) -> dict[str, list[tuple[int, str, object]]]:
    """fashion_scenes' test scenes, prompts and boxes whose relevancy maps `pointing` scores:
    for each of the first `scenes` scenes a class question about one present item (chosen with
    a fixed seed), and the first `scenes` questions about a present item in a held-out
    (class, region)."""
    import numpy as np

    from vit.data import fashion_scenes as fs

    data = fs.FashionScenesSource("test").data
    rng = np.random.default_rng(0)
    seen, held = [], []
    for n, scene in enumerate(data.scenes.tolist()[:scenes]):
        cells = [i for i, c in enumerate(scene) if c >= 0]
        i = cells[int(rng.integers(len(cells)))]
        seen.append((n, fs.question_text("class", fs.CLASSES[scene[i]]), data.boxes[n, i]))
    for n, scene in enumerate(data.scenes.tolist()):
        for i, c in enumerate(scene):
            for region in (fs._CELL_REGIONS[i] if c >= 0 else ()):
                if (fs.CLASSES[c], region) in fs.HELDOUT_REGIONS and len(held) < scenes:
                    held.append((n, fs.question_text("region", (fs.CLASSES[c], region)),
                                 data.boxes[n, i]))
    return {"seen_class_questions": seen, "heldout_region_questions": held}


POINTING_PROMPTS = {"seen_class_questions": "a present item's class question",
                    "heldout_region_questions": "a present held-out (class, region)"}


def pointing(workdir: Path, scenes: int) -> dict:
    """`pointing` of a trained fashion_scenes workdir (`vit.explain.text.pointing_rate`)."""
    import numpy as np
    from PIL import Image

    from vit.checkpoints import load_checkpoint
    from vit.data import fashion_scenes as fs
    from vit.explain.text import pointing_rate

    loaded = load_checkpoint(str(workdir))
    model = loaded.build_model()
    images = fs.FashionScenesSource("test").data.images
    out = {}
    for key, rows in pointing_prompts(scenes).items():
        batch = np.stack([loaded.preprocessing(Image.fromarray(images[n])) for n, _, _ in rows])
        out[key] = {**pointing_rate(model, batch, [p for _, p, _ in rows],
                                    np.stack([b for _, _, b in rows])),
                    "prompts": POINTING_PROMPTS[key]}
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks text",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", default="promptshapes",
                   help="the recipe: a path, or a name in configs/ (default promptshapes)")
    p.add_argument("--record", default=None,
                   help="the record's name, benchmarks/records/NAME.json (default: the recipe's)")
    p.add_argument("--labels", choices=LABELS, default="pairs",
                   help="promptshapes' ViT-stage labels: colour-shape pairs (the recipe's), or "
                        "colours and shapes apart (the ablation)")
    p.add_argument("--pointing-scenes", type=int, default=200, metavar="N",
                   help="fashion_scenes: test scenes per pointing figure (0: none)")
    p.add_argument("--workdir", default=None, help="default runs/bench_RECORD")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    return p


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    config = recipe_path(args.config)
    name = args.record or config.stem
    workdir = Path(args.workdir or ROOT / "runs" / f"bench_{name}")
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run: the timing covers every stage
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    vit = vit_command(config.stem, args.labels)
    train = vit + ["train", "--config", str(config), "--workdir", str(workdir)] + \
        [f"--set={s}" for s in args.set]
    start = time.time()
    subprocess.run(train, check=True, env=env, cwd=ROOT)
    train_s = time.time() - start
    start = time.time()
    done = subprocess.run(vit + ["eval", "--workdir", str(workdir), "--json"], check=True,
                          env=env, cwd=ROOT, capture_output=True, text=True)
    eval_s = time.time() - start
    report = json.loads(done.stdout.strip().splitlines()[-1])
    result = {
        "run": {"train": " ".join(["vit", *train[train.index("train"):]]),
                "eval": f"vit eval --workdir {workdir} --json",
                **({"labels": args.labels} if args.labels != "pairs" else {})},
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "stages": stage_results(workdir),
        "eval": report,
    }
    if report.get("data") == "fashion_scenes" and args.pointing_scenes:
        result["pointing"] = pointing(workdir, args.pointing_scenes)
    common.write_record(name, result, argv=argv, mode="text", out=args.out,
                        extra_packages=("grain",))
    questions = report.get("questions", {})
    print(json.dumps({"train_seconds": result["train_seconds"], **{
        k: report.get(k) for k in ("accuracy", "controls", "heldout_accuracy")},
        **{group: {k: questions[group][k] for k in ("balanced_accuracy", "auc", "false_yes")}
           for group in ("seen", "heldout", "wording") if group in questions},
        **{f"{group}_yes_rate": questions[group]["yes_rate"]
           for group in ("never", "unknown") if group in questions},
        **({"pointing": result["pointing"]} if "pointing" in result else {})}))


if __name__ == "__main__":
    sys.exit(vit_with_sources(sys.argv[1:]))
