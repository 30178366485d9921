"""Recipes: the training configuration. A recipe (`configs/*.py`, or a shipped one by name) sets
only what differs from the defaults; `--set KEY=VALUE` overrides any key, typed by the key.

Nothing is imported here: `vit.recipes.overrides` stays free of ml_collections and jax.
"""
