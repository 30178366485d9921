"""The docs' figures, made from the records: every table of docs/benchmarks.md, the README's
demo result and text-conditioning table, and the benchmarks page's contents.

A table sits between `<!-- table NAME -->` and `<!-- /table NAME -->`, NAME being its record
(`benchmarks/records/NAME.json`); each record has exactly one. The contents of
docs/benchmarks.md sit between `<!-- contents -->` and `<!-- /contents -->`. The text around
the markers is written by hand, and holds no measured figure: `--check` finds every number
with a unit of measure (a ratio, a time, a size, a share, a rate) in README.md and
docs/*.md outside the generated blocks and fails on it, unless `NOT_MEASURED` lists it as a
fact that is not a measurement (a page size, a time limit, a ratio worked out from shapes).

    python -m benchmarks tables            # rewrite the tables from the records
    python -m benchmarks tables --check    # exit 1 on a stale table or an unbacked figure
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import ROOT


def docs(root: Path = ROOT) -> list[str]:
    """The files whose figures are checked, relative to `root`."""
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]


RECORDS = "benchmarks/records"
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table (?P=name) -->)",
                   re.DOTALL)
CONTENTS = re.compile(r"(<!-- contents -->\n)(?P<body>.*?)(<!-- /contents -->)", re.DOTALL)
PAGE = "docs/benchmarks.md"

# A number with a unit of measure: a ratio, a time, a size, a share, a rate.
# "8x8" and "16,384 x 16,384" are shapes, not ratios: an "x" counts only glued to the number
# and not followed by a letter or digit.
FIGURE = re.compile(
    r"(?<![\w.,])(?:\d+h)?\d+m\d\ds\b|"  # a duration written 6m00s
    r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:[-–]\d[\d,]*(?:\.\d+)?)?"
    r"(?:[x×](?![\w])|\s?(?:ms|s|seconds|minutes|min|GiB|GB|MiB|MB|KiB|KB|%|img/s|images/s|"
    r"steps/s|GFLOP/s|TFLOP/s|GFLOP)(?![\w/]))")
# Facts written with a unit that are not measurements, by file: {figure: why it is not one}.
NOT_MEASURED = {
    "docs/attention.md": {
        "1.69x": "padded attention work at 197 tokens, worked out from the tile sizes",
        "1.23x": "padded attention work at 577 tokens, worked out from the tile sizes",
        "1.48x": "padded attention work at 197 tokens, worked out from the tile sizes",
        "1.17x": "padded attention work at 577 tokens, worked out from the tile sizes",
    },
    "docs/errors.md": {"64 MB": "the free-disk threshold below which the cache is skipped"},
    "docs/explain.md": {"95%": "the confidence level of the bootstrap interval"},
    "docs/training.md": {
        "2 MiB": "the size of a huge page", "4 KiB": "the size of a normal page",
        "45%": "RandAugment's largest translation, a setting",
        "2%": "RandomErasing's smallest box, a setting",
        "10%": "the share of each class an image folder's validation split takes, a setting"},
    "docs/text.md": {"10x": "the gates' learning-rate multiplier, a recipe setting",
                     "50%": "the answer of an image that ignores the prompt, by definition"},
}
# Figures of a record that left the tree with its experiment, by file: {figure: (the commit
# that last holds the record, the record's path there)}; tests/test_benchmark_tables.py reads
# them back from git.
FROM_HISTORY = {
    "docs/benchmarks.md": {
        "1.01x": ("14e3969", "benchmarks/bench_train_mkl_products.json"),
        "0.98x": ("14e3969", "benchmarks/bench_train_mkl_products.json"),
    },
}
# Figures in pages this change does not rewrite whose records are gone; each is to be deleted
# from its page (or put in a record's table), then from here.
PENDING = {
    "docs/training.md": {"2.64 GiB", "1.05x", "1.16x", "1.06x", "1.15x", "0.75 GiB", "1.69 GiB",
                         "1.02x", "1.09x"},
}


# ---------------------------------------------------------------------------- formatting


def num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def signed(x: float) -> str:
    return f"{x:+.3f}"


def interval(ci: list[float], fmt: Callable[[float], str] = lambda x: f"{x:.3f}") -> str:
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: list[str], rows: list[list]) -> list[str]:
    return [row(*header), row(*["---"] * len(header)), *(row(*r) for r in rows)]


def host(record: dict) -> str:
    """The machine a record was made on: CPU model, its bfloat16 arithmetic, cores."""
    machine = record.get("machine") or {}
    cpu = machine.get("cpu") or {}
    if not cpu.get("model_name"):
        return f"CPU not recorded, {machine['cpus']} cores" if machine.get("cpus") else \
            "machine not recorded"
    bf16 = cpu.get("bfloat16_arithmetic")
    arith = (f" (bfloat16 arithmetic: {', '.join(bf16)})" if bf16
             else " (no bfloat16 arithmetic)" if bf16 is not None else "")
    return f"{cpu['model_name']}{arith}, {machine.get('cpus')} cores"


def heading(record: dict) -> str:
    return f"**{host(record)}, {record['date_utc'][:10]}**"


def source(name: str, record: dict) -> str:
    """The line under each table: the record and the command that makes it."""
    return f"Record: `{RECORDS}/{name}.json`, made by `{record['command']}`."


# ------------------------------------------------------------------------------ renderers


def demo(r: dict) -> list[str]:
    right = round(r["test_accuracy"] * r["num_test_examples"])
    return [f"Measured {r['date_utc'][:10]} (`{RECORDS}/demo.json`): "
            f"**{pct(r['test_accuracy'])} test accuracy** ({right} of "
            f"{r['num_test_examples']} held-out digits) after {r['train_seconds']:.0f} s of "
            f"training on a {r['machine']['cpus']}-core {r['machine']['cpu']['model_name']}."]


def inference(r: dict) -> list[str]:
    s, speed, ratio, agree = r["setup"], r["img_s_median"], r["ratio_to_transformers_median"], \
        r["agreement"]
    n = agree["images"]
    rows = [[f"vit, {dtype}", num(speed[f"ours_{dtype}"]), num(ratio[f"ours_{dtype}"]),
             f"{round(agree[f'ours_{dtype}']['top1_agreement_with_transformers'] * n)} of {n}",
             f"{agree[f'ours_{dtype}']['max_prob_error']:.1e}"]
            for dtype in ("float32", "bfloat16") if f"ours_{dtype}" in speed]
    rows.append(["transformers, float32", num(speed["hf"]), "1.00", "", ""])
    if "hf_bfloat16" in speed:
        peer = agree.get("hf_bfloat16", {})
        rows.append(["transformers, bfloat16", num(speed["hf_bfloat16"]),
                     num(ratio["hf_bfloat16"]),
                     f"{round(peer['top1_agreement_with_transformers'] * n)} of {n}"
                     if peer else "", f"{peer['max_prob_error']:.1e}" if peer else ""])
    tail = []
    like = r.get("ours_bfloat16_ratio_to_hf_bfloat16_median")
    if like is not None:
        tail.append(f"bfloat16 against bfloat16: vit {num(like)}x transformers; vit's bfloat16 "
                    f"forward {num(speed['ours_bfloat16'] / speed['ours_float32'])}x its "
                    "float32 one.")
    spread = {k: [x[k] for x in r["rounds"]] for k in ("ours_bfloat16", "hf_bfloat16")
              if all(k in x for x in r["rounds"])}
    if len(spread) == 2:
        tail.append("Images/s by round, vit bfloat16 "
                    f"{num(min(spread['ours_bfloat16']), 1)}-{num(max(spread['ours_bfloat16']), 1)}"
                    f", transformers bfloat16 {num(min(spread['hf_bfloat16']), 1)}-"
                    f"{num(max(spread['hf_bfloat16']), 1)}.")
    return [f"`{s['model']}`, batch {s['batch']}, {s['image_size']} px, "
            f"median of {s['rounds']} rounds:", "",
            *table(["model", "images/s", "vs transformers", "top-1 = transformers'",
                    "largest probability difference"], rows), *([""] + tail if tail else [])]


def predict(r: dict) -> list[str]:
    speed, median, agree = r["images_per_s"], r["ratio_median_of_rounds"], \
        r["top1_agreement_with_transformers"]
    rows = [[f"`vit predict`, {d}", num(speed[f"vit_{d}"]), num(median[f"vit_{d}"]),
             num(agree[f"vit_{d}"])] for d in ("float32", "bfloat16") if f"vit_{d}" in speed]
    rows.append(["transformers pipeline, float32", num(speed["transformers"]), "1.00", ""])
    return [f"{r['task'][0].upper()}{r['task'][1:]}:", "",
            *table(["", "images/s (best pass)", "vs transformers (median of rounds)",
                    "top-1 = transformers'"], rows)]


def predict_startup(r: dict) -> list[str]:
    start = r["start_up_one_image"]
    ready = start["vit_ready_lines"]
    return ["One image, process start to exit, median of "
            f"{len(start['rounds']['vit_cold_s'])} rounds (seconds):", "",
            *table(["", "seconds", "`ready` line"], [
                ["`vit predict`, cold (empty cache)", num(start["vit_cold_s"], 1),
                 f"`{ready['vit_cold']}`"],
                ["`vit predict`, JAX's compile cache only",
                 num(start["vit_compile_cache_only_s"], 1),
                 f"`{ready['vit_compile_cache_only']}`"],
                ["`vit predict`, warm (prepared classifier)", num(start["vit_warm_s"], 1),
                 f"`{ready['vit_warm']}`"],
                ["transformers, first prediction", num(start["transformers_s"], 1), ""]])]


GEMM_CONTESTANTS = {
    "xla_ynn_off": "XLA's own dots, float32 (what inference compiles with on CPU)",
    "xla_default": "XLA, jax's default dots (YNNPACK), float32",
    "xla_onednn": "XLA's oneDNN dot fusion, float32",
    "torch_float32": "torch, float32",
    "xla_bfloat16": "XLA, bfloat16",
    "torch_bfloat16": "torch, bfloat16",
}


def gemm(r: dict) -> list[str]:
    res = r["results"]
    threads = sorted((k for k in res if k.startswith("threads_")),
                     key=lambda k: -int(k.split("_")[1]))
    rows = [[label, *(num(res[t]["ms_all_four"][k], 0) for t in threads)]
            for k, label in GEMM_CONTESTANTS.items() if k in res[threads[0]]["ms_all_four"]]
    ceiling, peak = res["ceiling"], res["peak"]
    names = [f"{t.split('_')[1]} thread{'s' if t != 'threads_1' else ''}" for t in threads]
    return ["ViT-B/16's four dense layers (qkv, proj, fc1 + GELU, fc2) at batch 8, ms for one "
            "block's four:", "",
            *table(["contestant", *names], rows), "",
            "The whole float32 forward beside them, in the same processes:", "",
            *table(["", "vit", "transformers"], [
                ["forward, ms", num(ceiling["ours_forward_ms"], 0),
                 num(ceiling["transformers_forward_ms"], 0)],
                ["matrix-product GFLOP", num(peak["ours_forward_gflop"], 0),
                 num(peak["transformers_forward_gflop"], 0)],
                ["share of the machine's float32 peak "
                 f"({num(peak['peak_gflop_s'], 0)} GFLOP/s)", pct(peak["ours_fraction_of_peak"]),
                 pct(peak["transformers_fraction_of_peak"])],
            ]), "",
            f"vit's forward is {num(ceiling['ratio_measured'])}x transformers' here."]


def _environment(r: dict) -> list[str]:
    env = r.get("environment")
    return ([f"Environment: ours `GLIBC_TUNABLES={env['vit']}` (as the `vit` command sets it), "
             f"transformers' `{env['transformers']}`; transparent huge pages "
             f"`{env['transparent_hugepage']}`."] if env else [])


def train(r: dict) -> list[str]:
    rows, ours = [], []
    for c in r["cases"]:
        for dtype in r["dtypes"]:
            d = c[dtype]
            steps = d["median_step_s"]
            rows.append([f"ViT-{c['model']}", c["batch"], dtype,
                         num(statistics.median(steps["vit"])),
                         num(statistics.median(steps["transformers"])),
                         " / ".join(num(x) for x in d["ratio_transformers_over_vit"]),
                         num(d["median_ratio"]),
                         f"{d['loss_last_relative_difference']:.1e}"])
        if "vit_bfloat16_speedup_median" in c:
            ours.append(f"ViT-{c['model']} batch {c['batch']}: our bfloat16 step is "
                        f"{num(c['vit_bfloat16_speedup_median'])}x our float32 step.")
    how = (", both processes alive throughout, their runs alternating" if r.get("interleaved")
           else "")
    if r.get("untimed_steps_per_run"):
        how += (f", each run after {r['untimed_steps_per_run']} untimed step(s) (memory the VM "
                "took back while the process waited)")
    return [f"`vit train`'s step against transformers' (CPU), seconds a step, median "
            f"of each run's {r['timed_steps_per_run']} timed steps, {r['rounds']} rounds{how}:",
            "",
            *table(["model", "batch", "dtype", "vit", "transformers",
                    "speed vs transformers, by round", "median",
                    "loss difference after the last step (relative)"], rows),
            "", *ours, *_environment(r)]


def train_variants(r: dict) -> list[str]:
    """Ours against ours changed one way, in the same rounds: without the huge-page tunable,
    and compiled with jax's default XLA:CPU options."""
    rows = []
    for c in r["cases"]:
        for dtype in r["dtypes"]:
            d = c[dtype]
            for key, label in (("plain_malloc", "without huge pages (glibc's default malloc)"),
                               ("jax_defaults", "jax's default XLA:CPU options")):
                if key in d:
                    rows.append([f"ViT-{c['model']}", c["batch"], dtype, label,
                                 num(statistics.median(d["median_step_s"]["vit"])),
                                 num(statistics.median(d[key]["median_step_s"])),
                                 " / ".join(num(x) for x in d[key]["ratio_over_vit"]),
                                 num(d[key]["median_ratio"])])
    options = ", ".join(f"`{k.removeprefix('xla_cpu_')}={v}`"
                        for k, v in r["xla_cpu_options"]["float32"].items())
    return [f"`vit train`'s float32 step against the same step changed one way (a variant), "
            f"seconds a step, median of each run's {r['timed_steps_per_run']} timed steps, "
            f"{r['rounds']} rounds, each in its own process:", "",
            *table(["model", "batch", "dtype", "variant", "vit, s", "variant, s",
                    "speed of vit over the variant, by round", "median"], rows), "",
            f"vit's float32 options in this record: {options}.", *_environment(r)]


