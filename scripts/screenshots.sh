#!/usr/bin/env bash
# Regenerate the README screenshots with the real default pair, offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=offscreen
export TANDEM_HOME="${TANDEM_HOME:-$(mktemp -d)}"  # a clean profile; models come from the real cache below
# The default pair lives in the user cache; point the clean profile's cache at it.
mkdir -p "$TANDEM_HOME"
ln -sfn "$(.venv/bin/python -c 'import platformdirs; print(platformdirs.user_cache_dir("tandem", appauthor=False))')" "$TANDEM_HOME/cache"
PY=.venv/bin/python
$PY -m app --tab models --screenshot docs/screenshots/models.png
$PY -m app --precision fast --max-new-tokens 160 --screenshot docs/screenshots/demo.png \
  --demo "Write a Python function that sorts a list of dictionaries by the 'age' key, then by 'name', and show an example call."
$PY -m app --precision fast --max-new-tokens 120 --screenshot docs/screenshots/chat.png \
  --chat "Write a bash one-liner that counts lines in all .py files under src/."
