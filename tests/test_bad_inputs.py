"""Every `vit` command answers a plain mistake the same way: exit code 2, a last stderr line
`vit <command>: error: ...` that names the input, no traceback, and nothing left behind.

One table, run in-process on tiny fixtures built once per module. Each row gives the command
line (with {placeholders} for the fixtures and for the row's own scratch folder, which is also
the working directory) and a piece of the input that the error line must name.
"""

import dataclasses
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from flax import nnx
from PIL import Image

import vit
from vit.cli import build_parser, main
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).parent.parent
RECIPE = str(ROOT / "configs" / "digits.py")


@pytest.fixture(scope="module")
def fx(tmp_path_factory, tiny_files):
    """Copies of the tiny checkpoint (an orbax export, a Hugging Face folder, a workdir), a text
    model, an image, and broken copies of them, all in one folder the table may not change."""
    from vit.checkpoints import save_orbax

    root = tmp_path_factory.mktemp("fixtures")
    shutil.copytree(tiny_files["orbax"], root / "ckpt")
    # A text model (answers prompts) of the same size, for datasets without prompts.
    text_model = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4,
                                  patch_size=4, image_size=8, num_classes=10, attention_impl="xla",
                                  text=vit.TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64,
                                                      max_len=16), rngs=nnx.Rngs(0))
    save_orbax(root / "text_ckpt", text_model, preprocessing=Preprocessing(size=(8, 8)))

    workdir = root / "workdir"  # what `vit train` leaves: config.json and checkpoints/<step>
    shutil.copytree(tiny_files["workdir"], workdir)
    bad_config = root / "workdir_bad_config"
    shutil.copytree(workdir, bad_config)
    (bad_config / "config.json").write_text('{"data": {"name": "digits",')
    bad_best = root / "workdir_bad_best"
    shutil.copytree(workdir, bad_best)
    (bad_best / "checkpoints" / "best.json").write_text('{"step": ')

    shutil.copytree(tiny_files["hf"], root / "hf")
    for name, file in [("hf_bad_config", "config.json"),
                       ("hf_bad_preprocessor", "preprocessor_config.json")]:
        shutil.copytree(root / "hf", root / name)
        (root / name / file).write_text('{"image_size": 8,')
    sharded = root / "hf_bad_index"  # a sharded folder whose index is cut short
    sharded.mkdir()
    shutil.copy(root / "hf" / "config.json", sharded)
    (sharded / "model.safetensors.index.json").write_text('{"weight_map": {"vit.')

    weights = (root / "hf" / "model.safetensors").read_bytes()
    (root / "truncated.safetensors").write_bytes(weights[:len(weights) - 64])
    # A header length of 2**40 bytes in a 100-byte file: must be refused, never allocated.
    (root / "huge_header.safetensors").write_bytes(
        struct.pack("<Q", 2**40) + b'{"a": ' + os.urandom(86))

    Image.new("RGB", (8, 8), (10, 200, 30)).save(root / "img.png")
    (root / "broken.png").write_bytes(b"not a png")
    (root / "empty.jpg").write_bytes(b"")
    (root / "one_class" / "cat").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(root / "one_class" / "cat" / f"{i}.png")
    (root / "no_images").mkdir()
    (root / "no_images" / "notes.txt").write_text("no pictures here")
    (root / "raises.py").write_text("def get_config():\n    return undefined_name\n")
    (root / "syntax.py").write_text("def get_config(:\n")
    (root / "pytorch_model.bin").write_bytes(b"\x80\x02pickle")
    return root


@dataclasses.dataclass
class Case:
    id: str
    argv: str  # split on spaces after formatting; placeholders as in `_placeholders`
    names: str  # the input the error line must name (formatted too)
    forbid: str | None = None  # a misleading hint the line must not give


def _placeholders(fx: Path, tmp: Path) -> dict:
    return {"ckpt": fx / "ckpt", "wd": fx / "workdir", "img": fx / "img.png", "fx": fx,
            "recipe": RECIPE, "stages": ROOT / "configs" / "promptshapes.py", "tmp": tmp,
            "file": tmp / "existing.txt", "blocked": tmp / "existing.txt" / "sub",
            "out": tmp / "out"}