def data_wait(r: dict) -> list[str]:
    rows = []
    for name, run in r["runs"].items():
        rows.append([name, run["recipe"], run["steps"],
                     " / ".join(pct(x) for x in run["data_wait_per_window"]),
                     pct(run["data_wait_median_after_first"]),
                     num(run["images_per_s_median_after_first"], 1),
                     num(run["pipeline_alone_images_per_s"], 0)])
    load = (r.get("machine") or {}).get("load_average")
    return ["The share of `vit train`'s wall time spent waiting for the input pipeline, per "
            "logging window (target: " + r["target"] + "):", "",
            *table(["run", "recipe", "steps", "waiting, by window",
                    "median after the first", "training img/s", "pipeline alone img/s"], rows),
            *([""] + [f"Load average while measured: {load[0]:.1f} (the machine was shared)."]
              if load else [])]


def scaling(r: dict) -> list[str]:
    rows = [[run["devices"], f"{run['mesh']['data']} x {run['mesh']['fsdp']}",
             num(run["steps_per_s"]), num(run["images_per_s"], 1),
             num(run["images_per_s_vs_1_device"]), num(run["param_bytes_per_device"] / 2**20, 1),
             f"{run['loss']:.4f}"] for run in r["runs"]]
    return [f"{r['setup']}, forced host devices:", "",
            *table(["devices", "data x fsdp", "steps/s", "images/s", "vs 1 device",
                    "parameter MiB per device", "loss"], rows)]


