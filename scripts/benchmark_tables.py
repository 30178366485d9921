"""Writes the benchmark tables of docs/benchmarks.md, and the demo's result in README.md, from
the records in benchmarks/*.json, so a figure in the docs is always the latest record's.

Each table sits between `<!-- table NAME -->` and `<!-- /table NAME -->`, NAME being its record
(benchmarks/NAME.json); the text around the markers is written by hand.

    python scripts/benchmark_tables.py            # rewrite the tables from the records
    python scripts/benchmark_tables.py --check    # exit 1 when a table differs from its record
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks"
# The files that hold tables; the demo's result is in the README alone.
DOCS = ("README.md", "docs/benchmarks.md")

BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table (?P=name) -->)",
                   re.DOTALL)


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


def command(record: dict) -> str:
    """The record's command from `scripts/` on, without `--out` (the script's default writes
    the record): the interpreter's path and a scratch output say nothing."""
    text = re.sub(r" --out \S+", "", record.get("command", ""))
    at = text.find("scripts/")
    return f"python {text[at:]}" if at >= 0 else text


def source(name: str, record: dict) -> str:
    """The line under each table: which record, when, on what, made by which command."""
    parts = [f"`benchmarks/{name}.json`"]
    date = record.get("date_utc")
    parts.append(date[:10] if date else "undated")
    machine = record.get("machine") or {}
    cpu = (machine.get("cpu") or {}).get("model_name")
    if cpu:
        parts.append(f"{cpu}, {machine.get('cpus')} cores")
    elif machine.get("cpus"):
        parts.append(f"{machine['cpus']} cores")
    parts.append(f"`{command(record)}`")
    return "Record: " + ", ".join(parts) + "."


# ------------------------------------------------------------------------------ renderers


def demo(r: dict) -> list[str]:
    right = round(r["test_accuracy"] * r["num_test_examples"])
    machine = r.get("machine") or {}
    cpu = (machine.get("cpu") or {}).get("model_name") or "CPU"
    return [f"Measured {r['date_utc'][:10]} (`benchmarks/demo.json`): **{pct(r['test_accuracy'])} "
            f"test accuracy** ({right} of {r['num_test_examples']} held-out digits) after "
            f"{r['train_seconds']:.0f} s of training on a {machine.get('cpus')}-core {cpu}."]


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
    like = r.get("ours_bfloat16_ratio_to_hf_bfloat16_median")
    cpu = r.get("machine", {}).get("cpu", {})
    tail = ([f"bfloat16 against bfloat16: vit {num(like)}x transformers. CPU bfloat16 "
             f"arithmetic: {', '.join(cpu.get('bfloat16_arithmetic') or []) or 'none'}."]
            if like is not None else [])
    return [f"`{s['model']}`, batch {s['batch']}, {s['image_size']} px, "
            f"median of {s['rounds']} rounds:", "",
            *table(["model", "images/s", "vs transformers", "top-1 = transformers'",
                    "largest probability difference"], rows), *([""] + tail if tail else [])]


