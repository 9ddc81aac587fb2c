"""`tandem distill`: train an EAGLE-3 drafter here for a target that has none (engine.distill)."""
from __future__ import annotations

import sys
from pathlib import Path

from engine.core.paths import RESOURCES

DEFAULT_PROMPTS = RESOURCES / "prompts" / "distill.jsonl"


def default_output(target: Path) -> Path:
    """Beside the model: ``<file or folder name>-speculator.eagle3``."""
    target = Path(target)
    stem = target.stem if target.suffix == ".gguf" else target.name
    return target.parent / f"{stem}-speculator.eagle3"


def run(args) -> int:
    import torch

    from engine.bench.prompt_sets import read_prompts, select_prompts
    from engine.cli.common import load_session
    from engine.core.settings import InvalidRequest
    from engine.distill.conversations import conversation_prompts, interleave, prompt_limit, read_folder
    from engine.distill.distill import DistillSettings, distill
    from engine.distill.training import training_device

    if args.minutes <= 0:
        raise InvalidRequest(f"--minutes must be above 0, not {args.minutes}")
    if args.reply_tokens < 8:
        raise InvalidRequest(f"--reply-tokens must be at least 8, not {args.reply_tokens}")
    texts = tuple(Path(t) for t in args.text or ())
    missing = [str(t) for t in texts if not (t.is_file() or t.is_dir())]
    if missing:
        raise InvalidRequest(f"--text: no such file or folder: {', '.join(missing)}")
    if args.top_k < 0:
        raise InvalidRequest(f"--top-k must be 0 or more, not {args.top_k}")
    if args.sampled_replies < 0:
        raise InvalidRequest(f"--sampled-replies must be 0 or more, not {args.sampled_replies}")
    if args.windows_per_file < 1:
        raise InvalidRequest(f"--windows-per-file must be at least 1, not {args.windows_per_file}")
    if args.data_minutes is not None and args.data_minutes <= 0:
        raise InvalidRequest(f"--data-minutes must be above 0, not {args.data_minutes}")
    if args.conversation_turns < 0:
        raise InvalidRequest(f"--conversation-turns must be 0 or more, not {args.conversation_turns}")
    if args.prompt_tokens < 64:
        raise InvalidRequest(f"--prompt-tokens must be at least 64, not {args.prompt_tokens}")
    saved = None
    if args.conversations is not None:
        folder = Path(args.conversations)
        if not folder.is_dir():
            raise InvalidRequest(f"--conversations: no such folder: {folder}")
        saved = read_folder(folder)
    try:
        device = training_device(args.train_device)
    except ValueError as exc:
        raise InvalidRequest(f"--train-device: {exc}") from None
    prompts = select_prompts(read_prompts(Path(args.prompts)), args.category, args.limit)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.drafter_model = None
    session = load_session(args, need_drafter=False)
    target_path = Path(args.target) if args.target else Path(session.target.gguf_file.path if session.target.gguf_file else ".")
    out = Path(args.out) if args.out else default_output(target_path)
    settings = DistillSettings(minutes=args.minutes, reply_tokens=args.reply_tokens, draft_vocab=args.head_tokens,
                               inner=args.inner, text_files=texts, text_tokens=args.text_tokens, seed=args.seed,
                               top_k=args.top_k, windows_per_file=args.windows_per_file, data_minutes=args.data_minutes,
                               device=str(device), sampled_replies=args.sampled_replies)
    encoded = [session.encode(p["prompt"]) for p in prompts]
    if saved is not None:
        limit = prompt_limit(session.target.model.config, args.prompt_tokens, args.reply_tokens)
        own, too_long = conversation_prompts(saved.conversations, session.encode, args.conversation_turns, limit)
        print(f"{len(own)} prompts from {len(saved.conversations)} saved conversation(s) in {args.conversations}"
              + (f"; {too_long} left out (over {limit} tokens, or nothing the chat template takes)" if too_long else "")
              + (f"; {saved.skipped} file(s) there were not conversations" if saved.skipped else ""), file=sys.stderr)
        encoded = interleave(own, encoded)
    print(f"distilling an EAGLE-3 drafter for {session.target.name} into {out}: {len(encoded)} prompts"
          + (f" and {len(texts)} text file(s)" if texts else "") + f", {args.minutes:g} min of training on the "
          f"{device.type.upper() if device.type != 'cpu' else 'CPU'}", file=sys.stderr)
    for event in distill(session.layer_states_runner, session.target.model, session.tokenizer, session.eos_ids, session.target.name,
                         encoded, out, settings):
        eta = f", about {event.eta_s / 60:.1f} min left" if event.eta_s is not None else ""
        if event.phase == "data":
            print(f"  data  {event.message}{eta}", file=sys.stderr)
        elif event.phase == "train":
            held = f"; held-out {event.tokens_per_pass:.3f} tokens a pass" if event.tokens_per_pass is not None else ""
            print(f"  train {event.done / 60:5.1f} / {event.total / 60:.1f} min  {event.message}{held}{eta}", file=sys.stderr)
        elif event.phase == "saved":
            print(f"  saved {event.message}", file=sys.stderr)
        else:
            print(event.message)
    print(f"use it: tandem compare --drafter-model {out} \"your prompt\"")
    return 0


