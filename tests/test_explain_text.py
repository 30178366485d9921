"""Explain mode for text-conditioned models: Chefer's bi-modal relevancy of the prompt answer,
against a plain reference built from the model's own forward pass, and `vit rollout --prompt`."""

import contextlib
import html
import json
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import tiny_text_model
from flax import nnx
from PIL import Image

import vit
from vit.cli import main
from vit.explanations import explain_prompt, text_relevance
from vit.explanations.tokens import map_readout
from vit.models.blocks import Block

pytestmark = pytest.mark.timeout(600)

TEXT = dict(max_len=24, width=16, depth=2, num_heads=2, mlp_dim=32, xattn_start=0,
            xattn_every=2)
CASES = {
    # cross-attention after blocks 0 and 2 of 3; a two-block byte text encoder
    "token": dict(text=TEXT),
    "map-registers-nonsquare": dict(classifier="map", class_token=False, num_registers=1,
                                    image_size=(16, 12), text=TEXT),
    "gap-embeddings": dict(classifier="gap", class_token=False,
                           text=dict(TEXT, source="embeddings", embed_dim=8, xattn_start=1)),
    # every patch scored against the prompt, soft maximum over patches
    "gap-patch-head": dict(classifier="gap", class_token=False, text=dict(TEXT, head="patches")),
    # and each patch's place scored against the prompt as well
    "gap-placed-head": dict(classifier="gap", class_token=False, text=dict(TEXT, head="placed")),
    # and once per thing the prompt names, with a soft minimum over the things
    "gap-things-head": dict(classifier="gap", class_token=False, text=dict(TEXT, head="things")),
}
PROMPTS = ["is there a red é?", "blue"]  # ragged, and a two-byte character



def images_for(model, n=2, seed=2):
    h, w = model.config.image_size
    return jax.random.normal(jax.random.key(seed), (n, h, w, 3))


def text_inputs(model, prompts, seed=4):
    """What `explain_prompt` takes (`prompt`, `text_mask`) and what the model takes."""
    t = model.config.text
    if t.source == "bytes":
        tokens, mask = vit.tokenize(prompts, t.max_len)
        return prompts, None, jnp.asarray(tokens), jnp.asarray(mask)
    lengths = [len(p.encode()) + 1 for p in prompts]
    mask = np.arange(t.max_len)[None] < np.array(lengths)[:, None]
    emb = jax.random.normal(jax.random.key(seed), (len(prompts), t.max_len, t.embed_dim))
    return emb, mask, emb, jnp.asarray(mask)


@contextlib.contextmanager
def hooked_text_encoder(model, hook):
    """The model's own text encoder, with `hook(layer, probs)` on its blocks' attention (the
    text path takes no hook, so its blocks' calls are intercepted, matched by identity)."""
    blocks = list(model.text_path.encoder.blocks) if model.text_path.encoder else []
    original = Block.__call__

    def call(self, x, keys, probs_hook=None, kv_len=None, queries=None, **options):
        for i, block in enumerate(blocks):
            if block is self:
                probs_hook = lambda p, i=i: hook(i, p)  # noqa: E731
        return original(self, x, keys, probs_hook, kv_len, queries, **options)

    with mock.patch.object(Block, "__call__", call):
        yield


def grad_times_attention(model, x, text, mask):
    """`grad A * A` of every attention, eagerly, from `jax.grad` with respect to a
    multiplicative perturbation `A * (1 + eps)` of each layer's probabilities; the logits and
    final tokens come from the model's own `features` (text=None: the image path alone).
    Under `"pool"`, the prompt head's route: the text tokens it pools perturbed the same way,
    `T_j * (1 + eps_j)`, with cross-attention reading `T` unperturbed."""

    def forward(eps):
        recorded = {"text": {}, "image": {}, "cross": {}, "pool": {}}

        def hook(kind):
            def perturb(i, p):
                recorded[kind][i] = p
                return p if eps is None else p * (1.0 + eps[kind][i])
            return perturb

        with hooked_text_encoder(model, hook("text")):
            tokens = model.features(x, text=text, text_mask=mask, probs_hook=hook("image"),
                                    xattn_hook=hook("cross"))
            # The prompt head also reads the pooled text: the same (perturbed) text encoder.
            txt, kv_len, _ = model.encode_text(text, mask)
        recorded["pool"][0] = jnp.zeros(txt.shape[:2], jnp.float32)
        scale = 1.0 if eps is None else 1.0 + eps["pool"][0][..., None]
        pooled = model.text_path.head_text(txt * scale, kv_len)
        logits = model.answer(tokens, (txt, kv_len, None), head_text=pooled)
        return logits.sum(), (logits, tokens, recorded)

    _, (_, _, shapes) = jax.eval_shape(lambda: forward(None))
    eps = {kind: [jnp.zeros(rec[i].shape, rec[i].dtype) for i in range(len(rec))]
           for kind, rec in shapes.items()}
    # Jitted with the model as a constant (eager is slow); hooks are matched while tracing.
    g, (logits, tokens, _) = jax.jit(jax.grad(forward, has_aux=True))(eps)
    g = {kind: [np.asarray(a, np.float64) for a in layers] for kind, layers in g.items()}
    return g, np.asarray(logits), tokens


