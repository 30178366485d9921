"""Fine-tune on your own images: `root/<class>/*.jpg` (or `root/train/<class>/...` and
`root/val/<class>/...`). Starts from a pretrained checkpoint given with `--init` or `init`.

    vit train --config configs/imagefolder.py --workdir runs/mine \
        --set data.name=/path/to/images --init /path/to/vit_b16_checkpoint

Without a checkpoint it trains the `model` below from scratch (slow to converge on small data).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = ""
    c.data = dict(name="/path/to/images", data_dir=None, train_split="train",
                  val_split="validation", test_split="test", strict=False, num_threads=4)
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="bfloat16", remat=False)  # bf16 compute, f32 params (big_vision)
    # mean/std None: the starting checkpoint's normalisation ([-1, 1] when training from scratch).
    c.input = dict(image_size=224, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.25, 1.0], flip=True, shift=0.0, rotate=0.0,
                   scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.1)
    c.optim = dict(name="sgd", lr=0.01, warmup_steps=100, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0,
                   trainable=".*")
    c.train = dict(steps=2000, batch_size=64, accum_steps=1, eval_every=200,
                   checkpoint_every=200, keep_checkpoints=2, log_every=20, ema_decay=0.0,
                   eval_batch_size=64)
    return ml_collections.ConfigDict(c)
