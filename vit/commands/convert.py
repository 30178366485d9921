"""`vit convert SRC DST [--format npz|hf|timm|orbax|onnx] [--lossy]`: any readable checkpoint to
another format, or to an ONNX classifier.

Lossless or refused: a format that cannot hold a property of the model (its head, GELU form,
preprocessing, labels, ...) is refused with the property named, before anything is written;
`--lossy` approximates what can be approximated and lists each change on stderr.
Whole or absent: a write that fails part-way (a full disk) leaves nothing at DST.
"""

from __future__ import annotations

import sys

SUFFIX_FORMATS = {".npz": "npz", ".onnx": "onnx"}
FORMATS = ("npz", "hf", "timm", "orbax", "onnx")


def add_arguments(parser) -> None:
    parser.add_argument("src", help="any checkpoint `vit predict --checkpoint` accepts")
    parser.add_argument("dst", help="a new destination: an .npz or .onnx file, or a folder "
                                    "(hf, timm, orbax); never an existing path")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="vit_jax-layout npz, Hugging Face folder, timm folder "
                             "(model.safetensors + config.json), our orbax export, or an ONNX "
                             "classifier file (logits and probabilities; preprocessing in its "
                             "metadata) (default: from a .npz or .onnx DST). A format that "
                             "cannot hold the model is refused, naming what does not fit; "
                             "orbax holds everything, text-conditioned models included")
    parser.add_argument("--lossy", action="store_true",
                        help="convert even where the format cannot hold a property that it "
                             "can approximate (e.g. timm's crop_pct becomes a plain resize in a "
                             "Hugging Face folder); each change is listed on stderr")
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
    named = SUFFIX_FORMATS.get(dst.suffix)
    if named and fmt != named:  # a name that says another format misleads every reader
        raise CheckpointError(f"{args.dst}: the name says {named} but --format {fmt} writes "
                              f"{'a file' if fmt in SUFFIX_FORMATS.values() else 'a folder'};"
                              f" drop --format, or name it without {dst.suffix}")
    if fmt is None:
        raise CheckpointError(f"{args.dst}: cannot tell the format from the name; pass "
                              f"--format {'|'.join(FORMATS)}")
    check_destination(dst)  # before the (possibly long) read: nothing is written on failure
    loaded = load_checkpoint(args.src, image_size=args.image_size, named="SRC")
    with written_whole(dst, needed=_stored_bytes(loaded.params)):
        notes = loaded.warnings + save_checkpoint(loaded, dst, fmt, lossy=args.lossy)
    for message in notes:  # a --lossy change is a fact of the new file, not a warning
        kind = "" if message.startswith("--lossy: ") else "warning: "
        print(f"vit convert: {kind}{message}", file=sys.stderr)
    print(f"vit convert: {loaded.source} -> {args.dst} ({fmt})", file=sys.stderr)
    return 0


def _stored_bytes(params) -> int:
    """What the weights take on disk: every format stores them as float32."""
    from vit.checkpoints.tree import flatten

    return sum(4 * int(getattr(v, "size", 1)) for v in flatten(params).values())
