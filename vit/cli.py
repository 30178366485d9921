"""The `vit` command: parse arguments, call the library, print.

Each subcommand lives in `vit/commands/<name>.py` with `add_arguments(parser)` and
`run(args) -> int`; heavy imports happen inside `run`, so `vit --help` stays fast. A `VitError`
(a user mistake) prints one line and exits 2; so does an OSError about a named file
(permissions, a full disk), which no check made in advance can rule out. A closed pipe on
stdout (`| head`) ends the run quietly with 141, as SIGPIPE would.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from vit.errors import VitError

# subcommand -> (module, one-line help)
COMMANDS = {
    "info": ("vit.commands.info", "parameters, GMACs and tokens of a model variant"),
    "predict": ("vit.commands.predict",
                "classify images with a checkpoint (top-k), or answer prompts with a text model"),
    "convert": ("vit.commands.convert", "convert a checkpoint between npz, hf, timm and orbax"),
    "train": ("vit.commands.train", "fine-tune or train a ViT from a config file"),
    "eval": ("vit.commands.eval", "accuracy, per-class accuracy and confusion matrix"),
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
    except OSError as err:
        if err.filename is None:  # not about a file the user named: a bug, keep the traceback
            raise
        # A file or folder the system refused (permissions, a full disk, a file where a folder
        # was expected): the user's to fix, so one line naming it, as for a VitError.
        sys.stderr.write(f"vit {args.command}: error: {err.filename}: {err.strerror or err}\n")
        return VitError.exit_code
    except KeyboardInterrupt:
        print(f"vit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