def bfloat16_agreement(r: dict) -> list[str]:
    rows = []
    for res in r["results"]:
        lay, acc, vs = res["layout"], res["test_accuracy"], res["bfloat16_vs_float32"]
        agree = round(vs["top1_agreement"] * res["images"])
        peer = res["transformers_float32"]
        peer_cell = (f"top-1 {pct(peer['float32_vs_transformers']['top1_agreement'])}, largest "
                     f"{peer['float32_vs_transformers']['max_prob_error']:.1e}"
                     if "skipped" not in peer else "not measured: " + peer["skipped"].split(":")[0])
        # A checkpoint the benchmark was given is named by its path; one it trained, by name.
        name = res["name"] if res["checkpoint"].startswith("(") else f"`{res['checkpoint']}`"
        rows.append([f"{name} (width {lay['width']}, {lay['depth']} blocks, "
                     f"`{lay['classifier']}` head)",
                     f"{acc['float32']:.3f} / {acc['bfloat16']:.3f}",
                     f"{agree} of {res['images']}",
                     f"{vs['max_prob_error']:.3f} (mean {vs['mean_prob_error']:.4f})", peer_cell])
    return table(["model", "test accuracy, float32 / bfloat16", "bfloat16 top-1 = float32's",
                  "largest probability difference", "float32 vs transformers"], rows)