def predict(r: dict) -> list[str]:
    speed, median, agree = r["images_per_s"], r["ratio_median_of_rounds"], \
        r["top1_agreement_with_transformers"]
    rows = [[f"`vit predict`, {d}", num(speed[f"vit_{d}"]), num(median[f"vit_{d}"]),
             num(agree[f"vit_{d}"])] for d in ("float32", "bfloat16")]
    rows.append(["transformers pipeline, float32", num(speed["transformers"]), "1.00", ""])
    lines = [f"{r['task'][0].upper()}{r['task'][1:]}:", "",
             *table(["", "images/s (best pass)", "vs transformers (median of rounds)",
                     "top-1 = transformers'"], rows)]
    start = r.get("start_up_one_image")
    if start:
        ready = start["vit_ready_lines"]
        lines += ["", "One image, process start to exit, median of "
                  f"{len(start['rounds']['vit_cold_s'])} rounds:", "",
                  *table(["", "seconds", "`ready` line"], [
                      ["`vit predict`, cold (empty cache)", num(start["vit_cold_s"], 1),
                       f"`{ready['vit_cold']}`"],
                      ["`vit predict`, JAX's compile cache only",
                       num(start["vit_compile_cache_only_s"], 1),
                       f"`{ready['vit_compile_cache_only']}`"],
                      ["`vit predict`, warm (prepared classifier)", num(start["vit_warm_s"], 1),
                       f"`{ready['vit_warm']}`"],
                      ["transformers, first prediction", num(start["transformers_s"], 1), ""]])]
    return lines


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
    rows = [[label, num(res["threads_2"]["ms_all_four"][k], 0),
             num(res["threads_1"]["ms_all_four"][k], 0)]
            for k, label in GEMM_CONTESTANTS.items() if k in res["threads_2"]["ms_all_four"]]
    ceiling, peak = res["ceiling"], res["peak"]
    return ["ViT-B/16's four dense layers (qkv, proj, fc1 + GELU, fc2) at batch 8, ms for one "
            "block's four:", "",
            *table(["contestant", "2 threads", "1 thread"], rows), "",
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


def native_products(r: dict) -> list[str]:
    """ViT's float32 products: XLA's dots, MKL through an FFI call, torch (GFLOP/s)."""
    rows = [[p["layer"], p["product"], num(p["gflop_s"]["xla"], 0), num(p["gflop_s"]["mkl"], 0),
             num(p["gflop_s"]["torch"], 0), num(p["gflop_s"]["xla"] / p["gflop_s"]["torch"]),
             num(p["gflop_s"]["mkl"] / p["gflop_s"]["torch"])] for p in r["products"]]
    return ["ViT-B/16's float32 layer products at batch 8 (1,576 tokens), GFLOP/s, best of "
            "each, alternating in one process:", "",
            *table(["layer", "product", "XLA's dots", "MKL by FFI", "torch", "XLA / torch",
                    "MKL / torch"], rows)]


def attention_cpu(r: dict) -> list[str]:
    """The attention core fwd+bwd, ours against SDPA, and the batched q @ k^T product alone."""
    rows = []
    for c in r["cases"]:
        core, rate = c["core_fwd_bwd_ms"], c["qk_product_gflop_s"]
        micro = c.get("vit_micro_batches", 1)
        ours = num(core["vit"], 1) + (f" ({micro} x {c['batch'] // micro})" if micro > 1 else "")
        rows.append([f"ViT-{c['case'].split(':')[0]}", c["batch"], c["heads"], ours,
                     num(core["torch_sdpa"], 1), num(c["torch_over_vit"]),
                     f"{num(rate['jax_all_cores'], 0)} / {num(rate['jax_1_core'], 0)}",
                     f"{num(rate['torch_all_cores'], 0)} / {num(rate['torch_1_core'], 0)}"])
    return [f"One block's attention core, forward + backward, float32, {r['tokens']} tokens, "
            f"head_dim {r['head_dim']}; the batched q @ k^T product alone on all "
            f"{r['cores']} cores / on one, GFLOP/s; ours on the micro-batches its step runs "
            f"(count x examples); medians of {r['rounds']} rounds:", "",
            *table(["model", "batch", "heads", "vit ms", "torch SDPA ms", "speed vs torch",
                    "XLA's q @ k^T", "torch's q @ k^T"], rows)]


def train(r: dict) -> list[str]:
    rows, ours = [], []
    for c in r["cases"]:
        # Records before bfloat16 was measured hold the float32 figures at the case's top level.
        for dtype in r.get("dtypes", ["float32"]):
            d = c.get(dtype, c)
            steps = d["median_step_s"]
            rows.append([f"ViT-{c['model']}", c["batch"], dtype,
                         num(statistics.median(steps["vit"])),
                         num(statistics.median(steps["transformers"])),
                         " / ".join(num(x) for x in d["ratio_transformers_over_vit"]),
                         num(d["median_ratio"]),
                         f"{d['loss_last_relative_difference']:.1e}"])
        for dtype in r.get("dtypes", ["float32"]):
            plain = c.get(dtype, {}).get("plain_malloc")
            if plain:  # ours once more without the huge-page tunable (--plain-malloc)
                ours.append(f"ViT-{c['model']} batch {c['batch']} {dtype}, ours without huge "
                            f"pages (glibc's default malloc): "
                            f"{num(statistics.median(plain['median_step_s']))} s a step; huge "
                            f"pages make it {num(plain['median_ratio'])}x as fast.")
            defaults = c.get(dtype, {}).get("jax_defaults")
            if defaults:  # ours once more with jax's default compile options (--jax-defaults)
                given = r["xla_cpu_options"]["float32" if dtype == "float32" else "other dtypes"]
                options = "our options (`" + ", ".join(
                    f"{k.removeprefix('xla_cpu_')}={v}" for k, v in given.items()) + "`)"
                ours.append(f"ViT-{c['model']} batch {c['batch']} {dtype}, ours compiled with "
                            f"jax's default XLA:CPU options (YNNPACK's dots): "
                            f"{num(statistics.median(defaults['median_step_s']))} s a step; "
                            f"{options} make it {num(defaults['median_ratio'])}x as fast.")
            mkl = c.get(dtype, {}).get("mkl_products")
            if mkl:  # ours once more, its layer products through MKL (--mkl-products)
                steps = c[dtype]["median_step_s"]
                mine = mkl["median_step_s"]
                over_ours = [v / m for v, m in zip(steps["vit"], mine, strict=True)]
                over_tf = [t / m for t, m in zip(steps["transformers"], mine, strict=True)]
                ours.append(f"ViT-{c['model']} batch {c['batch']} {dtype}, ours with every "
                            f"layer product through MKL (the experiment "
                            f"`scripts/native_gemm.py`): "
                            f"{num(statistics.median(mkl['median_step_s']))} s a step, "
                            f"{num(statistics.median(over_ours))}x ours as shipped and "
                            f"{num(statistics.median(over_tf))}x transformers' (by round: "
                            + " / ".join(num(x) for x in over_tf) + ").")
        if "vit_bfloat16_speedup_median" in c:
            ours.append(f"ViT-{c['model']} batch {c['batch']}: our bfloat16 step is "
                        f"{num(c['vit_bfloat16_speedup_median'])}x our float32 step.")
    cpu = r.get("machine", {}).get("cpu", {})
    bf16 = cpu.get("bfloat16_arithmetic")
    note = ([f"CPU bfloat16 arithmetic: {', '.join(bf16) if bf16 else 'none'}."]
            if bf16 is not None else [])
    env = r.get("environment")
    if env:
        note.append(f"Environment: ours `GLIBC_TUNABLES={env['vit']}` (as the `vit` command "
                    f"sets it), transformers' `{env['transformers']}`; transparent huge pages "
                    f"`{env['transparent_hugepage']}`.")
    # --interleave: the processes stay alive and alternate run by run (records before it: no).
    how = (", both processes alive throughout, their runs alternating" if r.get("interleaved")
           else "")
    if r.get("untimed_steps_per_run"):  # --rewarm: steps after the other side's run, untimed
        how += (f", each run after {r['untimed_steps_per_run']} untimed step(s) (memory the VM "
                "took back while the process waited)")
    return [f"`vit train`'s step against transformers' (CPU), seconds a step, median "
            f"of each run's {r['timed_steps_per_run']} timed steps, {r['rounds']} rounds{how}:",
            "",
            *table(["model", "batch", "dtype", "vit", "transformers",
                    "speed vs transformers, by round", "median",
                    "loss difference after the last step (relative)"], rows),
            *([""] + ours + note if ours or note else [])]


def profile(r: dict) -> list[str]:
    """Ours by part of the model, theirs by aten op (the ops past 1% of the step)."""
    def rows(parts: dict, floor: float) -> list[list]:
        total = sum(parts.values())
        return [[name, num(secs), pct(secs / total)] for name, secs in
                sorted(parts.items(), key=lambda kv: -kv[1]) if secs >= floor * total]

    model, batch = r["case"].split(":")
    ours, theirs = r["vit"], r["transformers"]
    return [f"Where one ViT-{model} batch-{batch} training step's time goes, seconds summed "
            f"over the ops of every thread (mean of {r['profiled_steps']} profiled steps; the "
            f"step took {num(ours['step_s'])} s ours, {num(theirs['step_s'])} s theirs under "
            "the profilers):", "",
            *table(["vit: part of the model", "s", "share"], rows(ours["parts_s"], 0.001)), "",
            *table(["transformers: aten op", "s", "share"], rows(theirs["parts_s"], 0.01)),
            *(ceiling_lines(r["ceiling"]) if "ceiling" in r else [])]


def ceiling_lines(c: dict) -> list[str]:
    """Whether the target ratio is within this machine's reach (profile_train_step's ceiling)."""
    rows = [["matrix-product GFLOP in a step", num(c["matmul_gflop"]["vit"], 0),
             num(c["matmul_gflop"]["transformers"], 0)],
            ["step's rate, share of the peak", pct(c["step_fraction_of_peak"]["vit"]),
             pct(c["step_fraction_of_peak"]["transformers"])],
            ["matrix products' rate, share of the peak",
             pct(c["products_fraction_of_peak"]["vit"]),
             pct(c["products_fraction_of_peak"]["transformers"])],
            ["the rest of the step (not matrix products), s", num(c["rest_s_now"]["vit"]),
             num(c["rest_s_now"]["transformers"])]]
    peaks = " / ".join(f"{k} {num(v, 0)}" for k, v in c["square_product_gflop_s"].items())
    return ["", f"What {c['target']}x transformers' step asks of this machine. Its float32 peak: "
            f"{num(c['peak_gflop_s'], 0)} GFLOP/s (the faster library's "
            f"{c['peak_product_side']}-square product: "
            f"{peaks}). The target allows {num(c['step_s_target_allows'])} s a step; our "
            f"matrix products alone take {num(c['vit_products_at_peak_s'])} s at the peak, "
            f"leaving {num(c['rest_s_allowed_if_products_at_peak'])} s for everything else:", "",
            *table(["", "vit", "transformers"], rows)]


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
    return [f"{r['benchmark']}, forced host devices:", "",
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
        # A checkpoint the script was given is named by its path; one it trained, by its name.
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
             "at least 0.80"],
            [f"training, all {len(stages)} stages", f"{r['train_seconds']:.0f} s ({steps:,} steps)",
             "under 10 minutes"]]
    return [*questions(ev["questions"]), "", *table(["figure", "value", "target"], rows)]


