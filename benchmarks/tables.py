"""The docs' tables, made from the records (`--check`: exit 1 on a stale table or a figure
outside the tables; docs/benchmarks.md says how)."""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from benchmarks.common import ROOT, add_options, read_record

RECORDS = "benchmarks/records"
BLOCK = re.compile(r"(<!-- (?P<kind>table|targets|contents)(?: (?P<name>[\w-]+))? -->\n)"
                   r"(?P<body>.*?)(<!-- /(?P=kind)(?: (?P=name))? -->)", re.DOTALL)
# A number with a unit of measure ("8x8" is a shape: an "x" counts only glued and alone).
FIGURE = re.compile(
    r"(?<![\w.,])(?:\d+h)?\d+m\d\ds\b|"  # a duration written 6m00s
    r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:[-–]\d[\d,]*(?:\.\d+)?)?"
    r"(?:[x×](?![\w])|\s?(?:ms|s|seconds|minutes|min|GiB|GB|MiB|MB|KiB|KB|%|img/s|images/s|"
    r"steps/s|GFLOP/s|TFLOP/s|GFLOP)(?![\w/]))")
# Facts written with a unit that are not measurements, by file: {figure: why it is not one}.
NOT_MEASURED = {
    "docs/attention.md": dict.fromkeys(
        ("1.69x", "1.23x", "1.48x", "1.17x"),
        "padded attention work at 197 and 577 tokens, worked out from the tile sizes"),
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
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]


def num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def f3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(map(str, r)) + " |" for r in [header, ["---"] * len(header), *rows]]


def cpu_name(record: dict) -> str | None:
    return ((record.get("machine") or {}).get("cpu") or {}).get("model_name")


def host(record: dict, usual: str | None = None) -> str:
    """A record's CPU, bfloat16 arithmetic, cores and date; and whether it is not `usual`'s."""
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


def records(root: Path = ROOT) -> dict[str, dict]:
    return {p.stem: read_record(p.stem, root) for p in sorted((root / RECORDS).glob("*.json"))}


def module_of(record: dict) -> ModuleType | None:
    from benchmarks.__main__ import MODES

    words = shlex.split(record.get("command", ""))
    mode = words[3] if words[:3] == ["python", "-m", "benchmarks"] and len(words) > 3 else None
    return importlib.import_module(MODES[mode][0]) if mode in MODES else None


def part(record: dict, name: str) -> Callable | None:
    return getattr(module_of(record), name, None)


def render(name: str, record: dict, recs: dict[str, dict]) -> str:
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
    """Every target the modes state, by record, with the figure and whether it is met."""
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


def contents(text: str, recs: dict[str, dict]) -> str:
    lines, usual = [], usual_cpu(recs)
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0]
        anchor = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        shown = [recs[n] for n in blocks(section) if n in recs]
        where = "; ".join(sorted({host(r, usual) for r in shown}))
        lines.append(f"- [{title}](#{anchor})" + (f": {where}" if where else ""))
    return "\n".join(lines) + "\n"


def blocks(text: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(text) if m["kind"] == "table"}


def placement(root: Path = ROOT) -> dict[str, str]:
    return {name: doc for doc in docs(root) for name in blocks((root / doc).read_text())}


def regenerate(text: str, recs: dict[str, dict], where: dict[str, str] | None = None) -> str:
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
    recs, where = records(root), placement(root)
    return [doc for doc in docs(root)
            if regenerate((root / doc).read_text(), recs, where) != (root / doc).read_text()]


def prose(text: str) -> str:
    """`text` without blocks, code, comments and link targets, its lines kept."""
    def blank(m: re.Match) -> str:
        return "\n" * m.group(0).count("\n")

    text = BLOCK.sub(blank, text)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def unbacked(root: Path = ROOT) -> list[str]:
    """"FILE:LINE: FIGURE" of each figure outside the blocks that `NOT_MEASURED` lacks."""
    out = []
    for doc in docs(root):
        allowed = NOT_MEASURED.get(doc, {})
        for number, line in enumerate(prose((root / doc).read_text()).splitlines(), 1):
            out += [f"{doc}:{number}: {m.group(0)}" for m in FIGURE.finditer(line)
                    if m.group(0) not in allowed]
    return out


def unshown(root: Path = ROOT) -> list[str]:
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
    args = add_options(parser, {"check": (False, "change nothing; report")}).parse_args(argv)
    problems, recs, where = unshown(), records(), placement()
    if args.check:
        problems += [f"{doc}: stale tables: run python -m benchmarks tables" for doc in stale()]
        problems += [f"{at} is a figure outside the generated tables: put it in a record's "
                     "table or delete it" for at in unbacked()]
    else:
        changed = stale()
        for doc in changed:
            (ROOT / doc).write_text(regenerate((ROOT / doc).read_text(), recs, where))
        print(f"tables: wrote {', '.join(changed) or 'nothing (all current)'}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        print(f"tables: {len(recs)} records, each in one current table; no other figures")
    return 0
