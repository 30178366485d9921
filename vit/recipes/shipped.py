"""The recipes that ship with the package, found by name: `vit train --config digits`.

The files live in the repository's `configs/` and are packaged as `vit.recipes.builtin` (see
setup.py), so an installed wheel has them too. A checkout that was installed before that mapping
existed finds them beside the package instead. A recipe's purpose is its docstring's first
sentence, read without running the file. Standard library only.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from pathlib import Path

from vit.errors import ConfigError

PACKAGE = "vit.recipes.builtin"


def recipe_dir() -> Path | None:
    """The folder of the shipped recipes: the installed package's, else a checkout's
    `configs/` (recognised by the pyproject.toml beside it), else None."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return None


def recipes() -> dict[str, Path]:
    """{name: file} of the shipped recipes, sorted by name."""
    folder = recipe_dir()
    if folder is None:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}


LONGEST = 120  # a purpose past this is cut to its first clause, to fit a listing's line


def purpose(path: Path) -> str:
    """The recipe's docstring's first sentence, or its first clause (up to ': ') when the
    sentence is long, or its first line; '' without a docstring."""
    try:
        doc = ast.get_docstring(ast.parse(Path(path).read_bytes())) or ""
    except (OSError, SyntaxError, ValueError):
        return ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    end = paragraph.find(". ")
    sentence = paragraph[:end + 1] if end >= 0 else paragraph
    if len(sentence) <= LONGEST:
        return sentence
    clause = sentence.split(": ")[0]
    return clause if len(clause) <= LONGEST else doc.splitlines()[0]


def resolve(config: str | Path) -> Path:
    """A recipe file: `config` itself when it is a file, else the shipped recipe of that name
    (`digits` or `digits.py`). Anything else is a one-line ConfigError listing the names."""
    path = Path(config)
    if path.is_file():
        return path
    shipped = recipes()
    name = path.name.removesuffix(".py")
    if str(config) in (name, f"{name}.py") and name in shipped:
        return shipped[name]
    near = difflib.get_close_matches(name, list(shipped), n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    names = ", ".join(shipped) or "none found"
    raise ConfigError(f"{config}: no such config file or shipped recipe; {hint}shipped recipes: "
                      f"{names} (vit train --list-configs)")


def listing() -> str:
    """One line per shipped recipe: its name and purpose, aligned."""
    shipped = recipes()
    if not shipped:
        return "no shipped recipes found"
    width = max(map(len, shipped))
    return "\n".join(f"{name:<{width}}  {purpose(path)}".rstrip()
                     for name, path in shipped.items())
