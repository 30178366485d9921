"""`vit rollout`: attention maps for images, as PNG overlays, raw `.npy` grids, a manifest and
an optional HTML gallery."""

from __future__ import annotations

import sys

METHODS = ("attention", "rollout", "grad-rollout", "relevancy")
HEAD_FUSIONS = ("mean", "max", "min")


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="IMAGES_OR_DIRS",
                        help="image files or folders of images")
    parser.add_argument("--checkpoint", required=True, help="any checkpoint vit can load")
    parser.add_argument("--data", help="explain dataset images instead, e.g. digits")
    parser.add_argument("--split", default="test", help="dataset split (default test)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many images")
    parser.add_argument("--data-dir", default=None, help="where the dataset lives (TFDS)")
    parser.add_argument("--method", choices=METHODS, default="rollout")
    parser.add_argument("--class", dest="class_", default="top", metavar="top|INDEX|LABEL",
                        help="class to explain (default: each image's top prediction)")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    parser.add_argument("--discard-ratio", type=float, default=0.0,
                        help="drop this fraction of the lowest attentions per row (rollouts)")
    parser.add_argument("--out", default="runs/rollout", help="output folder")
    parser.add_argument("--html", action="store_true", help="also write OUT/index.html")
    parser.add_argument("--cmap", default="jet", help="matplotlib colormap of the overlay")
    parser.add_argument("--alpha", type=float, default=0.5, help="overlay opacity in [0, 1]")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=None,
                        help="run the model at this size (position embeddings are resized)")


def run(args) -> int:
    import json
    from pathlib import Path

    import jax
    import matplotlib
    import numpy as np

    from vit.checkpoints import load_checkpoint
    from vit.errors import ConfigError, DataError
    from vit.explain import explain, inputs, render

    if not 0.0 <= args.alpha <= 1.0:
        raise ConfigError(f"--alpha {args.alpha}: must lie in [0, 1]")
    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio {args.discard_ratio}: must lie in [0, 1)")
    if args.cmap not in matplotlib.colormaps:
        raise ConfigError(f"--cmap {args.cmap!r} is not a matplotlib colormap; try jet or viridis")
    ckpt = load_checkpoint(args.checkpoint, image_size=args.image_size)
    for warning in ckpt.warnings:
        print(f"vit rollout: warning: {warning}", file=sys.stderr)
    labels = ckpt.labels
    wanted = inputs.resolve_class(args.class_, labels, ckpt.config.num_classes)
    items = inputs.gather(args.inputs, args.data, args.split, args.limit, args.data_dir)
    model = ckpt.build_model()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = render.SafeNames()
    gallery, written, skipped = [], 0, 0
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as manifest:
        for batch in inputs.batches(items, ckpt.preprocessing, args.batch_size):
            for item in batch.bad:
                print(f"vit rollout: skipped {item}", file=sys.stderr)
                skipped += 1
            if not batch.items:
                continue
            result = explain(model, batch.arrays, args.method, wanted,
                             head_fusion=args.head_fusion, discard_ratio=args.discard_ratio)
            probs = np.asarray(jax.nn.softmax(result.logits, -1))
            maps, classes = np.asarray(result.maps), np.asarray(result.class_index)
            for i, item in enumerate(batch.items):
                stem = names.claim(item.name)
                region = render.seen_region(ckpt.preprocessing, item.image.size)
                paths = render.write_explanation(out, stem, item.image, maps[i], cmap=args.cmap,
                                                 alpha=args.alpha, region=region)
                pred = int(probs[i].argmax())
                row = {"image": item.name, "label": item.label, "pred": pred,
                       "pred_label": labels[pred] if labels else None,
                       "prob": float(probs[i, pred]), "method": args.method,
                       "class": int(classes[i]), "overlay": paths["overlay"], "map": paths["map"]}
                manifest.write(json.dumps(row) + "\n")
                gallery.append({"input": paths["input"], "overlay": paths["overlay"],
                                "caption": inputs.caption(row, labels)})
                written += 1
    if not written:
        raise DataError("no image could be read; check the paths (see the skipped lines above)")
    if args.html:
        render.write_gallery(out, gallery, title=f"vit rollout: {args.method}")
    extra = ", index.html" if args.html else ""
    print(f"wrote {written} {args.method} maps to {out} (manifest.jsonl{extra})"
          + (f"; skipped {skipped} unreadable" if skipped else ""))
    return 0
