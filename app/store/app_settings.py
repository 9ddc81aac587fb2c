"""What the app remembers between runs (QSettings), behind one enum of keys."""
from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from PySide6.QtCore import QSettings


class Key(str, Enum):
    GEOMETRY = "window/geometry"
    TAB = "window/tab"
    SPLITTERS = "window/splitters"  # every QSplitter's state, hex, in findChildren order
    DEMO_PROMPT = "demo/prompt"
    CHAT_DRAFT = "chat/draft"
    CHAT_SETTINGS = "chat/settings"  # the settings panel's values, as a preset's JSON
    CHAT_CTRL_ENTER = "chat/ctrl_enter_sends"
    CHAT_PANEL_OPEN = "chat/settings_panel_open"
    CHAT_TOOLS = "chat/mcp_servers"  # app.store.tool_settings.ToolSettings as JSON
    DRAFTER = "decode/drafter"
    DRAFT_LENGTH = "decode/draft_length"
    MODE = "decode/mode"
    TEMPERATURE = "decode/temperature"
    TOP_P = "decode/top_p"
    PRECISION = "decode/precision"
    MAX_NEW_TOKENS = "decode/max_new_tokens"
    CONTEXT = "models/context"
    MODEL_TARGET = "models/target_path"
    MODEL_DRAFTER = "models/drafter_path"


def default_qsettings() -> QSettings:
    """The platform's settings store; under TANDEM_HOME (tests, portable use) an ini file there."""
    home = os.environ.get("TANDEM_HOME")
    if home:
        return QSettings(str(Path(home) / "config" / "settings.ini"), QSettings.Format.IniFormat)
    return QSettings("Tandem", "Tandem")


class AppSettings:
    def __init__(self, settings: QSettings | None = None) -> None:
        self.q = settings or default_qsettings()

    def get(self, key: Key, default=None, kind=None):
        value = self.q.value(key.value, default)
        if kind is not None and value is not None:
            try:
                return kind(value)
            except (TypeError, ValueError):
                return default
        return value

    def set(self, key: Key, value) -> None:
        self.q.setValue(key.value, value)

    def sync(self) -> None:
        self.q.sync()
