"""CIFAR-10 from an ImageNet-21k ViT-B/16 at 384 px: the vit_jax fine-tuning recipe
(vit_jax/configs/common.py): SGD with momentum 0.9, base lr 0.03, 500 warmup steps, cosine decay,
10,000 steps, batch 512 through 8 accumulation steps, global-norm clipping at 1.0, no weight
decay, `train[:98%]` for training and `train[98%:]` for validation.

    tfds build cifar10 --file_format=array_record   # once, needs TensorFlow
    vit train --config configs/cifar10_finetune.py --workdir runs/cifar10 --init ViT-B_16.npz

The vit_jax README reports 99.0% test accuracy for ViT-B/16 (i21k) with this recipe on TPU.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = ""
    c.data = dict(name="tfds:cifar10", data_dir=None, train_split="train[:98%]",
                  val_split="train[98%:]", test_split="test", strict=False, num_threads=8)
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="bfloat16", remat=False)  # bf16 compute, f32 params (big_vision)
    # vit_jax: inception crop then random flip for training; resize for evaluation; [-1, 1].
    c.input = dict(image_size=384, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.05, 1.0], flip=True, shift=0.0,
                   rotate=0.0, scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.0)
    c.optim = dict(name="sgd", lr=0.03, warmup_steps=500, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0,
                   trainable=".*")
    c.train = dict(steps=10_000, batch_size=512, accum_steps=8, eval_every=1000,
                   checkpoint_every=1000, keep_checkpoints=2, log_every=50, ema_decay=0.0,
                   eval_batch_size=256)
    return ml_collections.ConfigDict(c)