def questions(q: dict) -> list[str]:
    """Every question asked of every test scene (`vit eval`'s `questions`)."""
    groups = [("seen", f"every seen pair ({q['seen']['questions']})", "at least 0.97"),
              ("heldout", f"the {q['heldout']['questions']} held-out pairs", "at least 0.80"),
              ("wording", "seen pairs, 2 held-out wordings", "at least 0.90")]
    rows = [[label, f"{q[g]['balanced_accuracy']:.3f}", target, f"{q[g]['auc']:.3f}",
             " / ".join(f"{q[g]['false_yes'][k]:.3f}"
                        for k in ("neither", "colour_only", "shape_only", "both_apart"))]
            for g, label, target in groups]
    rows.append([f"never-drawn words ({q['never']['questions']} questions): yes-rate",
                 f"{q['never']['yes_rate']:.3f}", "at most 0.05", "", ""])
    return [f"Every question asked of each of {q['images']} test scenes (yes above "
            f"{q['threshold']}); false yes at most 0.03 where the scene has neither:", "",
            *table(["questions", "balanced accuracy", "target", "AUC",
                    "false yes: neither / colour only / shape only / both apart"], rows)]


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
    return [f"{r['images']} test digits, model test accuracy {r['model_test_accuracy']:.3f}, "
            "16 steps, `mean` substrate; area under the curve with its 95% bootstrap interval, "
            "and the paired difference from the random ranking on the same images:", "",
            *table(["method", "deletion AUC (lower is better)", "vs random",
                    "insertion AUC (higher is better)", "vs random"], rows), "",
            "Difference from random, deletion / insertion, by substrate (16 steps):", "",
            *table(["substrate", *METHODS], by_substrate)]


