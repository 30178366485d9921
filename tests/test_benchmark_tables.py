"""The docs' figures are what `python -m benchmarks tables` makes from benchmarks/records/*.json:
a record written without regenerating the tables, a hand-edited figure, a record without a
table, or a measured figure written outside the generated tables fails here; so does a record
naming a path of the machine that made it, or a command no mode of the runner takes."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "records"
DOC = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside vit, not inside it

from benchmarks import common, tables  # noqa: E402
from benchmarks.__main__ import MODES  # noqa: E402


def record(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


@pytest.fixture
def tree(tmp_path):
    """A copy of the README, the docs and the records to edit."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(RECORDS, tmp_path / "benchmarks" / "records")
    return tmp_path


def test_the_docs_match_the_records():
    assert tables.stale(ROOT) == [], "run python -m benchmarks tables"


def test_the_check_command_passes():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "tables", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_record_has_one_table_that_names_it():
    assert tables.unshown(ROOT) == []
    shown = {}
    for doc in tables.docs(ROOT):
        for name, body in tables.blocks((ROOT / doc).read_text()).items():
            shown[name] = doc
            assert f"`benchmarks/records/{name}.json`" in body, f"{doc}: {name} names no record"
    assert set(shown) == {p.stem for p in RECORDS.glob("*.json")}


def test_every_record_is_dated_with_its_command_and_host():
    for path in RECORDS.glob("*.json"):
        r = json.loads(path.read_text())
        assert r["benchmark"] == path.stem, path.name
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["date_utc"]), path.name
        words = shlex.split(r["command"])
        assert words[:3] == ["python", "-m", "benchmarks"] and words[3] in MODES, path.name
        assert r["versions"]["jax"], path.name


def test_every_records_command_is_one_its_mode_takes(monkeypatch):
    """Each record's command parses with its mode's own options (stopped right after parsing,
    so nothing runs)."""
    import argparse
    import importlib

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for path in RECORDS.glob("*.json"):
        words = shlex.split(json.loads(path.read_text())["command"])
        with pytest.raises(Parsed):
            importlib.import_module(MODES[words[3]][0]).main(words[4:])


def test_no_record_or_page_names_a_path_of_the_machine_that_made_it():
    """Paths are relative to the repository (`common.relative` raises on any other), in the
    records and in the pages their commands are printed in."""
    for path in RECORDS.glob("*.json"):
        assert common.relative(json.loads(path.read_text())), path.name
    for doc in tables.docs(ROOT):
        text = (ROOT / doc).read_text()
        assert not re.search(r"(?<![\w.~])/(?:work|tmp|root|home)/", text), doc


def test_a_stale_figure_is_caught(tree):
    assert tables.stale(tree) == []

    # A figure edited by hand in a table.
    doc = tree / "docs" / "benchmarks.md"
    text = doc.read_text()
    speed = f"{record('inference')['img_s_median']['ours_float32']:.2f}"
    assert f"| vit, float32 | {speed} |" in text
    doc.write_text(text.replace(f"| vit, float32 | {speed} |", "| vit, float32 | 99.99 |"))
    assert tables.stale(tree) == ["docs/benchmarks.md"]
    doc.write_text(text)

    # A new record, tables not regenerated: its table and the targets it meets are stale.
    demo = record("demo")
    demo["seeds"][0]["test_accuracy"] = demo["test_accuracy"] = 0.5
    (tree / "benchmarks" / "records" / "demo.json").write_text(json.dumps(demo))
    assert tables.stale(tree) == ["README.md", "docs/results.md"]


def test_a_record_without_a_table_is_caught(tree):
    shutil.copy(RECORDS / "inference.json", tree / "benchmarks" / "records" / "inference2.json")
    stray = {**record("inference"), "command": "python scripts/bench_inference.py"}
    (tree / "benchmarks" / "records" / "stray.json").write_text(json.dumps(stray))
    problems = tables.unshown(tree)
    assert "benchmarks/records/inference2.json has no table in the docs" in problems, problems
    assert any("stray.json has no renderer" in p for p in problems), problems
    assert not any("inference2.json has no renderer" in p for p in problems), problems


