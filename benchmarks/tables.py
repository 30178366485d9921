"""The docs' figures, made from the records.

A record's table sits between `<!-- table NAME -->` and `<!-- /table NAME -->` (NAME:
`benchmarks/records/NAME.json`) in README.md or a page of docs/, once per record. The mode that
wrote the record draws it: `table(record)` in the module of the mode its command names (with a
`records` parameter it also gets every record, to compare with another). `<!-- targets -->`
holds every target a mode's `targets(record)` states, with whether the record meets it, and
`<!-- contents -->` the sections of a page with the hosts of the records shown in each.

The text around the blocks is written by hand and holds no measured figure: `--check` fails
on a number with a unit of measure (a ratio, a time, a size, a share, a rate) outside them,
unless `NOT_MEASURED` lists it as a fact that is not a measurement.

    python -m benchmarks tables            # rewrite the tables from the records
    python -m benchmarks tables --check    # exit 1 on a stale table or an unbacked figure
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from benchmarks.common import ROOT

RECORDS = "benchmarks/records"
BLOCK = re.compile(r"(<!-- (?P<kind>table|targets|contents)(?: (?P<name>[\w-]+))? -->\n)"
                   r"(?P<body>.*?)(<!-- /(?P=kind)(?: (?P=name))? -->)", re.DOTALL)
# A number with a unit of measure. "8x8" and "16,384 x 16,384" are shapes, not ratios: an "x"
# counts only glued to the number and not followed by a letter or digit.
FIGURE = re.compile(
    r"(?<![\w.,])(?:\d+h)?\d+m\d\ds\b|"  # a duration written 6m00s
    r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:[-–]\d[\d,]*(?:\.\d+)?)?"
    r"(?:[x×](?![\w])|\s?(?:ms|s|seconds|minutes|min|GiB|GB|MiB|MB|KiB|KB|%|img/s|images/s|"
    r"steps/s|GFLOP/s|TFLOP/s|GFLOP)(?![\w/]))")
# Facts written with a unit that are not measurements, by file: {figure: why it is not one}.
NOT_MEASURED = {
    "docs/attention.md": {
        "1.69x": "padded attention work at 197 tokens, worked out from the tile sizes",
        "1.23x": "padded attention work at 577 tokens, worked out from the tile sizes",
        "1.48x": "padded attention work at 197 tokens, worked out from the tile sizes",
        "1.17x": "padded attention work at 577 tokens, worked out from the tile sizes",
    },
    "docs/errors.md": {"64 MB": "the free-disk threshold below which the cache is skipped"},
    "docs/explain.md": {"95%": "the confidence level of the bootstrap interval"},
    "docs/training.md": {
        "2 MiB": "the size of a huge page", "4 KiB": "the size of a normal page",
        "45%": "RandAugment's largest translation, a setting",
        "2%": "RandomErasing's smallest box, a setting",
        "10%": "the share of each class an image folder's validation split takes, a setting"},
    "docs/text.md": {"10x": "the gates' learning-rate multiplier, a recipe setting",
                     "50%": "the answer of an image that ignores the prompt, by definition"},
}


def docs(root: Path = ROOT) -> list[str]:
    """The pages whose blocks are made and whose figures are checked, relative to `root`."""
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]


# ------------------------------------------------------------------------------ formatting


def num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def f3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: list[str], rows: list[list]) -> list[str]:
    return [row(*header), row(*["---"] * len(header)), *(row(*r) for r in rows)]


def cpu_name(record: dict) -> str | None:
    return ((record.get("machine") or {}).get("cpu") or {}).get("model_name")


def host(record: dict, usual: str | None = None) -> str:
    """The machine and date of a record: CPU model, its bfloat16 arithmetic, cores; and, when
    `usual` (the CPU of most records) is another, that it is another host."""
    machine = record.get("machine") or {}
    cores = f", {machine['cpus']} cores" if machine.get("cpus") else ""
    name, date = cpu_name(record), record["date_utc"][:10]
    if not name:
        return f"CPU not recorded{cores}, {date}" if machine else f"host not recorded, {date}"
    bf16 = machine["cpu"].get("bfloat16_arithmetic")
    arith = (f" (bfloat16 arithmetic: {', '.join(bf16)})" if bf16
             else " (no bfloat16 arithmetic)" if bf16 is not None else "")
    other = (f": another host than the {usual} of the other records, so compare its figures "
             "with each other only" if usual and name != usual else "")
    return f"{name}{arith}{cores}, {date}{other}"


def usual_cpu(recs: dict[str, dict]) -> str | None:
    names = collections.Counter(n for r in recs.values() if (n := cpu_name(r)))
    return names.most_common(1)[0][0] if names else None


# -------------------------------------------------------------------------------- records


def records(root: Path = ROOT) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((root / RECORDS).glob("*.json"))}


def module_of(record: dict) -> ModuleType | None:
    """The module of the mode named in the record's command (`python -m benchmarks MODE`)."""
    from benchmarks.__main__ import MODES

    words = shlex.split(record.get("command", ""))
    mode = words[3] if words[:3] == ["python", "-m", "benchmarks"] and len(words) > 3 else None
    return importlib.import_module(MODES[mode][0]) if mode in MODES else None


def part(record: dict, name: str) -> Callable | None:
    """The `table` or `targets` function of the record's mode."""
    return getattr(module_of(record), name, None)


