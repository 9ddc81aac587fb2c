"""The person's saved chats as a drafter's data (opt-in): the app's conversation files read as the
model reads them (attached files in the user's turn), anything else in the folder skipped and
counted; each message sent is a prompt with the conversation before it, spread over the
conversations newest first; a long one loses its oldest turns; a distillation answers them and
trains on a window of a long prompt's context whose states are the ones the whole prompt gives.
Also: where the drafter trains (a GPU where there is one), and `tandem distill`'s refusals."""
from __future__ import annotations

import json
import os

import pytest
import torch

from engine.cli import main as cli_main
from engine.distill import teacher, training
from engine.distill.conversations import conversation_prompts, encode_within, interleave, read_folder, turn_prompts
from engine.distill.distill import DistillSettings, distill, read_data
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["def", "add", "return", "print", "for", "range", "quick", "brown", "fox", "lazy", "dog", "class", "self", "import"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def encoder(tokenizer):
    """The chat template's ids, as Session.encode gives them."""
    return lambda messages: list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                               return_dict=True)["input_ids"])


def saved(messages, updated, system=""):
    """A conversation file as the app's store writes it."""
    return {"id": "x", "title": "t", "created": updated, "updated": updated, "system_prompt": system, "messages": messages}


def user(text, **extra):
    return {"role": "user", "content": text, **extra}


def reply(text):
    return {"role": "assistant", "content": text, "stats": "20.0 tok/s", "meta": {"tok_per_s": 20.0, "new_tokens": 3}}


def write(folder, name, data):
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_a_folder_of_saved_chats_reads_as_the_model_reads_them(tmp_path):
    older = saved([user("fix this", attachments=[{"name": "calc.py", "kind": "text", "text": "x = 1\n", "tokens": 5}]),
                   reply("done"), user("and now?")], updated=100.0, system="Be brief.")
    newer = saved([user("hello"), reply("hi"),
                   {"role": "assistant", "content": "", "tool_calls": [{"name": "clock", "arguments": "{}"}]},
                   {"role": "tool", "name": "clock", "content": "12:00", "outcome": "ran"}], updated=200.0)
    write(tmp_path, "a1.json", older)
    write(tmp_path, "b2.json", newer)
    write(tmp_path, "broken.json", "{not json")
    write(tmp_path, "wrong.json", {"messages": [{"role": "wizard", "content": "?"}]})
    write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    write(tmp_path, "odd.json", {**saved([user("hi")], updated=300.0), "updated": "yesterday"})  # the app sets it aside
    write(tmp_path, ".tmp-save.json", newer)  # a save in progress: not a file of its own yet
    write(tmp_path, "notes.txt", "not a conversation")
    os.symlink(tmp_path / "a1.json", tmp_path / "link.json")  # a link is not the store's own file
    write(tmp_path, "my chat.json", newer)  # not a conversation id: the app sets it aside

    found = read_folder(tmp_path)

    assert found.skipped == 6  # broken, wrong, deep, odd, link, my chat
    first, second = found.conversations  # newest first
    assert [m["role"] for m in first] == ["user", "assistant", "assistant", "tool"]
    assert first[2]["tool_calls"][0]["function"]["name"] == "clock"
    assert second[0] == {"role": "system", "content": "Be brief."}
    assert second[1]["content"] == "File: calc.py\n```python\nx = 1\n```\n\nfix this"  # the file before what was typed


def test_each_message_sent_is_a_prompt_spread_over_conversations():
    a = [user("a1"), reply("r"), user("a2"), reply("r"), user("a3")]  # the last one never answered
    b = [{"role": "system", "content": "s"}, user("b1"), reply("r")]
    prompts = turn_prompts([a, b], limit=0)
    # Newest turn of each first, then the ones before.
    assert [p[-1]["content"] for p in prompts] == ["a3", "b1", "a2", "a1"]
    assert prompts[0] == a and prompts[1] == b[:2] and prompts[3] == a[:1]
    assert [p[-1]["content"] for p in turn_prompts([a, b], limit=3)] == ["a3", "b1", "a2"]
    assert turn_prompts([], limit=5) == []


