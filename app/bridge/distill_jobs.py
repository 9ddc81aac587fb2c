"""Training a drafter for the loaded model on the engine thread (engine.distill, as `tandem
distill`): its progress in the status strip, the best drafter so far kept when stopped."""
from __future__ import annotations

from pathlib import Path

from app.bridge.messages import DrafterTrained, Progress
from app.bridge.shared_engine import holding
from engine.distill.conversations import CONVERSATION_TURNS, PROMPT_TOKENS  # torch-free: `tandem distill`'s defaults

# The status strip's words for the engine's phases.
_STAGES = {"data": "Writing replies to learn from", "train": "Training the drafter", "saved": "Training the drafter"}


def default_drafter_folder(target_path: str | Path) -> Path:
    """Where the drafter goes: beside the model, as `tandem distill` puts it."""
    from engine.cli.distill import default_output

    return default_output(Path(target_path))


def _progress(event) -> Progress:
    if event.phase == "data":
        return Progress(_STAGES["data"], int(event.done), int(event.total), "texts", _eta(event.eta_s) + event.message)
    best = f"held-out {event.best_tokens_per_pass:.2f} tokens a pass · " if event.best_tokens_per_pass else ""
    return Progress(_STAGES.get(event.phase, event.phase), int(event.done), int(event.total), "s",
                    best + _eta(event.eta_s) + event.message)


def _eta(seconds: float | None) -> str:
    return f"about {seconds / 60:.0f} min left · " if seconds is not None and seconds >= 60 else ""


def train_drafter(target_path: str, minutes: float, out: str, reply_tokens: int = 160, limit: int = 0,
                  conversations: tuple[list[dict], ...] = (), conversation_turns: int = CONVERSATION_TURNS):
    """``minutes`` of training for the loaded model (from ``target_path``) after the data (its
    own replies to the shipped prompts, ``limit`` of them, 0: all; and to up to
    ``conversation_turns`` messages of ``conversations``, the person's saved chats as the model
    reads them, newest first, where they opted in), saved in ``out``; a run stopped earlier
    resumes from there."""

    def run(ctx) -> None:
        from engine.bench.prompt_sets import read_prompts, select_prompts
        from engine.cli.distill import DEFAULT_PROMPTS
        from engine.distill.conversations import conversation_prompts, interleave, prompt_limit
        from engine.distill.distill import DistillSettings, distill

        session = ctx.state.session
        if session is None:
            raise ValueError("no model is loaded yet: load the model to train a drafter for")
        prompts = [session.encode(p["prompt"]) for p in select_prompts(read_prompts(DEFAULT_PROMPTS), None, limit)]
        if conversations:
            longest = prompt_limit(session.target.model.config, PROMPT_TOKENS, reply_tokens)
            own, _ = conversation_prompts(conversations, session.encode, conversation_turns, longest)
            prompts = interleave(own, prompts)
        settings = DistillSettings(minutes=minutes, reply_tokens=reply_tokens)
        ended = None
        with holding(ctx.state.generation_lock, ctx.cancelled) as held:  # the server may be decoding
            if not held:
                return
            for event in distill(session.layer_states_runner, session.target.model, session.tokenizer, session.eos_ids,
                                 session.target.name, prompts, Path(out), settings, cancel=ctx.cancelled):
                if event.phase == "done":
                    ended = event
                else:
                    ctx.emit(_progress(event))
        saved = (Path(out) / "config.json").is_file()
        message = ended.message if ended is not None else "stopped before any text was made; nothing was saved"
        ctx.emit(DrafterTrained(str(out), target_path, message, ended.best_tokens_per_pass if ended else None,
                                stopped=ctx.cancelled(), saved=saved))

    return run
