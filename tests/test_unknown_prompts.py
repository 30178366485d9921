"""Prompts with words a text model was never trained on: the vocabulary and templates a prompt
dataset lists, the "no" that training teaches for prompts of no known word, the "no" by rule
for a question naming a thing by an unknown word, the one-line notice that names the words,
and the yes-rate `vit eval` reports."""

import json
import types
import warnings

import numpy as np
import pytest

import vit
from vit.data import prompt_words as pw
from vit.data import promptshapes as ps
from vit.data.sources import prompt_words_of
from vit.inference.prompts import checkpoint_prompt_words, encode_prompts, unknown_word_notices
from vit.inference.questions import question_figures


def _template_words(templates) -> set[str]:
    return {w for t in templates
            for w in t.replace("{c}", " ").replace("{s}", " ").replace("?", " ").split()}


def test_promptshapes_vocabulary_is_every_word_of_its_training_prompts():
    vocab = ps.vocabulary()
    expected = _template_words(ps.PAIR_TEMPLATES + ps.COLOUR_TEMPLATES + ps.SHAPE_TEMPLATES)
    expected |= set(ps.COLORS + ps.NEVER_COLORS + ps.SHAPES + ps.NEVER_SHAPES)
    assert vocab == expected
    d = ps.generate("train", 400, seed=3)
    for prompt, kind in zip(d.prompts, d.kinds, strict=True):
        if kind != "unknown":
            assert set(pw.words(prompt)) <= vocab, prompt
    # the evaluation-only wordings bring words of their own: they are not "seen"
    assert _template_words(ps.EVAL_TEMPLATES) - vocab


def test_training_asks_prompts_of_unknown_words_always_no():
    d = ps.generate("train")
    unknown = [(p, a) for p, a, k in zip(d.prompts, d.answers, d.kinds, strict=True)
               if k == "unknown"]
    assert len(unknown) >= 0.03 * d.num_examples
    assert all(a == 0 for _, a in unknown)
    assert all(pw.words(p) for p, _ in unknown)  # never the empty (null) prompt
    assert all(not set(pw.words(p)) & ps.vocabulary() for p, _ in unknown)
    assert len({p for p, _ in unknown}) > 0.5 * len(unknown)  # many different ones
    # and no prompt of the training set is one the evaluation asks
    eval_words = {w for p in pw.EVAL_PROMPTS for w in pw.words(p)}
    assert not eval_words & {w for p, _ in unknown for w in pw.words(p)}
    assert not eval_words & set(pw.TRAIN_WORDS)


def test_unknown_training_words_leave_every_evaluated_word_unseen():
    """The words that training answers "no" are none of a prompt dataset's words, none of the
    evaluation-only wordings' own ("do you see ...": "no" taught for "see" would be the wrong
    answer to a held-out wording) and none of the unknown prompts evaluation asks."""
    from vit.data.fashion_scenes import FashionScenesDataset

    train = set(pw.TRAIN_WORDS)
    asked = {w for p in pw.EVAL_PROMPTS for w in pw.words(p)}
    for dataset in (ps.PromptShapesDataset(), FashionScenesDataset()):
        wording = {w for t in dataset.all_templates() for w in pw.words(t)}
        assert not train & (wording | asked | dataset.vocabulary()), type(dataset).__name__


def test_evaluation_asks_unknown_prompts_of_every_image():
    grid = ps.grid_questions()
    asked = [q["prompt"] for q in grid if q["group"] == "unknown"]
    assert asked == list(pw.EVAL_PROMPTS) and len(asked) >= 8
    for prompt in asked:
        assert pw.knows_none(prompt, ps.vocabulary()), prompt
    data = ps.generate("test", 6, seed=0)
    source = ps.PromptShapesSource.__new__(ps.PromptShapesSource)
    source.data = data
    _, shares = source.question_grid()
    columns = [j for j, q in enumerate(grid) if q["group"] == "unknown"]
    assert (shares[:, columns] == "unknown").all()


def test_unknown_group_yes_rate():
    probs = np.array([[0.9, 0.2, 0.7, 0.1], [0.3, 0.6, 0.4, 0.2]])
    groups = ["seen", "unknown", "unknown", "never"]
    shares = np.array([["present", "unknown", "unknown", "never"]] * 2)
    figures = question_figures(probs, shares == "present", groups, shares)
    assert figures["unknown"] == {"questions": 2, "yes_rate": 0.5}  # 0.7 and 0.6 of 4
    assert figures["never"] == {"questions": 1, "yes_rate": 0.0}


def test_notices_name_the_unknown_words():
    words = prompt_words_of("promptshapes")
    assert unknown_word_notices(words, ["is there a red square?", "", "IS THERE A RED SQUARE"]) \
        == []
    (line,) = unknown_word_notices(words, ["Hello, world!"])
    assert "'hello'" in line and "'world'" in line and "no word seen in training" in line
    assert '"no"' in line and "\n" not in line
    (line,) = unknown_word_notices(words, ["is there a red dog?"])
    assert "'dog'" in line and "'red'" not in line and "no word seen" not in line
    assert '"no" by rule' in line
    (line,) = unknown_word_notices(words, ["is there a red square please?"])
    assert "'please'" in line and "rests on its other words" in line
    assert unknown_word_notices(None, ["hello"]) == []