def test_a_long_prompt_loses_its_oldest_turns_and_keeps_its_system_prompt(tokenizer):
    encode = encoder(tokenizer)
    words = " ".join(WORDS * 4)
    messages = [{"role": "system", "content": "s"}, user(words), reply(words), user(words), reply(words), user("last one")]
    whole = encode(messages)
    limit = len(whole) - 10
    ids = encode_within(encode, messages, limit)
    # The first exchange went (a turn started by the person comes first), the system prompt stayed.
    kept = [messages[0], *messages[3:]]
    assert ids == encode(kept) and len(ids) <= limit
    assert encode_within(encode, messages, len(whole)) == whole
    assert encode_within(encode, messages, 4) is None  # the last turn alone is over
    one_turn = len(encode([messages[0], user(words)]))
    prompts, too_long = conversation_prompts([messages, [user("short")]], encode, limit=0, max_tokens=one_turn)
    assert too_long == 0 and len(prompts) == 4  # every message fits once its history is dropped
    assert prompts[2] == encode([messages[0], messages[3]])
    prompts, too_long = conversation_prompts([[user(words * 3)], [user("short")]], encode, limit=0, max_tokens=40)
    assert too_long == 1 and prompts == [encode([user("short")])]
    assert interleave([1, 2, 3], ["a"]) == [1, "a", 2, 3]


@pytest.fixture(scope="module")
def target(tokenizer):
    from engine.testing.tiny_gguf import build_model

    model = build_model("qwen2", len(tokenizer), layers=2, seed=4)
    with torch.no_grad():
        for layer in model.model.layers:  # its next token depends on its current one alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def test_a_long_prompts_window_keeps_the_states_the_whole_prompt_gives(target, tokenizer):
    tokens = tokenizer(" ".join(WORDS * 8))["input_ids"]
    first = len(tokens) - 10
    whole = teacher.teach(ModelRunner(target), tokens, (0, 1, 2), first, top_k=4, kind="reply")
    window = teacher.teach(ModelRunner(target), tokens, (0, 1, 2), first, top_k=4, kind="reply", context_tokens=16)
    assert len(window) == 26 and window.first == 16
    cut = len(tokens) - 26
    assert torch.equal(window.tokens, whole.tokens[cut:]) and torch.equal(window.aux, whole.aux[cut:])
    assert torch.equal(window.labels, whole.labels[cut:]) and torch.equal(window.top_probs, whole.top_probs[cut:])
    short = teacher.teach(ModelRunner(target), tokens[:20], (0, 1, 2), 12, context_tokens=16)
    assert len(short) == 20 and short.first == 12  # shorter than the window: all of it


def test_distilling_with_saved_chats_answers_their_messages(target, tokenizer, tmp_path):
    import random

    rng = random.Random(3)
    encode = encoder(tokenizer)

    def words(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    chats = [[user(words(6)), reply(words(8)), user(words(6))] for _ in range(5)]
    chats.append([user(words(120))])  # a pasted file: longer than the window the drafter trains on
    own, too_long = conversation_prompts(chats, encode, limit=0, max_tokens=2048)
    shipped = [encode([user(words(6))]) for _ in range(8)]
    over = encode([user(words(300))])  # over the tiny model's 512-token window: said, and passed over
    prompts = interleave(own, shipped) + [over]
    out = tmp_path / "drafter"
    settings = DistillSettings(minutes=60.0, reply_tokens=16, draft_vocab=300, max_steps=60, aux_layers=(0, 1, 2),
                               checkpoint_minutes=60.0, context_tokens=64)
    events = list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings))
    assert events[-1].phase == "done" and (out / "config.json").is_file()
    assert any("left out: the prompt has" in e.message for e in events)
    data = read_data(out / "training")
    assert too_long == 0 and len(data) == len(own) + len(shipped) == 19
    for sample, prompt in zip(data, prompts):  # each one the target's reply to that prompt
        kept = prompt[-sample.first:]
        assert sample.tokens[: sample.first].tolist() == kept and sample.kind == "reply"
    assert max(s.first for s in data) == 64  # the pasted file's prompt, cut to the window
    assert json.loads((out / "config.json").read_text())["tandem_training"]["device"] == training.training_device().type


