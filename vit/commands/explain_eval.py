"""`vit explain-eval`: deletion / insertion faithfulness of attention maps on a dataset."""

from __future__ import annotations

METHODS = ("attention", "rollout", "grad-rollout", "relevancy")
DEFAULT_METHODS = ("rollout", "relevancy")
METRICS = ("deletion", "insertion")
SUBSTRATES = ("mean", "zero", "blur")


def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", required=True, help="any checkpoint vit can load")
    parser.add_argument("--data", required=True, help="dataset, e.g. digits")
    parser.add_argument("--split", default="test", help="dataset split (default test)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many images")
    parser.add_argument("--data-dir", default=None, help="where the dataset lives (TFDS)")
    parser.add_argument("--metric", choices=METRICS, default="deletion")
    # extend: `--method a b` and `--method a --method b` both give [a, b]
    parser.add_argument("--method", nargs="+", action="extend", choices=METHODS, default=None,
                        help="maps to score, repeatable (default: rollout relevancy; a random "
                             "ranking is always added)")
    parser.add_argument("--steps", type=int, default=None,
                        help="points on the curve (default: patches, at most 20)")
    parser.add_argument("--substrate", choices=SUBSTRATES, default="mean",
                        help="what replaces a patch (default: the dataset mean)")
    parser.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean")
    parser.add_argument("--discard-ratio", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="random baseline and bootstrap")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    import json

    import numpy as np

    from vit.checkpoints import load_checkpoint
    from vit.commands.checks import require_positive
    from vit.errors import ConfigError, DataError
    from vit.explanations import faithfulness, inputs

    require_positive(args, "steps", "limit", "batch_size")
    methods = list(dict.fromkeys(args.method or DEFAULT_METHODS))
    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio {args.discard_ratio}: must lie in [0, 1)")
    items = inputs.gather([], args.data, args.split, args.limit, args.data_dir)
    ckpt = load_checkpoint(args.checkpoint)
    pre = ckpt.preprocessing
    arrays = [b.arrays[:len(b.items)] for b in inputs.batches(items, pre, args.batch_size)]
    arrays = [a for a in arrays if len(a)]
    if not arrays:
        raise DataError(f"{args.data}:{args.split} gave no images to score")
    everything = np.concatenate(arrays)
    _check_fits(ckpt.config, len(arrays[0]), args.steps)
    model = ckpt.build_model()
    grid = model.grid_for(everything.shape[1:3])
    if args.steps is not None and args.steps > grid[0] * grid[1]:  # repeated points, no detail
        raise ConfigError(f"--steps {args.steps}: the model sees {grid[0]}x{grid[1]} patches, "
                          f"so a curve has at most {grid[0] * grid[1]} steps; give --steps "
                          f"{grid[0] * grid[1]} or fewer")
    report = faithfulness.evaluate(
        model, arrays, methods, metric=args.metric, steps=args.steps,
        substrate_kind=args.substrate, mean=everything.mean((0, 1, 2)),
        black=-np.asarray(pre.mean, np.float32) / np.asarray(pre.std, np.float32),
        explain_options=dict(head_fusion=args.head_fusion, discard_ratio=args.discard_ratio),
        seed=args.seed)
    if args.json:
        print(json.dumps(report))
        return 0
    steps = args.steps or faithfulness.default_steps(grid[0] * grid[1])
    better = "lower" if args.metric == "deletion" else "higher"
    print(f"{args.metric} AUC on {args.data}:{args.split}, {len(everything)} images, {steps} "
          f"steps, substrate {args.substrate} ({better} is better)")
    print(f"{'method':<14}{'auc':>8}   {'95% CI':<18}  vs random (paired, 95% CI)")
    for name, r in report["results"].items():
        d = r["vs_random"]
        paired = "" if name == "random" else (
            f"{d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]")
        line = f"{name:<14}{r['auc']:>8.4f}   [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]  {paired}"
        print(line.rstrip())
    return 0


def _check_fits(config, batch: int, steps: int | None) -> None:
    """Before the model is built: a batch's maps (every block's attention kept), and its
    perturbed copies, one per point of the curve, in one forward."""
    from vit.explanations import faithfulness
    from vit.inference.memory import check_fits

    (h, w), (ph, pw) = config.image_size, config.patch_size
    points = (steps or faithfulness.default_steps((h // ph) * (w // pw))) + 1
    lower = ("--batch-size", "--limit")
    check_fits(config, batch, maps=True, lower=lower)
    check_fits(config, batch * points, lower=lower)