CASES = [
    # --- info: model fields that would divide by zero or build nothing ---
    Case("info-unknown-model", "info vit_b61", "vit_b61"),
    Case("info-num-heads-0", "info vit_b16 --set num_heads=0", "num_heads=0"),
    Case("info-patch-size-0", "info vit_b16 --set patch_size=0", "patch_size"),
    Case("info-image-size-0", "info vit_b16 --image-size 0", "--image-size 0"),
    Case("info-image-not-multiple-of-patch", "info vit_b16 --image-size 225", "(225, 225)"),
    Case("info-image-smaller-than-patch", "info vit_b16 --set image_size=8", "image_size"),
    Case("info-width-0", "info vit_b16 --set width=0", "width=0"),
    Case("info-mlp-dim-0", "info vit_b16 --set mlp_dim=0", "mlp_dim=0"),
    Case("info-in-channels-0", "info vit_b16 --set in_channels=0", "in_channels=0"),
    Case("info-depth-0", "info vit_b16 --set depth=0", "depth=0"),
    Case("info-num-classes-negative", "info vit_b16 --num-classes -1", "num_classes=-1"),
    Case("info-dropout-above-1", "info vit_b16 --set dropout=1.5", "dropout=1.5"),
    Case("info-text-field-wrong-type", "info vit_b16 --set text={{'width':'wide'}}",
         "text.width='wide'"),
    Case("info-set-without-equals", "info vit_b16 --set depth", "depth"),
    Case("info-set-wrong-type", "info vit_b16 --set depth=deep", "depth=deep"),
    # --- predict ---
    Case("predict-only-missing-files",  # refused before the (also missing) model is read
         "predict {tmp}/nope1.png {tmp}/nope2.png --checkpoint {tmp}/no_model", "nope1.png"),
    Case("predict-empty-folder", "predict {fx}/no_images --checkpoint {ckpt}", "no_images"),
    Case("predict-batch-size-0", "predict {img} --checkpoint {ckpt} --batch-size 0",
         "--batch-size"),
    Case("predict-image-size-0", "predict {img} --checkpoint {ckpt} --image-size 0",
         "--image-size 0"),
    Case("predict-image-size-not-multiple", "predict {img} --checkpoint {ckpt} --image-size 30",
         "(30, 30)"),
    Case("predict-set-num-heads-0", "predict {img} --checkpoint {ckpt} --set num_heads=0",
         "num_heads=0"),
    Case("predict-missing-checkpoint", "predict {img} --checkpoint {tmp}/no_model", "no_model"),
    Case("predict-mistyped-relative-path", "predict {img} --checkpoint runs/dmeo", "runs/dmeo",
         forbid="hf download"),
    Case("predict-pickled-checkpoint", "predict {img} --checkpoint {fx}/pytorch_model.bin",
         "pytorch_model.bin"),
    Case("predict-labels-file-missing",
         "predict {img} --checkpoint {ckpt} --labels {tmp}/labels.txt", "labels.txt"),
    Case("predict-hf-config-malformed", "predict {img} --checkpoint {fx}/hf_bad_config",
         "config.json"),
    Case("predict-hf-preprocessor-malformed",
         "predict {img} --checkpoint {fx}/hf_bad_preprocessor", "preprocessor_config.json"),
    Case("predict-sharded-index-malformed", "predict {img} --checkpoint {fx}/hf_bad_index",
         "model.safetensors.index.json"),
    Case("predict-safetensors-truncated",
         "predict {img} --checkpoint {fx}/truncated.safetensors", "truncated.safetensors"),
    Case("predict-safetensors-absurd-header",
         "predict {img} --checkpoint {fx}/huge_header.safetensors", "huge_header.safetensors"),
    Case("predict-workdir-best-json-malformed",
         "predict {img} --checkpoint {fx}/workdir_bad_best", "best.json"),
    Case("predict-only-unreadable-files",  # each is reported, then one error line, exit 2
         "predict {fx}/broken.png {fx}/empty.jpg --checkpoint {ckpt}", "broken.png and 1 more"),
    # --- convert ---
    Case("convert-dst-is-existing-file", "convert {ckpt} {file} --format npz", "existing.txt"),
    Case("convert-dst-unwritable", "convert {ckpt} {blocked}.npz", "existing.txt"),
    Case("convert-dst-unwritable-folder", "convert {ckpt} {blocked} --format hf",
         "existing.txt"),
    Case("convert-no-format", "convert {ckpt} {out}", "out"),
    Case("convert-npz-name-for-a-folder-format", "convert {ckpt} {out}.npz --format hf",
         "out.npz: the name says npz"),
    Case("convert-image-size-0", "convert {ckpt} {out} --format orbax --image-size 0",
         "image_size"),
    Case("convert-src-config-malformed", "convert {fx}/hf_bad_config {out} --format orbax",
         "config.json"),
    Case("convert-src-truncated", "convert {fx}/truncated.safetensors {out} --format orbax",
         "truncated.safetensors"),
    # --- train: the workdir is checked, and the recipe's counts, before anything is made ---
    Case("train-workdir-is-file",  # checked first: the (missing) --init is never read
         "train --config {recipe} --workdir {file} --init {tmp}/no_model", "existing.txt"),
    Case("train-workdir-unwritable", "train --config {recipe} --workdir {blocked}",
         "existing.txt"),
    Case("train-missing-recipe", "train --config {tmp}/nope.py --workdir {out}", "nope.py"),
    Case("train-recipe-raises", "train --config {fx}/raises.py --workdir {out}", "raises.py"),
    Case("train-recipe-syntax-error", "train --config {fx}/syntax.py --workdir {out}",
         "syntax.py"),
    Case("train-unknown-key", "train --config {recipe} --workdir {out} --set train.stpes=5",
         "train.stpes"),
    Case("train-batch-size-0",
         "train --config {recipe} --workdir {out} --set train.batch_size=0", "batch_size=0"),
    Case("train-accum-steps-0",
         "train --config {recipe} --workdir {out} --set train.accum_steps=0", "accum_steps=0"),
    Case("train-log-every-0",
         "train --config {recipe} --workdir {out} --set train.log_every=0", "log_every=0"),
    Case("train-eval-every-negative",
         "train --config {recipe} --workdir {out} --set train.eval_every=-5", "eval_every=-5"),
    Case("train-stage-steps-0", "train --config {stages} --workdir {out} "
         "--set stages.text.train.steps=0", "stages.text.train.steps=0"),
    Case("train-batch-not-divisible-by-accum",
         "train --config {recipe} --workdir {out} --set train.batch_size=10 "
         "--set train.accum_steps=3", "accum_steps=3"),
    Case("train-num-heads-0",  # found after the workdir is made: it is removed again
         "train --config {recipe} --workdir {out}/nested/run --set model.num_heads=0",
         "num_heads=0"),
    Case("train-num-heads-0-existing-workdir",  # the user's folder stays, config.json goes
         "train --config {recipe} --workdir {tmp}/runs/demo --set model.num_heads=0",
         "num_heads=0"),
    Case("train-patch-size-0",
         "train --config {recipe} --workdir {out} --set model.patch_size=0", "patch_size"),
    Case("train-image-size-0",
         "train --config {recipe} --workdir {out} --set input.image_size=0", "image_size"),
    Case("train-image-not-multiple-of-patch",
         "train --config {recipe} --workdir {out} --set input.image_size=7", "(7, 7)"),
    Case("train-init-image-not-multiple-of-patch",
         "train --config {recipe} --workdir {out} --init {ckpt} --set input.image_size=6",
         "with input.image_size=6: image_size (6, 6)"),
    Case("train-crop-pct-0",
         "train --config {recipe} --workdir {out} --set input.crop_pct=0", "crop_pct=0"),
    Case("train-std-0",  # would train on infinities until the loss is NaN
         "train --config {recipe} --workdir {out} --set input.std=0,0,0", "std=[0.0, 0.0, 0.0]"),
    Case("train-mean-of-two-channels",
         "train --config {recipe} --workdir {out} --set input.mean=0.5,0.5", "mean=[0.5, 0.5]"),
    Case("train-negative-lr", "train --config {recipe} --workdir {out} --set optim.lr=-1",
         "optim.lr=-1"),
    Case("train-label-smoothing-above-1",
         "train --config {recipe} --workdir {out} --set input.label_smoothing=2.0",
         "input.label_smoothing=2.0"),
    Case("train-stage-negative-lr", "train --config {stages} --workdir {out} "
         "--set stages.text.optim.lr=-0.1", "stages.text.optim.lr=-0.1"),
    Case("train-one-class-folder",  # found after the workdir is made: it is removed again
         "train --config {recipe} --workdir {out} --set data.name={fx}/one_class", "one class"),
    Case("train-init-missing", "train --config {recipe} --workdir {out} --init {tmp}/no_model",
         "no_model"),
    Case("train-unknown-dataset",
         "train --config {recipe} --workdir {out} --set data.name={tmp}/no_data", "no_data"),
    # --- eval: the output folder is checked before the evaluation ---
    Case("eval-batch-size-0",
         "eval --checkpoint {ckpt} --data digits --batch-size 0 --out {out}", "--batch-size"),
    Case("eval-out-is-file",  # checked first: the (missing) model is never read
         "eval --checkpoint {tmp}/no_model --data digits --out {file}", "existing.txt"),
    Case("eval-out-unwritable", "eval --checkpoint {ckpt} --data digits --out {blocked}",
         "existing.txt"),
    Case("eval-workdir-out-is-file", "eval --workdir {wd} --out {file}", "existing.txt"),
    Case("eval-checkpoint-without-data", "eval --checkpoint {ckpt}", "--data"),
    Case("eval-unknown-split", "eval --checkpoint {ckpt} --data digits --split tset --out {out}",
         "tset"),
    Case("eval-not-a-workdir", "eval --workdir {tmp}", "{tmp}"),
    Case("eval-workdir-config-malformed", "eval --workdir {fx}/workdir_bad_config --out {out}",
         "config.json"),
    Case("eval-workdir-best-json-malformed", "eval --workdir {fx}/workdir_bad_best --out {out}",
         "best.json"),
    Case("eval-mistyped-dataset", "eval --checkpoint {ckpt} --data digitz --out {out}",
         "'digitz' is not built in", forbid="tfds build"),
    Case("eval-dataset-is-a-file", "eval --checkpoint {ckpt} --data {img} --out {out}",
         "{img}: is a file"),
    Case("eval-text-model-on-data-without-prompts",
         "eval --checkpoint {fx}/text_ckpt --data digits --out {out}", "digits"),
    # --- rollout ---
    Case("rollout-out-is-file",  # checked first: the (missing) model is never read
         "rollout {img} --checkpoint {tmp}/no_model --out {file}", "existing.txt"),
    Case("rollout-out-unwritable", "rollout {img} --checkpoint {ckpt} --out {blocked}",
         "existing.txt"),
    Case("rollout-limit-0", "rollout --checkpoint {ckpt} --data digits --limit 0 --out {out}",
         "--limit 0"),
    Case("rollout-limit-negative",
         "rollout --checkpoint {ckpt} --data digits --limit -2 --out {out}", "--limit -2"),
    Case("rollout-batch-size-0", "rollout {img} --checkpoint {ckpt} --batch-size 0 --out {out}",
         "--batch-size 0"),
    Case("rollout-image-size-0", "rollout {img} --checkpoint {ckpt} --image-size 0 --out {out}",
         "--image-size 0"),
    Case("rollout-only-missing-files",
         "rollout {tmp}/nope.png --checkpoint {tmp}/no_model --out {out}", "nope.png"),
    Case("rollout-only-unreadable-files", "rollout {fx}/broken.png --checkpoint {ckpt} "
         "--out {out}", "broken.png"),
    Case("rollout-folder-without-images",
         "rollout {fx}/no_images --checkpoint {ckpt} --out {out}", "no_images"),
    Case("rollout-nothing-to-explain", "rollout --checkpoint {ckpt} --out {out}", "--data"),
    Case("rollout-class-out-of-range", "rollout {img} --checkpoint {ckpt} --class 10 --out {out}",
         "--class 10"),
    Case("rollout-unknown-colormap", "rollout {img} --checkpoint {ckpt} --cmap jte --out {out}",
         "jte"),
    Case("rollout-unknown-split",
         "rollout --checkpoint {ckpt} --data digits --split tset --out {out}", "tset"),
    Case("rollout-malformed-checkpoint",
         "rollout {img} --checkpoint {fx}/hf_bad_config --out {out}", "config.json"),
    # --- explain-eval ---
    Case("explain-eval-batch-size-0",
         "explain-eval --checkpoint {ckpt} --data digits --limit 2 --batch-size 0",
         "--batch-size 0"),
    Case("explain-eval-limit-0", "explain-eval --checkpoint {ckpt} --data digits --limit 0",
         "--limit 0"),
    Case("explain-eval-steps-0",
         "explain-eval --checkpoint {ckpt} --data digits --limit 2 --steps 0", "--steps 0"),
    Case("explain-eval-more-steps-than-patches",  # the fixture model sees 2x2 patches
         "explain-eval --checkpoint {ckpt} --data digits --limit 2 --steps 5", "--steps 5"),
    Case("explain-eval-discard-ratio-1",
         "explain-eval --checkpoint {ckpt} --data digits --limit 2 --discard-ratio 1",
         "--discard-ratio"),
    Case("explain-eval-unknown-split",
         "explain-eval --checkpoint {ckpt} --data digits --split tset", "tset"),
    Case("explain-eval-missing-checkpoint",
         "explain-eval --checkpoint {tmp}/no_model --data digits --limit 2", "no_model"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, fx, tmp_path, monkeypatch,
                                                          run_vit, file_tree):
    command = case.argv.split()[0]
    monkeypatch.chdir(tmp_path)  # relative outputs (runs/rollout, eval_test) would land here
    (tmp_path / "existing.txt").write_text("keep me\n")
    (tmp_path / "runs" / "demo").mkdir(parents=True)  # for the mistyped `runs/dmeo`
    values = _placeholders(fx, tmp_path)
    argv = [part.format(**values) for part in case.argv.split()]
    before_fx, before_tmp = file_tree(fx), file_tree(tmp_path)

    code, err = run_vit(argv)

    assert code == 2, err
    assert err, "no error line"
    assert not any("Traceback" in line for line in err), err
    last = err[-1]
    assert last.startswith(f"vit {command}: error:"), last
    assert case.names.format(**values) in last, last
    if case.forbid:
        assert case.forbid not in last, last
    assert file_tree(tmp_path) == before_tmp, "partial output left behind"
    assert file_tree(fx) == before_fx, "a fixture was changed"


@pytest.mark.parametrize("argv", [
    "train --config {recipe} --workdir {ro}/run",
    "eval --checkpoint {ckpt} --data digits --out {ro}/eval",
    "rollout {img} --checkpoint {ckpt} --out {ro}/maps",
    "convert {ckpt} {ro}/m.npz",
], ids=["train", "eval", "rollout", "convert"])
def test_read_only_output_folder_is_refused(argv, fx, tmp_path, monkeypatch, run_vit):
    ro = tmp_path / "read_only"
    ro.mkdir()
    ro.chmod(0o555)
    # Root may write anywhere, so the permission is also denied where the commands ask.
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if Path(path) == ro and mode & os.W_OK else access(path, mode, **kw)))
    monkeypatch.chdir(tmp_path)
    try:
        code, err = run_vit([p.format(**_placeholders(fx, tmp_path), ro=ro)
                             for p in argv.split()])
    finally:
        ro.chmod(0o755)
    assert code == 2 and err[-1].startswith(f"vit {argv.split()[0]}: error:"), err
    assert "read_only" in err[-1] and not list(ro.iterdir())