def explain_memory(r: dict) -> list[str]:
    res = r["results"]
    batches = [c["batch"] for c in next(iter(res.values()))["compiled"]]
    rows = [[f"`{name}`" if name != "keep-every-layer" else "every layer's attention kept",
             *(num(c["total_gb"]) for c in v["compiled"])] for name, v in res.items()]
    return [f"ViT-{r['model']} at {r['image_size']} px ({r['tokens']} tokens), XLA's compiled "
            "memory in GB, the weights excluded:", "",
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


def step_options(r: dict) -> list[str]:
    names = [n for n in r["variants"] if n != "jax_defaults"]
    rows = []
    for c in r["cases"]:
        model, batch = c["case"].split(":")
        for n in names:
            rows.append([f"ViT-{model}", batch, n, f"`{r['variants'][n]}`",
                         num(statistics.median(c["step_s"]["jax_defaults"])),
                         num(statistics.median(c["step_s"][n])),
                         " / ".join(num(x) for x in c["speedup_over_jax_defaults"][n]),
                         num(c["median_speedup"][n]),
                         f"{c['scratch_bytes']['jax_defaults'] / 2**30:.2f} → "
                         f"{c['scratch_bytes'][n] / 2**30:.2f}"])
    lines = [f"{r['benchmark']}: seconds a step (the faster of {r['timed_steps_per_round']} a "
             f"round, median of {r['rounds']} rounds) and the speed over jax's defaults:", "",
             *table(["model", "batch", "variant", "XLA:CPU options", "jax's defaults s",
                     "variant s", "speed by round", "median",
                     "scratch GiB a step (defaults → variant)"], rows)]
    whole = "vit_whole_batch"
    if whole in r["variants"]:  # --whole-batch: the split step over the same step whole
        lines.append("")
        for c in r["cases"]:
            by_round = [w / v for w, v in zip(c["step_s"][whole], c["step_s"]["vit"],
                                              strict=True)]
            lines.append(f"ViT-{c['case'].replace(':', ' batch ')}: `vit` (the batch in "
                         f"micro-batches) over `{whole}`, by round "
                         f"{' / '.join(num(x) for x in by_round)}, median "
                         f"{num(statistics.median(by_round))}.")
    return lines


# Record name (benchmarks/NAME.json) -> what its table shows.
RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "demo": demo,
    "bench_inference": inference,
    "bench_inference_bf16cpu": inference,  # a CPU with bfloat16 arithmetic (AMX)
    "bench_inference_bf16cpu_before": inference,  # the same, bfloat16 through XLA's own dots
    "bench_predict": predict,
    "bench_predict_bf16cpu": predict,  # a CPU with bfloat16 arithmetic (AMX), no start-up
    "bench_gemm": gemm,
    "bench_gemm_bf16cpu": gemm,  # a CPU with bfloat16 arithmetic (AMX)
    "bench_train": train,
    "bench_train_repeat": train,  # the same benchmark run again: how far a record moves
    "bench_train_interleaved": train,  # --interleave: the host's drift cancels round by round
    "bench_train_interleaved_unsplit": train,  # the same, before a CPU step split its batch
    "bench_train_bf16cpu": train,  # a CPU with bfloat16 arithmetic (AMX), --interleave
    "bench_train_bf16cpu_norewarm": train,  # the same before --rewarm: every first step timed
    "bench_train_mkl_products": train,  # --mkl-products: our products through MKL (experiment)
    "native_gemm_products": native_products,  # scripts/native_gemm.py: the same, isolated
    "attention_cpu": attention_cpu,  # the step's attention core against SDPA
    "profile_train_step": profile,
    "profile_train_step_xeon": profile,  # ViT-B/16 batch 8 on a Xeon with AVX-512 and AMX
    "bench_step_options": step_options,
    "bench_step_split": step_options,  # --whole-batch: the step split for the cache, or whole
    "bench_step_split_bf16cpu": step_options,  # the same in bfloat16, on a CPU with AMX
    "bench_step_split_xeon": step_options,  # float32 again on that CPU, the faster of 2 steps
    "bench_scaling": scaling,
    "data_wait": data_wait,
    "bfloat16_agreement": bfloat16_agreement,
    "promptshapes": promptshapes,
    "faithfulness": faithfulness,
    "explain_memory": explain_memory,
    "kernel_resources": kernel_resources,
}


