#!/usr/bin/env bash
# The whole story on the bundled digits (scikit-learn's 1,797 8x8 images; nothing downloads):
# train a small ViT from scratch, evaluate it on the held-out test split, classify a few test
# digits from PNG files with the saved checkpoint, and print where everything is.
# A run already in runs/demo is resumed (or, when finished, just evaluated again);
# delete runs/demo for a fresh one.
set -euo pipefail
cd "$(dirname "$0")/.."
VIT_EXTRAS="" source scripts/setup_env.sh
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
RUN=runs/demo
START=$(date +%s)

if [ -d "$RUN/checkpoints" ]; then
  echo "== demo: $RUN exists: resuming it (rm -rf $RUN for a fresh run)"
else
  echo "== demo: training configs/digits.py from scratch into $RUN"
fi
vit train --config configs/digits.py --workdir "$RUN"

echo "== demo: test accuracy (360 held-out digits, never seen in training or model selection)"
vit eval --workdir "$RUN" --split test

echo "== demo: classifying 6 test digits from PNG files with the saved checkpoint"
mkdir -p "$RUN/digits"
python - "$RUN/digits" <<'PY'
import sys
from pathlib import Path

from PIL import Image

from vit.data import open_source

out = Path(sys.argv[1])
(out / "enlarged").mkdir(exist_ok=True)
test = open_source("digits", "test")
for i in range(6):
    item = test[i]
    # 8x8, as the model sees them; a 64x64 copy to look at.
    Image.fromarray(item["image"]).save(out / f"test{i}_label{item['label']}.png")
    Image.fromarray(item["image"]).resize((64, 64), Image.NEAREST).save(
        out / "enlarged" / f"test{i}_label{item['label']}.png")
PY
vit predict "$RUN"/digits/*.png --checkpoint "$RUN" --top-k 3

echo "== demo: attention rollout for 8 test digits, with an HTML gallery"
vit rollout --checkpoint "$RUN" --data digits --split test --limit 8 --method rollout \
  --out "$RUN/rollout" --html

echo "== demo: done in $(( $(date +%s) - START )) s"
echo "  checkpoints    $RUN/checkpoints (best: $RUN/checkpoints/best.json)"
echo "  metrics        $RUN/metrics.jsonl"
echo "  curves         $RUN/curves.png"
echo "  test results   $RUN/eval_test/eval.json, confusion matrix $RUN/eval_test/confusion.png"
echo "  digit images   $RUN/digits/ (8x8 as classified; enlarged/ to look at)"
echo "  rollout        $RUN/rollout/index.html (overlays/, maps/, manifest.jsonl)"
