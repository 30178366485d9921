# Sourced by demo.sh and test.sh: create .venv in the repo root when missing and install the
# package with the extras named in $VIT_EXTRAS. Reinstalls only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
STAMP="$VENV/.vit-installed"
WANT="$(sha256sum < "$ROOT/pyproject.toml" | cut -d' ' -f1) ${VIT_EXTRAS}"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  TARGET="$ROOT"
  [ -n "${VIT_EXTRAS}" ] && TARGET="$ROOT[${VIT_EXTRAS}]"
  echo "setup: installing $TARGET into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q -e "$TARGET"
  echo "$WANT" > "$STAMP"
fi
# The compare extra's timm reference (tests/timm_reference.py): timm imports torchvision, whose
# only registry build is a CUDA one whose import fails beside the CPU torch; installed among
# the packages it would break transformers' import too. So both go, pinned to the CPU torch's
# release and without dependencies, into a folder only the timm tests put on sys.path.
TIMM_REF="$VENV/timm-reference"
if [[ ",${VIT_EXTRAS}," == *",compare,"* ]] && [ ! -d "$TIMM_REF/timm" ]; then
  echo "setup: installing timm and torchvision into $TIMM_REF" >&2
  "$VENV/bin/python" -m pip install -q --no-deps --target "$TIMM_REF" "timm==1.0.31" \
    "torchvision==0.28.0"
fi
export PATH="$VENV/bin:$PATH"
