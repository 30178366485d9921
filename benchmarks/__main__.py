"""`python -m benchmarks MODE [options]`: one benchmark per mode, each writing its record to
`benchmarks/records/`; a mode's module is imported only when it runs."""

from __future__ import annotations

import importlib
import sys

from benchmarks import common

# mode -> (module, what it measures)
MODES = {
    "demo": ("benchmarks.demo", "the digits demo from scratch: test accuracy, training time"),
    "inference": ("benchmarks.inference", "the forward pass against transformers' ViT"),
    "predict": ("benchmarks.predict", "`vit predict` against transformers' pipeline; start-up"),
    "train": ("benchmarks.train", "`vit train`'s step against transformers + torch AdamW"),
    "data_wait": ("benchmarks.data_wait", "share of `vit train`'s wall time spent on data"),
    "realdata": ("benchmarks.realdata", "training on real images; vit against PyTorch"),
    "agreement": ("benchmarks.agreement", "bfloat16 predictions against float32's"),
    "text": ("benchmarks.text", "text recipes: promptshapes, its ablation, fashion_scenes"),
    "faithfulness": ("benchmarks.faithfulness", "deletion-curve faithfulness of explanations"),
    "explain": ("benchmarks.explain", "the compiled memory of explain, streaming and not"),
    "kernels": ("benchmarks.kernels", "the attention kernels' registers and memory on Hopper"),
    "attention": ("benchmarks.attention", "attention kernels on an accelerator (GPU check)"),
    "suite": ("benchmarks.suite", "the test suite's count and wall time"),
    "tables": ("benchmarks.tables", "write (or --check) the docs' tables from the records"),
}


def usage() -> str:
    width = max(map(len, MODES))
    return "usage: python -m benchmarks MODE [options]\n\nmodes:\n" + "\n".join(
        f"  {name:<{width}}  {what}" for name, (_, what) in MODES.items())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    mode, rest = argv[0], argv[1:]
    if mode not in MODES:
        print(f"unknown mode {mode!r}\n{usage()}", file=sys.stderr)
        return 2
    try:  # a record of the repository's, refused now rather than after the run
        common.relative(common.command(rest, mode), strict=common.is_record(common.out_of(rest)))
    except common.PathOutside as e:
        print(f"python -m benchmarks {mode}: {e}", file=sys.stderr)
        return 2
    return importlib.import_module(MODES[mode][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
