"""The README documents every `vit` subcommand and every recipe in configs/, so a section
cannot silently go missing in an edit."""

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def subcommands() -> list[str]:
    """The subcommand names registered on the real `vit` parser."""
    from vit.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "vit's parser should have exactly one set of subcommands"
    return sorted(actions[0].choices)


def recipes() -> list[str]:
    return sorted(f"configs/{p.name}" for p in (ROOT / "configs").iterdir()
                  if p.is_file() and p.suffix == ".py")


def missing_from(text: str) -> list[str]:
    """Subcommands (as `vit NAME`) and recipe files (as `configs/FILE`) that `text` omits."""
    missing = [f"vit {name}" for name in subcommands()
               if not re.search(rf"\bvit {re.escape(name)}(?![\w-])", text)]
    missing += [path for path in recipes() if not re.search(rf"{re.escape(path)}\b", text)]
    return missing


def test_discovery_finds_commands_and_recipes():
    assert {"train", "eval", "predict"} <= set(subcommands())
    assert "configs/digits.py" in recipes()


def test_readme_names_every_subcommand_and_recipe():
    text = (ROOT / "README.md").read_text()
    assert missing_from(text) == [], "README.md does not mention these; document them"


def test_a_missing_name_is_caught():
    text = (ROOT / "README.md").read_text()
    # `vit explain-eval` must not count as `vit explain`, nor `vit evaluate` as `vit eval`.
    without_eval = re.sub(r"\bvit eval(?![\w-])", "vit evaluate", text)
    assert "vit eval" in missing_from(without_eval)
    without_digits = text.replace("configs/digits.py", "configs/digits.pyc")
    assert "configs/digits.py" in missing_from(without_digits)
