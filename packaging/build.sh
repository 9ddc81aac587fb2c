#!/usr/bin/env bash
# Build the Linux app folder dist/Tandem with PyInstaller (see packaging/README.md).
#
# usage: packaging/build.sh [PROJECT_PYTHON]     (default: .venv/bin/python, made by make setup)
#
# The bundle is built from exactly the packages the project venv holds (the ones the tests ran
# against): a separate build venv (build/venv) gets PyInstaller and sees the project venv's
# site-packages through a .pth file, so PyInstaller never lands in the project venv and torch
# is not downloaded twice. The checkout's own app/engine/kernels are bundled, not any installed copy.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT_PYTHON="${1:-.venv/bin/python}"
BUILD_VENV=build/venv
NICE="${NICE:-nice -n 10}"  # shared build machines: stay out of the way of interactive work

if [ ! -x "$PROJECT_PYTHON" ]; then
  echo "no project python at $PROJECT_PYTHON: run make setup first, or pass one" >&2
  exit 2
fi
# purelib and platlib differ on some distributions (lib vs lib64): the .pth lists both.
site="$("$PROJECT_PYTHON" -c 'import sysconfig; p = sysconfig.get_paths(); print("\n".join(dict.fromkeys([p["purelib"], p["platlib"]])))')"
base="$("$PROJECT_PYTHON" -c 'import sys; print(sys._base_executable)')"
if [ ! -x "$BUILD_VENV/bin/python" ]; then
  echo "==> creating $BUILD_VENV (PyInstaller, layered on the project venv)"
  "$base" -m venv "$BUILD_VENV"
fi
pth="$("$BUILD_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_tandem_project.pth"
echo "$site" > "$pth"
"$BUILD_VENV/bin/pip" install --quiet --disable-pip-version-check -r packaging/requirements-build.txt

echo "==> building dist/Tandem (several minutes)"
start=$(date +%s)
rm -rf dist/Tandem
# Qt must not look for a display while the hooks import PySide6 during analysis.
QT_QPA_PLATFORM=offscreen $NICE "$BUILD_VENV/bin/pyinstaller" --noconfirm --clean --log-level WARN \
  --distpath dist --workpath build/pyinstaller packaging/tandem.spec
cp packaging/linux/install.sh dist/Tandem/install.sh
# torch's wheel keeps the full symbol table in its libraries (~90 MB in libtorch_cpu.so alone);
# the dynamic symbols that loading needs survive --strip-unneeded. Only torch's own libraries:
# stripping everything (PyInstaller's strip=True) is a risk the smoke test would have to cover.
if command -v strip >/dev/null; then
  strip --strip-unneeded dist/Tandem/_internal/torch/lib/*.so* 2>/dev/null || true
fi
seconds=$(( $(date +%s) - start ))

size="$(du -sh dist/Tandem | cut -f1)"
echo "==> built dist/Tandem in ${seconds} s: ${size} (binary: dist/Tandem/tandem-app)"
echo "    smoke test: make package-smoke    install into the menu: dist/Tandem/install.sh"
