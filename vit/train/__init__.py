"""Training: `vit.train(config, workdir, overrides=..., data=...)` trains from Python (see
`vit.train.api`); the loop, the step and its losses, optax recipes, shardings, checkpoints and
metrics are its submodules (`from vit.train.loop import train`).

This package is a callable module, so `vit.train(...)` and `vit.train.loop` are both what they
say, whichever is imported first; it imports nothing heavy by itself.
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from vit.train.api import train

        return train(*args, **kwargs)

    @property
    def __signature__(self):
        import inspect

        from vit.train.api import train

        return inspect.signature(train)


sys.modules[__name__].__class__ = _CallableModule
