"""`vit train --config FILE --workdir DIR [--set KEY=VALUE ...] [--init CHECKPOINT]
[--coordinator HOST:PORT --num-processes N --process-id I]`.

FILE is a recipe: what differs from the defaults in vit/recipes/defaults.py, where every key
has its meaning; `--set` changes any key, one the recipe leaves out included.

Running the same command again resumes from the workdir's latest checkpoint. With the three
process flags (or under SLURM / Open MPI / a multi-host TPU, detected) every process runs the
same command and `jax.distributed` joins them; the mesh is `parallel.data` x `parallel.fsdp`.

The workdir is a new or empty folder or a run's own (`vit.train.workdir`): another program's
folder is refused before anything loads, and a workdir another run is training is refused at
once (exit 2, naming that run). A run that fails before its first checkpoint takes back what it
added.
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True,
                        help="a recipe file such as configs/digits.py; it sets what differs "
                             "from vit/recipes/defaults.py")
    parser.add_argument("--workdir", required=True,
                        help="where checkpoints, metrics.jsonl and curves.png go (resumes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set train.steps=100 (repeatable)")
    parser.add_argument("--init", default=None, metavar="CHECKPOINT",
                        help="start from a pretrained checkpoint (npz, HF folder, timm, orbax); "
                             "the head is replaced when the class count differs")
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
    from vit.commands.checks import check_output_dir
    from vit.train.workdir import refuse_foreign

    workdir = check_output_dir(args.workdir, "--workdir")  # before any work, not after it
    refuse_foreign(workdir)  # checked again under the lock; this spares the imports
    from vit.train import signals
    from vit.train.parallel import start_processes

    # Before anything touches a device: joining the other processes fixes the device list.
    start_processes(args.coordinator, args.num_processes, args.process_id)
    if "stages" in config:  # several stages, each a train() run (vit/train/stages.py)
        from vit.train.stages import train_stages as train
    else:
        from vit.train.loop import train

    with signals.ending_process_on_second_interrupt():
        train(config, workdir, init=args.init)  # a SIGINT/SIGTERM saves, then returns
    return 0


def model_field_types() -> dict:
    """ViTConfig's fields, each with the type `--set model.FIELD=...` expects: what a recipe's
    `model` section may hold. Imports the model package (jax), so load_config calls it last."""
    from vit.models.config import FIELDS
    from vit.recipes.model_fields import field_type

    return {name: field_type(name) for name in FIELDS}