def render(name: str, record: dict, recs: dict[str, dict]) -> str:
    """A table block's text: the host and date, the mode's table, the record and command."""
    draw = part(record, "table")
    if draw is None:
        raise KeyError(f"{RECORDS}/{name}.json: its mode has no table(record)")
    lines = (draw(record, records=recs) if "records" in inspect.signature(draw).parameters
             else draw(record))
    if not getattr(module_of(record), "INLINE", False):
        lines = [f"**{host(record, usual_cpu(recs))}**", "", *lines,
                 "", f"Record: `{RECORDS}/{name}.json`, made by `{record['command']}`."]
    return "\n".join(lines) + "\n"


def targets(recs: dict[str, dict], where: dict[str, str]) -> str:
    """Every target the modes state with the measured figure and whether the record meets it,
    by record (named once, with its host and date, linked to the page showing its table)."""
    rows, usual = [], usual_cpu(recs)
    for name, record in recs.items():
        stated = (part(record, "targets") or (lambda r: []))(record)
        page = where.get(name)
        link = (f"[`{name}`]({'../' if page == 'README.md' else ''}{Path(page).name})"
                if page else f"`{name}`")
        for i, (what, measured, met) in enumerate(stated):
            rows.append([f"{link}: {host(record, usual)}" if i == 0
                         else "", what, measured, "met" if met else "**not met**"])
    return "\n".join(table(["record", "target", "measured", ""], rows)) + "\n"


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def contents(text: str, recs: dict[str, dict]) -> str:
    """A page's `##` sections, linked, with the hosts and dates of the records they show."""
    lines, usual = [], usual_cpu(recs)
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0]
        shown = [recs[n] for n in blocks(section) if n in recs]
        where = "; ".join(sorted({host(r, usual) for r in shown}))
        lines.append(f"- [{title}](#{slug(title)})" + (f": {where}" if where else ""))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- pages


def blocks(text: str) -> dict[str, str]:
    """NAME -> body of each table block in `text`."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text) if m["kind"] == "table"}


def placement(root: Path = ROOT) -> dict[str, str]:
    """NAME -> the page that shows its table."""
    return {name: doc for doc in docs(root) for name in blocks((root / doc).read_text())}


def regenerate(text: str, recs: dict[str, dict], where: dict[str, str] | None = None) -> str:
    """`text` with every block's body made afresh from the records."""
    def fill(m: re.Match) -> str:
        kind, name = m["kind"], m["name"]
        if kind == "table" and name not in recs:
            raise KeyError(f"a table names {RECORDS}/{name}.json, which does not exist")
        body = (render(name, recs[name], recs) if kind == "table" else
                targets(recs, where or {}) if kind == "targets" else m["body"])
        return m.group(1) + body + m.group(5)

    text = BLOCK.sub(fill, text)
    return BLOCK.sub(lambda m: m.group(1) + contents(text, recs) + m.group(5)
                     if m["kind"] == "contents" else m.group(0), text)


def stale(root: Path = ROOT) -> list[str]:
    """The pages whose blocks differ from what the records give."""
    recs, where = records(root), placement(root)
    return [doc for doc in docs(root)
            if regenerate((root / doc).read_text(), recs, where) != (root / doc).read_text()]


def prose(text: str) -> str:
    """`text` without what the figure check leaves alone: generated blocks, code, comments
    and link targets. Lines are kept, so positions still name the right line."""
    def blank(m: re.Match) -> str:
        return "\n" * m.group(0).count("\n")

    text = BLOCK.sub(blank, text)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def unbacked(root: Path = ROOT) -> list[str]:
    """Every figure outside the generated blocks that `NOT_MEASURED` does not list:
    "FILE:LINE: FIGURE"."""
    out = []
    for doc in docs(root):
        allowed = NOT_MEASURED.get(doc, {})
        for number, line in enumerate(prose((root / doc).read_text()).splitlines(), 1):
            out += [f"{doc}:{number}: {m.group(0)}" for m in FIGURE.finditer(line)
                    if m.group(0) not in allowed]
    return out


def unshown(root: Path = ROOT) -> list[str]:
    """A record whose mode draws no table, with no table in the pages, or with several."""
    recs, problems, shown = records(root), [], {}
    for name in sorted(n for n, r in recs.items() if part(r, "table") is None):
        problems.append(f"{RECORDS}/{name}.json has no renderer: its command names no mode "
                        "whose module has table(record)")
    for doc in docs(root):
        for name in blocks((root / doc).read_text()):
            if name in shown:
                problems.append(f"{name} has a table in {shown[name]} and in {doc}")
            shown[name] = doc
    problems += [f"{RECORDS}/{name}.json has no table in the docs"
                 for name in sorted(set(recs) - set(shown))]
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tables",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 on a stale table, a record without one, "
                             "or a figure outside the tables")
    args = parser.parse_args(argv)
    problems, recs, where = unshown(), records(), placement()
    changed = []
    for doc in docs():
        text = (ROOT / doc).read_text()
        new = regenerate(text, recs, where)
        if new != text:
            changed.append(doc)
            if not args.check:
                (ROOT / doc).write_text(new)
    if args.check:
        problems += [f"{doc}: stale tables: run python -m benchmarks tables" for doc in changed]
        problems += [f"{at} is a figure outside the generated tables: put it in a record's "
                     "table or delete it" for at in unbacked()]
    else:
        print(f"tables: wrote {', '.join(changed) or 'nothing (all current)'}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        print(f"tables: {len(recs)} records, each in one current table; no other figures")
    return 0
