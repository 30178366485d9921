"""`vit rollout`: attention maps for images, as PNG overlays, raw `.npy` grids, a manifest and
an optional HTML gallery. With `--prompt` (text models) the maps explain the prompt-match
answer, and each manifest line adds the prompt, its probability and a score per character."""

from __future__ import annotations

import contextlib
import sys

from vit.commands import inference_options

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
    parser.add_argument("--method", choices=METHODS, default=None,
                        help="default rollout; with --prompt only relevancy is supported (and "
                             "the default): its bi-modal rules are what scores the text")
    parser.add_argument("--class", dest="class_", default="top", metavar="top|INDEX|LABEL",
                        help="class to explain (default: each image's top prediction)")
    parser.add_argument("--prompt", default=None, metavar="TEXT",
                        help="text models: explain the answer to 'is TEXT true of the image?' "
                             "(patch map, and a relevance score per character of TEXT; "
                             "relevancy only)")
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
    inference_options.add_arguments(parser)


def run(args) -> int:
    inference_options.start(args)  # before anything compiles
    import matplotlib

    from vit.checkpoints import load_checkpoint
    from vit.commands import checks
    from vit.errors import ConfigError, OutOfSpace, is_out_of_space
    from vit.explanations import inputs

    checks.require_positive(args, "batch_size", "limit", "image_size")
    out = checks.check_output_dir(args.out, "--out")  # before the model loads, not after the maps
    method = args.method or ("relevancy" if args.prompt is not None else "rollout")
    if args.prompt is not None and method != "relevancy":
        raise ConfigError(f"--prompt is explained with the bi-modal relevancy rules only; drop "
                          f"--method {method} or use --method relevancy")
    if args.prompt is not None and args.class_ != "top":
        raise ConfigError("--class does not apply with --prompt: the map explains the prompt's "
                          "answer, not a class")
    if not 0.0 <= args.alpha <= 1.0:
        raise ConfigError(f"--alpha {args.alpha}: must lie in [0, 1]")
    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio {args.discard_ratio}: must lie in [0, 1)")
    if args.cmap not in matplotlib.colormaps:
        raise ConfigError(f"--cmap {args.cmap!r} is not a matplotlib colormap; try jet or viridis")
    # The images first: a mistyped path or dataset fails before the model loads.
    items = inputs.gather(args.inputs, args.data, args.split, args.limit, args.data_dir)
    ckpt = load_checkpoint(args.checkpoint, image_size=args.image_size,
                           **inference_options.with_dtype(args, {}))
    for warning in ckpt.warnings:
        print(f"vit rollout: warning: {warning}", file=sys.stderr)
    labels = ckpt.labels
    if args.prompt is not None:
        _check_prompt(args.prompt, args.checkpoint, ckpt.config.text)
        wanted = None
    else:
        wanted = inputs.resolve_class(args.class_, labels, ckpt.config.num_classes)
    from vit.inference.memory import check_fits

    # Before the model is built: every block's attention is kept for the maps.
    check_fits(ckpt.config, min(args.batch_size, len(items)), maps=True)
    model = ckpt.build_model()
    new_output = checks.NewOutput(out, deep=True)
    try:
        return _write_maps(args, out, items, ckpt, model, method, wanted)
    except Exception as err:  # nothing readable, or a failure part-way: nothing half-written
        full = is_out_of_space(err)
        needed = _needed_bytes(new_output, len(items)) if full else None
        new_output.undo()
        if full:
            raise OutOfSpace(out, needed) from None
        raise


def _needed_bytes(new_output, count: int) -> int | None:
    """What `count` images' files take on disk, from those written before it filled (None
    before the first was whole)."""
    files = [p for p in new_output.added() if p.is_file()]
    done = sum(1 for p in files if p.parent.name == "overlays")
    return int(sum(p.stat().st_blocks * 512 for p in files) / done * count) if done else None