@pytest.mark.parametrize("dataset", ["promptshapes", "fashion_scenes"])
def test_a_field_holding_a_never_seen_word_is_named_in_every_wording(dataset):
    """Every wording of the dataset, training and evaluation ones, with one field given a word
    no prompt used: that word is named; the same question with the word outside any field (a
    leading word) or with known words only names nothing."""
    import itertools

    words = prompt_words_of(dataset)
    source = {"promptshapes": ps.PromptShapesSource}.get(dataset)
    if source is None:
        from vit.data.fashion_scenes import FashionScenesSource as source
    values = {f: vs[0] for f, vs in source.dataset.field_words.items()}
    asked = 0
    for template, field in itertools.product(words.templates, values):
        if "{" + field + "}" not in template:
            continue
        filled = template.format(**{**values, field: "zorblax"})
        assert words.never_seen_named(filled) == ["zorblax"], filled
        known = template.format(**values)
        assert words.never_seen_named(known) == [], known
        assert words.never_seen_named(f"zorblax {known}") == [], known
        asked += 1
    assert asked >= len(words.templates)


def test_encode_prompts_warns_once_per_unknown_prompt():
    config = types.SimpleNamespace(text=vit.TextConfig(max_len=48))
    words = prompt_words_of("promptshapes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = encode_prompts(config, ["hello", "is there a red square?", "",
                                          "is there a belt?"], words=words)
    assert [str(w.message) for w in caught] == unknown_word_notices(
        words, ["hello", "is there a belt?"])
    assert prompts.text.shape == (4, 48)
    assert prompts.never_seen == (("hello",), (), (), ("belt",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = encode_prompts(config, ["hello", "is there a belt?"])  # nothing known: silent
    assert plain.ruled_no(1) == ()


def test_checkpoint_prompt_words_from_the_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "100").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"data": {"name": "promptshapes"}}))
    assert checkpoint_prompt_words(run).vocabulary == ps.vocabulary()
    assert checkpoint_prompt_words(run / "checkpoints" / "100") == checkpoint_prompt_words(run)
    other = tmp_path / "digits_run"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"data": {"name": "digits"}}))
    assert checkpoint_prompt_words(other) is None
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert checkpoint_prompt_words(hf) is None
    assert checkpoint_prompt_words(tmp_path / "missing") is None


@pytest.mark.parametrize("seed", [0, 1])
def test_unknown_prompt_never_uses_a_known_word(seed):
    rng = np.random.default_rng(seed)
    vocab = frozenset({"hello", "me", "cat"})
    for _ in range(200):
        prompt = pw.unknown_prompt(rng, vocab)
        assert 1 <= len(pw.words(prompt)) <= 4 and not set(pw.words(prompt)) & vocab


def test_points_inside_reads_the_strongest_patch_centre():
    from vit.explanations.text import points_inside

    maps = np.zeros((3, 4, 4))
    maps[0, 1, 2] = 1.0  # centre (24, 40) in a 64 px input: inside the right half's box
    maps[1, 0, 0] = 0.5  # centre (8, 8): outside
    maps[2, 3, 3] = 2.0  # centre (56, 56): on the box's exclusive end, so outside
    boxes = np.array([[16, 32, 48, 64], [16, 16, 48, 48], [28, 28, 56, 56]])
    assert points_inside(maps, boxes, 64).tolist() == [True, False, False]


@pytest.fixture(scope="module")
def promptshapes_run(tmp_path_factory):
    """A tiny text model saved inside a run folder whose config names promptshapes, and one
    image, as `vit predict --prompt` and `vit rollout --prompt` meet them."""
    from builders import tiny_text_model
    from PIL import Image

    from vit.checkpoints import save_orbax

    model = tiny_text_model(gates=0.5)
    run = tmp_path_factory.mktemp("run")
    (run / "config.json").write_text(json.dumps({"data": {"name": "promptshapes"}}))
    save_orbax(run / "checkpoints" / "5", model)
    pics = run / "pics"
    pics.mkdir()
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (32, 32, 3), np.uint8)).save(
        pics / "a.png")
    return run / "checkpoints" / "5", pics


@pytest.mark.parametrize("command", ["predict", "rollout"])
def test_cli_names_the_unknown_words_of_a_prompt(promptshapes_run, command, tmp_path, capsys):
    from vit.cli import main

    ckpt, pics = promptshapes_run
    extra = ["--out", str(tmp_path / "maps")] if command == "rollout" else []
    for prompt, unknown in [("hello xyzzy", "'hello', 'xyzzy'"), ("is there a red square?", None)]:
        assert main([command, str(pics), "--checkpoint", str(ckpt), "--prompt", prompt,
                     *extra]) == 0
        err = capsys.readouterr().err
        notices = [line for line in err.splitlines() if "seen in training" in line]
        if unknown is None:
            assert notices == [], err
        else:
            assert len(notices) == 1, err
            assert notices[0].startswith(f"vit {command}: warning: ")
            assert unknown in notices[0] and '"no" by rule' in notices[0]


def test_predict_answers_a_never_seen_noun_no_by_rule(promptshapes_run, capsys):
    from vit.cli import main

    ckpt, pics = promptshapes_run
    assert main(["predict", str(pics), "--checkpoint", str(ckpt), "--json",
                 "--prompt", "is there a belt?", "--prompt", "is there a red square?",
                 "--prompt", "hello xyzzy"]) == 0
    out, err = capsys.readouterr()
    belt, square, hello = json.loads(out.splitlines()[0])["prompts"]
    # a prompt with no word the model read: "no" by rule as well, every word named
    assert hello["prob"] == 0.0 and hello["never_seen"] == ["hello", "xyzzy"]
    assert belt["prob"] == 0.0 and belt["never_seen"] == ["belt"]
    assert 0.0 < belt["model_prob"] < 1.0  # the model's own answer, kept beside the rule's
    assert "never_seen" not in square and 0.0 < square["prob"] < 1.0
    assert "'belt', never seen in training" in err and '"no" by rule' in err
    assert main(["predict", str(pics), "--checkpoint", str(ckpt),
                 "--prompt", "is there a belt?"]) == 0
    assert "(no by rule: belt never seen)" in capsys.readouterr().out
