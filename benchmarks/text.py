"""Text-conditioning recipes trained into a fresh workdir and evaluated with `vit eval --json`
(`--ablation`: promptshapes changed one way at a time, `VARIANTS`); docs/text.md says more."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from benchmarks import common, tables
from benchmarks.tables import f3

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
NO_READOUT = ["model.patch_classes=0", "stages.vit.train.patch_loss=0.0"]
RECIPE = {"labels": "colours and shapes apart", "readout": "per patch",
          "cross_attention": "closed", "tune": "blocks 2-3, 100 steps", "head": "things"}
# name -> how it differs from `RECIPE`, its --sets, and the ViT stage it starts from: "recipe"
# (--init), None (its own) or another variant's.
VARIANTS = {
    "no_patch_readout": ({"readout": "none"}, NO_READOUT, None),
    "cross_attention_open": ({"cross_attention": "open"}, OPEN, "recipe"),
    "pair_labels": ({"labels": "colour x shape pairs"}, PAIRS, None),
    "pair_labels_cross_attention_open": (
        {"labels": "colour x shape pairs", "cross_attention": "open"}, PAIRS + OPEN,
        "pair_labels"),
    "longer_tune": ({"tune": "blocks 1-3, 300 steps"}, LONGER_TUNE, "recipe"),
    "patch_head": ({"head": "patches"}, ["model.text.head=patches"], "recipe"),
}


# fashion_scenes' recipe and what its ablation changes, from the recipe's own ViT stage or
# (base None) from one of its own.
FASHION_RECIPE = {"vit_stage": "16,000 steps of 32, stem [32, 64]",
                  "head": "things: each named thing found on a patch, a soft minimum",
                  "scene_jitter": "on", "tune": "1,500 / 450 steps, blocks 1-3"}
# A ViT stage of fewer, larger updates: 6,000 steps of 64 at a higher rate.
VIT_STAGE_BEFORE = ["stages.vit.train.steps=6000", "stages.vit.train.batch_size=64",
                    "optim.lr=0.003", "optim.warmup_steps=100",
                    "stages.vit.train.eval_every=2000", "stages.vit.train.checkpoint_every=2000"]
FASHION_VARIANTS = {
    "placed_head": ({"head": "placed: one score per patch, a soft maximum"},
                    ["model.text.head=placed"], "recipe"),
    "short_tune": ({"tune": "1,500 / 150 steps, blocks 2-3"},
                   ["stages.tune.train.steps=150",
                    f"stages.tune.optim.trainable={OPEN_TEXT_PARTS}|blocks/[23]/.*|norm/.*"],
                   "recipe"),
    "short_text_stages": ({"tune": "1,000 / 300 steps, blocks 1-3"},
                          ["stages.text.train.steps=1000", "stages.tune.train.steps=300"],
                          "recipe"),
    "no_scene_jitter": ({"scene_jitter": "off"}, ["input.scene_jitter=false"], None),
    "vit_stage_before": ({"vit_stage": "6,000 steps of 64, stem [32, 64]"}, VIT_STAGE_BEFORE,
                         None),
    # A narrower stem: a cheaper ViT-stage step on a CPU, against what it costs the answers.
    "narrow_stem": ({"vit_stage": "16,000 steps of 32, stem [16, 48]"}, ["model.stem=[16,48]"],
                    None),
}
ABLATIONS = {"promptshapes": (RECIPE, VARIANTS), "fashion_scenes": (FASHION_RECIPE,
                                                                    FASHION_VARIANTS)}


def recipe_path(config: str) -> Path:
    """`--config`: a recipe's path, or its name in configs/ ("fashion_scenes")."""
    path = Path(config)
    if path.suffix != ".py":
        path = common.ROOT / "configs" / f"{config}.py"
    if not path.is_file():
        raise SystemExit(f"--config {config}: no such recipe; give a path or a name in configs/")
    return path


