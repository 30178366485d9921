"""Staged training: one recipe, several stages in order, each a full `train()` run.

A recipe's `stages` maps a stage name to its changes to the base recipe: `order` (the place in
the sequence), `text` (whether the model has its text path in this stage), `skip_with_init`
(a stage `--init CHECKPOINT` replaces, such as pre-training the ViT), and `train` / `optim` /
`input` sections merged over the base ones (steps, loss, learning rate, `trainable`, ...).

Stage k starts from stage k-1's final checkpoint (through `--init`, so a plain ViT gains its
text path with the gates at 0). Every stage but the last trains in `WORKDIR/stages/NAME`; the
last one trains in WORKDIR itself, so `vit eval --workdir` and `vit predict --checkpoint` see
the finished model. Running the command again skips finished stages and resumes the one that
was interrupted, from its own latest checkpoint. The run holds WORKDIR's lock throughout (see
`vit.training.workdir`); each stage folder is claimed by its own stage as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import ml_collections

from vit.errors import ConfigError
from vit.models.config import variant_config
from vit.training import parallel
from vit.training import workdir as workdirs
from vit.training.early_stop import REASON as STOPPED_EARLY
from vit.training.from_recipe import model_fields
from vit.training.loop import train, train_claimed
from vit.training.program import check_patch_loss

SECTIONS = ("train", "optim", "input")
STAGE_KEYS = {"order", "text", "skip_with_init", *SECTIONS}


def stage_configs(config) -> list[tuple[str, ml_collections.ConfigDict]]:
    """[(name, the full recipe of that stage)] in order."""
    stages = sorted(config.stages.items(), key=lambda kv: kv[1].get("order", 0))
    out = []
    for name, stage in stages:
        unknown = set(stage) - STAGE_KEYS
        if unknown:
            raise ConfigError(f"stages.{name}: unknown key(s) {', '.join(sorted(unknown))}; "
                              f"a stage has {', '.join(sorted(STAGE_KEYS))}")
        cfg = ml_collections.ConfigDict(config.to_dict())
        with cfg.unlocked():
            del cfg["stages"]
            for section in SECTIONS:
                if section in stage:
                    cfg[section].update(stage[section].to_dict())
            if not stage.get("text", True) and "text" in cfg.model:
                del cfg.model["text"]
        out.append((name, cfg))
    if not out:
        raise ConfigError("stages is empty; remove it for a single-stage recipe")
    return out


def train_stages(config, workdir: str | Path, *, init: str | None = None,
                 stop_after: int | None = None, sources: dict | None = None) -> dict:
    """Runs the stages in order (see the module); `sources` (as `vit.training.loop.train` takes
    them) feed every stage."""
    stages = stage_configs(config)
    for name, cfg in stages:  # a mistake in a later stage fails now, not after stage 0
        variant_config(cfg.model.name, image_size=cfg.input.image_size, **model_fields(cfg))
        check_patch_loss(cfg, f"stages.{name}.train")
    workdir = Path(workdir)
    with workdirs.claim(workdir, primary=parallel.is_primary(),
                        agree=parallel.allgather_json) as claim:
        try:
            return _train_stages(config, stages, workdir, claim, init=init,
                                 stop_after=stop_after, sources=sources)
        except Exception:
            if claim is not None and not workdirs.has_finished_step(workdir):
                claim.undo()
            raise


def _train_stages(config, stages, workdir: Path, claim, *, init: str | None,
                  stop_after: int | None, sources: dict | None) -> dict:
    primary = jax.process_index() == 0  # process 0 alone writes files
    previous, result = init or (config.get("init") or None), {}
    for k, (name, cfg) in enumerate(stages):
        if init and config.stages[name].get("skip_with_init", False):
            print(f"stage {name}: skipped, starting from --init {init}", flush=True)
            continue
        last = k == len(stages) - 1
        where = workdir if last else workdir / "stages" / name
        steps = cfg.train.steps
        if workdirs.latest_step(where) == steps:
            print(f"stage {name}: finished earlier ({where})", flush=True)
        else:
            print(f"stage {name} ({k + 1}/{len(stages)}): {steps} steps into {where}", flush=True)
            with cfg.unlocked():
                cfg.init = ""
            if last:  # WORKDIR itself, held already
                result = train_claimed(cfg, where, claim, init=previous, stop_after=stop_after,
                                       sources=sources)
            else:
                result = train(cfg, where, init=previous, stop_after=stop_after,
                               sources=sources)
            if primary:  # written once a stage has trained: a refused run leaves the old one
                workdirs.write_config(workdir, config, "recipe.json")
            early = result.get("stopped_by") == STOPPED_EARLY  # this stage is done: go on
            if not early and (result.get("stopped_by") or workdirs.latest_step(where) != steps):
                return result  # interrupted: the same command resumes this stage
        previous = str(where)
    if primary:
        workdirs.replace_file(workdir / "stages.json", json.dumps(
            {"stages": [name for name, _ in stages], "final": str(workdir)}, indent=2))
    return result