@pytest.mark.parametrize("flags", [["--method", "attention", "--method", "relevancy"],
                                   ["--method", "attention", "relevancy"],
                                   ["--method", "attention", "--method", "relevancy",
                                    "--method", "attention"]])
def test_repeated_method_flags_accumulate(flags):
    args = build_parser().parse_args(["explain-eval", "--checkpoint", "c", "--data", "d",
                                      *flags])
    assert list(dict.fromkeys(args.method)) == ["attention", "relevancy"]
    default = build_parser().parse_args(["explain-eval", "--checkpoint", "c", "--data", "d"])
    assert default.method is None  # the default (rollout, relevancy) is filled in by run


def test_explain_eval_scores_every_repeated_method(fx, monkeypatch, capsys):
    from vit.explanations import faithfulness

    asked = []

    def fake_evaluate(model, arrays, methods, **kwargs):  # the scoring itself is tested elsewhere
        asked.extend(methods)
        return {"results": {}}

    monkeypatch.setattr(faithfulness, "evaluate", fake_evaluate)
    code = main(["explain-eval", "--checkpoint", str(fx / "ckpt"), "--data", "digits",
                 "--limit", "2", "--method", "attention", "--method", "rollout", "relevancy",
                 "--json"])
    assert code == 0, capsys.readouterr().err
    assert asked == ["attention", "rollout", "relevancy"]


