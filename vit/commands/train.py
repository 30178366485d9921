"""`vit train --config FILE --workdir DIR [--set KEY=VALUE ...] [--init CHECKPOINT]`.

Running the same command again resumes from the workdir's latest checkpoint.
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="a recipe file such as configs/digits.py")
    parser.add_argument("--workdir", required=True,
                        help="where checkpoints, metrics.jsonl and curves.png go (resumes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set train.steps=100 (repeatable)")
    parser.add_argument("--init", default=None, metavar="CHECKPOINT",
                        help="start from a pretrained checkpoint (npz, HF folder, timm, orbax); "
                             "the head is replaced when the class count differs")


def run(args) -> int:
    from vit.config import load_config

    config = load_config(args.config, args.set)  # config mistakes fail before the heavy imports
    if "stages" in config:  # several stages, each a train() run (vit/train/stages.py)
        from vit.train.stages import train_stages as train
    else:
        from vit.train.loop import train

    train(config, args.workdir, init=args.init)  # a SIGINT/SIGTERM saves, then returns
    return 0
