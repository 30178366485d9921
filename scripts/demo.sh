#!/usr/bin/env bash
# Placeholder until the fine-tuning work lands: sets up .venv and shows the model family.
set -euo pipefail
cd "$(dirname "$0")/.."
VIT_EXTRAS="" source scripts/setup_env.sh
echo "demo: training, prediction and rollout are not wired in yet; showing the model family:"
for name in vit_ti16 vit_b16; do vit info "$name"; done
