"""Whether a forward fits in memory, told before it is compiled.

`vit predict --image-size 4096` on a small model would ask XLA for terabytes of attention
scores; on a CPU the allocation can drive the machine into swap or the kernel's OOM killer
before any error comes back. `check_fits` refuses such a run up front, with a one-line
`OutOfMemory` saying what to lower. Its figure is a lower bound (the largest tensors of one
block, alive at once, plus the weights), so a run it refuses cannot fit; one that slips past it
and still fails is caught as XLA's RESOURCE_EXHAUSTED by the CLI.
"""

from __future__ import annotations

import math
import os
import resource

from vit.errors import OutOfMemory

GB = 1e9


def tokens(config) -> int:
    """Tokens the encoder attends over: the patches, the class token and the registers."""
    (h, w), (ph, pw) = config.image_size, config.patch_size
    return (h // ph) * (w // pw) + int(config.class_token) + config.num_registers


def scores_materialised(config, batch: int) -> bool:
    """Whether the attention backend the model will run writes out the `[batch, heads, n, n]`
    scores (XLA's path does; the flash kernel and cuDNN do not)."""
    from vit.ops.attention import choose_impl

    n, head_dim = tokens(config), config.width // config.num_heads
    shape = (batch, n, config.num_heads, head_dim)
    impl, _ = choose_impl(config.attention_impl, shape, shape, config.dtype, has_mask=False,
                          dropout=False)
    return impl == "xla"


def forward_bytes(config, batch: int, *, maps: bool = False) -> tuple[int, str]:
    """A lower bound of a forward's peak memory over `batch` images, and what dominates it.

    The float32 input batch, the weights, and one block's largest tensor: the float32
    attention scores (when materialised) or the MLP's hidden layer. `maps`: every block's
    attention probabilities are kept besides (rollout and the other explanations).
    """
    n, (h, w) = tokens(config), config.image_size
    inputs = 4 * batch * h * w * config.in_channels
    act = 2 if config.dtype in ("bfloat16", "float16") else 4
    weights = 4 * config.depth * (4 * config.width ** 2 + 2 * config.width * config.mlp_dim)
    scores = 4 * batch * config.num_heads * n * n
    mlp = act * batch * n * config.mlp_dim
    kept = config.depth * scores if maps else 0
    block = max(scores if maps or scores_materialised(config, batch) else 0, mlp)
    what = "attention scores" if block > mlp or kept else "MLP activations"
    if inputs > block + kept:
        what = "input images"
    return inputs + weights + block + kept, what


def available_bytes() -> tuple[int, str] | None:
    """(bytes, where) this process may still allocate: the accelerator's free memory, else the
    host's available memory, lowered by an address-space limit (`ulimit -v`); None where
    neither can be read."""
    import jax

    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"the {device.device_kind}"
    found = []
    host = _meminfo("MemAvailable")
    if host is not None:
        found.append((host, "this machine"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _status("VmSize")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        found.append((soft - mapped, "this process's memory limit (ulimit -v)"))
    return min(found) if found else None


def check_fits(config, batch: int, *, lower: tuple[str, ...] = ("--batch-size", "--image-size"),
               maps: bool = False) -> None:
    """An `OutOfMemory` naming the flags to `lower` when a forward over `batch` images cannot
    fit (`--batch-size` only while the batch is above 1)."""
    there = available_bytes()
    if there is None:
        return
    free, where = there
    needed, what = forward_bytes(config, batch, maps=maps)
    if needed <= free:
        return
    h, w = config.image_size
    flags = [flag for flag in lower if flag != "--batch-size" or batch > 1]
    fix = f"lower {' or '.join(flags)}" if flags else "it needs a machine with more memory"
    images = f"{batch} images" if batch > 1 else "1 image"
    raise OutOfMemory(
        f"{images} of {h}x{w} ({tokens(config):,} tokens each) need{'s' if batch == 1 else ''} "
        f"at least {_gb(needed)} for the {what}, and {where} has {_gb(max(free, 0))} free; "
        f"{fix}")


def _gb(size: float) -> str:
    return f"{size / GB:,.1f} GB" if size < 100 * GB else f"{math.ceil(size / GB):,} GB"


def _meminfo(field: str) -> int | None:
    return _proc_kb("/proc/meminfo", field)


def _status(field: str) -> int | None:
    return _proc_kb(f"/proc/{os.getpid()}/status", field)


def _proc_kb(path: str, field: str) -> int | None:
    """A `Field:  N kB` line of a /proc file, in bytes (None off Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
