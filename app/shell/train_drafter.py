"""Model > "Train a drafter for this model…": an EAGLE-3 drafter trained here for the loaded model,
on its own replies to the shipped prompts and, if the person ticks the box, to the messages of
their saved chats (engine.distill, through app.bridge.distill_jobs), as `tandem distill` does.

The dialog says what it will do and how long it expects it to take; the training runs as the
window's job (the status strip shows its phase, progress and time left, and its Cancel stops it
keeping the best drafter so far); a notice then offers to load the model with the new drafter,
which the side-by-side demo races against plain decoding.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
)

from app.bridge.distill_jobs import CONVERSATION_TURNS, default_drafter_folder, train_drafter
from app.bridge.messages import DrafterTrained

DEFAULT_MINUTES = 20.0
REPLY_TOKENS = 160  # tokens of each reply the model writes for the data (`tandem distill`'s default)


def prompt_count() -> int:
    """The shipped prompts the model answers for the data (a JSONL line each)."""
    from engine.cli.distill import DEFAULT_PROMPTS

    return sum(1 for line in Path(DEFAULT_PROMPTS).read_text().splitlines() if line.strip())


def expected_minutes(train_minutes: float, prompts: int, reply_tokens: int, decode_tok_s: float | None) -> float | None:
    """Data then training: the replies are written a token a pass, at the model's plain rate
    (None when no rate was measured here yet)."""
    if not decode_tok_s:
        return None
    return prompts * reply_tokens / decode_tok_s / 60 + train_minutes


def sent_messages(conversations) -> int:
    """Messages the person sent across ``conversations`` (app.store.conversations.Conversation)."""
    return sum(1 for c in conversations for m in c.messages if m["role"] == "user")


class TrainDrafterDialog(QDialog):
    def __init__(self, parent, model_name: str, out: Path, decode_tok_s: float | None, chats: int = 0,
                 chat_messages: int = 0) -> None:
        super().__init__(parent)
        self.setWindowTitle("Train a drafter for this model")
        self.prompts, self.decode_tok_s = prompt_count(), decode_tok_s
        self.chat_turns = min(chat_messages, CONVERSATION_TURNS)
        intro = QLabel(
            f"Tandem can train an EAGLE-3 drafter for <b>{model_name}</b> on this machine: a small layer that reads "
            f"the model's own hidden states and learns to guess its next tokens. The model first writes replies to "
            f"{self.prompts} prompts ({REPLY_TOKENS} tokens each) to learn from, then the drafter trains for the "
            f"time you choose. You can cancel at any time: the best drafter so far is kept, and starting again "
            f"resumes where it stopped.")
        intro.setWordWrap(True)
        self.minutes = QDoubleSpinBox()
        self.minutes.setRange(1, 600)
        self.minutes.setDecimals(0)
        self.minutes.setSuffix(" min")
        self.minutes.setValue(DEFAULT_MINUTES)
        self.expected = QLabel()
        self.expected.setWordWrap(True)
        where = QLabel(f"Saved in {out}" + (" (an earlier run there is resumed)" if (out / "training").is_dir() else ""))
        where.setWordWrap(True)
        where.setStyleSheet("color: #555;")
        # Opt-in, off by default: the chats are the person's own words and files.
        more = f"the newest {self.chat_turns} of your {chat_messages}" if chat_messages > self.chat_turns else f"your {chat_messages}"
        self.use_chats = QCheckBox(f"Also learn from my saved chats ({chats} conversation{'s' if chats != 1 else ''}: "
                                   f"the model answers {more} messages)")
        self.use_chats.setEnabled(chat_messages > 0)
        self.use_chats.setToolTip("Makes the drafter better at what you actually ask. Your chats are read on this "
                                  "machine only; what is made from them stays in the drafter's training folder.")
        form = QFormLayout()
        form.addRow("Training time", self.minutes)
        form.addRow("", self.use_chats)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.start_button = buttons.addButton("Start training", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col = QVBoxLayout(self)
        for w in (intro,):
            col.addWidget(w)
        col.addLayout(form)
        col.addWidget(self.expected)
        col.addWidget(where)
        col.addWidget(buttons)
        self.minutes.valueChanged.connect(self._show_expected)
        self.use_chats.toggled.connect(self._show_expected)
        self._show_expected()
        self.resize(560, self.sizeHint().height())

    def _show_expected(self) -> None:
        prompts = self.prompts + (self.chat_turns if self.use_chats.isChecked() else 0)
        total = expected_minutes(self.minutes.value(), prompts, REPLY_TOKENS, self.decode_tok_s)
        data = prompts * REPLY_TOKENS
        if total is None:
            self.expected.setText(f"Writing the {data:,} tokens of replies takes what the model needs to decode them here "
                                  f"(the status bar shows the time left once it starts), then {self.minutes.value():.0f} min "
                                  "of training. The model stays busy meanwhile.")
        else:
            train = self.minutes.value()
            self.expected.setText(f"About {total:.0f} min in all: {total - train:.0f} min for the {data:,} tokens of replies "
                                  f"at the {self.decode_tok_s:.0f} tok/s measured here, then {train:.0f} min of training. "
                                  "The model stays busy meanwhile.")


class TrainedNotice(QFrame):
    """Where the drafter is and what it reached, with a button that loads the model with it."""

    def __init__(self) -> None:
        super().__init__()
        self.setStyleSheet("TrainedNotice { background: #e6f4ea; border-radius: 4px; } QLabel { color: #0d5223; }")
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.use_button = QPushButton("Load the model with it")
        close = QPushButton("×")
        close.setFlat(True)
        close.setFixedWidth(28)
        close.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.text, 1)
        row.addWidget(self.use_button)
        row.addWidget(close)
        self.hide()


def _plain_rate(window) -> float | None:
    """The plain decoding rate the demo last measured on the loaded model, if it ran."""
    stats = window.demo.last.get("plain")
    return stats.tok_per_s if stats is not None and stats.tok_per_s > 0 else None


def install(window):
    """The Model menu's action (enabled while a model of this machine is loaded) and the notice."""
    menu = window.menuBar().addMenu("&Model")
    window.menuBar().insertMenu(window.menuBar().actions()[-2], menu)  # before Help
    action = menu.addAction("&Train a drafter for this model…", lambda: ask_and_train(window))
    action.setEnabled(False)
    window.model_loaded.connect(lambda loaded: action.setEnabled(loaded.drafter_kind != "remote" and bool(loaded.target_path)))
    notice = TrainedNotice()
    window.centralWidget().layout().insertWidget(2, notice)  # under the error banner
    notice.use_button.clicked.connect(lambda: use_trained(window))
    window.trained_notice = notice
    return action


