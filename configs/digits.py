"""The demo: a small ViT trained from scratch on the bundled 8x8 digits (scikit-learn).

1,293 training images is very little for a transformer, so the recipe leans on augmentation
(random shifts, small rotations and zooms), label smoothing and a cosine schedule. One token per
2x2 patch keeps the sequence at 16 tokens, so a step is cheap on a CPU.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = ""  # a pretrained checkpoint to start from; none here
    c.data = dict(name="digits", data_dir=None, train_split="train", val_split="validation",
                  test_split="test", strict=False, num_threads=1)
    c.model = dict(name="Ti/16", width=64, depth=4, mlp_dim=128, num_heads=4, patch_size=2,
                   classifier="gap", class_token=False, dropout=0.0, drop_path=0.0,
                   attention_impl="xla")
    c.input = dict(image_size=8, resample="bilinear", crop_pct=None, mean=[0.5] * 3,
                   std=[0.5] * 3, inception_crop=False, flip=False, shift=1.0, rotate=8.0,
                   scale=0.08, mixup=0.0, cutmix=0.0, label_smoothing=0.1)
    c.optim = dict(name="adamw", lr=3e-3, warmup_steps=100, schedule="cosine", weight_decay=0.05,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0,
                   trainable=".*")
    c.train = dict(steps=3000, batch_size=64, accum_steps=1, eval_every=500,
                   checkpoint_every=500, keep_checkpoints=2, log_every=50, ema_decay=0.0,
                   eval_batch_size=128)
    return ml_collections.ConfigDict(c)