def add_parser(sub) -> None:
    from engine.cli.common import model_options
    from engine.core.paths import data_dir
    from engine.distill.conversations import CONVERSATION_TURNS, PROMPT_TOKENS

    p = sub.add_parser("distill", help="train an EAGLE-3 drafter for the target here (its own replies, your files)")
    model_options(p)
    p.add_argument("--out", help="folder for the drafter (default: beside the model, <name>-speculator.eagle3); "
                                 "a run killed before it ended resumes from there")
    p.add_argument("--minutes", type=float, default=20.0, help="training time (the data comes first)")
    p.add_argument("--data-minutes", type=float, default=None,
                   help="stop making data after this long and train on what was made (default: make it all); "
                        "data is kept as it is made, so a run killed while making it goes on from there")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL prompts the target answers for the data")
    p.add_argument("--category", action="append", help="only prompts of this category (repeatable)")
    p.add_argument("--limit", type=int, default=0, help="at most this many prompts (0: all)")
    p.add_argument("--reply-tokens", type=int, default=160, help="tokens of each reply the target writes")
    p.add_argument("--sampled-replies", type=int, default=0,
                   help="replies sampled (temperature 0.7) to each prompt besides its greedy one: more data from the "
                        "same prompts, made after all the greedy ones")
    p.add_argument("--conversations", nargs="?", const=str(data_dir() / "conversations"), default=None, metavar="FOLDER",
                   help="also answer the messages of your saved chats (the app's, or FOLDER's): opt-in, nothing "
                        "leaves this machine")
    p.add_argument("--conversation-turns", type=int, default=CONVERSATION_TURNS,
                   help="at most this many messages of saved chats (newest conversations first; 0: all)")
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                   help="a saved chat's prompt longer than this loses its oldest turns")
    p.add_argument("--text", action="append", help="a text or code file read teacher-forced, or a folder: its text "
                                                  "and code files (repeatable)")
    p.add_argument("--windows-per-file", type=int, default=2,
                   help="512-token windows taken from each --text file before any gives more (spreads the text)")
    p.add_argument("--top-k", type=int, default=32,
                   help="learn the target's k likeliest next tokens with their probabilities (0: its argmax alone)")
    p.add_argument("--text-tokens", type=int, default=20000, help="at most this many tokens of --text files")
    p.add_argument("--head-tokens", type=int, default=16384, help="ids the drafter's head keeps (the ones the data uses most)")
    p.add_argument("--inner", type=int, default=None, help="the drafter MLP's width (default: 2 x hidden size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    p.add_argument("--train-device", default="auto", help="where the drafter trains: auto (a GPU where there is one), "
                                                          "cpu, cuda, mps (--device places the model that makes the data)")
    p.set_defaults(func=run)
