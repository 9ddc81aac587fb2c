#!/usr/bin/env bash
# Regenerate the README screenshots with the real default pair at its default precision (the GGUF file), offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=offscreen
export TANDEM_HOME="${TANDEM_HOME:-$(mktemp -d)}"  # a clean profile; models come from the real cache below
# The default pair lives in the user cache; point the clean profile's cache at it.
mkdir -p "$TANDEM_HOME"
ln -sfn "$(.venv/bin/python -c 'import platformdirs; print(platformdirs.user_cache_dir("tandem", appauthor=False))')" "$TANDEM_HOME/cache"
PY=.venv/bin/python
# The picker shot also lists one GGUF file "found" in an LM Studio folder: the default target's
# file, linked (not copied) under a scratch home.
SHOT_HOME="$(mktemp -d)"
LMS="$SHOT_HOME/.lmstudio/models/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
mkdir -p "$LMS"
ln -sfn "$TANDEM_HOME/cache/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" "$LMS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
HOME="$SHOT_HOME" LLAMA_CACHE="$SHOT_HOME/llama.cpp" OLLAMA_MODELS="$SHOT_HOME/ollama" \
  $PY -m app --tab models --select "LM Studio" --screenshot docs/screenshots/models.png
$PY -m app --max-new-tokens 160 --screenshot docs/screenshots/demo.png \
  --demo "Write a Python function that sorts a list of dictionaries by the 'age' key, then by 'name', and show an example call."
$PY -m app --max-new-tokens 120 --screenshot docs/screenshots/chat.png \
  --chat "Write a bash one-liner that counts lines in all .py files under src/."
