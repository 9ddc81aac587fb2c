"""A reply's stats: the line under it, and what its tooltip says (stored with the message)."""
from __future__ import annotations


def describe(s) -> str:
    if s.new_tokens == 0 and 0 < s.prompt_done < s.prompt_tokens:  # a long prompt's prefill, chunk by chunk
        kept = f" ({s.cached_tokens:,} kept from before)" if s.cached_tokens else ""
        return f"reading the prompt: {s.prompt_done:,} of {s.prompt_tokens:,} tokens{kept}"
    text = f"{s.tok_per_s:.1f} tok/s · {s.new_tokens} token{'' if s.new_tokens == 1 else 's'}"
    if s.drafted:
        text += f" · {s.acceptance:.0%} of drafted tokens accepted"
    return text


def describe_meta(meta: dict) -> str:
    """The tooltip of a reply's speed line: what made it and how fast."""
    lines = [" · ".join(x for x in (meta.get("model"), meta.get("precision") and f"precision {meta['precision']}",
                                    meta.get("drafter") and f"drafter {meta['drafter']}") if x)]
    lines.append(f"{meta.get('tok_per_s', 0):.1f} tok/s · {meta.get('new_tokens', 0)} tokens")
    if meta.get("drafted"):
        lines.append(f"acceptance {meta.get('acceptance', 0):.0%} ({meta.get('accepted', 0)} of {meta['drafted']} drafted tokens)")
    if meta.get("prompt_tokens"):
        first = f", first token after {meta['ttft_s']:.2f} s" if meta.get("ttft_s") is not None else ""
        lines.append(f"prompt {meta['prompt_tokens']:,} tokens, {meta.get('cached_tokens', 0):,} of them kept"
                     f" from before{first}")
    if meta.get("finish"):
        lines.append(f"ended by {meta['finish'].replace('_', ' ')}")
    return "\n".join(line for line in lines if line)


def reply_meta(finished, loaded) -> dict:
    """What a finished reply stores (engine/session/conversation_schema.py ReplyMetaSchema): its figures and
    the model, precision and drafter that made it (``loaded``: app.bridge.messages.ModelLoaded or None)."""
    s = finished.stats
    if s.drafted:
        drafter = (loaded.drafter or loaded.drafter_kind) if loaded else ""
    else:
        drafter = "off"
    return {"tok_per_s": round(s.tok_per_s, 2), "new_tokens": s.new_tokens, "drafted": s.drafted,
            "accepted": s.accepted, "acceptance": round(s.acceptance, 4),
            "model": loaded.target if loaded else "", "precision": loaded.precision if loaded else "",
            "drafter": drafter, "finish": finished.reason, "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens, "ttft_s": round(s.ttft_s, 3) if s.ttft_s is not None else None}
