"""Text conditioning: tokenizer, text path, gated cross-attention, prompt and similarity heads."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vit
from vit.models.config import TextConfig
from vit.models.text import detokenize, tokenize
from vit.ops.attention import dot_product_attention

TEXT = TextConfig(max_len=48, width=32, depth=1, num_heads=2, mlp_dim=64, xattn_start=1,
                  xattn_every=2)


def _models(**kw):
    common = dict(num_classes=5, image_size=32, depth=4, width=64, num_heads=4, mlp_dim=128)
    common.update(kw)
    plain = vit.create_model("Ti/16", rngs=nnx.Rngs(0), **common)
    text = vit.create_model("Ti/16", rngs=nnx.Rngs(0), text=TEXT, **common)
    # Make the shared (image) weights non-trivial: the head is zero at init, so randomise it.
    for m in (plain, text):
        m.head.kernel[...] = jax.random.normal(jax.random.key(7), m.head.kernel.shape)
    return plain, text


def _images(b=3, seed=1):
    return jax.random.normal(jax.random.key(seed), (b, 32, 32, 3))


def _prompts(max_len=48):
    return tokenize(["is there a red triangle?", "", "y a-t-il un carré bleu ?"], max_len)


def test_tokenizer_round_trips_any_language_and_masks_a_prefix():
    texts = ["is there a red triangle?", "gibt es ein grünes Dreieck?", "赤い三角形はありますか",
             "🙂 emoji", ""]
    tokens, mask = tokenize(texts, 64)
    assert tokens.shape == mask.shape == (5, 64) and tokens.dtype == np.int32
    assert detokenize(tokens) == texts
    lengths = mask.sum(-1)
    assert lengths[-1] == 0  # the empty prompt is the null prompt: no tokens at all
    for row, n in zip(mask, lengths, strict=True):
        assert row[:n].all() and not row[n:].any()
    # one token per UTF-8 byte plus the end token
    assert lengths[2] == len("赤い三角形はありますか".encode()) + 1


def test_long_prompt_is_truncated_with_a_warning():
    with pytest.warns(UserWarning, match="truncated"):
        tokens, mask = tokenize(["x" * 100], 16)
    assert mask.sum() == 16


def test_kv_len_attention_equals_a_plain_formula_on_the_real_keys():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 5, 2, 8)), jnp.float32) for _ in range(3))
    kv_len = jnp.array([5, 2, 1])
    k = k.at[1, 2:].set(jnp.nan)  # padding may hold anything
    v = v.at[2, 1:].set(jnp.nan)
    out = dot_product_attention(q, k, v, kv_len=kv_len, impl="xla")
    for b, n in enumerate([5, 2, 1]):
        qb, kb, vb = (np.asarray(x[b], np.float64) for x in (q, k[:, :n], v[:, :n]))
        logits = np.einsum("qhd,khd->hqk", qb, kb) / math.sqrt(8)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = np.einsum("hqk,khd->qhd", p, vb)
        np.testing.assert_allclose(np.asarray(out[b]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_text_model_equals_the_plain_vit_at_initialisation():
    plain, text = _models()
    x = _images()
    tokens, mask = _prompts()
    want = plain.features(x)
    got = text.features(x, text=jnp.asarray(tokens), text_mask=jnp.asarray(mask))
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # exact without jit
    logits = text.head_logits(text.pool(got))
    assert float(jnp.abs(logits).max()) > 0.1  # the comparison compares something
    np.testing.assert_array_equal(np.asarray(logits),
                                  np.asarray(plain.head_logits(plain.pool(want))))
    # plain(x) computes the last block for the class token alone: other matmul shapes, so
    # equal up to float rounding.
    np.testing.assert_allclose(np.asarray(logits), np.asarray(plain(x)), atol=1e-5, rtol=0)

    @nnx.jit
    def jitted(m, x, t, k):
        return m.features(x, text=t, text_mask=k)

    # Under jit XLA fuses and reorders float32 sums, so equal up to rounding: 1.3e-6 on one
    # host's codegen (within 1e-6 on the hosts before). Gates at tanh(0.05) move them by 0.14.
    np.testing.assert_allclose(np.asarray(jitted(text, x, jnp.asarray(tokens), jnp.asarray(mask))),
                               np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_gradients_reach_the_gates_at_step_0():
    _, text = _models()
    x = _images()
    tokens, mask = _prompts()
    graphdef, params = nnx.split(text, nnx.Param)

    def loss(params):
        m = nnx.merge(graphdef, params)
        return jnp.sum(m(x, text=jnp.asarray(tokens), text_mask=jnp.asarray(mask)) ** 2)

    grads = nnx.to_pure_dict(jax.jit(jax.grad(loss))(params))
    for block in grads["xattn"].values():
        assert abs(float(block["attn_gate"])) > 0
        assert abs(float(block["mlp_gate"])) > 0


@pytest.mark.slow
def test_padding_does_not_change_outputs_and_empty_prompt_works():
    _, text = _models()
    # open the gates so the text actually matters
    for block in text.xattn:
        block.attn_gate[...] = jnp.float32(0.8)
        block.mlp_gate[...] = jnp.float32(0.5)
    x = _images()
    short = tokenize(["is there a red triangle?", "", "blue"], 30)
    long = tokenize(["is there a red triangle?", "", "blue"], 48)
    a = text(x, text=jnp.asarray(short[0]), text_mask=jnp.asarray(short[1]))
    b = text(x, text=jnp.asarray(long[0]), text_mask=jnp.asarray(long[1]))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(np.asarray(a)))
    # and the text matters once the gates are open
    other = tokenize(["is there a green circle?", "a", "red"], 30)
    c = text(x, text=jnp.asarray(other[0]), text_mask=jnp.asarray(other[1]))
    assert float(jnp.abs(a - c).max()) > 1e-4


@pytest.mark.slow
def test_several_prompts_share_the_image_prefix_and_equal_one_at_a_time():
    _, text = _models()
    for block in text.xattn:
        block.attn_gate[...] = jnp.float32(0.7)
    x = _images(2)
    prompts = ["is there a red triangle?", "", "is there a blue cross?"]
    tokens, mask = tokenize(prompts, 48)
    forward = nnx.jit(lambda m, x, t, k: m(x, text=t, text_mask=k))
    many = forward(text, x, jnp.broadcast_to(tokens, (2, 3, 48)),
                   jnp.broadcast_to(mask, (2, 3, 48)))
    assert many.shape == (2, 3)
    for p in range(3):
        one = forward(text, x, jnp.broadcast_to(tokens[p], (2, 48)),
                      jnp.broadcast_to(mask[p], (2, 48)))
        np.testing.assert_allclose(np.asarray(many[:, p]), np.asarray(one), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.slow
def test_cross_attention_on_pallas_equals_xla_forward_and_gradients():
    _, text = _models()
    for block in text.xattn:
        block.attn_gate[...] = jnp.float32(0.9)
        block.mlp_gate[...] = jnp.float32(0.3)
    x = _images()
    tokens, mask = tokenize(["is there a red triangle?", "", "ab"], 48)  # ragged: 25, 0, 3
    graphdef, params = nnx.split(text, nnx.Param)

    def run(impl):
        cfg = text.config.replace(attention_impl=impl)
        g = nnx.graphdef(vit.create_model(cfg, rngs=nnx.Rngs(0)))

        def f(params):
            out = nnx.merge(g, params)(x, text=jnp.asarray(tokens), text_mask=jnp.asarray(mask))
            return jnp.sum(jnp.sin(out)), out

        (_, out), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        return out, nnx.to_pure_dict(grads)

    out_x, g_x = run("xla")
    out_p, g_p = run("pallas")
    np.testing.assert_allclose(np.asarray(out_p), np.asarray(out_x), rtol=1e-4, atol=1e-5)
    leaves_x = jax.tree.leaves(g_x["xattn"]) + jax.tree.leaves(g_x["text_path"])
    leaves_p = jax.tree.leaves(g_p["xattn"]) + jax.tree.leaves(g_p["text_path"])
    assert max(float(jnp.abs(a).max()) for a in leaves_x) > 1e-3
    for a, b in zip(leaves_p, leaves_x, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3,
                                   atol=1e-4 + 1e-3 * float(jnp.abs(b).max()))


@pytest.mark.slow
def test_similarity_head_scores_every_image_against_every_text():
    cfg = TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64, similarity_dim=16)
    model = vit.create_model("Ti/16", num_classes=0, image_size=32, depth=2, width=64,
                             num_heads=4, mlp_dim=128, text=cfg, rngs=nnx.Rngs(0))
    img = model.image_embedding(_images(3))
    txt = model.text_embedding(*map(jnp.asarray, tokenize(["a red square", "a blue cross"], 32)))
    assert img.shape == (3, 16) and txt.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(img), axis=-1), 1.0, rtol=1e-5)
    logits = model.similarity.logits(img, txt)
    want = 10.0 * np.asarray(img) @ np.asarray(txt).T - 10.0
    np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_text_on_a_plain_model_is_refused():
    plain, _ = _models()
    tokens, mask = _prompts()
    with pytest.raises(ValueError, match="no text path"):
        plain(_images(), text=jnp.asarray(tokens), text_mask=jnp.asarray(mask))


def _patch_model(head="patches"):
    common = dict(num_classes=5, image_size=32, depth=4, width=64, num_heads=4, mlp_dim=128)
    model = vit.create_model("Ti/16", rngs=nnx.Rngs(0), **common,
                             text=TextConfig(**{**TEXT.__dict__, "head": head}))
    for block in model.xattn:  # open the gates: the prompt must change the patches
        block.attn_gate[...] = jnp.float32(0.7)
    if head in ("placed", "things"):  # positions as large as the patches' terms: they count
        model.prompt_head.position[...] = jax.random.normal(jax.random.key(3),
                                                            model.prompt_head.position.shape)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["patches", "placed"])
def test_patch_head_is_a_soft_maximum_of_per_patch_scores(kind):
    model = _patch_model(kind)
    head = model.prompt_head
    head.log_temperature[...] = jnp.float32(np.log(0.5))
    x = _images(2)
    tokens, mask = tokenize(["is there a red triangle?", "is there a blue cross?"], 48)
    encoded = model.encode_text(tokens, mask)
    final = np.asarray(model.features(x, encoded_text=encoded), np.float64)
    txt = np.asarray(model.text_path.pooled(*encoded[:2]), np.float64)

    def norm(v, ln):  # LayerNorm in numpy
        v = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + ln.epsilon)
        return v * np.asarray(ln.scale[...]) + np.asarray(ln.bias[...])

    patches = norm(final[:, model.num_prefix_tokens:], head.norm)
    text_side = norm(txt, head.text_norm) @ np.asarray(head.text.kernel[...])
    match = np.einsum("bnd,de,be->bn", patches, np.asarray(head.image.kernel[...]), text_side)
    if kind == "placed":  # each patch position's own vector meets the text too
        place = norm(txt, head.text_norm) @ np.asarray(head.place.kernel[...])
        match = match + np.einsum("nd,bd->bn", np.asarray(head.position[...]), place)
    s = (patches @ np.asarray(head.out.kernel[...]))[..., 0] + float(head.out.bias[0]) \
        + match / np.sqrt(patches.shape[-1])
    want = 0.5 * (np.log(np.exp(s / 0.5).sum(-1)) - np.log(s.shape[-1]))
    got = np.asarray(model(x, text=tokens, text_mask=mask))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    # One patch scoring far above the rest decides the answer at a low temperature.
    head.log_temperature[...] = jnp.float32(np.log(0.01))
    np.testing.assert_allclose(np.asarray(model(x, text=tokens, text_mask=mask)),
                               s.max(-1) - 0.01 * np.log(s.shape[-1]), rtol=1e-3, atol=1e-3)


def _layer_norm(v, ln):  # LayerNorm in numpy
    v = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + ln.epsilon)
    return v * np.asarray(ln.scale[...]) + np.asarray(ln.bias[...])


@pytest.mark.slow
def test_things_head_needs_every_named_thing_found():
    """text.head="things": per thing k, its text is the mean of the real tokens plus their
    softmax(q_k . LN(T_j) / sqrt(d)) pooling; each thing gets the placed head's soft maximum
    over patches, and the answer is their soft minimum; all in numpy from the parameters."""
    model = _patch_model("things")
    head, path = model.prompt_head, model.text_path
    head.log_temperature[...] = jnp.float32(np.log(0.5))
    head.log_min_temperature[...] = jnp.float32(np.log(0.3))
    x = _images(2)
    tokens, mask = tokenize(["is there a red triangle and a blue cross?", "a blue cross"], 48)
    encoded = model.encode_text(tokens, mask)
    final = np.asarray(model.features(x, encoded_text=encoded), np.float64)
    txt, kv_len = np.asarray(encoded[0], np.float64), np.asarray(encoded[1])
    things = []
    for b in range(2):
        real = txt[b, :kv_len[b]]
        logits = _layer_norm(real, path.things_norm) @ np.asarray(path.things[...]).T
        w = np.exp(logits / np.sqrt(real.shape[-1]) - (logits / np.sqrt(real.shape[-1])).max(0))
        w = w / w.sum(0)
        things.append(real.mean(0) + w.T @ real)  # [K, width]
    things = np.stack(things)
    assert things.shape == (2, 2, final.shape[-1]) and not np.allclose(things[:, 0], things[:, 1])
    patches = _layer_norm(final[:, model.num_prefix_tokens:], head.norm)
    t_norm = _layer_norm(things, head.text_norm)
    match = np.einsum("bnd,de,bke->bkn", patches, np.asarray(head.image.kernel[...]),
                      t_norm @ np.asarray(head.text.kernel[...]))
    match += np.einsum("nd,bkd->bkn", np.asarray(head.position[...]),
                       t_norm @ np.asarray(head.place.kernel[...]))
    s = (patches @ np.asarray(head.out.kernel[...]))[:, None, :, 0] \
        + float(head.out.bias[0]) + match / np.sqrt(patches.shape[-1])
    found = 0.5 * (np.log(np.exp(s / 0.5).sum(-1)) - np.log(s.shape[-1]))  # [b, K]
    want = -0.3 * (np.log(np.exp(-found / 0.3).sum(-1)) - np.log(2))
    got = np.asarray(model(x, text=tokens, text_mask=mask))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    assert np.all(got <= found.max(-1) + 1e-4)  # the weaker thing holds the answer down
    # The explain readout: d answer / d score per patch, summed over the things.
    per_thing = np.exp(-found / 0.3) / np.exp(-found / 0.3).sum(-1, keepdims=True)
    per_patch = np.exp(s / 0.5) / np.exp(s / 0.5).sum(-1, keepdims=True)
    readout = np.asarray(model.answer_readout(model.features(x, encoded_text=encoded),
                                              encoded))[:, model.num_prefix_tokens:]
    np.testing.assert_allclose(readout, np.einsum("bk,bkn->bn", per_thing, per_patch),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["patches", "things"])
def test_patch_head_answers_every_prompt_as_one_at_a_time(kind):
    model = _patch_model(kind)
    x = _images(2)
    tokens, mask = tokenize(["is there a red triangle?", "", "is there a blue cross?"], 48)
    every = np.asarray(model.answer_prompts(x, tokens, mask))
    for p in range(3):
        one = model(x, text=jnp.broadcast_to(tokens[p], (2, 48)),
                    text_mask=jnp.broadcast_to(mask[p], (2, 48)))
        np.testing.assert_allclose(every[:, p], np.asarray(one), rtol=1e-5, atol=1e-5)


def test_prompt_head_defaults_to_the_pooled_head_and_refuses_unknown_heads():
    from vit.errors import ConfigError
    from vit.models.config import ViTConfig

    old = {k: v for k, v in TEXT.__dict__.items() if k != "head"}  # a file from before the field
    assert ViTConfig(text=old).text.head == "pooled"
    with pytest.raises(ConfigError, match="text.head"):
        TextConfig(head="max")
