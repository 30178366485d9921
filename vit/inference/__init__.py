"""Running a trained model: prediction, evaluation and what makes their start-up fast.

- `predictor`: `Predictor` (top-k classes, prompt probabilities or zero-shot names for image
  files, one compiled forward) and `load_pretrained`;
- `prompts`: texts for a text model (`--prompt`, `--text-embeddings`, `--zero-shot` names);
- `prepared`: prepared classifiers on disk (weights in our layout and an exported forward), and
  `warm_start`: `vit predict`'s checkpoint opened from one when stored, else cold;
- `compile_cache`: JAX's persistent compilation cache for the commands;
- `evaluate`: the figures shared by `vit eval` and training's validation.

Import submodules directly; this package imports nothing by itself.
"""
