#!/usr/bin/env bash
# Text conditioning end to end on `promptshapes` (generated offline, nothing downloads):
# train the three stages of configs/promptshapes.py (ViT on the scenes' colours and shapes,
# then the text encoder + patch prompt head with the ViT frozen, then the top blocks too),
# evaluate answers with the shuffled/null-prompt and blank-image controls and the held-out
# colour-shape pairs, ask a scene several questions, and export rollout maps for a prompt.
# A run already in runs/demo_text is resumed (finished stages are skipped); delete it for a
# fresh one.
set -euo pipefail
cd "$(dirname "$0")/.."
VIT_EXTRAS="" source scripts/setup_env.sh
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
RUN=runs/demo_text
START=$(date +%s)

echo "== demo_text: training configs/promptshapes.py (3 stages) into $RUN"
vit train --config configs/promptshapes.py --workdir "$RUN"

echo "== demo_text: answer accuracy, controls (chance 0.5) and unseen colour-shape pairs"
vit eval --workdir "$RUN" --split test

echo "== demo_text: asking test scenes several questions"
mkdir -p "$RUN/scenes"
python - "$RUN/scenes" <<'PY'
import sys
from pathlib import Path

from PIL import Image

from vit.data.promptshapes import CLASS_NAMES, generate

out = Path(sys.argv[1])
test = generate("test")
for i in range(3):
    present = [CLASS_NAMES[j] for j in range(len(CLASS_NAMES)) if test.labels[i, j]]
    name = f"scene{i}_" + "_".join(p.replace(" ", "-") for p in present) + ".png"
    Image.fromarray(test.images[i]).save(out / name)
PY
vit predict "$RUN"/scenes/*.png --checkpoint "$RUN" \
  --prompt "is there a red circle?" --prompt "is there a purple cross?" \
  --prompt "is there a white cross?" --prompt "is there a red square?"

echo "== demo_text: which patches drove the answer"
vit rollout "$RUN"/scenes/*.png --checkpoint "$RUN" --prompt "is there a red circle?" \
  --method relevancy --out "$RUN/rollout" --html

echo "== demo_text: done in $(( $(date +%s) - START )) s"
echo "  stages         $RUN/stages/ (vit, text) and $RUN (tune, the final model)"
echo "  metrics        $RUN/metrics.jsonl, $RUN/stages/*/metrics.jsonl"
echo "  test results   $RUN/eval_test/eval.json"
echo "  scenes         $RUN/scenes/ (file names list what each holds)"
echo "  rollout        $RUN/rollout/index.html (overlays/, maps/, manifest.jsonl with token scores)"
