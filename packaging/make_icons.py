"""Render resources/icons/tandem.svg into every icon file a platform wants, with Qt only.

Writes hicolor PNGs (resources/icons/hicolor/NxN/apps/tandem.png, for the Linux menu and the
install script), packaging/macos/tandem.icns and packaging/windows/tandem.ico. Both container
formats are written by hand with PNG payloads (supported since macOS 10.7 and Windows Vista), so
no iconutil, ImageMagick or Pillow is needed. The outputs are committed; rerun after editing the
SVG:  QT_QPA_PLATFORM=offscreen python packaging/make_icons.py
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "icons" / "tandem.svg"
HICOLOR_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
# icns element types with PNG data, by pixel size (the @2x variants reuse the larger renders).
ICNS_TYPES = (("icp4", 16), ("icp5", 32), ("icp6", 64), ("ic07", 128), ("ic08", 256), ("ic09", 512),
              ("ic10", 1024), ("ic11", 32), ("ic12", 64), ("ic13", 256), ("ic14", 512))
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(renderer: QSvgRenderer, size: int) -> bytes:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data)


def icns(pngs: dict[int, bytes]) -> bytes:
    body = b"".join(kind.encode() + struct.pack(">I", 8 + len(pngs[size])) + pngs[size] for kind, size in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def ico(pngs: dict[int, bytes]) -> bytes:
    header = struct.pack("<HHH", 0, 1, len(ICO_SIZES))
    offset = len(header) + 16 * len(ICO_SIZES)
    entries, blobs = b"", b""
    for size in ICO_SIZES:
        data = pngs[size]
        side = 0 if size == 256 else size  # 0 means 256 in the directory entry
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(data), offset + len(blobs))
        blobs += data
    return header + entries + blobs


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QPainter needs it)
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        print(f"cannot read {SVG}", file=sys.stderr)
        return 1
    sizes = sorted(set(HICOLOR_SIZES) | {s for _, s in ICNS_TYPES} | set(ICO_SIZES))
    pngs = {size: render(renderer, size) for size in sizes}
    for size in HICOLOR_SIZES:
        path = ROOT / "resources" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "tandem.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pngs[size])
    (ROOT / "packaging" / "macos").mkdir(exist_ok=True)
    (ROOT / "packaging" / "macos" / "tandem.icns").write_bytes(icns(pngs))
    (ROOT / "packaging" / "windows").mkdir(exist_ok=True)
    (ROOT / "packaging" / "windows" / "tandem.ico").write_bytes(ico(pngs))
    print(f"wrote {len(HICOLOR_SIZES)} hicolor PNGs, tandem.icns and tandem.ico from {SVG.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
