"""Fashion-MNIST from scratch: a small hybrid ViT on 55,000 real 28x28 photos of clothes
(Debian's dataset-fashion-mnist), in about a quarter of an hour on a 2-core CPU with bfloat16
arithmetic (benchmarks/records/fashion_mnist_amd_bf16.json holds the run).

A convolutional stem (`model.stem`: two 3x3 convolutions of stride 2, 48 and 96 channels)
gives each of the 49 tokens (one per 4x4 patch) local features before the blocks; a plain
patch embedding learns far more slowly on so few epochs. Width 64, depth 6. The compute dtype
is `auto` (float32 weights either way): bfloat16 on a CPU with bfloat16 arithmetic
(AVX512_BF16, AMX), on a GPU or TPU; float32 on other CPUs, where bfloat16 is no faster. The
run prints its choice; `--set model.dtype=float32` (or bfloat16) overrides it.

AdamW with a cosine schedule over 16,600 steps of 32 (9.7 epochs). In this short a run the
number of updates counts more than the images each one sees: batches of 32 cost about what
batches of 64 do per image on 2 cores, and reach a higher accuracy in the same time than 64
(or 128, or 16) did. No augmentation but label smoothing: in so few epochs the model
underfits, and random shifts or flips lowered validation accuracy in shorter trials; the
in-memory images go to the step as they are. A batch runs whole (`train.micro_tokens=0`): the
stem's convolutions run slower in cache-sized pieces than the blocks gain from them.

    apt-get install dataset-fashion-mnist     # once: the IDX files in /usr/share/datasets
    vit train --config fashion_mnist --workdir runs/fashion
    vit eval --workdir runs/fashion --split test

Expect the test accuracy and training time recorded for your kind of host in
benchmarks/records/fashion_mnist*.json (docs/results.md shows them).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="fashion_mnist", num_threads=1)
    c.model = dict(name="Ti/16", width=64, depth=6, mlp_dim=256, num_heads=4, patch_size=4,
                   stem=[48, 96], classifier="gap", class_token=False, dropout=0.0, drop_path=0.0,
                   attention_impl="xla", dtype="auto")
    c.input = dict(image_size=28, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False, label_smoothing=0.1)
    c.optim = dict(name="adamw", lr=1.5e-3, weight_decay=0.05, warmup_steps=600)
    c.train = dict(steps=16600, batch_size=32, eval_every=4150, checkpoint_every=4150,
                   micro_tokens=0)
    return c