def promptshapes(r: dict) -> list[str]:
    ev, stages = r["eval"], r["stages"]
    steps = sum(s["steps"] for s in stages.values())
    rows = [["`accuracy` (test split, image-prompt pairs)", f"{ev['accuracy']:.3f}",
             "at least 0.95"],
            *([f"`controls.{k}`", f"{v:.3f}", "0.50 ± 0.05"] for k, v in ev["controls"].items()),
            ["`heldout_accuracy` (unseen colour-shape prompts)", f"{ev['heldout_accuracy']:.3f}",
             "at least 0.95"],
            [f"training, all {len(stages)} stages", f"{r['train_seconds']:.0f} s ({steps:,} steps)",
             "under 10 minutes"]]
    return [*questions(ev["questions"]), "", *table(["figure", "value", "target"], rows)]


def questions(q: dict) -> list[str]:
    """Every question asked of every test scene (`vit eval`'s `questions`)."""
    groups = [("seen", f"every seen pair ({q['seen']['questions']})", "at least 0.97"),
              ("heldout", f"the {q['heldout']['questions']} held-out pairs",
               "at least 0.95; hard false yes at most 0.10"),
              ("wording", "seen pairs, 2 held-out wordings", "at least 0.90")]
    rows = [[label, f"{q[g]['balanced_accuracy']:.3f}", target, f"{q[g]['auc']:.3f}",
             " / ".join(f"{q[g]['false_yes'][k]:.3f}"
                        for k in ("neither", "colour_only", "shape_only", "both_apart"))]
            for g, label, target in groups]
    rows.append([f"never-drawn words ({q['never']['questions']} questions): yes-rate",
                 f"{q['never']['yes_rate']:.3f}", "at most 0.05", "", ""])
    if "unknown" in q:
        rows.append([f"prompts of unknown words ({q['unknown']['questions']}): yes-rate",
                     f"{q['unknown']['yes_rate']:.3f}", "", "", ""])
    return [f"Every question asked of each of {q['images']} test scenes (yes above "
            f"{q['threshold']}); false yes at most 0.03 where the scene has neither:", "",
            *table(["questions", "balanced accuracy", "target", "AUC",
                    "false yes: neither / colour only / shape only / both apart"], rows)]


