"""Which folders of a `checkpoints/` folder are finished steps: the one definition, shared by
training (its workdir checks, resume, and what an interruption leaves) and the checkpoint
readers.

Orbax writes a step into `<step>.orbax-checkpoint-tmp-*` and renames it when complete, so a
finished step is a folder named by its step alone that holds the model's items (`params` and
`meta`, as `vit.checkpoints.orbax_format` names them). Standard library only: `vit train`
checks a workdir with it before the heavy imports.
"""

from __future__ import annotations

from pathlib import Path

PARAMS, META = "params", "meta"  # vit.checkpoints.orbax_format's names (a test holds them equal)


def has_model_items(path: Path) -> bool:
    """Whether `path` holds the items every checkpoint of ours has: `params` and `meta`."""
    return (path / PARAMS).is_dir() and (path / META).is_dir()


def finished_steps(checkpoints: Path) -> list[int]:
    """The finished steps in `checkpoints`, in order ([] when the folder is missing)."""
    try:
        return sorted(int(p.name) for p in Path(checkpoints).iterdir()
                      if p.name.isdigit() and has_model_items(p))
    except (FileNotFoundError, NotADirectoryError):
        return []
