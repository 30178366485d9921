"""`vit info NAME`: parameters, GMACs per image (multiply-adds, as timm reports), tokens."""

from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("name", help="variant such as vit_b16 or 'B/16', or any timm ViT "
                        "architecture (vit_base_patch16_clip_224, deit_small_patch16_224)")
    parser.add_argument("--num-classes", type=int, default=None, help="head size (default 1000)")
    parser.add_argument("--image-size", type=int, default=None, help="image side in pixels")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a model field, e.g. --set classifier=gap (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from vit.commands.checks import require_positive
    from vit.models.info import model_info
    from vit.recipes.model_fields import parse_model_overrides

    require_positive(args, "image_size")
    overrides = parse_model_overrides(args.set)
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    info = model_info(args.name, **overrides)
    if args.json:
        print(json.dumps(info))
        return 0
    cfg = info["config"]
    print(f"{args.name}: {info['summary']}")
    print(f"  parameters  {info['params']:,}")
    print(f"  GMACs/image {info['gmacs']:.2f}")
    print(f"  tokens      {info['tokens']} ({info['grid'][0]}x{info['grid'][1]} patches"
          f" + {info['tokens'] - info['grid'][0] * info['grid'][1]} prefix)")
    print(f"  attention   {cfg['attention_impl']}, compute dtype {cfg['dtype']}")
    return 0