def train_and_eval(config: Path, workdir: Path, sets: list[str], init: str | None) -> dict:
    """One fresh run of `config` into `workdir`, then `vit eval --json`; per stage folder
    ("final": the workdir) the steps trained and the last validation row."""
    shutil.rmtree(workdir, ignore_errors=True)
    train = common.vit_train(config, workdir, sets, init=init)
    evaluate, stages = common.vit_eval(workdir), {}
    for metrics in sorted(workdir.glob("**/metrics.jsonl")):
        steps, val = (common.metrics(metrics.parent, s) for s in ("train", "validation"))
        stages[metrics.parent.name if metrics.parent != workdir else "final"] = {
            "steps": steps[-1]["step"] if steps else 0, "last_validation": val[-1] if val else None}
    return {"run": {"train": train["command"], "eval": evaluate["command"]},
            "train_seconds": train["wall_s"], "eval_seconds": evaluate["wall_s"],
            "stages": stages, "eval": evaluate["report"]}


def seeded(config: Path, root: Path, init: str | None, extra: list[str], seeds: int) -> dict:
    """The recipe trained and evaluated with seeds 0..seeds-1 (with `init`, its text stages
    alone from that ViT stage): each figure's spread over trainings, where a record holds one."""
    runs = {str(seed): train_and_eval(config, root / f"seed{seed}", [*extra, f"seed={seed}"],
                                      init) for seed in range(seeds)}
    return {"recipe": config.stem, "init": init, "sets": extra, "seeds": runs}


def ablation(config: Path, root: Path, init: str | None, extra: list[str]) -> dict:
    """Every variant of the recipe's `ABLATIONS` entry trained and evaluated, `extra` --sets
    after its own."""
    recipe, variants = ABLATIONS[config.stem]
    out = {}
    for name, (change, sets, base) in variants.items():
        start = init if base == "recipe" else str(root / base / "stages" / "vit") if base \
            else None
        out[name] = {**recipe, **change, "sets": sets + extra, "init": start,
                     **train_and_eval(config, root / name, sets + extra, start)}
    return {"recipe": config.stem, "variants": out}


POINTING_PROMPTS = {"seen_class_questions": "a present item's class question",
                    "heldout_region_questions": "a present held-out (class, region)"}


def pointing(workdir: Path, scenes: int) -> dict:
    """`pointing_rate` (`vit.explanations.text`) of a trained fashion_scenes workdir on up to
    `scenes` questions of each group of `POINTING_PROMPTS`, from the first test scenes on."""
    import numpy as np
    from PIL import Image

    from vit.checkpoints import load_checkpoint
    from vit.data import fashion_scenes as fs
    from vit.explanations.text import pointing_rate

    data = fs.FashionScenesSource("test").data
    rng = np.random.default_rng(0)
    seen, held = [], []  # (scene, prompt, box)
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
    loaded = load_checkpoint(str(workdir))
    model, out = loaded.build_model(), {}
    for key, rows in zip(POINTING_PROMPTS, (seen, held), strict=True):
        batch = np.stack([loaded.preprocessing(Image.fromarray(data.images[n]))
                          for n, _, _ in rows])
        out[key] = {**pointing_rate(model, batch, [p for _, p, _ in rows],
                                    np.stack([b for _, _, b in rows])),
                    "prompts": POINTING_PROMPTS[key]}
    return out


def parser() -> argparse.ArgumentParser:
    return common.parser(
        "text", __doc__, config=("promptshapes", "a path or a name in configs/"),
        record=(None, "the record's name (default: the recipe's)"),
        ablation=(False, "train the recipe's ABLATIONS instead"),
        init=(None, "a ViT stage to start from"),
        seeds=(1, "train seeds 0..N-1 and record each figure's spread (the recipe's record "
                  "holds seed 0's)"),
        set=([], "a recipe setting KEY=VALUE"))


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    config = recipe_path(args.config)
    name = args.record or (f"{config.stem}_ablation" if args.ablation else
                           f"{config.stem}_seeds" if args.seeds > 1 else config.stem)
    workdir = common.ROOT / "runs" / f"bench_{name}"
    if args.seeds > 1:
        result = seeded(config, workdir, args.init, args.set, args.seeds)
    elif args.ablation:
        if config.stem not in ABLATIONS:
            raise SystemExit(f"--ablation varies {' or '.join(ABLATIONS)}, not {config.stem}")
        result = ablation(config, workdir, args.init, args.set)
    else:
        result = train_and_eval(config, workdir, args.set, args.init)
        if result["eval"]["data"] == "fashion_scenes":
            result["pointing"] = pointing(workdir, scenes=200)
    common.write_record(name, result, argv=argv, mode="text", out=args.out)


