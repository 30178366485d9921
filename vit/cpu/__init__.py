"""The CPU backend: what this CPU can do, how XLA:CPU compiles our programs, and the memory
glibc gives its scratch buffers.

- `features`: bfloat16 arithmetic in hardware (/proc/cpuinfo), and what follows from it for a
  narrow compute dtype;
- `xla_options`: the XLA:CPU compile options of inference forwards and of the training step;
- `huge_pages`: transparent huge pages for XLA:CPU's per-run scratch memory (glibc's tunable,
  set by the `vit` command starting itself again where jax will compute on the CPU).

Below every other part of vit: it imports nothing of vit but itself, and only the standard
library until a function asks jax.
"""
