"""The README and the guide in docs/ stay true to the code: every `vit` subcommand and every
recipe in configs/ is documented, every `vit ...` command line in a code block parses with the
real argument parser, the README's command table is the CLI's, links and named paths resolve,
and the README stays a landing page."""

import argparse
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Code blocks in these languages hold no command lines: Python, and program output.
NOT_SHELL = {"python", "text"}
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "<"}


def pages() -> dict[str, str]:
    """Repository-relative name -> text of the README and every docs page."""
    return {str(p.relative_to(ROOT)): p.read_text() for p in [README, *DOCS]}


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


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, indented ones (in lists) included."""
    fence = re.compile(r"^[ \t]*```([\w-]*)[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
    return [(m[1], m[2]) for m in fence.finditer(text)]


def command_lines(block: str) -> list[list[str]]:
    """The arguments after `vit` of every command line in a shell block: continuation lines
    joined, comments dropped, a pipe or redirection ends the command, and `vit` may follow a
    launcher or variable assignments (`srun ... vit train`, `VAR=1 vit predict`)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        tokens = shlex.split(line, comments=True)
        for i, token in enumerate(tokens):
            if token in SHELL_OPERATORS:
                tokens = tokens[:i]
                break
        if "vit" in tokens:
            commands.append(tokens[tokens.index("vit") + 1:])
    return commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """(page, arguments) of every `vit` command line in a code block of the README and docs."""
    return [(page, argv) for page, text in pages().items()
            for lang, body in code_blocks(text) if lang not in NOT_SHELL
            for argv in command_lines(body)]


def parse_error(argv: list[str]) -> str | None:
    """What the real parser says about `vit ARGV` when it refuses it, else None."""
    from vit.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            if exit_.code:
                return err.getvalue().strip().splitlines()[-1]
    return None


def test_discovery_finds_commands_and_recipes():
    assert {"train", "eval", "predict"} <= set(subcommands())
    assert "configs/digits.py" in recipes()
    assert len(documented_commands()) >= 30, "the extractor found too few command lines"


def test_docs_name_every_subcommand_and_recipe():
    text = "\n".join(pages().values())
    assert missing_from(text) == [], "README.md and docs/ do not mention these; document them"


def test_every_subcommand_has_an_example_that_parses():
    shown = {argv[0] for _, argv in documented_commands() if argv}
    assert sorted(set(subcommands()) - shown) == [], "give these commands an example in docs/"


def test_every_command_line_parses():
    refused = [f"{page}: vit {shlex.join(argv)}: {error}"
               for page, argv in documented_commands() if (error := parse_error(argv))]
    assert refused == [], "command lines the real parser refuses:\n" + "\n".join(refused)


def test_every_documented_recipe_override_is_a_key():
    """`vit train` lines load their recipe with their `--set`s: a key that does not exist, or a
    value of the wrong type, would be refused."""
    from vit.cli import build_parser
    from vit.commands.train import model_field_types
    from vit.recipes.load import load_config

    trains = [argv for _, argv in documented_commands()
              if argv[:1] == ["train"] and "--list-configs" not in argv]
    assert trains
    for argv in trains:
        args = build_parser().parse_args(argv)
        load_config(args.config, args.set, model_field_types=model_field_types)


def test_a_missing_name_is_caught():
    text = "\n".join(pages().values())
    # `vit explain-eval` must not count as `vit explain`, nor `vit evaluate` as `vit eval`.
    without_eval = re.sub(r"\bvit eval(?![\w-])", "vit evaluate", text)
    assert "vit eval" in missing_from(without_eval)
    without_digits = text.replace("configs/digits.py", "configs/digits.pyc")
    assert "configs/digits.py" in missing_from(without_digits)


def test_a_bad_command_line_is_caught():
    block = ("FOO=1 vit train --config configs/digits.py \\\n  --workdir w  # a comment\n"
             "srun -n 2 vit predict a.png --checkpoint c --top-k 3 | head -n 1\n"
             "./scripts/demo.sh\n")
    assert command_lines(block) == [
        ["train", "--config", "configs/digits.py", "--workdir", "w"],
        ["predict", "a.png", "--checkpoint", "c", "--top-k", "3"]]
    assert parse_error(["train", "--config", "configs/digits.py", "--workdir", "w"]) is None
    assert "--config" in parse_error(["train", "--workdir", "w"])
    assert "--no-such-flag" in parse_error(["predict", "a.png", "--checkpoint", "c",
                                            "--no-such-flag"])
    assert "invalid int" in parse_error(["predict", "a.png", "--checkpoint", "c",
                                         "--top-k", "abc"])


def test_readme_is_a_landing_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_readme_command_table_is_the_clis():
    """One row per subcommand, with the one line `vit --help` gives it."""
    from vit.cli import COMMANDS

    rows = dict(re.findall(r"^\| `vit ([\w-]+)` \| (.+?) \|$", README.read_text(), re.MULTILINE))
    assert rows == {name: help_text for name, (_, help_text) in COMMANDS.items()}


def test_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)", README.read_text()))
    assert {f"docs/{p.name}" for p in DOCS} <= linked


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", title).strip().lower().replace(" ", "-")
            for title in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_links_resolve():
    broken = []
    for page, text in pages().items():
        folder = (ROOT / page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (folder / path).resolve() if path else ROOT / page
            if not file.exists():
                broken.append(f"{page}: {target}: no such file")
            elif anchor and anchor not in anchors(file.read_text()):
                broken.append(f"{page}: {target}: no such heading")
    assert broken == []


def test_named_paths_exist():
    """Every repository path the docs name (`vit/...`, `scripts/...`, ...) is there."""
    pattern = re.compile(r"(?<![\w/.~-])((?:vit|scripts|configs|tests|docs|benchmarks)/[\w./-]*)")
    missing = []
    for page, text in pages().items():
        for path in set(pattern.findall(text)):
            path = path.rstrip(".")
            # The GPU check's results folder is made by a GPU run.
            if path.startswith("benchmarks/gpu") or any(c in path for c in "*<"):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{page}: {path}")
    assert sorted(missing) == []


def test_architecture_names_every_part_of_the_package():
    """The tree in docs/architecture.md lists each folder and top-level module of vit/."""
    tree = code_blocks((ROOT / "docs" / "architecture.md").read_text())[0][1]
    named = set(re.findall(r"^  ([\w]+/|[\w]+\.py)", tree, re.MULTILINE))
    present = {f"{p.name}/" for p in (ROOT / "vit").iterdir()
               if p.is_dir() and any(p.glob("*.py"))}
    present |= {p.name for p in (ROOT / "vit").glob("*.py")}
    assert named == present


def test_demo_result_is_stated_once():
    """Each host kind's demo record (demo.json, demo_amd_bf16.json, ...) is one README line."""
    paths = sorted((ROOT / "benchmarks" / "records").glob("demo*.json"))
    figures = [f"{100 * json.loads(p.read_text())['test_accuracy']:.1f}%" for p in paths]
    assert "demo.json" in [p.name for p in paths]
    for path, figure in zip(paths, figures, strict=True):
        found = {page: text.count(figure) for page, text in pages().items() if figure in text}
        assert found == {"README.md": figures.count(figure)}, (
            f"{path.name}'s {figure} should be in the README alone, once per record")
        assert pages()["README.md"].count(f"`benchmarks/records/{path.name}`") == 1, path.name


def test_no_history_wording():
    for page, text in pages().items():
        assert not re.search(r"\bissue \d+|\bsessions?\b", text, re.IGNORECASE), page
