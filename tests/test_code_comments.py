"""Code comments say why, never how fast, and carry no history: every comment and docstring
under vit/ and tests/ is free of measured figures (a number with `x`, `ms`, `s`, `GB`, `GiB`,
`%` or `img/s` after it: a speed-up, a time, a size, a share, a rate) and of history wording
(see `HISTORY`). Figures live in benchmarks/ records and the docs generated from them; history
lives in git and CHANGELOG.md. `PLANTED` below shows each kind.

Comments are read with `tokenize` and docstrings with `ast`, so code and string literals the
program prints are not scanned. `PENDING` lists the hits in files still being cleaned; it is
meant to be empty, and an entry whose text is gone from its file fails too, so the list only
shrinks.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("vit", "tests", "benchmarks")

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*(?:-\d+(?:\.\d+)?)?"  # 1,576 or 1.01-1.08
FIGURE = re.compile(
    rf"{_NUMBER}(?:"
    r"[x×](?![\w])"          # a ratio; a shape such as 8x8 or a hex 0x1f is no figure
    r"|\s?(?:ms|s|GiB|GB)\b(?!-)"
    r"|\s?%"
    r"|\s?(?:img|images)/s\b"
    r")")
HISTORY = re.compile(
    r"\bused to\b|\bearlier\b|\bfirst exported\b|\bformerly\b|\bpreviously\b|\bno longer\b"
    r"|\bwas\b[^.;:]{0,60}\bnow\b",
    re.IGNORECASE)

# (file, the text that hits): files their owners are still cleaning. Empty it, don't grow it.
PENDING: set[tuple[str, str]] = set()


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in `source`."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                first = body[0].lineno
                for offset, line in enumerate(body[0].value.value.splitlines()):
                    found.append((first + offset, line))
    return found


def hits(source: str) -> list[tuple[int, str]]:
    """(line, matched text) of every figure or history wording in `source`'s comments and
    docstrings. A docstring line's number counts from the docstring's first line."""
    out = []
    for line, text in comments_and_docstrings(source):
        for pattern in (FIGURE, HISTORY):
            out += [(line, m.group(0)) for m in pattern.finditer(text)]
    return out


def python_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")
                  if "data" not in p.relative_to(ROOT).parts[1:-1])


def all_hits() -> dict[tuple[str, str], list[int]]:
    """(file, matched text) -> the lines where it hits, over every scanned file."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in python_files():
        name = str(path.relative_to(ROOT))
        for line, text in hits(path.read_text()):
            found.setdefault((name, text), []).append(line)
    return found


def test_no_figures_or_history_in_comments():
    found = all_hits()
    new = sorted(f"{name}:{lines[0]}: {text!r}" for (name, text), lines in found.items()
                 if (name, text) not in PENDING)
    assert not new, ("measured figures or history in comments (figures go in benchmarks/, "
                     "history in git and CHANGELOG.md):\n" + "\n".join(new))


def test_pending_only_lists_what_still_hits():
    stale = sorted(PENDING - set(all_hits()))
    assert not stale, f"cleaned since: drop from PENDING: {stale}"


def test_the_scanner_reads_python_files_under_vit_and_tests():
    names = {str(p.relative_to(ROOT)) for p in python_files()}
    assert {"vit/cli.py", "vit/training/loop.py", "tests/conftest.py"} <= names


# -- the scanner's own examples: string constants, which the scan above does not read -------
PLANTED = '''"""A module.

A narrow product used to be slow: 383 -> 312 ms a step, 1.01-1.08x faster, 2.64 GiB less.
"""

# ViT-S/16 batch 32: 4.4 GB of scratch, 8% of the forward, 120 img/s, 3.2 s a step.
x = 1  # the name this module first exported


def f():
    """It was slow and is now fast. Measured earlier."""
    return "1.5x is in a string the program prints, not a comment"
'''

CLEAN = '''"""8x8 images in 4 KiB pages, patch 16x16, step 300, 2 blocks, bfloat16."""

# Every 0x1f byte is a flag; a --set takes KEY=VALUE; v2 of the format; 512 times fewer faults.
y = "3.2 s"  # a string, not a comment
'''


def test_a_planted_figure_or_history_is_caught():
    found = [text for _, text in hits(PLANTED)]
    for text in ("used to", "312 ms", "1.01-1.08x", "2.64 GiB", "4.4 GB", "8%", "120 img/s",
                 "3.2 s", "first exported", "earlier"):
        assert text in found, text
    assert any(t.startswith("was") and t.endswith("now") for t in found)
    assert not any("1.5x" in t for t in found)  # a string literal is not a comment
    assert [line for line, text in hits(PLANTED) if text == "first exported"] == [7]


def test_sizes_shapes_and_counts_are_not_figures():
    assert hits(CLEAN) == []
