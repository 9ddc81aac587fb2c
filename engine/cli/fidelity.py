"""`tandem fidelity`: how close each precision stays to the GGUF file's own model (teacher-forced
top-1 agreement, KL and perplexity against the fp32 model of its dequantized weights)."""
from __future__ import annotations

import sys
from pathlib import Path

from engine.cli.common import check_writable, write_json_atomically
from engine.core.paths import RESOURCES


def _default_files(gguf: str | None, folder: str | None) -> tuple[Path, Path | None]:
    """The GGUF file and its converted folder: the ones given, else the default target's."""
    if gguf:
        return Path(gguf), Path(folder) if folder else None
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair

    spec = default_pair.TARGET
    converted = Path(folder) if folder else default_pair.prepare(spec)
    return default_pair.assemble(spec, default_pair.part_paths(spec), cache_dir() / "gguf"), converted


def _candidates(text: str, folder: Path | None) -> list[str]:
    from engine.bench.fidelity import CANDIDATES
    from engine.core.settings import PRECISION_ALIASES, InvalidRequest

    names = [PRECISION_ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown or not names:
        raise InvalidRequest(f"--candidates: choose among {', '.join(CANDIDATES)}, not {text!r}")
    if folder is None and any(n not in ("file", "file-kv32") for n in names):
        raise InvalidRequest("--folder (the GGUF file's converted model folder) is needed for candidates other than file and file-kv32")
    return names


def run(args) -> int:
    import json

    import torch

    from engine.bench.fidelity import format_table, run_fidelity
    from engine.bench.prompt_sets import read_prompts, select_prompts
    from engine.core.settings import InvalidRequest

    # Every input first: the reference takes minutes.
    if args.new_tokens < 1:
        raise InvalidRequest(f"--new-tokens must be at least 1, not {args.new_tokens}")
    if args.threads < 0:
        raise InvalidRequest(f"--threads must be >= 0 (0: torch's choice), not {args.threads}")
    prompts = select_prompts(read_prompts(args.prompts), args.category, args.limit)
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read the perplexity text {args.text}: {exc}") from None
    out = check_writable(Path(args.json))
    gguf, folder = _default_files(args.gguf, args.folder)
    candidates = _candidates(args.candidates, folder)
    if args.threads:
        torch.set_num_threads(args.threads)

    def show(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_fidelity(gguf, folder, candidates, prompts, text, args.new_tokens, args.max_text_tokens,
                          check_weights=not args.no_weight_check, on_report=lambda r: write_json_atomically(out, r),
                          progress=show)
    print(format_table(report))
    summary = {name: {"top1_agreement": c["prompts"]["top1_agreement"], "mean_kl": c["prompts"]["mean_kl"],
                      "text_perplexity": c["text"]["perplexity"]} for name, c in report["candidates"].items()}
    print(json.dumps({"reference_text_perplexity": report["reference"]["text_perplexity"], **summary}, indent=1))
    print(f"wrote {out}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("fidelity", help="how close each precision stays to a GGUF file's own model")
    p.add_argument("--gguf", help="the .gguf file (default: the offline Qwen2.5-Coder 1.5B Q4_K_M)")
    p.add_argument("--folder", help="its converted model folder, for the candidates other than file (default: the"
                                    " default target's)")
    p.add_argument("--candidates", default="file,file-kv32,int8,int4,bf16,fp32",
                   help="comma-separated: file (the file's own quantization, fp16 K/V cache as the engine runs it),"
                        " file-kv32 (the same with an fp32 cache), int8, int4 (Tandem's), bf16, fp32 (of the bf16"
                        " conversion); fast and exact are read as bf16 and fp32")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens the reference writes per prompt")
    p.add_argument("--prompts", default=str(RESOURCES / "prompts" / "bench.jsonl"))
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--category", action="append", help="only prompts of this category (repeatable)")
    p.add_argument("--text", default=str(RESOURCES / "texts" / "fidelity.txt"), help="the perplexity text")
    p.add_argument("--max-text-tokens", type=int, default=0, help="score only the text's first N tokens (0: all)")
    p.add_argument("--no-weight-check", action="store_true",
                   help="skip comparing the converted folder's weights with the file's values")
    p.add_argument("--json", default="fidelity.json")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=run)
