"""Training: the loop, the step and its losses, optax recipes, shardings, checkpoints, metrics.

Import submodules directly (`from vit.train.loop import train`); this package imports nothing
heavy by itself.
"""
