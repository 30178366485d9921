"""Text conditioning on `promptshapes`: "is there a red triangle?" about 64x64 scenes of 2-4
coloured shapes, every prompt true in half its uses (see vit/data/promptshapes.py).

The prompt head scores every patch against the prompt and takes a soft maximum over patches
(`text.head="patches"`), so "red triangle" needs red and triangle on one object: that is what
answers colour x shape pairs never asked in training.

Three stages (vit/train/stages.py), one command, resumable across them:
- `vit`: the ViT learns the scenes' own labels, a multi-hot sigmoid over every colour x shape
  pair present (held-out pairs included: they are withheld from the prompts, not the images).
  No pretrained ViT can be downloaded here; `--init CHECKPOINT` skips this stage.
- `text`: the ViT frozen, the text encoder, the gated cross-attention and the prompt head learn
  to answer prompts (the Flamingo/LiT recipe); the gates get a 10x learning rate and no decay.
- `tune`: the top two blocks unfrozen as well, at a lower learning rate.

    vit train --config configs/promptshapes.py --workdir runs/demo_text
    vit eval --workdir runs/demo_text --json

Training asks every kind of question in nine wordings (see vit/data/promptshapes.py); `vit eval`
asks every colour x shape question of every test scene. The latest figures, held-out pairs
included, are in benchmarks/promptshapes.json (docs/text.md shows them).
"""

import ml_collections

TEXT_PARTS = "(text_path|xattn|prompt_head)/.*"


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="promptshapes", val_split="test", heldout_split="heldout",
                  num_threads=1)
    c.model = dict(name="Ti/16", width=128, depth=4, mlp_dim=256, num_heads=4, patch_size=16,
                   classifier="gap", class_token=False, attention_impl="xla",
                   text=dict(source="bytes", max_len=48, width=64, depth=1, num_heads=2,
                             mlp_dim=128, xattn_start=2, xattn_every=1, head="patches"))
    c.input = dict(image_size=64, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False)
    c.optim = dict(name="adamw", lr=3e-3, weight_decay=0.05)
    c.train = dict(steps=600, eval_every=300, checkpoint_every=300, keep_checkpoints=1,
                   eval_batch_size=250, loss="sigmoid_xent")
    c.stages = dict(
        vit=dict(order=0, text=False, skip_with_init=True,
                 train=dict(steps=800, loss="sigmoid_xent")),
        text=dict(order=1, train=dict(steps=900, loss="prompt_xent"),
                  optim=dict(lr=2e-3, warmup_steps=50, trainable=TEXT_PARTS,
                             lr_mults=[[r"xattn/\d+/\w+_gate", 10.0]], no_decay=r".*_gate")),
        tune=dict(order=2, train=dict(steps=100, loss="prompt_xent"),
                  optim=dict(lr=3e-4, warmup_steps=20,
                             trainable=f"{TEXT_PARTS}|blocks/[23]/.*|norm/.*",
                             lr_mults=[[r"xattn/\d+/\w+_gate", 10.0]], no_decay=r".*_gate")),
    )
    return c
