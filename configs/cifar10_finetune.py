"""CIFAR-10 from an ImageNet-21k ViT-B/16 at 384 px: the vit_jax fine-tuning recipe
(vit_jax/configs/common.py): SGD with momentum 0.9, base lr 0.03, 500 warmup steps, cosine decay,
10,000 steps, batch 512 through 8 accumulation steps, global-norm clipping at 1.0, no weight
decay, `train[:98%]` for training and `train[98%:]` for validation; inception crop then random
flip for training, resize for evaluation.
The compute dtype is `auto`: bfloat16 (float32 parameters, as big_vision) on a GPU, a TPU
or a CPU with bfloat16 arithmetic, float32 on other CPUs; the run prints its choice.

    tfds build cifar10 --file_format=array_record   # once, needs TensorFlow
    vit train --config configs/cifar10_finetune.py --workdir runs/cifar10 --init ViT-B_16.npz
    vit eval --workdir runs/cifar10 --split test

The vit_jax README reports 99.0% test accuracy for ViT-B/16 (i21k) with this recipe on TPU.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="tfds:cifar10", train_split="train[:98%]", val_split="train[98%:]",
                  num_threads=8)
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False)  # bf16 compute where it pays, f32 params
    c.input = dict(image_size=384)
    c.optim = dict(lr=0.03, warmup_steps=500)
    c.train = dict(steps=10_000, batch_size=512, accum_steps=8, eval_every=1000,
                   checkpoint_every=1000, eval_batch_size=256)
    return c
