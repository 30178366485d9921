"""Records a text-conditioning recipe: trains it, evaluates it, writes the figures.

The recipe trains (all stages) into a fresh workdir, `vit eval --json` evaluates it, and the record
holds the figures and the wall time of each stage and of the whole run. The eval's `questions` hold
every question asked of every test scene (balanced accuracy and AUC for seen questions, held-out
pairs and held-out wordings, false-yes by what the scene shares, yes-rates on never-seen words and
on prompts of unknown words). For `fashion_scenes` the record also holds `pointing`: how often the
relevancy map of a question about a present item (what `vit rollout --prompt` draws) has its
strongest patch on that item.

`--ablation` records what makes promptshapes' held-out pairs answerable instead: the recipe
changed one way at a time (`VARIANTS`: the ViT stage learning colour x shape pairs, the
cross-attention opened, both, a longer tune stage), each trained and evaluated as above. A
variant with the recipe's ViT-stage labels starts from `--init` (the recipe run's ViT stage)
where given; the pairs variants share one pairs ViT stage.

    python -m benchmarks text                                   # promptshapes -> promptshapes
    python -m benchmarks text --config configs/fashion_scenes.py --record fashion_scenes
    python -m benchmarks text --ablation --init runs/bench_promptshapes/stages/vit
                                                                # -> promptshapes_ablation
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
VIT = [sys.executable, "-m", "vit.cli"]
# The cross-attention opened: trained in both text stages, its gates at ten times the rate
# and without decay (the Flamingo recipe), as against the recipe's closed blocks.
OPEN_TEXT_PARTS = "(text_path|xattn|prompt_head)/.*"
OPEN = [f"stages.text.optim.trainable={OPEN_TEXT_PARTS}",
        f"stages.tune.optim.trainable={OPEN_TEXT_PARTS}|blocks/[23]/.*|norm/.*",
        "stages.text.optim.no_decay=.*_gate", "stages.tune.optim.no_decay=.*_gate",
        r"stages.text.optim.lr_mults=[['xattn/\d+/\w+_gate', 10.0]]",
        r"stages.tune.optim.lr_mults=[['xattn/\d+/\w+_gate', 10.0]]"]
PAIRS = ["data.labels=pairs"]
# The tune stage longer, over one more block.
LONGER_TUNE = ["stages.tune.train.steps=300",
               "stages.tune.optim.trainable=(text_path|prompt_head)/.*|blocks/[123]/.*|norm/.*"]
RECIPE = {"labels": "colours and shapes apart", "cross_attention": "closed",
          "tune": "blocks 2-3, 100 steps"}
# name -> how it differs from `RECIPE`, its --sets, and the variant whose ViT stage it starts
# from (None: --init where it keeps the recipe's labels, else its own).
VARIANTS = {
    "cross_attention_open": ({"cross_attention": "open"}, OPEN, None),
    "pair_labels": ({"labels": "colour x shape pairs"}, PAIRS, None),
    "pair_labels_cross_attention_open": (
        {"labels": "colour x shape pairs", "cross_attention": "open"}, PAIRS + OPEN,
        "pair_labels"),
    "longer_tune": ({"tune": "blocks 1-3, 300 steps"}, LONGER_TUNE, None),
}


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


def train_and_eval(config: Path, workdir: Path, sets: list[str], init: str | None) -> dict:
    """One fresh run of `config` into `workdir`, then `vit eval --json`: the commands, their
    times, each stage's last validation and the evaluation."""
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run: the timing covers every stage
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    train = VIT + ["train", "--config", str(config), "--workdir", str(workdir)] + \
        (["--init", str(init)] if init else []) + [f"--set={s}" for s in sets]
    start = time.time()
    subprocess.run(train, check=True, env=env, cwd=ROOT)
    train_s = time.time() - start
    start = time.time()
    done = subprocess.run(VIT + ["eval", "--workdir", str(workdir), "--json"], check=True,
                          env=env, cwd=ROOT, capture_output=True, text=True)
    eval_s = time.time() - start
    return {"run": {"train": " ".join(["vit", *train[train.index("train"):]]),
                    "eval": f"vit eval --workdir {workdir} --json"},
            "train_seconds": round(train_s, 1), "eval_seconds": round(eval_s, 1),
            "stages": stage_results(workdir),
            "eval": json.loads(done.stdout.strip().splitlines()[-1])}


def ablation(config: Path, root: Path, init: str | None, extra: list[str]) -> dict:
    """Every `VARIANTS` entry trained and evaluated, in order, each with `extra` --sets after
    its own. A variant starts from its base variant's ViT stage, else from `init` if it keeps
    the recipe's labels, else trains its own."""
    out = {}
    for name, (change, sets, base) in VARIANTS.items():
        start = (str(root / base / "stages" / "vit") if base else
                 None if PAIRS[0] in sets else init)
        out[name] = {**RECIPE, **change, "sets": sets + extra, "init": start,
                     **train_and_eval(config, root / name, sets + extra, start)}
    return {"variants": out}


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
    """`pointing` of a trained fashion_scenes workdir (`vit.explanations.text.pointing_rate`)."""
    import numpy as np
    from PIL import Image

    from vit.checkpoints import load_checkpoint
    from vit.data import fashion_scenes as fs
    from vit.explanations.text import pointing_rate

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
                   help="the record's name, benchmarks/records/NAME.json (default: the recipe's, "
                        "or promptshapes_ablation with --ablation)")
    p.add_argument("--ablation", action="store_true",
                   help="promptshapes changed one way at a time (VARIANTS) instead of the recipe")
    p.add_argument("--init", default=None,
                   help="a ViT stage to start from, skipping the recipe's own (with --ablation: "
                        "the recipe run's, for the variants that keep its labels)")
    p.add_argument("--pointing-scenes", type=int, default=200, metavar="N",
                   help="fashion_scenes: test scenes per pointing figure (0: none)")
    p.add_argument("--workdir", default=None, help="default runs/bench_RECORD")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    return p


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    config = recipe_path(args.config)
    name = args.record or (f"{config.stem}_ablation" if args.ablation else config.stem)
    workdir = Path(args.workdir or ROOT / "runs" / f"bench_{name}")
    if args.ablation:
        if config.stem != "promptshapes":
            raise SystemExit(f"--ablation varies promptshapes' recipe, not {config.stem}'s")
        result = ablation(config, workdir, args.init, args.set)
    else:
        result = train_and_eval(config, workdir, args.set, args.init)
        report = result["eval"]
        if report.get("data") == "fashion_scenes" and args.pointing_scenes:
            result["pointing"] = pointing(workdir, args.pointing_scenes)
    common.write_record(name, result, argv=argv, mode="text", out=args.out,
                        extra_packages=("grain",))
    runs = result["variants"] if args.ablation else {name: result}
    for label, run in runs.items():
        report, questions = run["eval"], run["eval"].get("questions", {})
        print(label, json.dumps({"train_seconds": run["train_seconds"], **{
            k: report.get(k) for k in ("accuracy", "controls", "heldout_accuracy")},
            **{group: {k: questions[group][k] for k in ("balanced_accuracy", "auc", "false_yes")}
               for group in ("seen", "heldout", "wording") if group in questions},
            **{f"{group}_yes_rate": questions[group]["yes_rate"]
               for group in ("never", "unknown") if group in questions},
            **({"pointing": run["pointing"]} if "pointing" in run else {})}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
