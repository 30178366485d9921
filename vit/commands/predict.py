"""`vit predict IMAGE_OR_DIR... --checkpoint PATH`: top-k classes per image, or for a model
trained multi-label (`sigmoid_xent`) each label's own probability and those over `--threshold`;
with a text model, the probability of each `--prompt` (or `--text-embeddings` prompt), or
`--zero-shot` top-k names. Printed as text, JSON Lines or CSV (`--format`).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from vit.commands import inference_options
from vit.commands.predict_output import FORMATS, ResultWriter
from vit.commands.predict_output import text_line as _line  # noqa: F401 - the tests' name


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR",
                        help="image files or folders (walked for image files)")
    parser.add_argument("--checkpoint", required=True,
                        help="npz, Hugging Face or timm folder/file, orbax checkpoint, training "
                             "workdir, or a hub id / timm name (NAME@REVISION), from the "
                             "Hugging Face cache or downloaded")
    parser.add_argument("--image-size", type=int, default=None,
                        help="run at this resolution (position embeddings are resized)")
    parser.add_argument("--top-k", type=int, default=5,
                        help="classes (or --zero-shot names) per image (default 5)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class display names, one per line (overrides the checkpoint's)")
    parser.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                        help="text model: print the probability that TEXT is true of each image "
                             "(repeatable; all prompts of an image share one forward pass; \"\" "
                             "is the null prompt)")
    parser.add_argument("--text-embeddings", default=None, metavar="FILE",
                        help="text model trained on outside embeddings (text.source="
                             "embeddings): an .npz of tokens [P, T, D] float and mask [P, T] "
                             "bool (optionally texts [P] to label them), used in place of "
                             "--prompt: P prompts scored against every image")
    parser.add_argument("--zero-shot", default=None, metavar="FILE",
                        help="text model with a similarity head: score the names in FILE (one "
                             "per line) and print the top-k, as for classes")
    parser.add_argument("--template", default=None, metavar="TEXT",
                        help="with --zero-shot: the text a name is written into, {} standing "
                             "for the name, e.g. \"a photo of a {}\" (default \"{}\")")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a model field that keeps weight shapes, e.g. "
                             "--set attention_impl=xla (repeatable)")
    inference_options.add_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="JSON Lines on stdout (the same as --format jsonl): {image, top_k: "
                             "[{index, label, prob}]}, multi-label {image, labels: [{index, "
                             "label, prob}], probs: [...]}, or with prompts {image, prompts: "
                             "[{text, prob}]}; a bad image {image, error}")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (default), jsonl (as --json) or csv: a header row, then a "
                             "row per image (per image and prompt with --prompt)")
    parser.add_argument("--multi-label", action=argparse.BooleanOptionalAction, default=None,
                        help="read the class head as independent labels, each by its own "
                             "sigmoid (default: when the checkpoint records it was trained "
                             "with sigmoid_xent, or a Hugging Face problem_type of "
                             "multi_label_classification)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="multi-label: list every label whose probability is at least "
                             "this (default 0.5)")


def _format(args) -> str:
    """`--format`, with `--json` meaning jsonl; the two must agree when both are given."""
    from vit.errors import DataError

    if args.json and args.format not in (None, "jsonl"):
        raise DataError(f"--json and --format {args.format} disagree; give one of them")
    return "jsonl" if args.json else (args.format or "text")


def _multi_label(args, text_flags: list[str]) -> bool:
    """Whether the class head is read as independent labels: `--multi-label` / `--no-multi-label`
    when given, else the loss the checkpoint records (`sigmoid_xent`)."""
    from vit.errors import DataError
    from vit.inference.recorded_loss import recorded_loss

    if args.threshold is not None and not 0 <= args.threshold <= 1:
        raise DataError(f"--threshold {args.threshold:g} is not a probability; give a value "
                        "from 0 to 1, e.g. --threshold 0.5")
    if text_flags:
        if args.multi_label or args.threshold is not None:
            flag = "--multi-label" if args.multi_label else "--threshold"
            raise DataError(f"{flag} reads a classifier's labels; {text_flags[0]} scores its "
                            "own texts")
        return False
    loss, where = recorded_loss(args.checkpoint) if args.multi_label is None else (None, None)
    chosen = args.multi_label if args.multi_label is not None else loss == "sigmoid_xent"
    if args.threshold is not None and not chosen:
        if args.multi_label is False:
            why = "--no-multi-label was given"
        elif loss:
            why = f"{where} records {loss}"
        else:
            why = f"{args.checkpoint} records no training loss"
        raise DataError(f"--threshold applies to multi-label prediction, and {why}; pass "
                        "--multi-label to read each label by its own sigmoid")
    return chosen


def _text_inputs(args, config):
    """`(prompts, zero_shot)` for the Predictor; tokenizer warnings (a truncated prompt) are
    printed as ours rather than as Python warnings with a source line."""
    from vit.inference.prompts import (
        checkpoint_prompt_words,
        encode_prompts,
        load_text_embeddings,
        read_names,
        zero_shot_prompts,
    )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        prompts = zero_shot = None
        if args.prompt is not None:
            prompts = encode_prompts(config, args.prompt,
                                     words=checkpoint_prompt_words(args.checkpoint))
        elif args.text_embeddings is not None:
            prompts = load_text_embeddings(config, args.text_embeddings)
        elif args.zero_shot is not None:
            zero_shot = zero_shot_prompts(config, read_names(args.zero_shot),
                                          args.template if args.template is not None else "{}")
    for w in caught:
        print(f"vit predict: warning: {w.message}", file=sys.stderr)
    return prompts, zero_shot


def _model_overrides(items: list[str]) -> dict:
    """`--set` parsed against the model's fields (imported only when given: the model package
    pulls in flax, which a prepared classifier does without)."""
    if not items:
        return {}
    from vit.recipes.model_fields import parse_model_overrides

    return parse_model_overrides(items)


def _labels(args, num_classes: int) -> list[str] | None:
    """`--labels FILE`'s names, or None."""
    if not args.labels:
        return None
    from vit.checkpoints.labels import read_labels

    return read_labels(args.labels, num_classes)