def f3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


FASHION_TARGETS = {"seen": "at least 0.95", "heldout": "at least 0.90", "wording": "at least 0.93"}


def fashion_scenes(r: dict) -> list[str]:
    """`fashion_scenes`: every question of every test scene by group and kind of question,
    the controls, the relevancy maps' pointing, and the ViT stage's class recognition."""
    ev, q = r["eval"], r["eval"]["questions"]
    rows = []
    for g, target in FASHION_TARGETS.items():
        for kind, fig in [("all", q[g]), *q[g].get("by_kind", {}).items()]:
            rows.append([f"{g}" + ("" if kind == "all" else f": {kind}") + f" ({fig['questions']})",
                         f3(fig["balanced_accuracy"]), target if kind == "all" else "",
                         f3(fig["auc"]), ", ".join(f"{k} {f3(v)}" for k, v in
                                                   fig["false_yes"].items() if v is not None)])
    rows.append([f"never-placed classes ({q['never']['questions']}): yes-rate",
                 f3(q["never"]["yes_rate"]), "at most 0.05", "", ""])
    if "unknown" in q:
        rows.append([f"prompts of unknown words ({q['unknown']['questions']}): yes-rate",
                     f3(q["unknown"]["yes_rate"]), "", "", ""])
    rows += [[f"control `{k}` (answer accuracy)", f3(v), "0.50 ± 0.05", "", ""]
             for k, v in ev["controls"].items()]
    rows += [[f"relevancy's strongest patch on the item: {k.replace('_', ' ')}",
              f"{v['inside']} of {v['scenes']} ({f3(v['rate'])})", "at least 0.90", "", ""]
             for k, v in r.get("pointing", {}).items()]
    vit_stage = (r.get("stages", {}).get("vit") or {}).get("last_validation") or {}
    stages = r.get("stages", {})
    tail = []
    if "label_accuracy" in vit_stage:
        tail.append(f"The ViT stage ({stages['vit']['steps']:,} steps) recognises the classes "
                    f"present with a per-label accuracy of {f3(vit_stage['label_accuracy'])} on "
                    "the validation scenes.")
    if stages:
        tail.append(f"Training, all {len(stages)} stages: {r['train_seconds']:.0f} s "
                    f"({sum(s['steps'] for s in stages.values()):,} steps).")
    return [f"Every question asked of each of {q['images']} test scenes (yes above "
            f"{q['threshold']}):", "",
            *table(["questions", "balanced accuracy", "target", "AUC",
                    "false yes by kind of \"no\""], rows), *(["", " ".join(tail)] if tail else [])]


def ablation_row(run: dict, where: str, q: dict) -> list[str]:
    h = q["heldout"]
    return [run["labels"], run["cross_attention"], run["tune"], f3(h["balanced_accuracy"]),
            f3(h["auc"]), f3(h["false_yes"]["both_apart"]), f3(h["false_yes"]["colour_only"]),
            f3(h["false_yes"]["shape_only"]), f3(q["seen"]["balanced_accuracy"]),
            f3(q["seen"]["false_yes"]["both_apart"]), f3(q.get("unknown", {}).get("yes_rate")),
            where]