def _write_maps(args, out, items, ckpt, model, method, wanted) -> int:
    """Every readable image's map and overlay, the manifest, and with --html the gallery."""
    import json

    import jax
    import numpy as np

    from vit.errors import DataError
    from vit.explanations import explain, inputs, render

    labels = ckpt.labels
    names = render.SafeNames()
    gallery, written, skipped, first_bad = [], 0, 0, None
    with _LazyFile(out / "manifest.jsonl") as manifest:  # made with the first map
        for batch in inputs.batches(items, ckpt.preprocessing, args.batch_size):
            for item in batch.bad:
                print(f"vit rollout: skipped {item}", file=sys.stderr)
                if first_bad is None:
                    first_bad = item
                skipped += 1
            if not batch.items:
                continue
            if args.prompt is not None:
                rows = _prompt_rows(model, batch.arrays, args.prompt, len(batch.items))
            else:
                result = explain(model, batch.arrays, method, wanted,
                                 head_fusion=args.head_fusion, discard_ratio=args.discard_ratio)
                probs = np.asarray(jax.nn.softmax(result.logits, -1))
                maps, classes = np.asarray(result.maps), np.asarray(result.class_index)
                rows = []
                for i in range(len(batch.items)):
                    pred = int(probs[i].argmax())
                    rows.append(({"pred": pred, "pred_label": labels[pred] if labels else None,
                                  "prob": float(probs[i, pred]), "method": method,
                                  "class": int(classes[i])}, maps[i]))
            for item, (fields, grid) in zip(batch.items, rows, strict=True):
                stem = names.claim(item.name)
                region = render.seen_region(ckpt.preprocessing, item.image.size)
                paths = render.write_explanation(out, stem, item.image, grid, cmap=args.cmap,
                                                 alpha=args.alpha, region=region)
                row = {"image": item.name, "label": item.label, **fields,
                       "overlay": paths["overlay"], "map": paths["map"]}
                manifest.write(json.dumps(row) + "\n")
                gallery.append({"input": paths["input"], "overlay": paths["overlay"],
                                "caption": inputs.caption(row, labels),
                                "text_relevance": row.get("text_relevance")})
                written += 1
    if not written:
        more = f" and {skipped - 1} more" if skipped > 1 else ""
        raise DataError(f"none of the {len(items)} images could be read: {first_bad}{more}")
    what = method if args.prompt is None else f"{method} for prompt {args.prompt!r}"
    if args.html:
        render.write_gallery(out, gallery, title=f"vit rollout: {what}")
    extra = ", index.html" if args.html else ""
    print(f"wrote {written} {what} maps to {out} (manifest.jsonl{extra})"
          + (f"; skipped {skipped} unreadable" if skipped else ""))
    return 0


class _LazyFile:
    """A text file (and its folder) created on the first write, so a run that writes nothing
    leaves nothing behind; written by `vit.paths.replacing`, so an existing file of that name
    is replaced whole, when the block ends well, or kept."""

    def __init__(self, path):
        self.path, self.file = path, None
        self.stack = contextlib.ExitStack()

    def write(self, text: str) -> None:
        if self.file is None:
            from vit.paths import replacing

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.stack.enter_context(replacing(self.path))
        self.file.write(text.encode("utf-8"))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stack.__exit__(*exc)  # a full disk may only show here, as the file is closed


def _check_prompt(prompt: str, checkpoint: str, text_config) -> None:
    """One-line errors for a model that cannot answer prompts; warns once about truncation."""
    import warnings

    from vit.errors import ConfigError
    from vit.inference.prompts import (
        checkpoint_prompt_words,
        require_utf8,
        unknown_word_notices,
    )
    from vit.models.text import tokenize

    require_utf8("--prompt", prompt)
    if text_config is None:
        raise ConfigError(f"--prompt: {checkpoint} is a plain image model without a text path; "
                          "drop --prompt, or use a text-conditioned checkpoint")
    if text_config.source != "bytes":
        raise ConfigError("--prompt: this model reads embeddings from a separate text model, "
                          "not text; explain it from Python with vit.explanations.explain_prompt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenize(prompt, text_config.max_len)
    for warning in caught:
        print(f"vit rollout: warning: {warning.message}", file=sys.stderr)
    for line in unknown_word_notices(checkpoint_prompt_words(checkpoint), [prompt]):
        print(f"vit rollout: warning: {line}", file=sys.stderr)


def _prompt_rows(model, arrays, prompt: str, count: int):
    """(manifest fields, map) for the first `count` images of a (padded) batch, explaining
    the prompt-match answer."""
    import warnings

    import numpy as np

    from vit.explanations import explain_prompt, text_relevance

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation was reported once, up front
        result = explain_prompt(model, arrays, prompt)
    probs, maps = np.asarray(result.probs), np.asarray(result.maps)
    # The map explains the prompt, not a class: the class fields are None.
    return [({"pred": None, "pred_label": None, "prob": float(probs[i]), "method": "relevancy",
              "class": None, "prompt": prompt, "text_relevance": text_relevance(result, i)},
             maps[i]) for i in range(count)]
