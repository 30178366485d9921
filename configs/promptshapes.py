"""Text conditioning on `promptshapes`: "is there a red triangle?" about 64x64 scenes of 2-4
coloured shapes, every prompt true in half its uses (see vit/data/promptshapes.py).

What makes colour x shape pairs never asked in training answerable, and a red square beside a
blue triangle no "red triangle" (docs/text.md keeps the ablation):
- the ViT learns colours and shapes apart (`data.labels="attributes"`: a multi-hot over the
  colours and the shapes drawn), so a patch's features hold "red" and "triangle" as separate
  directions rather than one code per pair;
- and it learns what lies on each patch: a per-patch readout (`model.patch_classes`, the 24
  pairs and "nothing") trained against the shape drawn in each cell (`train.patch_loss`), so a
  patch's features say what is on that patch, not what the scene holds somewhere;
- the prompt meets the image only at the prompt head, which scores every patch against the
  prompt and takes a soft maximum over patches, for each thing the prompt names
  (`text.head="things"`; one thing here). What a thing's words score on a patch is close to
  the sum of what each word scores there, so "red triangle" needs red and triangle on one
  patch, for any pair; and a prompt of no known word finds nothing anywhere.
  The gated cross-attention blocks are built but stay closed (their gates at 0, not
  trained): opened, they let the prompt reshape the patch features jointly, which fits the
  pairs seen in training and not the others.

Three stages (vit/training/stages.py), one command, resumable across them:
- `vit`: the ViT learns the scenes' own labels. No pretrained ViT can be downloaded here;
  `--init CHECKPOINT` skips this stage.
- `text`: the ViT frozen, the text encoder and the prompt head learn to answer prompts.
- `tune`: the top two blocks unfrozen as well, at a lower learning rate.

    vit train --config configs/promptshapes.py --workdir runs/demo_text
    vit eval --workdir runs/demo_text --json

Training asks every kind of question in nine wordings (see vit/data/promptshapes.py); `vit eval`
asks every colour x shape question of every test scene. The latest figures, held-out pairs
included, are in benchmarks/records/promptshapes.json (docs/text.md shows them).
"""

import ml_collections

# The text encoder and the prompt head; the cross-attention blocks (`xattn/`) stay closed.
TEXT_PARTS = "(text_path|prompt_head)/.*"


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="promptshapes", labels="attributes", val_split="test",
                  heldout_split="heldout", num_threads=1)
    c.model = dict(name="Ti/16", width=128, depth=4, mlp_dim=256, num_heads=4, patch_size=16,
                   classifier="gap", class_token=False, attention_impl="xla", patch_classes=25,
                   text=dict(source="bytes", max_len=48, width=64, depth=1, num_heads=2,
                             mlp_dim=128, xattn_start=2, xattn_every=1, head="things"))
    c.input = dict(image_size=64, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False)
    c.optim = dict(name="adamw", lr=3e-3, weight_decay=0.05)
    c.train = dict(steps=600, eval_every=300, checkpoint_every=300, keep_checkpoints=1,
                   eval_batch_size=250, loss="sigmoid_xent")
    c.stages = dict(
        vit=dict(order=0, text=False, skip_with_init=True,
                 train=dict(steps=800, loss="sigmoid_xent", patch_loss=1.0)),
        text=dict(order=1, train=dict(steps=900, loss="prompt_xent"),
                  optim=dict(lr=2e-3, warmup_steps=50, trainable=TEXT_PARTS)),
        tune=dict(order=2, train=dict(steps=100, loss="prompt_xent"),
                  optim=dict(lr=3e-4, warmup_steps=20,
                             trainable=f"{TEXT_PARTS}|blocks/[23]/.*|norm/.*")),
    )
    return c