def _check_warnings(warnings_: list[str], checkpoint, text_flags: list[str]) -> None:
    """Prints the loader's warnings; an all-zero class head is refused (meaningless) unless
    only text is scored."""
    from vit.errors import CheckpointError

    for message in warnings_:
        if "head is all zeros" in message:
            if text_flags:  # prompts and zero-shot never use the class head
                continue
            raise CheckpointError(f"{checkpoint}: {message}")
        print(f"vit predict: warning: {message}", file=sys.stderr)


def run(args) -> int:
    started = time.perf_counter()
    cache_root = inference_options.start(args)  # before anything compiles
    from vit.errors import DataError

    text_flags = _check_flags(args)
    fmt, multi_label = _format(args), _multi_label(args, text_flags)
    paths = _image_paths(args.inputs)
    # One image is not padded to a batch of 32: the batch is at most the number of images.
    # A prepared classifier's forward is softmax top-k: multi-label runs take the plain path.
    opened, predictor = _open(args, min(args.batch_size, len(paths)), text_flags,
                              cache_root=None if text_flags or multi_label else cache_root,
                              multi_label=multi_label)
    compiling = time.perf_counter()
    predictor.compile(export=opened.caching)
    ready = time.perf_counter()
    print(f"vit predict: ready in {ready - started:.1f} s (compile {ready - compiling:.1f} s, "
          f"batch {predictor.batch_size}, {opened.dtype})", file=sys.stderr)
    done, failed, first_failed = _print_results(fmt, predictor, paths)
    _store(opened, predictor)  # after the answers
    if done == failed:  # every image unreadable: the user's input to fix, as in `vit rollout`
        more = f" and {failed - 1} more" if failed > 1 else ""
        raise DataError(f"none of the {failed} images could be read: {first_failed}{more} "
                        "(each listed above with its reason); give readable image files")
    return 0


def _store(opened, predictor) -> None:
    """Keeps the prepared classifier for the next run. The answers are printed first; a disk too
    full for the cache then ends the run with exit 2 as any full disk does, nothing stored."""
    from vit.errors import OutOfSpace, VitError, megabytes

    try:
        opened.store(predictor)
    except OutOfSpace as err:
        size = f" (needs about {megabytes(err.needed)})" if err.needed else ""
        raise VitError(f"{err.path}: no space left on device{size}, so the prepared classifier "
                       "was not stored (the answers above stand); free some space, set "
                       "VIT_CACHE_DIR to another folder, or pass --no-cache") from None


