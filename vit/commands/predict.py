"""`vit predict IMAGE_OR_DIR... --checkpoint PATH`: top-k classes per image."""

from __future__ import annotations

import json
import sys
import time


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR",
                        help="image files or folders (walked for image files)")
    parser.add_argument("--checkpoint", required=True,
                        help="npz, Hugging Face or timm folder/file, orbax checkpoint, training "
                             "workdir, or a hub id / timm name in the local Hugging Face cache")
    parser.add_argument("--image-size", type=int, default=None,
                        help="run at this resolution (position embeddings are resized)")
    parser.add_argument("--top-k", type=int, default=5, help="classes per image (default 5)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class display names, one per line (overrides the checkpoint's)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a model field that keeps weight shapes, e.g. "
                             "--set attention_impl=xla (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="JSON Lines on stdout: {image, top_k: [{index, label, prob}]}")


def _line(result: dict) -> str:
    if "error" in result:
        return f"{result['image']}: error: {result['error']}"
    tops = ", ".join(f"{t['label'] if t['label'] is not None else '#' + str(t['index'])} "
                     f"({t['prob']:.3f})" for t in result["top_k"])
    return f"{result['image']}: {tops}"


def run(args) -> int:
    from tqdm import tqdm

    from vit.checkpoints import load_checkpoint
    from vit.checkpoints.labels import read_labels
    from vit.commands.overrides import parse_model_overrides
    from vit.errors import CheckpointError, DataError
    from vit.predict import Predictor, collect_images

    if args.top_k < 1 or args.batch_size < 1:
        raise DataError("--top-k and --batch-size must be at least 1")
    paths = collect_images(args.inputs)
    if not paths:
        raise DataError(f"no image files found in {' '.join(args.inputs)}")
    loaded = load_checkpoint(args.checkpoint, image_size=args.image_size,
                             **parse_model_overrides(args.set))
    print(f"vit predict: {loaded.source}", file=sys.stderr)
    for message in loaded.warnings:
        if "head is all zeros" in message:  # predictions would be meaningless: refuse
            raise CheckpointError(f"{args.checkpoint}: {message}")
        print(f"vit predict: warning: {message}", file=sys.stderr)
    labels = (read_labels(args.labels, loaded.config.num_classes) if args.labels
              else loaded.labels)
    predictor = Predictor(loaded.build_model(), loaded.preprocessing, labels,
                          top_k=args.top_k, batch_size=args.batch_size)
    start, done, failed = time.perf_counter(), 0, 0
    with tqdm(total=len(paths), unit="img", file=sys.stderr, dynamic_ncols=True) as bar:
        for result in predictor.predict_files(paths, progress=bar):
            failed += "error" in result
            done += 1
            print(json.dumps(result) if args.json else _line(result), flush=args.json)
    seconds = time.perf_counter() - start
    print(f"vit predict: {done - failed} images classified, {failed} failed, {seconds:.1f} s "
          f"({(done - failed) / seconds:.1f} images/s)", file=sys.stderr)
    return 0 if done > failed else 1
