"""The chat's conversation list actions: search, rename, delete with undo, export and import.

A mixin of ChatView (app/chat/chat_view.py), which owns the widgets and the list of conversations;
kept apart so each file holds one concern.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.chat_widgets import NoticeBar
from app.store import conversation_io
from app.store.conversations import Conversation

UNDO_SECONDS = 8  # how long the "Deleted — Undo" bar stays


def matches(conversation: Conversation, query: str) -> bool:
    """Case-insensitive search over the title, the system prompt and every message."""
    q = query.strip().lower()
    return not q or q in conversation.title.lower() or q in conversation.system_prompt.lower() or any(
        q in m["content"].lower() for m in conversation.messages)



class ConversationActions:
    """Needs: store, conversations, current, running, list, search, undo_bar, stats, deleted,
    new_chat(), _save_current()."""

    # --- conversations ------------------------------------------------------------------------
    def _build_library(self) -> QWidget:
        """The list column: search, New chat, the conversations, Delete (with its undo bar) and
        the export / import menu."""
        left = QWidget()
        left_col = QVBoxLayout(left)
        left_col.setContentsMargins(0, 0, 0, 0)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.new_button = QPushButton("New chat")
        self.list = QListWidget()
        self.list.setEditTriggers(QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed)
        self.delete_button = QPushButton("Delete")
        self.more_button = QToolButton()
        self.more_button.setText("Export / import ▾")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more_button.setMenu(self._conversation_menu())
        self.undo_bar = NoticeBar("Undo", "#fef7e0")
        buttons = QHBoxLayout()
        buttons.addWidget(self.delete_button)
        buttons.addWidget(self.more_button)
        for w in (self.search, self.new_button, self.list):
            left_col.addWidget(w, 1 if w is self.list else 0)
        left_col.addWidget(self.undo_bar)
        left_col.addLayout(buttons)
        self.new_button.clicked.connect(self.new_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.undo_bar.action.connect(self.undo_delete)
        self.undo_bar.closed.connect(self._forget_deleted)
        self.list.currentRowChanged.connect(self._select)
        self.list.itemChanged.connect(self._renamed)
        self.search.textChanged.connect(self._filter)
        return left

    def _conversation_menu(self) -> QMenu:
        menu = QMenu(self)
        menu.addAction("Rename chat", self.rename_current)
        menu.addSeparator()
        menu.addAction("Export chat as Markdown…", lambda: self._ask_export(".md", everything=False))
        menu.addAction("Export chat as JSON…", lambda: self._ask_export(".json", everything=False))
        menu.addAction("Export all chats as Markdown…", lambda: self._ask_export(".md", everything=True))
        menu.addAction("Export all chats as JSON…", lambda: self._ask_export(".json", everything=True))
        menu.addSeparator()
        menu.addAction("Import chats from JSON…", self._ask_import)
        return menu

    def _fill_list(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for c in self.conversations:
            item = QListWidgetItem(c.title)
            item.setToolTip(c.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
        if self.current in self.conversations:
            self.list.setCurrentRow(self.conversations.index(self.current))
        self.list.blockSignals(False)
        self._filter(self.search.text())

    def _filter(self, query: str) -> None:
        for row, c in enumerate(self.conversations):
            self.list.item(row).setHidden(not matches(c, query))

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def rename_current(self) -> None:
        if self.current in self.conversations:
            self.list.editItem(self.list.item(self.conversations.index(self.current)))

    def rename(self, conversation: Conversation, title: str) -> None:
        title = " ".join(title.split())[:120]
        if not title or title == conversation.title:
            self._fill_list()  # an empty name puts the old one back
            return
        conversation.title = title
        if conversation.messages:
            self.store.save(conversation)
        self._fill_list()

    def _renamed(self, item: QListWidgetItem) -> None:
        row = self.list.row(item)
        if 0 <= row < len(self.conversations):
            QTimer.singleShot(0, lambda c=self.conversations[row], t=item.text(): self.rename(c, t))

    def delete_chat(self) -> None:
        if self.running or self.current is None:
            return
        self._forget_deleted()
        row = self.conversations.index(self.current)
        data = self.store.delete(self.current.id)
        self.deleted = (self.current, data, row)
        self.conversations.remove(self.current)
        self.undo_bar.show_message(f"Deleted “{self.current.title}”", UNDO_SECONDS)
        self.current = None
        self._fill_list()
        if self.conversations:
            self.list.setCurrentRow(min(row, len(self.conversations) - 1))
        else:
            self.new_chat()

    def undo_delete(self) -> None:
        if self.deleted is None or self.running:
            return
        conversation, data, row = self.deleted
        self.deleted = None
        if data is not None:
            conversation = self.store.restore(conversation.id, data)
        if self.current is not None and not self.current.messages and self.current in self.conversations:
            self.conversations.remove(self.current)  # the empty chat deleting the last one opened
        self.conversations.insert(min(row, len(self.conversations)), conversation)
        self.current = None
        self._fill_list()
        self.list.setCurrentRow(self.conversations.index(conversation))

    def _forget_deleted(self) -> None:
        self.deleted = None

    def saved_conversations(self) -> list[Conversation]:
        return [c for c in self.conversations if c.messages]

    def export(self, path: Path, everything: bool = False) -> Path:
        chosen = self.saved_conversations() if everything else [self.current]
        return conversation_io.export([c for c in chosen if c is not None], path)

    def import_file(self, path: Path) -> list[Conversation]:
        imported = conversation_io.read_import(Path(path), {c.id for c in self.conversations})
        for c in imported:
            self.store.save(c)
        self.conversations[:0] = imported
        self._fill_list()
        if imported:
            self.list.setCurrentRow(0)
        return imported

    def _ask_export(self, suffix: str, everything: bool) -> None:
        name = "tandem-chats" if everything else (self.current.title if self.current else "chat")
        kind = "Markdown (*.md)" if suffix == ".md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path.home() / f"{name}{suffix}"), kind)
        if path:
            self.export(Path(path), everything)
            self.stats.setText(f"exported to {path}")

    def _ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chats", str(Path.home()), "JSON (*.json)")
        if not path:
            return
        try:
            n = len(self.import_file(Path(path)))
        except (OSError, ValueError) as exc:
            self.stats.setText(f"could not import {Path(path).name}: {exc}")
            return
        self.stats.setText(f"imported {n} chat{'s' if n != 1 else ''}")