def promptshapes_ablation(r: dict, recipe: dict) -> list[str]:
    """What makes promptshapes' held-out pairs answerable: the recipe's record
    (`promptshapes`) beside each variant of this record, on the same questions."""
    from benchmarks.text import RECIPE

    rows = [ablation_row(RECIPE, "the recipe, `promptshapes.json`",
                         recipe["eval"]["questions"])]
    rows += [ablation_row(v, f"`{name}`", v["eval"]["questions"])
             for name, v in r["variants"].items()]
    return [f"Held-out pairs, each of {recipe['eval']['questions']['images']} test scenes asked "
            "every question (targets: held-out balanced accuracy at least 0.95, false yes on "
            "hard negatives at most 0.10):", "",
            *table(["ViT-stage labels", "cross-attention", "tune stage",
                    "held-out pairs: balanced accuracy", "AUC", "false yes, both apart (hard)",
                    "colour only", "shape only", "seen pairs", "seen pairs, hard false yes",
                    "unknown-word yes-rate", "run"], rows), "",
            f"The recipe's row: `{RECORDS}/promptshapes.json` ({host(recipe)}, "
            f"{recipe['date_utc'][:10]}), made by `{recipe['command']}`."]


METHODS = ("attention", "rollout", "grad-rollout", "relevancy")


def auc_cells(result: dict) -> list[str]:
    """The area with its interval, and the difference from random with its interval."""
    vs = result["vs_random"]
    return [f"{result['auc']:.3f} {interval(result['ci95'])}",
            f"{signed(vs['mean'])} {interval(vs['ci95'], signed)}"]


def faithfulness(r: dict) -> list[str]:
    runs = {(run["metric"], run["substrate"], run["steps"]): run["results"] for run in r["runs"]}
    dele, ins = runs[("deletion", "mean", 16)], runs[("insertion", "mean", 16)]
    rows = [[m, *auc_cells(dele[m]), *auc_cells(ins[m])] for m in METHODS]
    rows.append(["random", auc_cells(dele["random"])[0], "", auc_cells(ins["random"])[0], ""])
    by_substrate = []
    for sub in ("mean", "zero", "blur"):
        d, i = runs.get(("deletion", sub, 16)), runs.get(("insertion", sub, 16))
        if d and i:
            by_substrate.append([f"`{sub}`", *(f"{signed(d[m]['vs_random']['mean'])} / "
                                               f"{signed(i[m]['vs_random']['mean'])}"
                                               for m in METHODS)])
    by_steps = []
    for steps in sorted({s for (_, sub, s) in runs if sub == "mean"}):
        d, i = runs.get(("deletion", "mean", steps)), runs.get(("insertion", "mean", steps))
        if d and i:
            by_steps.append([steps, *(f"{d[m]['auc']:.3f} / {i[m]['auc']:.3f}"
                                      for m in METHODS)])
    model = (f"the digits model `{r['checkpoint']}` that the demo record of "
             f"{r['model_made_utc'][:10]} made" if r.get("model_made_utc")
             else f"the digits model `{r['checkpoint']}`")
    return [f"{r['images']} test digits, {model} (test accuracy "
            f"{r['model_test_accuracy']:.3f}), 16 steps, `mean` substrate; area under the curve "
            "with its 95% bootstrap interval, and the paired difference from the random ranking "
            "on the same images:", "",
            *table(["method", "deletion AUC (lower is better)", "vs random",
                    "insertion AUC (higher is better)", "vs random"], rows), "",
            "Difference from random, deletion / insertion, by substrate (16 steps):", "",
            *table(["substrate", *METHODS], by_substrate),
            *(["", "Deletion / insertion AUC by step count (`mean` substrate):", "",
               *table(["steps", *METHODS], by_steps)] if len(by_steps) > 1 else [])]


def explain_memory(r: dict) -> list[str]:
    res = r["results"]
    batches = [c["batch"] for c in next(iter(res.values()))["compiled"]]
    rows = [[f"`{name}`" if name != "keep-every-layer" else "every layer's attention kept",
             *(num(c["total_gb"]) for c in v["compiled"])] for name, v in res.items()]
    return [f"ViT-{r['model']} at {r['image_size']} px ({r['tokens']} tokens), XLA's compiled "
            "memory in GB (temporaries and outputs, the weights and images excluded):", "",
            *table(["method", *(f"batch {b}" for b in batches)], rows)]


KERNELS = {"flash_attention_fwd": "forward", "flash_attention_dkv": "dK/dV",
           "flash_attention_dq": "dQ"}


