"""The `vit` command: parse arguments, call the library, print.

Each subcommand lives in `vit/commands/<name>.py` with `add_arguments(parser)` and
`run(args) -> int`; heavy imports happen inside `run`, so `vit --help` stays fast. A `VitError`
(a user mistake) prints one line and exits 2; so do what no check made in advance can rule out:
an OSError about a named file (permissions), a full disk or quota however a library reports it,
and running out of memory (a MemoryError, XLA's RESOURCE_EXHAUSTED), named with what to lower.
A closed pipe on stdout (`| head`) ends the run quietly with 141, as SIGPIPE would.
Run as the `vit` command where jax will compute on the CPU, it first starts itself again with
glibc asking for huge pages (vit/cpu/huge_pages.py: XLA:CPU's per-step scratch memory then
faults in 2 MiB pages).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
from typing import NoReturn

from vit.cpu import huge_pages
from vit.errors import OutOfSpace, VitError, is_out_of_memory, is_out_of_space

# subcommand -> (module, one-line help)
COMMANDS = {
    "info": ("vit.commands.info", "parameters, GMACs and tokens of a model variant"),
    "predict": ("vit.commands.predict",
                "classify images with a checkpoint (top-k or multi-label), or answer prompts "
                "with a text model"),
    "convert": ("vit.commands.convert",
                "convert a checkpoint between npz, hf, timm and orbax, or export it to onnx"),
    "train": ("vit.commands.train", "fine-tune or train a ViT from a shipped recipe or a "
              "config file"),
    "eval": ("vit.commands.eval", "accuracy, precision/recall/F1, calibration, confusion "
             "matrix and reliability diagram"),
    "rollout": ("vit.commands.rollout", "export attention-rollout overlays for images"),
    "explain-eval": ("vit.commands.explain_eval", "deletion/insertion faithfulness of maps"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vit", description="Vision Transformers in JAX + Flax NNX.")
    parser.add_argument("--version", action="version",
                        version=f"vit {importlib.import_module('vit').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `vit` command: on the CPU, start again with huge pages for XLA
        huge_pages.reexec()
        _exit_now(_run(argv))
    return _run(argv)


def _exit_now(code: int) -> NoReturn:
    """Ends the `vit` command once it has returned: streams flushed, exit handlers run (jax's
    shutdown among them), then out without the interpreter's teardown, which destroys XLA's
    client, compiled programs and arrays one by one for seconds after everything is written."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except VitError as err:
        # One write, line and newline together: a library thread that prints meanwhile cannot
        # split it.
        sys.stderr.write(f"vit {args.command}: error: {err}\n")
        return err.exit_code
    except BrokenPipeError:
        # The reader went away (`vit predict DIR | head`): stop quietly, as a shell tool
        # killed by SIGPIPE does, and keep Python from failing again on flushing stdout.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except Exception as err:  # noqa: BLE001  (only the faults below are caught: others raise)
        message = _system_fault(args.command, err)
        if message is None:  # a bug: keep the traceback
            raise
        sys.stderr.write(f"vit {args.command}: error: {message}\n")
        return VitError.exit_code
    except KeyboardInterrupt:
        print(f"vit {args.command}: interrupted", file=sys.stderr)
        return 130


# What to lower when a command runs out of memory.
LOWER = {"predict": "--batch-size or --image-size", "eval": "--batch-size",
         "rollout": "--batch-size or --image-size", "explain-eval": "--batch-size or --limit",
         "convert": "--image-size", "info": "the variant or --image-size",
         "train": "train.batch_size (or raise train.accum_steps) or input.image_size"}


def _system_fault(command: str, err: Exception) -> str | None:
    """The one line for a fault the system raised that is the user's to fix, else None.

    A writer that knows its path and size raises `OutOfSpace` itself (and removes what it
    began); this catches a full disk met anywhere else.
    """
    if is_out_of_space(err):
        where = getattr(err, "filename", None)
        return str(OutOfSpace(where)) if where else ("no space left on device; free some "
                                                     "space or write elsewhere")
    if is_out_of_memory(err):
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        said = said.removeprefix("RESOURCE_EXHAUSTED: ")
        said = said if len(said) <= 100 else said[:97] + "..."
        return f"out of memory ({said}); lower {LOWER.get(command, 'the batch size')}"
    if isinstance(err, OSError) and err.filename is not None:
        # A file or folder the system refused (permissions, a file where a folder was
        # expected): the user's to fix, so one line naming it, as for a VitError.
        return f"{err.filename}: {err.strerror or err}"
    return None


if __name__ == "__main__":
    sys.exit(main())
