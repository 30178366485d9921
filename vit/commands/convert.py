"""`vit convert SRC DST [--format npz|hf|timm|orbax]`: any readable checkpoint to another format."""

from __future__ import annotations

import sys

SUFFIX_FORMATS = {".npz": "npz", ".safetensors": "timm"}


def add_arguments(parser) -> None:
    parser.add_argument("src", help="any checkpoint `vit predict --checkpoint` accepts")
    parser.add_argument("dst", help="destination file (.npz, .safetensors) or folder")
    parser.add_argument("--format", choices=("npz", "hf", "timm", "orbax"), default=None,
                        help="vit_jax-layout npz, Hugging Face folder, timm safetensors, or our "
                             "orbax export (default: from DST's suffix); a text-conditioned "
                             "model converts to orbax only")
    parser.add_argument("--image-size", type=int, default=None,
                        help="resize the position embeddings to this resolution first")


def run(args) -> int:
    from pathlib import Path

    from vit.checkpoints import load_checkpoint, save_checkpoint
    from vit.errors import CheckpointError

    fmt = args.format or SUFFIX_FORMATS.get(Path(args.dst).suffix)
    if fmt is None:
        raise CheckpointError(f"{args.dst}: cannot tell the format from the name; pass "
                              "--format npz|hf|timm|orbax")
    loaded = load_checkpoint(args.src, image_size=args.image_size)
    notes = loaded.warnings + save_checkpoint(loaded, args.dst, fmt)
    for message in notes:
        print(f"vit convert: warning: {message}", file=sys.stderr)
    print(f"vit convert: {loaded.source} -> {args.dst} ({fmt})", file=sys.stderr)
    return 0
