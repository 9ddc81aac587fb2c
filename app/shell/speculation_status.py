""""Why isn't speculation running?": one line under the header of the demo and chat tabs that
says when speculation is not what runs, why, and what to do about it.

Causes, most specific first: the user chose no drafter; the drafter given was refused (another
vocabulary, a mismatched assistant: engine.drafters.assistant_fit); the engine replaced the
chosen drafter (Session.drafter_note); no draft model is loaded, so prompt lookup drafts; the
draft-length controller switched speculation off for part of a reply
(RunStats.speculation_off_steps). After those, a note when the last reply gave up CPU threads to
other programs keeping cores busy (RunStats.threads_fewest), so a slower reply is explained."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel


@dataclass(frozen=True)
class SpeculationState:
    choice: str = "model"  # the decode controls' drafter: "model", "mtp", "lookup", "off"
    target: str = ""
    drafter: str | None = None  # the loaded draft model's name
    loaded_kind: str = "model"  # what the engine offers: "model", "mtp" or "lookup"
    refused: str | None = None  # why a given drafter was refused at load
    engine_note: str | None = None  # the engine replaced the chosen drafter
    off_steps: int = 0  # steps of the last speculative reply with speculation switched off
    steps: int = 0
    acceptance: float = 0.0
    threads_fewest: int = 0  # the fewest threads a step of the last reply ran with (0: not counted)
    threads_max: int = 0


def threads_note(state: SpeculationState) -> str:
    if not state.threads_fewest or state.threads_fewest >= state.threads_max:
        return ""
    return (f"Other programs kept cores busy: the last reply ran on {state.threads_fewest} of {state.threads_max} "
            "threads there, which is faster than sharing those cores with them.")


def explain(state: SpeculationState) -> str:
    """The line to show, "" when speculation runs as chosen on every thread."""
    return " ".join(part for part in (_speculation(state), threads_note(state)) if part)


def _speculation(state: SpeculationState) -> str:
    """Why speculation is not what runs, "" when it runs as chosen."""
    if state.choice == "off":
        return ("Speculation is off: you chose plain decoding (Drafter: Off). "
                "Choose “Draft model” or “Prompt lookup” to draft again.")
    if state.refused:
        return (f"The drafter was refused: {state.refused}. Drafting by prompt lookup instead. "
                "What to do: pick a drafter with the target's tokenizer (the catalog's pairing on the Models tab).")
    if state.engine_note:
        return f"Speculation changed: {state.engine_note}. Choose another drafter, or load a model with a draft model."
    if state.choice == "lookup" and state.loaded_kind == "model":
        return ("Drafting by prompt lookup, as you chose: it helps only where the reply repeats the prompt. "
                "Choose “Draft model” for a general speed-up.")
    if state.choice in ("lookup", "model") and state.loaded_kind == "lookup":
        return (f"No draft model is loaded for {state.target or 'this model'}: drafting by prompt lookup, which helps "
                "only where the reply repeats the prompt. What to do: download the model with its drafter on the Models tab.")
    if state.off_steps:
        share = f"{state.off_steps} of {state.steps} steps" if state.steps else f"{state.off_steps} steps"
        # The controller weighs acceptance against what drafting and verifying cost on this
        # machine: 80% can be too little for a dear drafter, so the line names both.
        return (f"Speculation switched itself off for {share} of the last reply: with drafts accepted "
                f"{state.acceptance:.0%} of the time, drafting and checking them cost more than they saved "
                "here, so plain decoding ran there (no speed lost). Set a fixed draft length to force drafting.")
    return ""


class SpeculationStatus(QLabel):
    def __init__(self) -> None:
        super().__init__("")
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setStyleSheet("background: #e8f0fe; color: #174ea6; padding: 6px; border-radius: 4px;")
        self.state = SpeculationState()
        self.on_tab = False
        self.hide()

    def update_state(self, **changes) -> None:
        from dataclasses import replace

        self.state = replace(self.state, **changes)
        self._sync()

    def set_on_tab(self, shown: bool) -> None:
        self.on_tab = shown
        self._sync()

    def _sync(self) -> None:
        text = explain(self.state)
        self.setText(text)
        self.setVisible(bool(text) and self.on_tab)