def _check_flags(args) -> list[str]:
    """Refuses flags that do not go together; returns the text flags given (at most one)."""
    from vit.commands.checks import require_positive
    from vit.errors import DataError

    if args.top_k < 1 or args.batch_size < 1:
        raise DataError("--top-k and --batch-size must be at least 1")
    require_positive(args, "image_size")
    text_flags = [flag for flag, value in (("--prompt", args.prompt),
                                           ("--text-embeddings", args.text_embeddings),
                                           ("--zero-shot", args.zero_shot)) if value is not None]
    if len(text_flags) > 1:
        raise DataError(f"{' and '.join(text_flags)} do not go together; give one of them")
    if args.template is not None and args.zero_shot is None:
        raise DataError("--template only applies to --zero-shot (it writes each name into text)")
    if args.labels and text_flags:
        raise DataError(f"--labels names a classifier's classes; {text_flags[0]} is labelled by "
                        "its own texts")
    return text_flags


def _image_paths(inputs: list[str]) -> list:
    """The image files of `inputs`; refused when there are none, or when none exists."""
    from vit.errors import DataError
    from vit.images import list_images

    paths = list_images(inputs)
    if not paths:
        raise DataError(f"no image files found in {' '.join(inputs)}")
    missing = [p for p in paths if not p.exists()]
    if len(missing) == len(paths):  # a typo, not a few bad files: say so before the model loads
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{missing[0]}: no such file or folder{more}")
    return paths


def _open(args, batch_size: int, text_flags: list[str], cache_root, multi_label: bool):
    """`(opened checkpoint, Predictor)`: from a prepared classifier when one is stored, else
    from the checkpoint."""
    from vit.inference.warm_start import open_checkpoint

    overrides = inference_options.with_dtype(args, _model_overrides(args.set))
    opened = open_checkpoint(args.checkpoint, image_size=args.image_size, overrides=overrides,
                             batch_size=batch_size, top_k=args.top_k, cache_root=cache_root)
    prepared = f" (prepared: {opened.entry})" if opened.entry is not None else ""
    print(f"vit predict: {opened.source}{prepared}", file=sys.stderr)
    _check_warnings(opened.warnings, args.checkpoint, text_flags)
    if opened.loaded is not None:  # a prepared classifier has run at this size and batch
        from vit.inference.memory import check_fits

        check_fits(opened.loaded.config, batch_size)  # before the model is built
    prompts, zero_shot = _text_inputs(args, opened.loaded.config) if text_flags else (None, None)
    labels = _labels(args, opened.num_classes) or opened.labels
    if multi_label:  # always cold (no prepared entry): the checkpoint is loaded
        from vit.inference.predictor import Predictor

        threshold = 0.5 if args.threshold is None else args.threshold
        return opened, Predictor(opened.loaded.build_model(), opened.loaded.preprocessing,
                                 labels, batch_size=batch_size, multi_label=True,
                                 threshold=threshold)
    return opened, opened.predictor(labels, top_k=args.top_k, batch_size=batch_size,
                                    prompts=prompts, zero_shot=zero_shot)


def _print_results(fmt: str, predictor, paths: list) -> tuple[int, int, str | None]:
    """Prints each image's result in `fmt` and the closing count; returns the images done,
    those that failed, and the first that failed."""
    from tqdm import tqdm

    verb = "scored" if predictor.mode == "prompts" else "classified"
    start, done, failed, first_failed = time.perf_counter(), 0, 0, None
    writer = ResultWriter(fmt, predictor)
    # A bar on a terminal only: redirected, its redraws would run into the results' lines.
    with tqdm(total=len(paths), unit="img", file=sys.stderr, dynamic_ncols=True,
              disable=not sys.stderr.isatty()) as bar:
        for result in predictor.predict_files(paths, progress=bar):
            if "error" in result:
                failed += 1
                first_failed = first_failed or result["image"]
            done += 1
            writer.write(result)
    seconds = time.perf_counter() - start
    print(f"vit predict: {done - failed} images {verb}, {failed} failed, {seconds:.1f} s "
          f"({(done - failed) / seconds:.1f} images/s)", file=sys.stderr)
    return done, failed, first_failed
