"""An attached code file edited on the real default pair (slow): the reply is the same with and
without speculation, and the file's text in the prompt lets the drafters copy long runs of it.
Prints each drafter's speed, acceptance and speedup over plain decoding."""
import pytest

from tests.app.conftest import wait_idle

pytestmark = pytest.mark.slow


def inventory_module() -> str:
    """~1.3k tokens of ordinary Python: a function to rename, called from several places."""
    parts = ['"""Inventory bookkeeping for a small shop."""\nfrom dataclasses import dataclass, field\n\n\n'
             "@dataclass\nclass Item:\n    name: str\n    price: float\n    quantity: int = 0\n    tags: list = field(default_factory=list)\n\n\n"
             "def compute_total(items):\n    \"\"\"The value of all items in stock.\"\"\"\n    total = 0.0\n"
             "    for item in items:\n        total += item.price * item.quantity\n    return round(total, 2)\n\n\n"]
    for n, (what, cond) in enumerate([("cheap", "item.price < 5"), ("expensive", "item.price >= 100"),
                                      ("empty", "item.quantity == 0"), ("tagged_sale", "'sale' in item.tags"),
                                      ("bulk", "item.quantity >= 50"), ("named_a", "item.name.startswith('a')"),
                                      ("fragile", "'fragile' in item.tags"), ("rare", "0 < item.quantity < 3"),
                                      ("heavy", "item.quantity > 10 and item.price > 20"), ("unnamed", "not item.name")]):
        parts.append(
            f"def {what}_items(items):\n    \"\"\"The items that are {what.replace('_', ' ')}.\"\"\"\n"
            f"    return [item for item in items if {cond}]\n\n\n"
            f"def {what}_value(items):\n    \"\"\"What the {what.replace('_', ' ')} items are worth.\"\"\"\n"
            f"    return compute_total({what}_items(items))\n\n\n"
            f"def {what}_summary(items):\n    \"\"\"A line on the {what.replace('_', ' ')} items: how many, and their worth.\"\"\"\n"
            f"    chosen = {what}_items(items)\n    return f\"{what}: {{len(chosen)}} items worth {{compute_total(chosen):.2f}}\"\n\n\n")
    parts.append("def report(items):\n    lines = [f\"{item.name}: {item.quantity} x {item.price:.2f}\" for item in items]\n"
                 "    lines.append(f\"total: {compute_total(items):.2f}\")\n    return \"\\n\".join(lines)\n")
    return "".join(parts)


def test_an_attached_file_is_edited_identically_with_and_without_speculation(qtbot, real_pair_window, tmp_path, capsys):
    window = real_pair_window
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    panel = chat.panel
    panel.temperature.setValue(0.0)  # greedy: speculation must not change a token
    panel.max_new_tokens.setValue(160)
    path = tmp_path / "inventory.py"
    path.write_text(inventory_module(), encoding="utf-8")
    chat.attach_files([str(path)])
    qtbot.waitUntil(lambda: all(a is not None and a.tokens for a in chat.attached.values()), timeout=120_000)
    file_tokens = next(iter(chat.attached.values())).tokens
    assert 1000 <= file_tokens <= 2000

    replies = {}
    for kind in ("off", "lookup", "model"):
        panel.drafter.setCurrentIndex(panel.drafter.findData(kind))
        if not replies:
            chat.input.setPlainText("Rename the function compute_total to sum_stock_value everywhere in this file. "
                                    "Reply with the whole updated file in one code block.")
            chat.send_button.click()
        else:
            chat.regenerate_button.click()
        qtbot.waitUntil(lambda: not chat.running and chat._has_reply(), timeout=900_000)
        wait_idle(qtbot, window, timeout=900_000)
        reply = chat.current.messages[-1]
        replies[kind] = (reply["content"], reply["meta"])
    assert chat.current.messages[0]["attachments"][0]["name"] == "inventory.py"
    plain_text, plain = replies["off"]
    assert "sum_stock_value" in plain_text

    def decode_rate(meta) -> float:
        """Tokens after the first over the time after it: the first reply also read the whole
        prompt, the later ones kept its cache, so wall-clock tok/s would flatter speculation."""
        seconds = meta["new_tokens"] / meta["tok_per_s"] - (meta["ttft_s"] or 0.0)
        return (meta["new_tokens"] - 1) / seconds

    with capsys.disabled():
        print(f"\n[real pair attachment edit] file {file_tokens:,} tokens, prompt {plain['prompt_tokens']:,} tokens, "
              f"{plain['new_tokens']} new tokens; plain {decode_rate(plain):.2f} tok/s after the first token "
              f"(first token {plain['ttft_s']:.1f} s: it read the prompt)")
        for kind in ("lookup", "model"):
            text, meta = replies[kind]
            same = text == plain_text
            first = next((i for i, (a, b) in enumerate(zip(text, plain_text)) if a != b), min(len(text), len(plain_text)))
            print(f"  {kind}: {decode_rate(meta):.2f} tok/s, speedup {decode_rate(meta) / decode_rate(plain):.2f}x, "
                  f"acceptance {meta['acceptance']:.2f} ({meta['accepted']}/{meta['drafted']}), identical={same}"
                  + ("" if same else f" (first difference at character {first})"))
    for kind in ("lookup", "model"):
        assert replies[kind][0] == plain_text, f"{kind} changed the reply"
