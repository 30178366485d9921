"""Oxford-IIIT Pets from a pretrained ViT: big_vision's transfer recipe
(big_vision/configs/transfer.py): SGD momentum 0.9, lr 0.01, 500 steps with 100 warmup, cosine,
batch 512, global-norm clipping at 1.0, 224 px, `train[:90%]` / `train[90%:]`.
The compute dtype is `auto`: bfloat16 (float32 parameters, as big_vision) on a GPU, a TPU
or a CPU with bfloat16 arithmetic, float32 on other CPUs; the run prints its choice.

    tfds build oxford_iiit_pet --file_format=array_record   # once, needs TensorFlow
    vit train --config configs/pets_finetune.py --workdir runs/pets --init ViT-B_16.npz
    vit eval --workdir runs/pets --split test

No figure of ours is recorded for this recipe yet (it needs a GPU and the TFDS data).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="tfds:oxford_iiit_pet", train_split="train[:90%]",
                  val_split="train[90%:]", num_threads=8)
    c.model = dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False)  # bf16 compute where it pays, f32 params
    c.train = dict(steps=500, batch_size=512, accum_steps=4, eval_every=100,
                   checkpoint_every=100, log_every=10, eval_batch_size=256)
    return c
