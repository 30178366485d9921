"""Text-conditioning recipes trained into a fresh workdir and evaluated with `vit eval --json`
(`--ablation`: promptshapes changed one way at a time, `VARIANTS`); docs/text.md says more."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from benchmarks import common, tables

ROOT = common.ROOT
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
    """Per stage folder ("final": the workdir): steps trained and the last validation row."""
    out = {}
    for metrics in sorted(workdir.glob("**/metrics.jsonl")):
        train, val = (common.metrics(metrics.parent, s) for s in ("train", "validation"))
        out[metrics.parent.name if metrics.parent != workdir else "final"] = {
            "steps": train[-1]["step"] if train else 0, "last_validation": val[-1] if val else None}
    return out


def train_and_eval(config: Path, workdir: Path, sets: list[str], init: str | None) -> dict:
    """One fresh run of `config` into `workdir`, then `vit eval --json`."""
    shutil.rmtree(workdir, ignore_errors=True)
    train = common.vit_train(config, workdir, sets, init=init)
    evaluate = common.vit_eval(workdir)
    return {"run": {"train": train["command"], "eval": evaluate["command"]},
            "train_seconds": train["wall_s"], "eval_seconds": evaluate["wall_s"],
            "stages": stage_results(workdir), "eval": evaluate["report"]}


def ablation(config: Path, root: Path, init: str | None, extra: list[str]) -> dict:
    """Every `VARIANTS` entry trained and evaluated, `extra` --sets after its own."""
    out = {}
    for name, (change, sets, base) in VARIANTS.items():
        start = (str(root / base / "stages" / "vit") if base else
                 None if PAIRS[0] in sets else init)
        out[name] = {**RECIPE, **change, "sets": sets + extra, "init": start,
                     **train_and_eval(config, root / name, sets + extra, start)}
    return {"variants": out}


def pointing_prompts(scenes: int) -> dict[str, list[tuple[int, str, object]]]:
    """(scene, prompt, box) per group: a present item's class question in each of the first
    `scenes` scenes, and the first `scenes` questions about a present held-out (class, region)."""
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
    p = common.parser("text", __doc__)
    p.add_argument("--config", default="promptshapes", help="a path or a name in configs/")
    p.add_argument("--record", default=None, help="the record's name (default: the recipe's)")
    p.add_argument("--ablation", action="store_true", help="train VARIANTS instead")
    p.add_argument("--init", default=None, help="a ViT stage to start from")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return p


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    config = recipe_path(args.config)
    name = args.record or (f"{config.stem}_ablation" if args.ablation else config.stem)
    workdir = ROOT / "runs" / f"bench_{name}"
    if args.ablation:
        if config.stem != "promptshapes":
            raise SystemExit(f"--ablation varies promptshapes' recipe, not {config.stem}'s")
        result = ablation(config, workdir, args.init, args.set)
    else:
        result = train_and_eval(config, workdir, args.set, args.init)
        if result["eval"].get("data") == "fashion_scenes":
            result["pointing"] = pointing(workdir, scenes=200)
    common.write_record(name, result, argv=argv, mode="text", out=args.out)


# ---------------------------------------------------------------------------------- tables

# promptshapes' targets by question group (issue targets; the table and `targets` share them).
PROMPTSHAPES = {"seen": ("at least 0.97", 0.97), "heldout": ("at least 0.95", 0.95),
                "wording": ("at least 0.90", 0.90)}
FASHION = {"seen": ("at least 0.95", 0.95), "heldout": ("at least 0.90", 0.90),
           "wording": ("at least 0.93", 0.93)}
NEVER, HARD, CONTROL, POINTING = 0.05, 0.10, 0.05, 0.90


f3 = tables.f3


def yes_rates(q: dict, never: str, unknown_target: str) -> list[list]:
    labels = {"never": (never, "at most 0.05"),
              "unknown": ("prompts of unknown words ({})", unknown_target)}
    return [[f"{label.format(q[k]['questions'])}: yes-rate", f3(q[k]["yes_rate"]), target, "", ""]
            for k, (label, target) in labels.items() if k in q]


def ablation_row(run: dict, where: str, q: dict) -> list[str]:
    h = q["heldout"]
    return [run["labels"], run["cross_attention"], run["tune"], f3(h["balanced_accuracy"]),
            f3(h["auc"]), *(f3(h["false_yes"][k]) for k in ("both_apart", "colour_only",
                                                             "shape_only")),
            f3(q["seen"]["balanced_accuracy"]), f3(q["seen"]["false_yes"]["both_apart"]),
            f3(q.get("unknown", {}).get("yes_rate")), where]


def fashion_rows(r: dict) -> list[list]:
    ev, q = r["eval"], r["eval"]["questions"]
    rows = []
    for g, (target, _) in FASHION.items():
        for kind, fig in [("all", q[g]), *q[g].get("by_kind", {}).items()]:
            rows.append([f"{g}" + ("" if kind == "all" else f": {kind}") + f" ({fig['questions']})",
                         f3(fig["balanced_accuracy"]), target if kind == "all" else "",
                         f3(fig["auc"]), ", ".join(f"{k} {f3(v)}" for k, v in
                                                   fig["false_yes"].items() if v is not None)])
    rows += yes_rates(q, "never-placed classes ({})", "")
    rows += [[f"control `{k}` (answer accuracy)", f3(v), "0.50 ± 0.05", "", ""]
             for k, v in ev["controls"].items()]
    rows += [[f"relevancy's strongest patch on the item: {k.replace('_', ' ')}",
              f"{v['inside']} of {v['scenes']} ({f3(v['rate'])})", "at least 0.90", "", ""]
             for k, v in r.get("pointing", {}).items()]
    return rows


def table(r: dict, records: dict | None = None) -> list[str]:
    """promptshapes, fashion_scenes, or the ablation (beside the recipe's own record)."""
    if "variants" in r:
        recipe = (records or {})["promptshapes"]
        rows = [ablation_row(RECIPE, "the recipe, `promptshapes.json`",
                             recipe["eval"]["questions"])]
        rows += [ablation_row(v, f"`{name}`", v["eval"]["questions"])
                 for name, v in r["variants"].items()]
        return [f"Held-out pairs, each of {recipe['eval']['questions']['images']} test scenes "
                "asked every question (targets: held-out balanced accuracy at least 0.95, false "
                "yes on hard negatives at most 0.10):", "",
                *tables.table(["ViT-stage labels", "cross-attention", "tune stage",
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
    if ev.get("data") == "fashion_scenes":
        vit_stage = (stages.get("vit") or {}).get("last_validation") or {}
        tail = ([f"The ViT stage ({stages['vit']['steps']:,} steps) recognises the classes "
                 f"present with a per-label accuracy of {f3(vit_stage['label_accuracy'])} on "
                 "the validation scenes."] if "label_accuracy" in vit_stage else [])
        tail.append(f"Training, all {len(stages)} stages: {r['train_seconds']:.0f} s "
                    f"({steps:,} steps).")
        return [f"{asked}:", "", *tables.table(["questions", "balanced accuracy", "target", "AUC",
                                                "false yes by kind of \"no\""], fashion_rows(r)),
                "", " ".join(tail)]
    labels = {"seen": f"every seen pair ({q['seen']['questions']})",
              "heldout": f"the {q['heldout']['questions']} held-out pairs",
              "wording": "seen pairs, 2 held-out wordings"}
    rows = [[labels[g], f3(q[g]["balanced_accuracy"]),
             target + ("; hard false yes at most 0.10" if g == "heldout" else ""),
             f3(q[g]["auc"]), " / ".join(f3(q[g]["false_yes"][k])
                                         for k in ("neither", "colour_only", "shape_only",
                                                   "both_apart"))]
            for g, (target, _) in PROMPTSHAPES.items()]
    rows += yes_rates(q, "never-drawn words ({} questions)", "at most 0.05")
    figures = [
        ["`accuracy` (test split, image-prompt pairs)", f3(ev["accuracy"]), "at least 0.95"],
        *([f"`controls.{k}`", f3(v), "0.50 ± 0.05"] for k, v in ev["controls"].items()),
        ["`heldout_accuracy` (unseen colour-shape prompts)", f3(ev["heldout_accuracy"]),
         "at least 0.95"],
        [f"training, all {len(stages)} stages", f"{r['train_seconds']:.0f} s ({steps:,} steps)",
         "under 10 minutes"]]
    return [f"{asked}; false yes at most 0.03 where the scene has neither:", "",
            *tables.table(["questions", "balanced accuracy", "target", "AUC",
                           "false yes: neither / colour only / shape only / both apart"], rows),
            "", *tables.table(["figure", "value", "target"], figures)]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    """Each question group against its target, the controls, the unknown-word rule, pointing
    and the training budget."""
    if "variants" in r:
        return []
    ev, q = r["eval"], r["eval"]["questions"]
    fashion = ev.get("data") == "fashion_scenes"
    out = [(f"{g} questions: balanced accuracy {text}", f3(q[g]["balanced_accuracy"]),
            q[g]["balanced_accuracy"] >= need)
           for g, (text, need) in (FASHION if fashion else PROMPTSHAPES).items()]
    if fashion:
        out += [(f"seen questions of each kind ({kind}): balanced accuracy at least 0.93",
                 f3(k["balanced_accuracy"]), k["balanced_accuracy"] >= 0.93)
                for kind, k in q["seen"]["by_kind"].items()]
        out.append(("false yes where the class is elsewhere, at most 0.10",
                    f3(q["seen"]["false_yes"]["elsewhere"]),
                    q["seen"]["false_yes"]["elsewhere"] <= HARD))
        out += [(f"relevancy's strongest patch on the item ({k.replace('_', ' ')}), at least "
                 "0.90", f3(v["rate"]), v["rate"] >= POINTING) for k, v in r["pointing"].items()]
    else:
        hard = q["heldout"]["false_yes"]["both_apart"]
        out.append(("held-out pairs: false yes on hard negatives at most 0.10", f3(hard),
                    hard <= HARD))
        out += [(f"`{k}` at least 0.95", f3(ev[k]), ev[k] >= 0.95)
                for k in ("accuracy", "heldout_accuracy")]
    out.append((f"never-{'placed classes' if fashion else 'drawn words'}: yes-rate at most 0.05",
                f3(q["never"]["yes_rate"]), q["never"]["yes_rate"] <= NEVER))
    if "unknown" in q:
        out.append(("prompts of unknown words: yes-rate at most 0.05",
                    f3(q["unknown"]["yes_rate"]), q["unknown"]["yes_rate"] <= NEVER))
    out += [(f"control `{k}` at 0.50 ± 0.05", f3(v), abs(v - 0.5) <= CONTROL)
            for k, v in ev["controls"].items()]
    budget = 900 if fashion else 600
    out.append((f"all stages trained within {budget // 60} minutes",
                f"{r['train_seconds']:.0f} s", r["train_seconds"] <= budget))
    return out
