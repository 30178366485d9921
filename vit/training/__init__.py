"""Training: `vit.train(config, workdir, overrides=..., data=...)` trains from Python (its
implementation is `vit.training.api.train`); the loop, the step and its losses, optax recipes,
shardings, checkpoints and metrics are this package's modules (`from vit.training.loop import
train`). It imports nothing by itself.
"""