def ask_and_train(window) -> None:
    loaded = window.loaded
    if loaded is None:
        return
    out = default_drafter_folder(loaded.target_path)
    chats = [c for c in window.chat.conversations if c.messages]
    dialog = TrainDrafterDialog(window, loaded.target, out, _plain_rate(window), len(chats), sent_messages(chats))
    if dialog.exec() == QDialog.DialogCode.Accepted:
        start(window, dialog.minutes.value(), with_chats=dialog.use_chats.isChecked())


def start(window, minutes: float, limit: int = 0, reply_tokens: int = REPLY_TOKENS, out: Path | None = None,
          with_chats: bool = False, chat_turns: int = CONVERSATION_TURNS) -> bool:
    """Train for the loaded model (``limit`` prompts, 0: all; and up to ``chat_turns`` messages of
    the saved chats, newest first, when ``with_chats``); False when the window is busy."""
    loaded = window.loaded
    out = out or default_drafter_folder(loaded.target_path)
    # The chats as the model reads them, taken now on the GUI thread, the last one written to first.
    recent = sorted((c for c in window.chat.conversations if c.messages), key=lambda c: c.updated, reverse=True)
    chats = tuple(c.chat_messages() for c in recent) if with_chats else ()
    window.trained_notice.hide()
    return window._submit("distill", train_drafter(loaded.target_path, minutes, str(out), reply_tokens, limit, chats,
                                                   chat_turns))


def on_trained(window, trained: DrafterTrained) -> None:
    window.last_trained = trained
    if not trained.saved:
        window.banner.show_error(f"No drafter was saved: {trained.message}")
        return
    how = "Training stopped" if trained.stopped else "Drafter trained"
    window.trained_notice.text.setText(f"{how}: {trained.message}")
    window.trained_notice.show()
    window.models.refresh()  # the model's row names the drafter trained for it


def use_trained(window) -> None:
    """Load the model the drafter was trained for, with it (the model's own precision), and the
    draft model it drafted with so far beside it: the demo races the two."""
    from app.bridge import jobs

    trained = window.last_trained
    loaded = window.loaded
    precision = loaded.precision if loaded is not None else "file"
    draft_model = loaded.draft_model_path if loaded is not None and loaded.target_path == trained.target_path else ""
    if window._submit("load", jobs.load_models(trained.target_path, trained.out, precision, race_with=draft_model or None)):
        window.trained_notice.hide()