def test_an_os_error_about_a_file_is_one_line(monkeypatch, run_vit):
    """What no check made in advance can rule out (a disk that fills, permissions that change
    mid-run) is still one line naming the file, not a traceback."""
    from vit.commands import info

    def refused(args):
        raise PermissionError(13, "Permission denied", "/somewhere/model.npz")

    monkeypatch.setattr(info, "run", refused)
    code, err = run_vit(["info", "vit_b16"])
    assert code == 2 and err == ["vit info: error: /somewhere/model.npz: Permission denied"]


def test_every_command_is_in_the_table():
    from vit.cli import COMMANDS

    assert {c.argv.split()[0] for c in CASES} == set(COMMANDS)


def test_fixtures_work_when_used_right(fx, tmp_path, capsys):
    """The table's refusals mean something only if the same fixtures work when used right."""
    code = main(["predict", str(fx / "img.png"), "--checkpoint", str(fx / "ckpt"), "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.splitlines()[0])["top_k"]
    assert main(["info", "vit_b16", "--set", "num_heads=4", "--image-size", "224"]) == 0


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("argv", [
    "train --config {recipe} --workdir /proc/vit-test/run",
    "eval --checkpoint {ckpt} --data digits --out /proc/vit-test/eval",
    "rollout {img} --checkpoint {ckpt} --out /proc/vit-test/maps",
], ids=["train", "eval", "rollout"])
def test_a_folder_that_takes_no_new_folders_is_refused_before_the_work(argv, fx, tmp_path,
                                                                       monkeypatch, run_vit):
    """/proc passes `os.access` for root but takes no new folders: refused up front, naming
    the flag's path, rather than after the evaluation or the maps."""
    import vit.checkpoints

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output folder was checked")

    monkeypatch.setattr(vit.checkpoints, "load_checkpoint", no_model)
    monkeypatch.chdir(tmp_path)
    code, err = run_vit([p.format(**_placeholders(fx, tmp_path)) for p in argv.split()])
    assert code == 2 and err[-1].startswith(f"vit {argv.split()[0]}: error:"), err
    flag = "--workdir" if argv.startswith("train") else "--out"
    assert f"{flag} /proc/vit-test" in err[-1] and "Traceback" not in "\n".join(err), err


def test_rollout_gallery_takes_a_file_name_that_is_not_utf8(fx, tmp_path, capsys):
    """A file name in another encoding (bytes that are not UTF-8) is drawn, and named in the
    gallery with "?" for the byte, not a crash with half the output written."""
    images = tmp_path / "images"
    images.mkdir()
    (images / os.fsdecode(b"caf\xe9.png")).write_bytes((fx / "img.png").read_bytes())
    code = main(["rollout", str(images), "--checkpoint", str(fx / "ckpt"), "--out",
                 str(tmp_path / "maps"), "--html"])
    assert code == 0, capsys.readouterr().err
    page = (tmp_path / "maps" / "index.html").read_text(encoding="utf-8")
    assert "caf?.png" in page
    assert len(list((tmp_path / "maps" / "overlays").iterdir())) == 1


def test_rollout_that_fails_part_way_leaves_nothing(fx, tmp_path, monkeypatch, run_vit):
    """A write that fails after maps exist (here the gallery: a full disk) takes the new output
    folder away again and is one line naming the file."""
    from vit.explanations import render

    def disk_full(out, *args, **kwargs):
        raise OSError(28, "No space left on device", str(out / "index.html"))

    monkeypatch.setattr(render, "write_gallery", disk_full)
    code, err = run_vit(["rollout", str(fx / "img.png"), "--checkpoint", str(fx / "ckpt"),
                         "--out", str(tmp_path / "maps"), "--html"])
    assert code == 2 and f"{tmp_path / 'maps'}: no space left on device" in err[-1], err
    assert not (tmp_path / "maps").exists()


def test_a_closed_pipe_ends_the_run_quietly(monkeypatch, run_vit):
    """`vit predict DIR | head -n 1`: when the reader goes away, no traceback, exit 141 (as a
    tool killed by SIGPIPE)."""
    from vit.commands import info

    def reader_gone(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(info, "run", reader_gone)
    code, err = run_vit(["info", "vit_b16"])
    assert code == 141 and err == []


def test_a_mistyped_dataset_name_gets_a_suggestion():
    from vit.data import open_source
    from vit.errors import DataError

    with pytest.raises(DataError, match=r"'digitz'.*did you mean 'digits'\?$"):
        open_source("digitz", "train")