def kernel_resources(r: dict) -> list[str]:
    cells: dict = {}
    for k in r["kernels"]:
        if k["dtype"] == "bfloat16" and not k["kv_len"] and k["head_dim"] in (64, 128):
            tile = "x".join(map(str, k["tile"]))
            spill = f", {k['spill_bytes']} B spill" if k["spill_bytes"] else ""
            cells.setdefault((k["head_dim"], k["seq"]), {})[k["kernel"]] = (
                f"{tile}, {k['warps']}w: {k['registers']} regs, "
                f"{k['shared_bytes'] // 1024} KiB{spill}")
    rows = [[hd, seq, *(cell.get(k, "-") for k in KERNELS)]
            for (hd, seq), cell in sorted(cells.items())]
    fit = sum(k["ok"] for k in r["kernels"])
    bf16 = [k for k in r["kernels"] if k["dtype"] == "bfloat16"]
    return [f"{r['target']}, bfloat16; each cell is the tile (queries x keys), warps, registers "
            "per thread and shared memory:", "",
            *table(["head_dim", "tokens", *KERNELS.values()], rows), "",
            f"{fit} of {len(r['kernels'])} kernels fit (head_dim "
            f"{min(k['head_dim'] for k in r['kernels'])}-"
            f"{max(k['head_dim'] for k in r['kernels'])}, bfloat16 and float32, with and "
            f"without `kv_len`); {sum(k['spill_bytes'] > 0 for k in bf16)} bfloat16 kernels "
            f"spill; {sum(k['wgmma'] for k in bf16)} of {len(bf16)} bfloat16 kernels use "
            "`wgmma`."]


def fashion_mnist(r: dict) -> list[str]:
    """A real-data recipe run as a user runs it (`python -m benchmarks realdata fashion`)."""
    rows = [[f"{v['step']:,}", pct(v["validation_accuracy"]), f"{v['seconds'] / 60:.1f}"]
            for v in r["validation_curve"]]
    load = r.get("load_average_1min") or {}
    within = r.get("reached_within_15_min")
    reached = (f" Within 15 minutes: {pct(within['validation_accuracy'])} validation accuracy "
               f"(step {within['step']:,})." if within else "")
    return [f"`vit train --config {r['recipe']}`, {r['steps']:,} steps of {r['batch_size']} "
            f"(target: {r['target']}):", "",
            *table(["step", "validation accuracy", "minutes from the start"], rows), "",
            f"Test accuracy {pct(r['test_accuracy'])} on the {r['test_images']:,} test images; "
            f"{num(r['images_per_s_median'], 1)} images/s (median), the run "
            f"{r['wall_s'] / 60:.0f} minutes"
            + (f", load average {load['median']:.1f} (median over the run)." if load else ".")
            + reached]


def suite(r: dict) -> list[str]:
    rows = [[f"`{run['command']}`", run["passed"], run.get("skipped", 0),
             run.get("failed", 0), f"{run['wall_s'] / 60:.1f} minutes"] for run in r["runs"]]
    return table(["command", "passed", "skipped", "failed", "wall time"], rows)


# Each record's renderer. A record not listed here is rendered by the `table(record) -> list
# of Markdown lines` function of the mode whose command made it (`MODES` in __main__.py), so
# a new mode brings its own; a record with neither fails the check.
RENDERERS = {
    "demo": demo,
    "inference": inference,
    "predict": predict,
    "predict_startup": predict_startup,
    "gemm": gemm,
    "train": train,
    "train_variants": train_variants,
    "data_wait": data_wait,
    "scaling": scaling,
    "bfloat16_agreement": bfloat16_agreement,
    "promptshapes": promptshapes,
    "faithfulness": faithfulness,
    "explain_memory": explain_memory,
    "kernel_resources": kernel_resources,
    "suite": suite,
    "fashion_mnist": fashion_mnist,
    "fashion_scenes": fashion_scenes,
    "promptshapes_ablation": promptshapes_ablation,
}
# Records whose table also shows another record, for comparison: {record: the other}. The
# other keeps its own table; this one's is regenerated when either changes.
COMPARED_WITH = {"promptshapes_ablation": "promptshapes"}
# Blocks that are one sentence in running text: no heading line, the record named inside.
INLINE = {"demo"}


# ------------------------------------------------------------------------------- the docs


def records(root: Path = ROOT) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text())
            for p in sorted((root / RECORDS).glob("*.json"))}


def renderer(name: str, record: dict) -> Callable[[dict], list[str]] | None:
    """The function that makes record `name`'s table: `RENDERERS`' entry, or the `table`
    function of the mode named in the record's command."""
    if name in RENDERERS:
        return RENDERERS[name]
    import importlib

    from benchmarks.__main__ import MODES

    words = record.get("command", "").split()
    mode = words[3] if words[:3] == ["python", "-m", "benchmarks"] and len(words) > 3 else None
    if mode not in MODES:
        return None
    return getattr(importlib.import_module(MODES[mode][0]), "table", None)


