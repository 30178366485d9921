"""Text conditioning on real photos: `fashion_scenes`, 64x64 scenes of 2-4 Fashion-MNIST photos
asked "is there a sneaker?", "is there a bag on the left?", "is there a coat and a sandal?"
(see vit/data/fashion_scenes.py). Training scenes use Fashion-MNIST's training photos,
validation its validation slice, test and held-out scenes only its test photos.

The recipe is `promptshapes`' (configs/promptshapes.py), staged the same way:
- `vit`: the ViT learns the scenes' own labels, a multi-hot sigmoid over the classes present,
  and what lies on each patch: a per-patch readout over the ten classes and "nothing"
  (`model.patch_classes`, `train.patch_loss`, the scenes' `where` map). Recognising the photos
  is what limits every answer, so the ViT is a hybrid (`model.stem`: two 3x3 convolutions of
  stride 2, as fashion_mnist's) and this stage takes most of the recipe's training
  time on a 2-core CPU, in batches of 32 as fashion_mnist: twice the updates of batches of
  64 for about the same cost per image. Every epoch each photo moves inside its cell and is
  mirrored at random (`input.scene_jitter`): without it the stage memorises its training
  scenes (its validation loss rises over the second half) and the answers lean to "no";
- `text`: the ViT frozen, the text encoder, gated cross-attention and the prompt head learn to
  answer prompts; the gates get a 10x learning rate and no decay. The head is
  `text.head="things"`: for each thing the prompt names, what lies on each patch and where
  the patch lies are scored against that thing's words, and every named thing must be found
  ("a coat and a sandal" needs both);
- `tune`: the top three blocks unfrozen as well, at a lower learning rate.

    vit train --config configs/fashion_scenes.py --workdir runs/fashion_text
    vit eval --workdir runs/fashion_text --json

`vit eval` asks every class, class-region and class-pair question (and the evaluation-only
wordings, never-placed classes and prompts of unknown words) of every test scene; the latest
figures are in benchmarks/records/fashion_scenes.json (docs/text.md shows them).
"""

import ml_collections

TEXT_PARTS = "(text_path|xattn|prompt_head)/.*"


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="fashion_scenes", val_split="validation", test_split="test",
                  heldout_split="heldout", num_threads=1)
    c.model = dict(name="Ti/16", width=128, depth=4, mlp_dim=256, num_heads=4, patch_size=16,
                   classifier="gap", class_token=False, attention_impl="xla", patch_classes=11,
                   stem=[32, 64],
                   text=dict(source="bytes", max_len=48, width=64, depth=1, num_heads=2,
                             mlp_dim=128, xattn_start=2, xattn_every=1, head="things"))
    c.input = dict(image_size=64, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False, scene_jitter=True)
    c.optim = dict(name="adamw", lr=2.2e-3, weight_decay=0.05, warmup_steps=200)
    c.train = dict(steps=600, eval_every=400, checkpoint_every=400, keep_checkpoints=1,
                   eval_batch_size=250, loss="sigmoid_xent", log_every=200)
    c.stages = dict(
        vit=dict(order=0, text=False, skip_with_init=True,
                 train=dict(steps=16000, batch_size=32, loss="sigmoid_xent", patch_loss=1.0,
                            eval_every=8000, checkpoint_every=8000)),
        text=dict(order=1, train=dict(steps=1500, loss="prompt_xent"),
                  optim=dict(lr=2e-3, warmup_steps=50, trainable=TEXT_PARTS,
                             lr_mults=[[r"xattn/\d+/\w+_gate", 10.0]], no_decay=r".*_gate")),
        tune=dict(order=2, train=dict(steps=450, loss="prompt_xent"),
                  optim=dict(lr=3e-4, warmup_steps=20,
                             trainable=f"{TEXT_PARTS}|blocks/[123]/.*|norm/.*",
                             lr_mults=[[r"xattn/\d+/\w+_gate", 10.0]], no_decay=r".*_gate")),
    )
    return c
