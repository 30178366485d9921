"""Fine-tune on your own images: `root/<class>/*.jpg` (or `root/train/<class>/...` and
`root/val/<class>/...`). Starts from a pretrained checkpoint given with `--init` or `init`.
The compute dtype is `auto`: bfloat16 (float32 parameters, as big_vision) on a GPU, a TPU
or a CPU with bfloat16 arithmetic, float32 on other CPUs; the run prints its choice.

    vit train --config configs/imagefolder.py --workdir runs/mine \
        --set data.name=/path/to/images --init /path/to/vit_b16_checkpoint
    vit eval --workdir runs/mine --split validation

The result depends on your images; no figure is recorded for this recipe. Without a checkpoint it
trains the B/16 below from scratch (slow to converge on small data).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="/path/to/images")
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False)  # bf16 compute where it pays, f32 params
    # mean/std (unset): the starting checkpoint's normalisation ([-1, 1] from scratch).
    c.input = dict(crop_area=[0.25, 1.0], label_smoothing=0.1)
    c.train = dict(steps=2000, log_every=20, eval_batch_size=64)
    return c
