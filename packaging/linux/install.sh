#!/usr/bin/env bash
# Put Tandem in the user's applications menu (no root): the app folder, a launcher, the icons and
# the AppStream metadata under ~/.local/share (XDG_DATA_HOME).
#
# usage: install.sh [--link] [APP_DIR]      install (APP_DIR: the folder holding tandem-app)
#        install.sh --uninstall             remove everything install.sh put there
#
# By default the app folder is copied to $XDG_DATA_HOME/tandem/app, so the download can be deleted;
# --link makes the launcher run the app where it is instead. The copy shipped inside the app
# folder finds its own folder; from a checkout the default is dist/Tandem.
set -euo pipefail
ID=io.github.tandem.Tandem
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
TARGET="$DATA/tandem/app"
here="$(cd "$(dirname "$0")" && pwd)"

refresh() {  # menus and icon caches pick up changes faster; harmless where the tools are missing
  command -v update-desktop-database >/dev/null && update-desktop-database -q "$DATA/applications" || true
  command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$DATA/icons/hicolor" 2>/dev/null || true
}

if [ "${1:-}" = "--uninstall" ]; then
  rm -rf "$TARGET"
  rm -f "$DATA/applications/$ID.desktop" "$DATA/metainfo/$ID.metainfo.xml" "$DATA/icons/hicolor/scalable/apps/$ID.svg"
  rm -f "$DATA"/icons/hicolor/*/apps/"$ID".png
  refresh
  echo "Tandem removed from the menu (your models, chats and settings are kept)."
  exit 0
fi

link=0
if [ "${1:-}" = "--link" ]; then link=1; shift; fi
if [ -n "${1:-}" ]; then app="$1"
elif [ -x "$here/tandem-app" ]; then app="$here"
else app="$here/../../dist/Tandem"
fi
app="$(cd "$app" && pwd)"
[ -x "$app/tandem-app" ] || { echo "no tandem-app in $app: build it with make package" >&2; exit 2; }
resources="$app/_internal/resources"

if [ "$link" = 0 ] && [ "$app" != "$TARGET" ]; then
  echo "==> copying the app to $TARGET"
  rm -rf "$TARGET"
  mkdir -p "$(dirname "$TARGET")"
  cp -a "$app" "$TARGET"
  app="$TARGET"
  resources="$app/_internal/resources"
fi

mkdir -p "$DATA/applications" "$DATA/metainfo" "$DATA/icons/hicolor/scalable/apps"
# The launcher runs this copy of the app by its absolute path (~/.local/bin is not always on
# the PATH a desktop session gives to menus).
sed "s|^Exec=.*|Exec=\"$app/tandem-app\"|" "$resources/linux/$ID.desktop" > "$DATA/applications/$ID.desktop"
cp "$resources/linux/$ID.metainfo.xml" "$DATA/metainfo/"
cp "$resources/icons/tandem.svg" "$DATA/icons/hicolor/scalable/apps/$ID.svg"
for png in "$resources"/icons/hicolor/*/apps/tandem.png; do
  size="$(basename "$(dirname "$(dirname "$png")")")"
  mkdir -p "$DATA/icons/hicolor/$size/apps"
  cp "$png" "$DATA/icons/hicolor/$size/apps/$ID.png"
done
refresh
echo "Tandem is in your applications menu ($DATA/applications/$ID.desktop -> $app/tandem-app)."