# ---------------------------------------------------------------------------------- tables

# promptshapes' targets by question group (the table and `targets` share them).
PROMPTSHAPES = {"seen": 0.97, "heldout": 0.95, "wording": 0.90}
FASHION = {"seen": 0.95, "heldout": 0.90, "wording": 0.93}
NEVER, HARD, CONTROL, POINTING = 0.05, 0.10, 0.05, 0.90


def yes_rates(q: dict, never: str, unknown_target: str) -> list[list]:
    labels = {"never": (never, "at most 0.05"),
              "unknown": ("prompts of unknown words ({})", unknown_target)}
    return [[f"{label.format(q[k]['questions'])}: yes-rate", f3(q[k]["yes_rate"]), target, "", ""]
            for k, (label, target) in labels.items() if k in q]


def ablation_row(run: dict, where: str, q: dict) -> list[str]:
    h, s = q["heldout"], q["seen"]
    figures = [h["balanced_accuracy"], h["auc"], *(h["false_yes"][k] for k in (
        "both_apart", "colour_only", "shape_only")), s["balanced_accuracy"],
        s["false_yes"]["both_apart"], q["unknown"]["yes_rate"]]
    return [run["labels"], run["readout"], run["cross_attention"], run["tune"],
            run.get("head", "patches"), *map(f3, figures), where]


def fashion_rows(r: dict) -> list[list]:
    ev, q = r["eval"], r["eval"]["questions"]
    rows = [[f"{g}" + ("" if kind == "all" else f": {kind}") + f" ({fig['questions']})",
             f3(fig["balanced_accuracy"]), f"at least {need:.2f}" if kind == "all" else "",
             f3(fig["auc"]), ", ".join(f"{k} {f3(v)}" for k, v in fig["false_yes"].items()
                                       if v is not None)]
            for g, need in FASHION.items()
            for kind, fig in [("all", q[g]), *q[g]["by_kind"].items()]]
    rows += yes_rates(q, "never-placed classes ({})", "")
    rows += [[f"control `{k}` (answer accuracy)", f3(v), "0.50 ± 0.05", "", ""]
             for k, v in ev["controls"].items()]
    return rows + [[f"relevancy's strongest patch on the item: {k.replace('_', ' ')}",
                    f"{v['inside']} of {v['scenes']} ({f3(v['rate'])})", "at least 0.90", "", ""]
                   for k, v in r["pointing"].items()]


def fashion_ablation_row(run: dict, where: str, q: dict) -> list[str]:
    s, h = q["seen"], q["heldout"]
    figures = [s["balanced_accuracy"], s["by_kind"]["both"]["balanced_accuracy"],
               s["false_yes"]["one_only"], s["false_yes"]["elsewhere"], h["balanced_accuracy"],
               q["wording"]["balanced_accuracy"], q["never"]["yes_rate"]]
    trained = f"{run['train_seconds']:.0f}" + (" (text stages)" if run.get("init") else "")
    return [run["vit_stage"], run["head"], run["scene_jitter"],
            run["tune"], *map(f3, figures), trained, where]


