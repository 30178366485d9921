"""Oxford-IIIT Pets from a pretrained ViT: big_vision's transfer recipe
(big_vision/configs/transfer.py): SGD momentum 0.9, lr 0.01, 500 steps with 100 warmup, cosine,
batch 512, global-norm clipping at 1.0, 224 px, `train[:90%]` / `train[90%:]`.

    tfds build oxford_iiit_pet --file_format=array_record   # once, needs TensorFlow
    vit train --config configs/pets_finetune.py --workdir runs/pets --init ViT-B_16.npz
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = ""
    c.data = dict(name="tfds:oxford_iiit_pet", data_dir=None, train_split="train[:90%]",
                  val_split="train[90%:]", test_split="test", strict=False, num_threads=8)
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="bfloat16", remat=False)  # bf16 compute, f32 params (big_vision)
    c.input = dict(image_size=224, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.05, 1.0], flip=True, shift=0.0,
                   rotate=0.0, scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.0)
    c.optim = dict(name="sgd", lr=0.01, warmup_steps=100, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0,
                   trainable=".*")
    c.train = dict(steps=500, batch_size=512, accum_steps=4, eval_every=100,
                   checkpoint_every=100, keep_checkpoints=2, log_every=10, ema_decay=0.0,
                   eval_batch_size=256)
    return ml_collections.ConfigDict(c)