def test_a_mode_renders_its_own_record(tree, monkeypatch):
    """A record that benchmarks/tables.py has no entry for is drawn by the `table` function of
    the mode named in its command, and needs one block like any other."""
    import types

    from benchmarks import __main__ as runner

    module = types.ModuleType("toy_mode")
    module.table = lambda r: [f"toy figure {r['value']}"]
    monkeypatch.setitem(sys.modules, "toy_mode", module)
    monkeypatch.setitem(runner.MODES, "toy", ("toy_mode", "a toy benchmark"))
    toy = {**record("inference"), "benchmark": "toy", "command": "python -m benchmarks toy",
           "value": 3}
    (tree / "benchmarks" / "records" / "toy.json").write_text(json.dumps(toy))
    assert [p for p in tables.unshown(tree) if "toy" in p] == [
        "benchmarks/records/toy.json has no table in the docs"]
    page = tree / "docs" / "benchmarks.md"
    page.write_text(page.read_text() + "\n<!-- table toy -->\n<!-- /table toy -->\n")
    assert tables.unshown(tree) == []
    assert "toy figure 3" in tables.regenerate(page.read_text(), tables.records(tree))


def figures(text: str) -> list[str]:
    return [m.group(0) for m in tables.FIGURE.finditer(text)]


def test_the_figure_rule():
    """What counts as a measured figure: a number with a unit of measure. Shapes, counts and
    plain numbers do not."""
    assert figures("ran 1.2x as fast, 5-6x XLA's, in 35 ms, 4 s, 6m00s, 2.64 GiB, 0.75 GB, "
                   "12% of it, 30 img/s, 3.5 images/s, 172 GFLOP/s") == [
        "1.2x", "5-6x", "35 ms", "4 s", "6m00s", "2.64 GiB", "0.75 GB", "12%", "30 img/s",
        "3.5 images/s", "172 GFLOP/s"]
    assert figures("8x8 digits on a 4x4 grid, 16,384 x 16,384 pixels, ViT-B/16, 785 tests, "
                   "0.978 accuracy, 2 cores, 360 images, v1.5, the 3 stages, sm_90") == []


def test_a_figure_outside_the_tables_is_caught(tree):
    assert tables.unbacked(tree) == []
    readme = tree / "README.md"
    text = readme.read_text()
    readme.write_text(text + "\nThe default set, 785 tests, in 6m00s; the step is 1.13x "
                             "faster.\n")
    found = tables.unbacked(tree)
    assert [f.split(": ", 1)[1] for f in found] == ["6m00s", "1.13x"], found
    assert all(f.startswith("README.md:") for f in found)
    # The same figures in a code block, inline code or a comment are not prose.
    readme.write_text(text + "\n```\nstep 1.13x\n```\n`6m00s` <!-- 1.13x -->\n")
    assert tables.unbacked(tree) == []