# ------------------------------------------------------------------------------- the docs


def records(folder: Path = RECORDS) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def render(name: str, record: dict) -> str:
    """A block's text: the table, then the record it came from (the demo's sentence names it)."""
    lines = RENDERERS[name](record)
    if name != "demo":
        lines = [*lines, "", source(name, record)]
    return "\n".join(lines) + "\n"


def blocks(text: str) -> dict[str, str]:
    """NAME -> body of each `<!-- table NAME -->` block in `text`."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def regenerate(text: str, recs: dict[str, dict]) -> str:
    """`text` with each block's body replaced by what its record gives."""
    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in recs:
            raise KeyError(f"a table names benchmarks/{name}.json, which does not exist")
        return m.group(1) + render(name, recs[name]) + m.group(4)

    return BLOCK.sub(fill, text)


def stale(root: Path = ROOT) -> list[str]:
    """The docs whose tables differ from what the records give."""
    recs = records(root / "benchmarks")
    return [doc for doc in DOCS
            if regenerate((root / doc).read_text(), recs) != (root / doc).read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a table differs from its record")
    args = parser.parse_args(argv)
    recs = records()
    missing = sorted(set(recs) - set(RENDERERS))
    if missing:
        print(f"benchmark_tables: no table for {', '.join(missing)}: add a renderer",
              file=sys.stderr)
        return 1
    changed = []
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        new = regenerate(text, recs)
        if new != text:
            changed.append(doc)
            if not args.check:
                path.write_text(new)
    if args.check and changed:
        print(f"benchmark_tables: stale tables in {', '.join(changed)}: run "
              "python scripts/benchmark_tables.py", file=sys.stderr)
        return 1
    print(f"benchmark_tables: {'checked' if args.check else 'wrote'} {', '.join(DOCS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
