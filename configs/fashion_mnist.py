"""Fashion-MNIST from scratch: a small ViT on 55,000 real 28x28 photos of clothes (Debian's
dataset-fashion-mnist), in about a quarter of an hour on a 2-core CPU.

One token per 4x4 patch (49 tokens), width 64, depth 6: a narrow model takes more of the
epochs a quarter of an hour holds. The compute dtype is `auto` (float32 weights either way):
bfloat16 on a CPU with bfloat16 arithmetic (AVX512_BF16, AMX), where the narrow products run
faster, and on a GPU or TPU; float32 on other CPUs, where bfloat16 is no faster. The run
prints its choice; `--set model.dtype=float32` (or bfloat16) overrides it. AdamW with a
cosine schedule over 3,400 steps of 128 (7.9 epochs); random shifts of a pixel stand in for
crops (a crop of a 28-pixel image throws away most of it); no flips, so the in-memory images
go to the step without per-example work.

    apt-get install dataset-fashion-mnist     # once: the IDX files in /usr/share/datasets
    vit train --config fashion_mnist --workdir runs/fashion
    vit eval --workdir runs/fashion --split test

Expect the test accuracy and training time recorded in benchmarks/records/fashion_mnist.json.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="fashion_mnist", num_threads=1)
    c.model = dict(name="Ti/16", width=64, depth=6, mlp_dim=256, num_heads=4, patch_size=4,
                   classifier="gap", class_token=False, dropout=0.0, drop_path=0.0,
                   attention_impl="xla", dtype="auto")
    c.input = dict(image_size=28, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False, shift=1.0, label_smoothing=0.1)
    c.optim = dict(name="adamw", lr=2e-3, weight_decay=0.05, warmup_steps=200)
    c.train = dict(steps=3400, batch_size=128, eval_every=850, checkpoint_every=850)
    return c