def render(name: str, record: dict, recs: dict[str, dict] | None = None) -> str:
    """A block's text: the host and date, the table, then the record and its command. `recs`
    holds the records a table compares with (`COMPARED_WITH`)."""
    draw = renderer(name, record)
    lines = (draw(record, (recs or {})[COMPARED_WITH[name]]) if name in COMPARED_WITH
             else draw(record))
    if name not in INLINE:
        lines = [heading(record), "", *lines, "", source(name, record)]
    return "\n".join(lines) + "\n"


def blocks(text: str) -> dict[str, str]:
    """NAME -> body of each `<!-- table NAME -->` block in `text`."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def contents(text: str, recs: dict[str, dict]) -> str:
    """The page's contents: each `##` section, linked, with the hosts and dates of the records
    shown in it."""
    lines = []
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    for section in sections:
        title = section.splitlines()[0]
        shown = [recs[n] for n in blocks(section) if n in recs]
        where = "; ".join(sorted({f"{host(r)}, {r['date_utc'][:10]}" for r in shown}))
        lines.append(f"- [{title}](#{slug(title)})" + (f": {where}" if where else ""))
    return "\n".join(lines) + "\n"


def regenerate(text: str, recs: dict[str, dict]) -> str:
    """`text` with each block's body replaced by what its record gives."""
    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in recs:
            raise KeyError(f"a table names {RECORDS}/{name}.json, which does not exist")
        return m.group(1) + render(name, recs[name], recs) + m.group(4)

    text = BLOCK.sub(fill, text)
    return CONTENTS.sub(lambda m: m.group(1) + contents(text, recs) + m.group(3), text)


def stale(root: Path = ROOT) -> list[str]:
    """The docs whose generated blocks differ from what the records give."""
    recs = records(root)
    return [doc for doc in docs(root)
            if regenerate((root / doc).read_text(), recs) != (root / doc).read_text()]


def prose(text: str) -> str:
    """`text` without what the figure check leaves alone: generated blocks, code, comments
    and link targets. Lines are kept, so positions still name the right line."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = BLOCK.sub(blank, text)
    text = CONTENTS.sub(blank, text)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def unbacked(root: Path = ROOT) -> list[str]:
    """Every figure in the docs outside a generated block that `NOT_MEASURED` does not list:
    "FILE:LINE: FIGURE"."""
    out = []
    for doc in docs(root):
        allowed = {*NOT_MEASURED.get(doc, {}), *FROM_HISTORY.get(doc, {}),
                   *PENDING.get(doc, ())}
        for number, line in enumerate(prose((root / doc).read_text()).splitlines(), 1):
            out += [f"{doc}:{number}: {m.group(0)}" for m in FIGURE.finditer(line)
                    if m.group(0) not in allowed]
    return out


def unshown(root: Path = ROOT) -> list[str]:
    """Problems with which records are shown: a record with no renderer, with no table, or
    with more than one."""
    recs, problems, shown = records(root), [], {}
    for name in sorted(n for n, r in recs.items() if renderer(n, r) is None):
        problems.append(f"{RECORDS}/{name}.json has no renderer: a `table(record)` in its "
                        "mode's module, or an entry in benchmarks/tables.py")
    for doc in docs(root):
        for name in blocks((root / doc).read_text()):
            if name in shown:
                problems.append(f"{name} has a table in {shown[name]} and in {doc}")
            shown[name] = doc
    for name in sorted(set(recs) - set(shown)):
        problems.append(f"{RECORDS}/{name}.json has no table in the docs")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tables",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 on a stale table, a record without one, "
                             "or a figure outside the tables")
    args = parser.parse_args(argv)
    problems = unshown()
    recs = records()
    changed = []
    for doc in docs():
        path = ROOT / doc
        text = path.read_text()
        new = regenerate(text, recs)
        if new != text:
            changed.append(doc)
            if not args.check:
                path.write_text(new)
    if not args.check:
        print(f"tables: wrote {', '.join(changed) or 'nothing (all current)'}")
        print("\n".join(problems), file=sys.stderr)
        return 1 if problems else 0
    problems += [f"{doc}: stale tables: run python -m benchmarks tables" for doc in changed]
    problems += [f"{where} is a figure outside the generated tables: put it in a record's "
                 "table or delete it" for where in unbacked()]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"tables: {len(recs)} records, each in one current table; no other figures")
    return 0
