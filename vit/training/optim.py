"""Optimiser recipes on optax, over the model's pure-dict parameters.

- `sgd`: the vit_jax fine-tuning recipe: SGD with momentum 0.9, no weight decay, global-norm
  clipping at 1.0, linear warmup then cosine decay.
- `adamw`: AdamW, weight decay on weight matrices only (no decay on biases, norms, position
  embeddings or tokens).

Options on both: layer-wise learning-rate decay (a factor per block depth, as BEiT/timm), a
`trainable` regex over parameter paths such as `head/kernel`: the rest are frozen (a linear
probe is `trainable="head/.*"`), `lr_mults` (`[[regex, factor], ...]`: the first match scales
a parameter's learning rate, as Flamingo's gates get a higher one) and a `no_decay` regex.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import optax

from vit.errors import ConfigError

DECAYED = ("kernel", "patch_kernel")  # weight matrices; everything else is left undecayed


def path_names(params) -> Any:
    """A tree like `params` whose leaves are `"blocks/0/attn/qkv/kernel"`-style paths."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "/".join(str(getattr(k, "key", k)) for k in path), params)


def schedule(cfg) -> optax.Schedule:
    """Linear warmup to `lr`, then `cosine` / `linear` decay to 0, or `constant`."""
    steps, warmup, lr = cfg.steps, min(cfg.warmup_steps, cfg.steps), cfg.lr
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), 0.0)
    if cfg.schedule == "linear":
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.linear_schedule(lr, 0.0, max(steps - warmup, 1))],
                                    [warmup])
    if cfg.schedule == "constant":
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.constant_schedule(lr)], [warmup])
    raise ConfigError(f"optim.schedule={cfg.schedule!r}; use cosine, linear or constant")


def layer_id(path: str, depth: int) -> int:
    """0 for the embeddings, i + 1 for block i, depth + 1 for the final norm and heads."""
    m = re.match(r"blocks/(\d+)/", path)
    if m:
        return int(m.group(1)) + 1
    if path.split("/")[0] in ("stem", "patch_kernel", "patch_bias", "cls_token", "reg_tokens",
                              "pos_embed"):
        return 0
    return depth + 1


def scale_by_tree(factors) -> optax.GradientTransformation:
    """Multiplies each update by a fixed per-parameter factor. Under `optax.multi_transform`
    (frozen parameters) frozen leaves arrive as `MaskedNode`s and pass through."""
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731

    def update(updates, state, params=None):
        return jax.tree.map(lambda u, f: u if masked(u) else u * f, updates, factors,
                            is_leaf=masked), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(cfg, params, depth: int, steps: int) -> tuple[optax.GradientTransformation,
                                                               optax.Schedule]:
    """`cfg` is the config's `optim` block; `steps` the number of optimiser updates."""
    cfg = cfg.copy_and_resolve_references()
    with cfg.unlocked():
        cfg.steps = steps
    lr = schedule(cfg)
    names = path_names(params)
    if cfg.name == "sgd":
        core = optax.sgd(lr, momentum=cfg.momentum, nesterov=False)
    elif cfg.name == "adamw":
        no_decay = re.compile(cfg.get("no_decay") or "(?!)")
        mask = jax.tree.map(lambda n: n.rsplit("/", 1)[-1] in DECAYED
                            and not no_decay.fullmatch(n), names)
        core = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=mask)
    else:
        raise ConfigError(f"optim.name={cfg.name!r}; use sgd or adamw")
    chain = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
    chain.append(core)
    if cfg.layer_decay and cfg.layer_decay != 1.0:
        factors = jax.tree.map(
            lambda n: jnp.float32(cfg.layer_decay ** (depth + 1 - layer_id(n, depth))), names)
        chain.append(scale_by_tree(factors))
    if cfg.get("lr_mults"):
        rules = [(re.compile(pattern), float(factor)) for pattern, factor in cfg.lr_mults]
        chain.append(scale_by_tree(jax.tree.map(
            lambda n: jnp.float32(next((f for r, f in rules if r.fullmatch(n)), 1.0)), names)))
    tx = optax.chain(*chain)
    trainable = re.compile(cfg.trainable)
    labels = jax.tree.map(lambda n: "train" if trainable.fullmatch(n) else "frozen", names)
    if not any(label == "train" for label in jax.tree.leaves(labels)):
        raise ConfigError(f"optim.trainable={cfg.trainable!r} matches no parameter; paths look "
                          "like 'head/kernel' or 'blocks/11/mlp/fc2/bias'")
    if any(label == "frozen" for label in jax.tree.leaves(labels)):
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, lr
