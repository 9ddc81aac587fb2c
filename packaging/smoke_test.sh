#!/usr/bin/env bash
# Smoke test of the built app folder (make package-smoke). Headless, about a minute:
#  1. tandem-app --self-test: a tiny model pair, generated with and without speculation, outputs
#     identical, screenshot written, exit 0, every CPU kernel the compiled one (on AVX2); with the user's real dirs, so it also shows that the
#     bundle finds the same cache (default model pair) and Hugging Face cache as a source install
#  2. a hard crash (SIGSEGV) of the running app leaves a readable traceback in crash.log
#  3. install.sh puts a launcher and metainfo that desktop-file-validate / appstreamcli accept
#
# usage: packaging/smoke_test.sh [APP_DIR]      (default: dist/Tandem)
set -euo pipefail
cd "$(dirname "$0")/.."
app="${1:-dist/Tandem}"
[ -x "$app/tandem-app" ] || { echo "no $app/tandem-app: run make package first" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export QT_QPA_PLATFORM=offscreen
ID=io.github.tandem.Tandem

echo "==> 1. self-test"
start=$(date +%s)
timeout 900 "$app/tandem-app" --self-test "$tmp/self-test.png" >"$tmp/out.txt" 2>"$tmp/err.txt" || {
  echo "FAILED (exit $?)"; cat "$tmp/out.txt"; tail -n 40 "$tmp/err.txt"; exit 1; }
cat "$tmp/out.txt"
[ -s "$tmp/self-test.png" ] || { echo "FAILED: no screenshot"; exit 1; }
# On an AVX2 machine every CPU kernel must be the compiled one the bundle ships (prebuilt/).
if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -q "CPU kernels:.*reference" "$tmp/out.txt"; then
  echo "FAILED: a CPU kernel fell back to the reference (not shipped in prebuilt/?)"; exit 1
fi
echo "    passed in $(( $(date +%s) - start )) s, screenshot $(stat -c %s "$tmp/self-test.png") bytes"

echo "==> 2. crash log"
TANDEM_HOME="$tmp/home" "$app/tandem-app" --tab models >"$tmp/crash-out.txt" 2>&1 &
pid=$!
for _ in $(seq 120); do  # wait until the window is up (the log says so), then crash it
  grep -q "machine probe\|MachineReport\|INFO" "$tmp/home/log/tandem.log" 2>/dev/null && break
  sleep 0.5
done
sleep 2
kill -SEGV "$pid"
wait "$pid" && { echo "FAILED: the app survived SIGSEGV"; exit 1; } || true
if grep -q "Fatal Python error: Segmentation fault" "$tmp/home/log/crash.log"; then
  echo "    crash.log: $(grep -c 'File "' "$tmp/home/log/crash.log") stack lines, e.g.:"
  grep -m 3 'File "' "$tmp/home/log/crash.log" | sed 's/^/      /'
else
  echo "FAILED: crash.log has no traceback"; cat "$tmp/home/log/crash.log"; exit 1
fi

echo "==> 3. install into the menu (into a temporary XDG_DATA_HOME)"
XDG_DATA_HOME="$tmp/data" "$app/install.sh" --link "$app"
desktop-file-validate "$tmp/data/applications/$ID.desktop"
appstreamcli validate --no-net "$tmp/data/metainfo/$ID.metainfo.xml"
grep "^Exec=" "$tmp/data/applications/$ID.desktop" | sed 's/^/    /'
ls "$tmp/data/icons/hicolor" | tr '\n' ' ' | sed 's/^/    icons: /'; echo

echo "==> smoke test passed: $app ($(du -sh "$app" | cut -f1))"