def seeds_table(r: dict) -> list[str]:
    """A recipe's figures seed by seed, and how many seeds meet each target."""
    fashion = r["recipe"] == "fashion_scenes"
    rows, met = [], {}
    for seed, run in r["seeds"].items():
        q = run["eval"]["questions"]
        hard = q["seen" if fashion else "heldout"]["false_yes"][
            "elsewhere" if fashion else "both_apart"]
        rows.append([seed, *(f3(q[g]["balanced_accuracy"]) for g in ("seen", "heldout",
                                                                      "wording")),
                     f3(hard), f3(q["never"]["yes_rate"]), f3(q["unknown"]["yes_rate"]),
                     f"{run['train_seconds']:.0f}"])
        for what, _, ok in targets({**run, "pointing": {}}):  # seeds record no pointing
            if not (r["init"] and what.startswith("all stages")):  # text stages alone
                met.setdefault(what, []).append(ok)
    stages = (f"the text stages alone, from the ViT stage `{r['init']}`" if r["init"]
              else "every stage")
    short = [f"{what} ({sum(oks)} of {len(oks)})" for what, oks in met.items()
             if not all(oks)]
    return [f"`{r['recipe']}` trained with {len(rows)} seeds ({stages}), each evaluated as its "
            "record is:", "",
            *tables.table(["seed", "seen", "held-out", "wordings",
                           "elsewhere said yes" if fashion else "hard negatives said yes",
                           f"never-{'placed' if fashion else 'drawn'} yes-rate",
                           "unknown-word yes-rate", "training s"], rows), "",
            "Targets met by every seed but: " + "; ".join(short) + "." if short else
            "Every target met by every seed."]