def test_the_drafter_trains_where_it_is_asked_and_a_missing_device_is_refused():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert training.training_device("auto").type == expected
    assert training.training_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            training.training_device("cuda")
    with pytest.raises(ValueError, match="cannot train on"):
        training.training_device("xla")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_on_the_gpu_scores_as_on_the_cpu_and_raises_acceptance(target, tokenizer, tmp_path):
    """The same layers and text give the same loss on the GPU as on the CPU (fp32), and a
    distillation on the GPU raises held-out acceptance and saves a drafter the CPU loads."""
    import copy

    from engine.distill import new_drafter
    from engine.drafters.eagle3 import load_eagle3_drafter

    tokens = tokenizer(" ".join(WORDS * 3))["input_ids"]
    sample = teacher.teach(ModelRunner(target), tokens, (0, 1, 2), 4, top_k=4, kind="reply")
    spec = new_drafter.spec_for_target(target.config, "tiny-target", 300, None, (0, 1, 2))
    ids = list(range(300))
    layers = new_drafter.new_drafter(spec, ids, target.get_output_embeddings(), target.get_decoder().norm.weight.detach())
    on_cpu, _, _ = training.unrolled(layers, target.get_input_embeddings(), sample, training.draft_index(layers), 3)
    gpu_layers = copy.deepcopy(layers).to("cuda")
    on_gpu, _, _ = training.unrolled(gpu_layers, target.get_input_embeddings(), sample, training.draft_index(gpu_layers), 3)
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-4, rtol=1e-4)

    import random

    rng = random.Random(0)
    prompts = [tokenizer(" ".join(rng.choice(WORDS) for _ in range(6)))["input_ids"] for _ in range(24)]
    out = tmp_path / "drafter"
    settings = DistillSettings(minutes=60.0, reply_tokens=24, draft_vocab=300, max_steps=200, aux_layers=(0, 1, 2),
                               checkpoint_minutes=60.0, device="cuda")
    list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings))
    record = json.loads((out / "config.json").read_text())["tandem_training"]
    assert record["device"] == "cuda"
    assert record["heldout_tokens_per_pass"] > record["untrained_tokens_per_pass"] + 1.0, record
    assert load_eagle3_drafter(out, target, "tiny-target", ("tiny-target",)) is not None


@pytest.mark.parametrize("args, message", [
    (["--windows-per-file", "0"], "--windows-per-file must be at least 1"),
    (["--data-minutes", "0"], "--data-minutes must be above 0"),
    (["--conversation-turns", "-1"], "--conversation-turns must be 0 or more"),
    (["--prompt-tokens", "10"], "--prompt-tokens must be at least 64"),
    (["--conversations", "/no/such/folder"], "--conversations: no such folder"),
    (["--train-device", "xla"], "--train-device: cannot train on"),
])
def test_distill_refuses_bad_values_before_it_loads_a_model(args, message, capsys, tmp_path):
    code = cli_main(["distill", "--target", str(tmp_path / "missing.gguf"), *args])
    assert code != 0 and message in capsys.readouterr().err


def test_sampled_replies_add_the_targets_other_answers_and_are_held_out_with_their_prompt(target, tokenizer, tmp_path):
    import random

    from engine.distill.distill import split

    rng = random.Random(5)
    prompts = [tokenizer(" ".join(rng.choice(WORDS) for _ in range(6)))["input_ids"] for _ in range(6)]
    settings = DistillSettings(minutes=60.0, reply_tokens=16, draft_vocab=300, max_steps=10, aux_layers=(0, 1, 2),
                               checkpoint_minutes=60.0, sampled_replies=2)
    out = tmp_path / "drafter"
    list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings))
    data = read_data(out / "training")
    assert len(data) == 18 and all(d.kind == "reply" for d in data)
    # Greedy replies to every prompt first, then two rounds of sampled ones, to the same prompts.
    for n, sample in enumerate(data):
        assert sample.tokens[: sample.first].tolist() == prompts[n % 6]
    sampled = data[6:]
    assert any(not torch.equal(s.tokens, data[n % 6].tokens) for n, s in enumerate(sampled))
    first_round_seed = 100_003  # seed 0, round 1, prompt 0 (distill's seeds for sampled replies)
    again = next(teacher.own_replies(lambda: ModelRunner(target), [prompts[0]], tokenizer, set(), 16, seeds=[first_round_seed]))
    assert again[0] == sampled[0].tokens.tolist()  # seeded: the same reply again
    record = json.loads((out / "config.json").read_text())["tandem_training"]
    assert record["sampled_replies"] == 2 and record["replies"] == 18
    held, trained = split(data, 0.2, seed=0)
    held_prompts = {tuple(s.tokens[: s.first].tolist()) for s in held}
    # A prompt's three replies apart together; its greedy one scored, the sampled two unused.
    assert len(held_prompts) == 1 and len(held) == 1 and len(trained) == 15
    assert any(held[0] is g for g in data[:6])
    assert not any(tuple(s.tokens[: s.first].tolist()) in held_prompts for s in trained)
