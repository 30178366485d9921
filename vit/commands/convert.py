"""`vit convert SRC DST [--format npz|hf|timm|orbax]`: any readable checkpoint to another format.

Lossless or refused: a format that cannot hold a property of the model (its head, GELU form,
preprocessing, labels, ...) is refused with the property named, before anything is written.
Whole or absent: a write that fails part-way (a full disk) leaves nothing at DST.
"""

from __future__ import annotations

import sys

SUFFIX_FORMATS = {".npz": "npz"}


def add_arguments(parser) -> None:
    parser.add_argument("src", help="any checkpoint `vit predict --checkpoint` accepts")
    parser.add_argument("dst", help="a new destination: an .npz file, or a folder (hf, timm, "
                                    "orbax); never an existing path")
    parser.add_argument("--format", choices=("npz", "hf", "timm", "orbax"), default=None,
                        help="vit_jax-layout npz, Hugging Face folder, timm folder "
                             "(model.safetensors + config.json), or our orbax export (default: "
                             "npz for a .npz DST). A format that cannot hold the model is "
                             "refused, naming what does not fit; orbax holds everything, "
                             "text-conditioned models included")
    parser.add_argument("--image-size", type=int, default=None,
                        help="resize the position embeddings to this resolution first")


def run(args) -> int:
    from pathlib import Path

    from vit.checkpoints import load_checkpoint, save_checkpoint
    from vit.checkpoints.files import check_destination
    from vit.checkpoints.timm import BARE_FILE
    from vit.checkpoints.written_whole import written_whole
    from vit.errors import CheckpointError

    dst = Path(args.dst)
    if dst.suffix == ".safetensors" and args.format in (None, "timm", "hf"):
        raise CheckpointError(f"{args.dst}: {BARE_FILE}")
    fmt = args.format or SUFFIX_FORMATS.get(dst.suffix)
    if dst.suffix == ".npz" and fmt != "npz":  # a folder named like a file misleads every reader
        raise CheckpointError(f"{args.dst}: the name says npz but --format {fmt} writes a "
                              f"folder; drop --format, or name the folder without .npz")
    if fmt is None:
        raise CheckpointError(f"{args.dst}: cannot tell the format from the name; pass "
                              "--format npz|hf|timm|orbax")
    check_destination(dst)  # before the (possibly long) read: nothing is written on failure
    loaded = load_checkpoint(args.src, image_size=args.image_size)
    with written_whole(dst, needed=_stored_bytes(loaded.params)):
        notes = loaded.warnings + save_checkpoint(loaded, dst, fmt)
    for message in notes:
        print(f"vit convert: warning: {message}", file=sys.stderr)
    print(f"vit convert: {loaded.source} -> {args.dst} ({fmt})", file=sys.stderr)
    return 0


def _stored_bytes(params) -> int:
    """What the weights take on disk: every format stores them as float32."""
    from vit.checkpoints.tree import flatten

    return sum(4 * int(getattr(v, "size", 1)) for v in flatten(params).values())
