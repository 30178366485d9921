"""Parameter trees as the loaders and writers hold them: nested dicts of arrays (our pure dict,
as `nnx.to_pure_dict` gives), flattened to `{path tuple: leaf}` and back."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp


def flatten(tree: dict, prefix: tuple = ()) -> dict[tuple, Any]:
    """Nested dict -> {path tuple: leaf}; digit-string keys (as orbax restores them) become ints."""
    out = {}
    for key, value in tree.items():
        key = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(value, dict):
            out.update(flatten(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def nest(flat: dict[tuple, Any]) -> dict:
    """{path tuple: leaf} -> nested dict (the inverse of `flatten`)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def path_name(path: tuple) -> str:
    """`("blocks", 0, "attn")` -> `"blocks/0/attn"`, for messages."""
    return "/".join(str(p) for p in path)


def as_jax(params: dict) -> dict:
    """The same tree with every leaf a float32 jax array (what a model's state takes)."""
    return nest({k: jnp.asarray(v, jnp.float32) for k, v in flatten(params).items()})
