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
export PATH="$VENV/bin:$PATH"