def np_bar(r):
    eye = np.eye(r.shape[-1])
    off = r - eye
    return off / np.maximum(off.sum(-1, keepdims=True), 1e-12) + eye


def reference(model, x, text=None, mask=None):
    """Chefer's bi-modal rules written out in numpy: (maps, text scores, null score, logits)."""
    cfg = model.config
    g, logits, tokens = grad_times_attention(model, x, text, mask)
    b, n = x.shape[0], tokens.shape[1]
    q = 1 + (text.shape[1] if text is not None else 0)
    abar = {kind: [np.maximum(a, 0).mean(1) for a in g[kind]]
            for kind in ("text", "image", "cross")}
    r_qq = np.tile(np.eye(q), (b, 1, 1))
    for a in abar["text"]:
        full = np.zeros((b, q, q))
        full[:, 1:, 1:] = a  # the null token (index 0) is not in the text encoder
        r_qq = r_qq + full @ r_qq
    r_ss = np.tile(np.eye(n), (b, 1, 1))
    r_sq = np.zeros((b, n, q))
    cross = iter(abar["cross"])
    xlayers = cfg.text.xattn_layers(cfg.depth) if text is not None else ()
    for i, a in enumerate(abar["image"]):
        r_ss = r_ss + a @ r_ss
        r_sq = r_sq + a @ r_sq
        if i in xlayers:
            r_sq = r_sq + np.swapaxes(np_bar(r_ss), 1, 2) @ next(cross) @ np_bar(r_qq)
    prefix = cfg.num_prefix_tokens
    if cfg.text.head in ("patches", "placed"):  # the soft maximum's weights
        txt, kv_len, _ = model.encode_text(text, mask)
        head = model.prompt_head
        s = np.asarray(head.scores(tokens[:, prefix:], model.text_path.pooled(txt, kv_len)),
                       np.float64) / np.exp(float(head.log_temperature[...]))
        readout = np.zeros((b, n))
        readout[:, prefix:] = np.exp(s - s.max(-1, keepdims=True))
        readout /= readout.sum(-1, keepdims=True)
    elif cfg.text.head == "things":  # each thing's soft-minimum weight x its soft maximum's
        txt, kv_len, _ = model.encode_text(text, mask)
        head = model.prompt_head
        t, u = (np.exp(float(p[...])) for p in (head.log_temperature, head.log_min_temperature))
        s = np.asarray(head.thing_scores(tokens[:, prefix:],
                                         model.text_path.head_text(txt, kv_len)), np.float64)
        per_patch = np.exp(s / t - (s / t).max(-1, keepdims=True))
        per_patch /= per_patch.sum(-1, keepdims=True)
        found = t * np.log(np.exp(s / t).sum(-1))
        per_thing = np.exp(-found / u - (-found / u).max(-1, keepdims=True))
        per_thing /= per_thing.sum(-1, keepdims=True)
        readout = np.zeros((b, n))
        readout[:, prefix:] = np.einsum("bk,bkn->bn", per_thing, per_patch)
    elif cfg.classifier == "token":
        readout = np.eye(n)[None, 0].repeat(b, 0)
    elif cfg.classifier == "gap":
        readout = np.zeros((b, n))
        readout[:, prefix:] = 1.0 / (n - prefix)
    else:
        readout = np.asarray(map_readout(model.map_head, tokens), np.float64)
    grid = model.grid_for(x.shape[1:3])
    maps = np.einsum("bq,bqk->bk", readout, r_ss)[:, prefix:].reshape(b, *grid)
    row = np.einsum("bq,bqk->bk", readout, r_sq)
    # The prompt head's pooling, one more cross-attention layer from the answer to the text.
    row = row + np.einsum("bq,bqk->bk", np.maximum(g["pool"][0], 0), np_bar(r_qq))
    scores = row[:, 1:] * (np.asarray(mask) if mask is not None else 0)
    return maps, scores, row[:, 0], logits


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(name, gates):
        if (name, gates) not in cache:
            cache[name, gates] = tiny_text_model(gates, **CASES[name])
        return cache[name, gates]

    return get


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow
def test_open_gates_match_the_plain_reference(built, name):
    model = built(name, 0.8)
    x = images_for(model)
    prompt, text_mask, text, mask = text_inputs(model, PROMPTS)
    out = explain_prompt(model, x, prompt, text_mask=text_mask)
    want_maps, want_scores, want_null, logits = reference(model, x, text, mask)
    # The explain pass's logits are the model's own.
    public = nnx.jit(lambda m, x, t, k: m(x, text=t, text_mask=k))(model, x, text, mask)
    np.testing.assert_allclose(out.logits, public, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.logits, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.probs, jax.nn.sigmoid(logits), rtol=1e-5)
    assert out.maps.shape == (2, *model.grid_for(x.shape[1:3]))
    np.testing.assert_allclose(out.maps, want_maps, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(out.text_scores, want_scores, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(out.null_score, want_null, rtol=1e-4, atol=1e-9)
    # The comparison compares something: text relevance is there, on real tokens only.
    real = np.asarray(mask)
    assert np.abs(want_maps).min() > 0 and np.mean(want_scores[real] > 0) > 0.8
    assert np.all(np.asarray(out.text_scores)[~real] == 0)
    # And it follows the text: another prompt of the same lengths scores differently.
    other = ["is there a big ü?", "pink"] if model.config.text.source == "bytes" else None
    prompt2, text_mask2, _, _ = text_inputs(model, other or PROMPTS, seed=9)
    scores2 = explain_prompt(model, x, prompt2, text_mask=text_mask2).text_scores
    assert not np.allclose(scores2, out.text_scores, rtol=1e-2)


def head_gradient_times_input(model, x, text, mask):
    """The prompt head's route written out with jnp: `(dlogit/dT_j . T_j)^+` per text token,
    `T` the encoded text (null first) and the head's text input its mean over the real tokens;
    the image side is the model's own pooled features, which closed gates leave text-free."""
    txt, kv_len, _ = model.encode_text(text, mask)
    img = model.pool(model.features(x))
    real = (jnp.arange(txt.shape[1])[None] < kv_len[:, None]).astype(jnp.float32)

    def logit(t):
        pooled = jnp.einsum("bt,btd->bd", real, t) / real.sum(-1, keepdims=True)
        return model.prompt_head(img, pooled).sum()

    return np.maximum(np.asarray((jax.grad(logit)(txt) * txt).sum(-1), np.float64), 0.0)


@pytest.mark.parametrize("name", ["token", "gap-embeddings"])
@pytest.mark.slow
def test_closed_gates_give_the_prompt_heads_route_and_the_image_only_map(built, name):
    model = built(name, None)  # gates at their initial 0
    assert all(float(b.attn_gate[...]) == 0 and float(b.mlp_gate[...]) == 0
               for b in model.xattn)
    x = images_for(model)
    prompt, text_mask, text, mask = text_inputs(model, PROMPTS)
    out = explain_prompt(model, x, prompt, text_mask=text_mask)
    # The comparison compares something: the answer does follow the prompt (through the head).
    other = ["is there a big ü?", "pink"] if model.config.text.source == "bytes" else None
    _, _, text2, mask2 = text_inputs(model, other or PROMPTS, seed=9)
    forward = nnx.jit(lambda m, x, t, k: m(x, text=t, text_mask=k))
    assert np.abs(np.asarray(forward(model, x, text2, mask2) - out.logits)).min() > 1e-3
    # Gates closed, the text relevance is not 0: the head's route, apart from the rules' code.
    real = np.asarray(mask)
    assert np.mean(np.asarray(out.text_scores)[real] > 0) > 0.3
    assert np.all(np.asarray(out.text_scores)[~real] == 0)
    want_maps, want_scores, want_null, logits = reference(model, x, text, mask)
    if model.config.text.source == "embeddings":  # no text encoder: R^qq = I, h itself
        h = head_gradient_times_input(model, x, text, mask)
        np.testing.assert_allclose(out.text_scores, h[:, 1:] * real, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(out.null_score, h[:, 0], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(out.text_scores, want_scores, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(out.null_score, want_null, rtol=1e-4, atol=1e-9)
    # The map is the relevancy of the prompt logit through the image's self-attention (brute
    # force through the model's own forward pass).
    assert np.abs(want_maps).max() > 0
    np.testing.assert_allclose(out.logits, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.maps, want_maps, rtol=1e-4, atol=1e-9)


@pytest.mark.slow
def test_the_head_route_gives_padding_and_an_unread_text_nothing():
    from vit.explanations.text import prompt_relevance_core

    model = tiny_text_model(None, **CASES["gap-embeddings"])
    x = images_for(model)
    emb, text_mask, _, _ = text_inputs(model, ["a much longer prompt", "ab"])
    mask = jnp.asarray(text_mask)
    core = nnx.jit(prompt_relevance_core)
    _, row, _ = core(model, x, emb, mask)
    row = np.asarray(row)
    real = np.concatenate([np.ones((2, 1), bool), np.asarray(mask)], 1)  # the null is real
    assert np.mean(row[real] > 0) > 0.3
    assert np.all(row[~real] == 0)  # padded positions, before any masking of the output
    # What sits at the padded positions changes nothing.
    noisy = jnp.where(mask[..., None], emb, 100.0 * jax.random.normal(jax.random.key(7),
                                                                      emb.shape))
    np.testing.assert_allclose(core(model, x, noisy, mask)[1], row, rtol=1e-5, atol=1e-9)
    # A head that does not read the text (its text projection zero): nothing through it.
    model.prompt_head.text.kernel[...] = jnp.zeros_like(model.prompt_head.text.kernel[...])
    _, row0, logits0 = core(model, x, emb, mask)
    assert np.all(np.asarray(row0) == 0)
    _, _, logits1 = core(model, x, noisy * 3.0, mask)
    np.testing.assert_allclose(logits0, logits1, rtol=1e-6)  # the text indeed has no effect


@pytest.mark.slow
def test_a_batch_gives_each_image_what_it_gets_alone(built):
    model = built("token", 0.8)
    x = images_for(model)
    together = explain_prompt(model, x, PROMPTS)
    alone = explain_prompt(model, x[1:], PROMPTS[1:])
    np.testing.assert_allclose(together.maps[1], alone.maps[0], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(together.text_scores[1], alone.text_scores[0], rtol=1e-5,
                               atol=1e-9)


@pytest.mark.slow
def test_text_relevance_groups_bytes_into_characters(built):
    model = built("token", 0.8)
    x = images_for(model, 3)
    out = explain_prompt(model, x, ["red é", "", "日本"])
    per_token = text_relevance(out, 0, per="token")
    assert [t["token"] for t in per_token] == ["r", "e", "d", " ", "\\xc3", "\\xa9", "<end>"]
    scores = np.asarray(out.text_scores[0])
    np.testing.assert_allclose([t["score"] for t in per_token], scores[:7], rtol=1e-6)
    chars = text_relevance(out, 0)
    assert [t["token"] for t in chars] == ["r", "e", "d", " ", "é", "<end>"]
    np.testing.assert_allclose(chars[4]["score"], scores[4] + scores[5], rtol=1e-6)
    assert text_relevance(out, 1) == []  # the null prompt has no tokens
    assert [t["token"] for t in text_relevance(out, 2)] == ["日", "本", "<end>"]
    # Truncation can cut a character: the bytes the model saw stay one entry.
    with pytest.warns(UserWarning, match="truncated"):
        cut = explain_prompt(model, x[:1], ["x" * 22 + "日"])
    entries = text_relevance(cut, 0)
    assert len(entries) == 23 and entries[-1]["token"] == "\ufffd"
    np.testing.assert_allclose(sum(e["score"] for e in entries),
                               float(np.sum(cut.text_scores[0])), rtol=1e-5)


@pytest.mark.slow
def test_explain_prompt_refuses_what_it_cannot_explain(built):
    plain = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=4,
                             image_size=16, num_classes=5, rngs=nnx.Rngs(0))
    x = images_for(plain)
    with pytest.raises(ValueError, match="no text path"):
        explain_prompt(plain, x, "a cat")
    with pytest.raises(ValueError, match="3 prompts for 2 images"):
        explain_prompt(built("token", 0.8), x, ["a", "b", "c"])
    with pytest.raises(ValueError, match="embeddings"):
        explain_prompt(built("gap-embeddings", 0.8), x, "a cat")


# -- vit rollout --prompt ---------------------------------------------------------------------

PLAIN_KEYS = {"image", "label", "pred", "pred_label", "prob", "method", "class", "overlay",
              "map"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_files):
    """A text model of the shared tiny ViT's size, and the plain tiny ViT itself."""
    from vit.checkpoints import save_orbax
    from vit.preprocess import Preprocessing

    root = tmp_path_factory.mktemp("ckpt")
    common = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4, image_size=8,
                  num_classes=10)
    text = tiny_text_model(0.8, **common, text=dict(TEXT, max_len=16))
    save_orbax(root / "text", text, preprocessing=Preprocessing(size=(8, 8)),
               labels=[f"digit{i}" for i in range(10)])
    return {"text": str(root / "text"), "plain": str(tiny_files["orbax"]), "model": text}


@pytest.mark.slow
def test_rollout_prompt_writes_maps_prompt_probability_and_token_scores(checkpoints, tmp_path,
                                                                       capsys):
    pics = tmp_path / "pics"
    pics.mkdir()
    Image.new("RGB", (40, 30), (200, 20, 20)).save(pics / "red.png")
    Image.new("RGB", (8, 8), (20, 20, 200)).save(pics / "blue.png")
    out = tmp_path / "out"
    prompt = "a red <é>"
    rc = main(["rollout", str(pics), "--checkpoint", checkpoints["text"], "--prompt", prompt,
               "--out", str(out), "--html", "--batch-size", "4"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "for prompt" in captured.out
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert set(row) == PLAIN_KEYS | {"prompt", "text_relevance"}
        assert row["prompt"] == prompt and row["method"] == "relevancy"
        assert row["class"] is None and 0 < row["prob"] < 1
        assert "".join(t["token"] for t in row["text_relevance"]) == prompt + "<end>"
        assert all(t["score"] > 0 for t in row["text_relevance"])
        assert np.load(out / row["map"], allow_pickle=False).shape == (2, 2)
    # The probability is the model's answer for the preprocessed image.
    from vit.checkpoints import load_checkpoint

    ckpt = load_checkpoint(checkpoints["text"])
    blue = ckpt.preprocessing(Image.open(pics / "blue.png"))[None]
    tokens, mask = vit.tokenize(prompt, 16)
    forward = nnx.jit(lambda m, x, t, k: m(x, text=t, text_mask=k))
    want = jax.nn.sigmoid(forward(checkpoints["model"], jnp.asarray(blue), jnp.asarray(tokens),
                                  jnp.asarray(mask)))
    row = next(r for r in rows if r["image"].endswith("blue.png"))
    np.testing.assert_allclose(row["prob"], float(want[0]), rtol=1e-4)
    page = (out / "index.html").read_text(encoding="utf-8")
    assert html.escape(prompt) in page and 'class="tokens"' in page and "&lt;end&gt;" in page
    assert f"{row['prob']:.1%}" in page


def test_rollout_prompt_mistakes_are_one_line_errors(checkpoints, tmp_path, capsys):
    pic = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(pic)
    base = ["rollout", str(pic), "--out", str(tmp_path / "o")]
    assert main([*base, "--checkpoint", checkpoints["plain"], "--prompt", "a cat"]) == 2
    assert "plain image model" in capsys.readouterr().err
    assert main([*base, "--checkpoint", checkpoints["text"], "--prompt", "a",
                 "--method", "rollout"]) == 2
    assert main([*base, "--checkpoint", checkpoints["text"], "--prompt", "a",
                 "--class", "3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 2 and "relevancy" in err
