"""Recipes: the training configuration. `defaults` holds every key with its default and meaning;
a recipe (`configs/*.py`, loaded by `load`) sets only what differs; `--set KEY=VALUE` overrides
any key, typed by the key (`overrides`, shared with model fields through `model_fields`).

Nothing is imported here: `vit.recipes.overrides` stays free of ml_collections and jax.
"""
