"""`--dtype` and `--no-cache`, shared by the commands that run a pretrained model (predict,
eval, rollout)."""

from __future__ import annotations

COMPUTE_DTYPES = ("float32", "bfloat16")


def add_arguments(parser) -> None:
    parser.add_argument("--dtype", choices=COMPUTE_DTYPES, default=None,
                        help="compute dtype (default: the checkpoint's, normally float32). "
                             "bfloat16 runs the matmuls in bfloat16, with LayerNorm, softmax "
                             "and the residual stream in float32; it is the fast choice on GPUs "
                             "and TPUs and on CPUs with bfloat16 arithmetic (AVX512_BF16, AMX); "
                             "on other CPUs float32 is as fast or faster")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not read or write the caches in $VIT_CACHE_DIR (default "
                             "~/.cache/vit): JAX's compiles and vit predict's prepared "
                             "classifiers")


def start(args):
    """Call first in `run`, before anything compiles: the compilation cache on (its folder) or
    off (None)."""
    import sys

    from vit.inference.compile_cache import configure

    command = getattr(args, "command", "")
    folder = configure(args.no_cache, note=lambda text: print(f"vit {command}: note: {text}",
                                                              file=sys.stderr))
    if args.dtype == "bfloat16":
        from vit.cpu.features import bfloat16_note

        note = bfloat16_note()  # None on GPUs, TPUs and CPUs with bfloat16 arithmetic
        if note:
            print(f"vit {command}: note: {note}", file=sys.stderr)
    return folder


def with_dtype(args, overrides: dict) -> dict:
    """Model overrides plus `--dtype`; `--set dtype=...` and a different `--dtype` conflict."""
    from vit.errors import ConfigError

    if args.dtype is None:
        return overrides
    if overrides.get("dtype", args.dtype) != args.dtype:
        raise ConfigError(f"--dtype {args.dtype} and --set dtype={overrides['dtype']} disagree; "
                          "give one of them")
    return {**overrides, "dtype": args.dtype}