def test_the_check_command_fails_on_a_figure_outside_the_tables(tree):
    """`--check` on a copy of the tree with one hand-written figure exits 1, naming it."""
    shutil.copytree(ROOT / "benchmarks", tree / "benchmarks", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("records", "__pycache__", "gpu"))
    page = tree / "docs" / "predict.md"
    page.write_text(page.read_text() + "\nPredicting got 1.42x faster.\n")
    done = subprocess.run([sys.executable, "-m", "benchmarks", "tables", "--check"], cwd=tree,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "docs/predict.md" in done.stderr and "1.42x" in done.stderr, done.stderr


def test_the_targets_say_whether_each_record_meets_them(tree):
    """The results page's targets come from the records: a record that reaches a target turns
    its row from "not met" to "met" when the tables are made again."""
    page = tree / "docs" / "results.md"

    def row(text: str) -> str:
        rows = [x for x in text.splitlines() if x.startswith("| [`fashion_mnist`]")]
        assert len(rows) == 1, rows
        return rows[0]

    assert row(page.read_text()).endswith("| **not met** |")
    r = record("fashion_mnist")
    r["test_accuracy"], r["wall_s"] = 0.92, 850.0
    (tree / "benchmarks" / "records" / "fashion_mnist.json").write_text(json.dumps(r))
    made = tables.regenerate(page.read_text(), tables.records(tree), tables.placement(tree))
    assert row(made).endswith("| met |") and "0.920 test" in row(made), row(made)


def test_a_record_from_another_host_says_so():
    """A table's heading names its host; one whose CPU is not that of most records says it is
    another host, and one without its CPU says it was not recorded."""
    recs, where = tables.records(ROOT), tables.placement(ROOT)
    usual = tables.usual_cpu(recs)
    for name, r in recs.items():
        if getattr(tables.module_of(r), "INLINE", False):
            continue
        heading = tables.blocks((ROOT / where[name]).read_text())[name].splitlines()[0]
        if tables.cpu_name(r) is None:
            assert "not recorded" in heading, name
        elif tables.cpu_name(r) != usual:
            assert f"another host than the {usual} of the other records" in heading, name
        else:
            assert "another host" not in heading, name


def test_figures_are_the_records():
    """Cells read from the docs by pattern equal the records' own values."""
    readme, doc = (ROOT / "README.md").read_text(), DOC.read_text()

    demo = record("demo")
    n = demo["num_test_examples"]
    seeds = demo["seeds"]
    assert seeds[0] == {"seed": 0, "test_accuracy": demo["test_accuracy"],
                        "train_seconds": demo["train_seconds"]}
    low = min(s["test_accuracy"] for s in seeds)
    assert f"**{100 * low:.1f}% test accuracy or more** over seeds" in readme
    counts = [str(round(s["test_accuracy"] * n)) for s in seeds]
    assert f"({', '.join(counts[:-1])} and {counts[-1]} of {n} held-out digits)" in readme

    inference = record("inference")
    assert (f"| vit, float32 | {inference['img_s_median']['ours_float32']:.2f} | "
            f"{inference['ratio_to_transformers_median']['ours_float32']:.2f} |") in doc
    cpu = inference["machine"]["cpu"]["model_name"]
    assert re.search(rf"^\*\*{re.escape(cpu)}.*{inference['date_utc'][:10]}(: .*)?\*\*$",
                     doc, re.MULTILINE)

    faith = {(r["metric"], r["substrate"], r["steps"]): r["results"]
             for r in record("faithfulness")["runs"]}
    rollout = faith[("deletion", "mean", 16)]["rollout"]
    assert re.search(rf"^\| rollout \| {rollout['auc']:.3f} \[", doc, re.MULTILINE)

    memory = record("explain_memory")["results"]["rollout"]["compiled"]
    assert "| `rollout` | " + " | ".join(f"{c['total_gb']:.2f}" for c in memory) + " |" in doc

    results = (ROOT / "docs" / "results.md").read_text()
    prompts = record("promptshapes")["eval"]
    assert f"| {prompts['heldout_accuracy']:.3f} |" in results
    heldout = prompts["questions"]["heldout"]
    assert f"| the 4 held-out pairs | {heldout['balanced_accuracy']:.3f} |" in results

    unknown = prompts["questions"]["unknown"]
    assert (f"| prompts of unknown words ({unknown['questions']}): yes-rate | "
            f"{unknown['yes_rate']:.3f} |") in results


def text_page() -> str:
    return (ROOT / "docs" / "text.md").read_text()


def test_the_text_records_tables():
    """fashion_scenes' groups and pointing, and the ablations' rows, read back by pattern."""
    page = text_page()
    fashion = record("fashion_scenes")
    questions = fashion["eval"]["questions"]
    for group in ("seen", "heldout", "wording"):
        g = questions[group]
        assert (f"| {group} ({g['questions']}) | {g['balanced_accuracy']:.3f} | at least "
                f"0.9") in page, group
        for kind, k in g["by_kind"].items():
            assert f"| {group}: {kind} ({k['questions']}) | {k['balanced_accuracy']:.3f} |" in page
    for key, p in fashion["pointing"].items():
        assert f"{p['inside']} of {p['scenes']} ({p['inside'] / p['scenes']:.3f})" in page, key
    assert f"{fashion['stages']['vit']['last_validation']['label_accuracy']:.3f}" in page

    from benchmarks.text import RECIPE, VARIANTS

    recipe = record("promptshapes")["eval"]["questions"]
    ablation = record("promptshapes_ablation")["variants"]
    assert list(ablation) == list(VARIANTS)
    rows = [(RECIPE, recipe, "the recipe, `promptshapes.json`")]
    rows += [(v, v["eval"]["questions"], f"`{name}`") for name, v in ablation.items()]
    cells = {(r["labels"], r["readout"], r["cross_attention"], r["tune"], r["head"])
             for r, _, _ in rows}
    assert len(cells) == len(rows)  # each row changes something
    for run, q, where in rows:
        held = q["heldout"]
        assert (f"| {run['labels']} | {run['readout']} | {run['cross_attention']} | "
                f"{run['tune']} | {run['head']} | "
                f"{held['balanced_accuracy']:.3f} | {held['auc']:.3f} | "
                f"{held['false_yes']['both_apart']:.3f} |") in page, where
        assert f"| {q['unknown']['yes_rate']:.3f} | {where} |" in page, where

    from benchmarks.text import FASHION_RECIPE, FASHION_VARIANTS

    recipe = record("fashion_scenes")["eval"]["questions"]
    ablation = record("fashion_scenes_ablation")["variants"]
    assert list(ablation) == list(FASHION_VARIANTS)
    fashion_seconds = record("fashion_scenes")["train_seconds"]
    rows = [({**FASHION_RECIPE, "train_seconds": fashion_seconds, "init": None}, recipe,
             "the recipe, `fashion_scenes.json`")]
    rows += [(v, v["eval"]["questions"], f"`{name}`") for name, v in ablation.items()]
    cells = {(r["vit_stage"], r["head"], r["scene_jitter"], r["tune"]) for r, _, _ in rows}
    assert len(cells) == len(rows)  # each row changes something
    for run, q, where in rows:
        s = q["seen"]
        assert (f"| {run['vit_stage']} | {run['head']} | {run['scene_jitter']} | {run['tune']} | "
                f"{s['balanced_accuracy']:.3f} | "
                f"{s['by_kind']['both']['balanced_accuracy']:.3f} | "
                f"{s['false_yes']['one_only']:.3f} |") in page, where
        # the seconds of all three stages, or of the text stages for a row started from --init
        seconds = f"{round(run['train_seconds'])}" + (" (text stages)" if run["init"] else "")
        assert f"| {q['never']['yes_rate']:.3f} | {seconds} | {where} |" in page, where


def test_a_compared_record_refreshes_the_table_that_shows_it(tree):
    """The ablation's table is the ablation record's, with a row read from the recipe's record:
    a new recipe record makes both that table and the recipe's own stale."""
    recipe = record("promptshapes")
    recipe["eval"]["questions"]["heldout"]["auc"] = 0.4321
    (tree / "benchmarks" / "records" / "promptshapes.json").write_text(json.dumps(recipe))
    assert tables.stale(tree) == ["docs/results.md", "docs/text.md"]
    page = tables.regenerate((tree / "docs" / "text.md").read_text(), tables.records(tree))
    ablation = tables.blocks(page)["promptshapes_ablation"]
    assert re.search(r"^\| colours and shapes apart \| per patch \| closed \| "
                     r"blocks 2-3, 100 steps \| things \| [\d.]+ \| 0\.432 \|", ablation,
                     re.MULTILINE)


def test_the_text_records_commands_remake_them():
    """Each text record's `command` is the text mode naming that record, and the recipe its
    evaluations ran on; an ablation record holds every variant the mode trains, a seeds
    record every seed."""
    import shlex

    from benchmarks import text

    seen = 0
    for path in RECORDS.glob("*.json"):
        r = json.loads(path.read_text())
        words = shlex.split(r["command"])
        if words[3:4] != ["text"]:
            continue
        seen += 1
        args = text.parser().parse_args(words[4:])
        recipe = text.recipe_path(args.config).stem
        named = (f"{recipe}_ablation" if args.ablation else
                 f"{recipe}_seeds" if args.seeds > 1 else recipe)
        assert (args.record or named) == path.stem
        runs = (r["variants"] if args.ablation else r["seeds"] if args.seeds > 1 else
                {path.stem: r})
        if args.seeds > 1:
            assert list(runs) == [str(s) for s in range(args.seeds)], path.name
        if args.ablation:
            assert list(runs) == list(text.ABLATIONS[recipe][1]), path.name
        for run in runs.values():
            assert run["eval"]["data"] == recipe, path.name
    assert seen >= 3


def test_a_seeds_record_counts_the_seeds_that_meet_each_target():
    """`benchmarks text --seeds`: one row a seed, and each target that some seed misses named
    with how many of them meet it (the time target left out when only the text stages ran)."""
    import copy

    from benchmarks import text

    run = record("promptshapes")
    missed = copy.deepcopy(run)
    missed["eval"]["questions"]["unknown"]["yes_rate"] = 0.09
    missed["eval"]["questions"]["heldout"]["false_yes"]["both_apart"] = 0.2
    missed["train_seconds"] = 900.0
    seeds = {"recipe": "promptshapes", "init": None, "sets": [], "seeds": {"0": run, "1": missed}}
    lines = text.table(seeds)
    rows = [line for line in lines if line.startswith(("| 0 |", "| 1 |"))]
    assert len(rows) == 2 and "| 0.090 |" in rows[1] and "| 0.200 |" in rows[1]
    summary = lines[-1]
    assert "prompts of unknown words: yes-rate at most 0.05 (1 of 2)" in summary
    assert "hard negatives at most 0.10 (1 of 2)" in summary
    assert "within 10 minutes (1 of 2)" in summary
    assert text.targets(seeds) == []
    from_init = {**seeds, "init": "runs/x/stages/vit"}
    assert "within 10 minutes" not in text.table(from_init)[-1]
    assert "`runs/x/stages/vit`" in text.table(from_init)[0]
