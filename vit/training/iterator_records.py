"""What a checkpoint records of the data stream: every process's iterator state, and this
process's part of it on resume."""

from __future__ import annotations

import jax

from vit.errors import ConfigError
from vit.training import parallel


def iterator_states(local_state: dict) -> dict:
    """What a checkpoint records of the data stream: every process's iterator state (the
    same on each process, gathered), so a resumed multi-process run reads the same data."""
    return {"process_count": jax.process_count(),
            "per_process": parallel.allgather_json(local_state)}


def iterator_state_of_process(saved: dict, step: int) -> dict:
    """This process's iterator state from `iterator_states`' record. Each process reads its
    own shard of the data, so another process count would read other data from this point:
    refused rather than silently replaying or skipping examples."""
    count, now = saved["process_count"], jax.process_count()
    if count != now:
        raise ConfigError(
            f"the checkpoint at step {step} was written by {count} process(es) and this run "
            f"has {now}: each process reads its own shard of the data, so resuming would "
            f"replay or skip examples; resume with {count} process(es), or start a new workdir "
            "from its weights with --init WORKDIR")
    return saved["per_process"][jax.process_index()]
