"""`vit train --config RECIPE --workdir DIR [--set KEY=VALUE ...] [--init CHECKPOINT]
[--coordinator HOST:PORT --num-processes N --process-id I]`; `vit train --list-configs`;
`vit train --config RECIPE --dry-run` (vit/training/dry_run.py: the recipe's model and step at
full size, compiled and measured, nothing written).

RECIPE is a shipped recipe's name (`digits`; `--list-configs` lists them with their purpose)
or a recipe file: what differs from the defaults in vit/recipes/defaults.py, where every key
has its meaning; `--set` changes any key, one the recipe leaves out included. The run itself is
`vit.train(...)` (vit/training/api.py), the same from Python.

Running the same command again resumes from the workdir's latest checkpoint. With the three
process flags (or under SLURM / Open MPI / a multi-host TPU, detected) every process runs the
same command and `jax.distributed` joins them; the mesh is `parallel.data` x `parallel.fsdp`.

The workdir is a new or empty folder or a run's own (`vit.training.workdir`): another program's
folder is refused before anything loads, and a workdir another run is training is refused at
once (exit 2, naming that run). A run that fails before its first checkpoint takes back what it
added.
"""

from __future__ import annotations

import argparse
import sys


class _ListConfigs(argparse.Action):
    """Prints the shipped recipes and exits, before the required flags are asked for (as
    --version does)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from vit.recipes.shipped import listing

        print(listing())
        parser.exit()


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True,
                        help="a shipped recipe's name (digits, ...: see --list-configs) or a "
                             "recipe file; it sets what differs from vit/recipes/defaults.py")
    parser.add_argument("--list-configs", action=_ListConfigs,
                        help="list the shipped recipes with their purpose, and exit")
    parser.add_argument("--workdir", default=None,
                        help="where checkpoints, metrics.jsonl, curves.png and TensorBoard's "
                             "tb/ go (resumes); required unless --dry-run")
    parser.add_argument("--dry-run", action="store_true",
                        help="build and compile the recipe's model and step at full size, print "
                             "parameters, FLOPs, memory per device and one step's time; write "
                             "nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set train.steps=100 (repeatable)")
    parser.add_argument("--init", default=None, metavar="CHECKPOINT",
                        help="start from a pretrained checkpoint (npz, HF folder, timm, orbax); "
                             "the head is replaced when the class count differs")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not read or write JAX's compilation cache in $VIT_CACHE_DIR "
                             "(default ~/.cache/vit): a second run of the same recipe on this "
                             "machine loads its compiled step and evaluation from there")
    procs = parser.add_argument_group("several processes (one per host or per GPU)")
    procs.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="process 0's address, the same on every process")
    procs.add_argument("--num-processes", type=int, default=None, metavar="N")
    procs.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="this process's index, 0..N-1")


def run(args) -> int:
    from vit.recipes.load import load_config

    # Config mistakes fail before the heavy imports.
    config = load_config(args.config, args.set, model_field_types=model_field_types)
    if args.dry_run:  # touches no workdir, given or not
        from vit.training.dry_run import dry_run

        dry_run(config, init=args.init)
        return 0
    if args.workdir is None:
        from vit.errors import ConfigError

        raise ConfigError("vit train needs --workdir DIR (where the run's checkpoints go), "
                          "or --dry-run")
    from vit.commands.checks import check_output_dir
    from vit.training.workdir import refuse_foreign

    workdir = check_output_dir(args.workdir, "--workdir")  # before any work, not after it
    refuse_foreign(workdir)  # checked again under the lock; this spares the imports
    from vit.training import signals
    from vit.training.parallel import start_processes

    # Before anything touches a device: joining the other processes fixes the device list.
    start_processes(args.coordinator, args.num_processes, args.process_id)
    if (args.num_processes or 1) == 1:  # processes of one host would write the same entries
        from vit.inference.compile_cache import configure

        configure(args.no_cache, note=lambda text: print(f"vit train: note: {text}",
                                                         file=sys.stderr))
    from vit.training.api import train

    with signals.ending_process_on_second_interrupt():
        train(config, workdir, init=args.init)  # a SIGINT/SIGTERM saves, then returns
    return 0


def model_field_types() -> dict:
    """ViTConfig's fields, each with the type `--set model.FIELD=...` expects: what a recipe's
    `model` section may hold. Imports the model package (jax), so load_config calls it last."""
    from vit.recipes.model_fields import model_field_types

    return model_field_types()
