"""Training: the loop, optax recipes, mesh and shardings, checkpoints, metrics, init adaptation.

Import submodules directly (`from vit.train.loop import train`); this package imports nothing
heavy by itself.
"""
