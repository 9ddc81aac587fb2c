"""Light and dark themes that follow the system's colour scheme (Qt 6.5+ QStyleHints)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette


def dark_palette() -> QPalette:
    p = QPalette()
    colors = {
        QPalette.ColorRole.Window: "#202124", QPalette.ColorRole.WindowText: "#e8eaed",
        QPalette.ColorRole.Base: "#292a2d", QPalette.ColorRole.AlternateBase: "#303134",
        QPalette.ColorRole.Text: "#e8eaed", QPalette.ColorRole.Button: "#303134",
        QPalette.ColorRole.ButtonText: "#e8eaed", QPalette.ColorRole.Highlight: "#8ab4f8",
        QPalette.ColorRole.HighlightedText: "#202124", QPalette.ColorRole.ToolTipBase: "#303134",
        QPalette.ColorRole.ToolTipText: "#e8eaed", QPalette.ColorRole.PlaceholderText: "#9aa0a6",
        QPalette.ColorRole.Link: "#8ab4f8",
    }
    for role, color in colors.items():
        p.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6f7378"))
    return p


def is_dark(scheme: Qt.ColorScheme) -> bool:
    return scheme == Qt.ColorScheme.Dark


def apply_theme(app: QGuiApplication, scheme: Qt.ColorScheme | None = None) -> bool:
    """Apply the palette for ``scheme`` (the system's when None); True when dark."""
    scheme = app.styleHints().colorScheme() if scheme is None else scheme
    dark = is_dark(scheme)
    app.setPalette(dark_palette() if dark else app.style().standardPalette() if hasattr(app, "style") else QPalette())
    return dark


def follow_system(app: QGuiApplication) -> None:
    """Apply now and again whenever the system switches between light and dark."""
    apply_theme(app)
    app.styleHints().colorSchemeChanged.connect(lambda scheme: apply_theme(app, scheme))