def table(r: dict, records: dict | None = None) -> list[str]:
    """promptshapes, fashion_scenes, an ablation (beside the recipe's own record), or a
    recipe's seeds."""
    if "seeds" in r:
        return seeds_table(r)
    if r.get("recipe") == "fashion_scenes":
        recipe = (records or {})["fashion_scenes"]
        rows = [fashion_ablation_row({**FASHION_RECIPE, "train_seconds": recipe["train_seconds"]},
                                     "the recipe, `fashion_scenes.json`",
                                     recipe["eval"]["questions"])]
        rows += [fashion_ablation_row(v, f"`{name}`", v["eval"]["questions"])
                 for name, v in r["variants"].items()]
        own = " and ".join(f"`{name}`" for name, v in r["variants"].items() if not v["init"])
        return [f"Each of {recipe['eval']['questions']['images']} test scenes asked every "
                f"question; every row but {own} (each its own) from the recipe's ViT stage:",
                "",
                *tables.table(["ViT stage", "prompt head", "scene jitter", "text / tune stages",
                               "seen: balanced accuracy", "seen: both",
                               "one only said yes", "elsewhere said yes",
                               "held-out pairs", "held-out wordings",
                               "never-placed yes-rate", "training s", "run"], rows), "",
                f"The recipe's row: `{tables.RECORDS}/fashion_scenes.json` "
                f"({tables.host(recipe)}), made by `{recipe['command']}`."]
    if "variants" in r:
        recipe = (records or {})["promptshapes"]
        rows = [ablation_row(RECIPE, "the recipe, `promptshapes.json`",
                             recipe["eval"]["questions"])]
        rows += [ablation_row(v, f"`{name}`", v["eval"]["questions"])
                 for name, v in r["variants"].items()]
        return [f"Held-out pairs, each of {recipe['eval']['questions']['images']} test scenes "
                "asked every question (targets: held-out balanced accuracy at least 0.95, false "
                "yes on hard negatives at most 0.10):", "",
                *tables.table(["ViT-stage labels", "per-patch readout", "cross-attention",
                               "tune stage", "prompt head",
                               "held-out pairs: balanced accuracy", "AUC",
                               "false yes, both apart (hard)", "colour only", "shape only",
                               "seen pairs", "seen pairs, hard false yes",
                               "unknown-word yes-rate", "run"], rows), "",
                f"The recipe's row: `{tables.RECORDS}/promptshapes.json` ({tables.host(recipe)}), "
                f"made by `{recipe['command']}`."]
    ev, stages = r["eval"], r["stages"]
    q, steps = ev["questions"], sum(s["steps"] for s in stages.values())
    asked = (f"Every question asked of each of {q['images']} test scenes (yes above "
             f"{q['threshold']})")
    trained = f"{r['train_seconds']:.0f} s ({steps:,} steps)"
    if ev["data"] == "fashion_scenes":
        return [f"{asked}:", "", *tables.table(["questions", "balanced accuracy", "target", "AUC",
                                                "false yes by kind of \"no\""], fashion_rows(r)),
                "", f"The ViT stage ({stages['vit']['steps']:,} steps) recognises the classes "
                f"present with a per-label accuracy of "
                f"{f3(stages['vit']['last_validation']['label_accuracy'])} on the validation "
                f"scenes. Training, all {len(stages)} stages: {trained}."]
    labels = {"seen": f"every seen pair ({q['seen']['questions']})",
              "heldout": f"the {q['heldout']['questions']} held-out pairs",
              "wording": "seen pairs, 2 held-out wordings"}
    rows = [[labels[g], f3(q[g]["balanced_accuracy"]),
             f"at least {need:.2f}" + ("; hard false yes at most 0.10" if g == "heldout" else ""),
             f3(q[g]["auc"]), " / ".join(f3(q[g]["false_yes"][k]) for k in (
                 "neither", "colour_only", "shape_only", "both_apart"))]
            for g, need in PROMPTSHAPES.items()]
    rows += yes_rates(q, "never-drawn words ({} questions)", "at most 0.05")
    figures = [
        ["`accuracy` (test split, image-prompt pairs)", f3(ev["accuracy"]), "at least 0.95"],
        *([f"`controls.{k}`", f3(v), "0.50 ± 0.05"] for k, v in ev["controls"].items()),
        ["`heldout_accuracy` (unseen colour-shape prompts)", f3(ev["heldout_accuracy"]),
         "at least 0.95"],
        [f"training, all {len(stages)} stages", trained, "under 10 minutes"]]
    return [f"{asked}; false yes at most 0.03 where the scene has neither:", "",
            *tables.table(["questions", "balanced accuracy", "target", "AUC",
                           "false yes: neither / colour only / shape only / both apart"], rows),
            "", *tables.table(["figure", "value", "target"], figures)]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    if "variants" in r or "seeds" in r:  # no one run's figures
        return []
    ev, q = r["eval"], r["eval"]["questions"]
    fashion = ev["data"] == "fashion_scenes"
    out = [(f"{g} questions: balanced accuracy at least {need:.2f}",
            f3(q[g]["balanced_accuracy"]), q[g]["balanced_accuracy"] >= need)
           for g, need in (FASHION if fashion else PROMPTSHAPES).items()]
    if fashion:
        out += [(f"seen questions of each kind ({kind}): balanced accuracy at least 0.93",
                 f3(k["balanced_accuracy"]), k["balanced_accuracy"] >= 0.93)
                for kind, k in q["seen"]["by_kind"].items()]
        elsewhere = q["seen"]["false_yes"]["elsewhere"]
        out.append(("false yes where the class is elsewhere, at most 0.10", f3(elsewhere),
                    elsewhere <= HARD))
        out += [(f"relevancy's strongest patch on the item ({k.replace('_', ' ')}), at least "
                 "0.90", f3(v["rate"]), v["rate"] >= POINTING) for k, v in r["pointing"].items()]
    else:
        hard = q["heldout"]["false_yes"]["both_apart"]
        out.append(("held-out pairs: false yes on hard negatives at most 0.10", f3(hard),
                    hard <= HARD))
        out += [(f"`{k}` at least 0.95", f3(ev[k]), ev[k] >= 0.95)
                for k in ("accuracy", "heldout_accuracy")]
    words = {"never": f"never-{'placed classes' if fashion else 'drawn words'}",
             "unknown": "prompts of unknown words"}
    out += [(f"{words[k]}: yes-rate at most 0.05", f3(q[k]["yes_rate"]), q[k]["yes_rate"] <= NEVER)
            for k in words if k in q]
    out += [(f"control `{k}` at 0.50 ± 0.05", f3(v), abs(v - 0.5) <= CONTROL)
            for k, v in ev["controls"].items()]
    budget = 900 if fashion else 600
    return out + [(f"all stages trained within {budget // 60} minutes",
                   f"{r['train_seconds']:.0f} s", r["train_seconds"] <= budget)]
