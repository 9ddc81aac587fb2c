"""``tandem distill`` on tiny models: the training forward drafts exactly as the drafter will,
a short training raises held-out acceptance above the untrained layer's, a stopped run keeps
its best drafter and resumes where it stopped, and the saved drafter (Speculators format) gives
plain decoding's output through ``tandem compare``."""
from __future__ import annotations

import json

import pytest
import torch

from engine.cli import main as cli_main
from engine.core.settings import DecodeSettings
from engine.decode.decoding import speculative_decode
from engine.distill import new_drafter, teacher, training
from engine.distill.distill import DistillSettings, distill, read_data
from engine.drafters.eagle3 import Eagle3Drafter, load_eagle3_drafter
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_tokenizer
from tests.engine.helpers import run_to_end

pytestmark = pytest.mark.usefixtures("one_torch_thread")

AUX = (0, 1, 2)
WORDS = ["def", "add", "return", "print", "for", "range", "quick", "brown", "fox", "lazy", "dog", "class", "self", "import"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def target(tokenizer):
    """A target whose next token depends on its current one alone (its layers add nothing to
    the embedding): what it does can be learnt from a few texts and holds on others, as a real
    model's habits do; a random model's choices depend chaotically on the whole context."""
    from engine.testing.tiny_gguf import build_model as build_small_init_model

    model = build_small_init_model("qwen2", len(tokenizer), layers=2, seed=4)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


@pytest.fixture(scope="module")
def prompts(tokenizer):
    import random

    rng = random.Random(0)
    return [tokenizer(" ".join(rng.choice(WORDS) for _ in range(6)))["input_ids"] for _ in range(24)]


def test_training_sees_what_the_drafter_drafts(tokenizer):
    """The unrolled training forward's logits at position j and step s equal the drafter's own
    at its s-th draft after the context up to j + 1 (the text's tokens drafted)."""
    from engine.testing.tiny_models import build_model

    target = build_model(len(tokenizer), hidden=32, layers=2, seed=2)
    spec = new_drafter.spec_for_target(target.config, "tiny", 300, None, AUX)
    layers = new_drafter.new_drafter(spec, list(range(300)), target.lm_head, target.model.norm.weight.detach(), seed=1)
    with torch.no_grad():  # make the layer's attention and MLP matter
        layers.layers[0].self_attn.o_proj.weight.mul_(10)
        layers.layers[0].mlp.down_proj.weight.mul_(10)
    tokens = tokenizer("def add(a, b):\n    return a + b\nfor i in range(10): print(i)")["input_ids"]
    runner = ModelRunner(target)
    runner.aux_layers = AUX
    labels = runner.forward(tokens, n_logits=len(tokens)).argmax(-1)
    sample = teacher.Sample(runner.aux.float(), torch.tensor(tokens), labels)  # fp32 states, as the drafter reads them
    seen = []
    head = layers.lm_head.forward
    layers.lm_head.forward = lambda x: seen.append(head(x).detach()) or seen[-1]
    with torch.no_grad():
        training.unrolled(layers, target.get_input_embeddings(), sample, training.draft_index(layers), 3)
    del layers.lm_head.forward

    class TextTokens:  # a "sampler" that drafts the text's own next tokens
        greedy = True

        def __init__(self, start):
            self.next = start

        def choose(self, logits):
            drafted.append(logits)
            self.next += 1
            return tokens[self.next - 1], None

    for j in (3, 8, 14):
        drafter = Eagle3Drafter(layers, AUX, target.get_input_embeddings())
        runner = ModelRunner(target)
        drafter.attach_target(runner)
        context = tokens[: j + 2]
        runner.forward(context[:-1])
        drafter.prepare(context)
        drafted = []
        drafter.propose(context, 3, TextTokens(j + 2))
        for step in range(3):
            full = seen[step][j]
            mine = drafted[step][drafter._target_ids]
            torch.testing.assert_close(mine, full, atol=1e-4, rtol=1e-4)


def run_distill(target, tokenizer, prompts, out, **overrides):
    settings = DistillSettings(**{"minutes": 60.0, "reply_tokens": 24, "draft_vocab": 300, "steps": 3,
                                  "checkpoint_minutes": 60.0, "max_steps": 200, "aux_layers": AUX, **overrides})
    return list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings))


def test_a_short_training_raises_held_out_acceptance(target, tokenizer, prompts, tmp_path):
    events = run_distill(target, tokenizer, prompts, tmp_path / "drafter")
    record = json.loads((tmp_path / "drafter" / "config.json").read_text())["tandem_training"]
    assert record["heldout_tokens_per_pass"] > record["untrained_tokens_per_pass"] + 1.0, record
    assert [e.phase for e in events if e.phase == "data"] and events[-1].phase == "done"
    # The data's progress counts every text; training reports its held-out figure as it goes.
    assert max(e.done for e in events if e.phase == "data") == len(prompts)
    assert any(e.tokens_per_pass is not None for e in events if e.phase == "train")
    # What was saved drafts for the target: greedy output identical, and it is accepted.
    drafter = load_eagle3_drafter(tmp_path / "drafter", target, "tiny-target", ("tiny-target",))
    from engine.decode.decoding import plain_decode

    accepted = drafted = 0
    for prompt in prompts[-4:]:
        plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=24), set()))
        spec, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt,
                                                DecodeSettings(max_new_tokens=24, draft_length=3), set()))
        assert spec.token_ids == plain.token_ids
        accepted, drafted = accepted + spec.stats.accepted, drafted + spec.stats.drafted
    assert accepted > drafted / 2


def test_a_stopped_run_keeps_its_best_and_resumes(target, tokenizer, prompts, tmp_path):
    out = tmp_path / "drafter"
    state = {"calls": 0}

    def stop_after_a_while():
        """Stop some steps into training (once the data is on disk)."""
        if (out / "training" / "data.json").is_file():
            state["calls"] += 1
        return state["calls"] > 40

    settings = DistillSettings(minutes=60.0, reply_tokens=24, draft_vocab=300, max_steps=300, aux_layers=AUX,
                               checkpoint_minutes=60.0)
    first = list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings,
                         cancel=stop_after_a_while))
    assert (out / "config.json").is_file() and (out / "training" / "state.pt").is_file()
    stopped_at = torch.load(out / "training" / "state.pt", weights_only=False)["progress"]["step"]
    assert 0 < stopped_at < 300
    before = json.loads((out / "config.json").read_text())["tandem_training"]
    second = list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out, settings))
    assert any("from an earlier run" in e.message for e in second)  # the data is not made again
    assert any(e.message.startswith("resumed after") for e in second)
    assert torch.load(out / "training" / "state.pt", weights_only=False)["progress"]["step"] == 300
    after = json.loads((out / "config.json").read_text())["tandem_training"]
    # The record keeps the first run's untrained figure and data time, not the resumed run's.
    assert after["untrained_tokens_per_pass"] == before["untrained_tokens_per_pass"]
    assert after["data_seconds"] == before["data_seconds"] and after["steps"] > before["steps"]
    assert first[-1].phase == second[-1].phase == "done"


@pytest.mark.slow
def test_cli_distill_then_compare(tmp_path, tokenizer, capsys):
    from engine.testing.tiny_gguf import build_model as build_gguf_model
    from engine.testing.tiny_gguf import write_gguf

    path = write_gguf(build_gguf_model("qwen2", len(tokenizer), layers=4, seed=4), tokenizer, tmp_path / "tiny-q8_0.gguf", "Q8_0")
    code = cli_main(["distill", "--target", str(path), "--limit", "12", "--reply-tokens", "24", "--head-tokens", "300",
                     "--minutes", "0.05"])
    assert code == 0
    out = tmp_path / "tiny-q8_0-speculator.eagle3"
    assert (out / "config.json").is_file()
    capsys.readouterr()
    code = cli_main(["compare", "--target", str(path), "--drafter-model", str(out), "--max-new-tokens", "16", "def add(a, b):"])
    assert code == 0 and "outputs: identical" in capsys.readouterr().out


def test_text_windows_spread_over_files_and_folders(tokenizer, tmp_path):
    """A folder gives its text files (not others); the windows come from every file before any
    file gives a second, and the token limit holds."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    import random

    for n in range(4):  # four different texts
        rng = random.Random(n)
        (folder / "sub" / f"f{n}.py").write_text(" ".join(rng.choice(WORDS) for _ in range(400)))
    (folder / "skip.bin").write_bytes(b"\x00\x01" * 100)
    files = teacher.text_files([folder])
    assert sorted(p.name for p in files) == ["f0.py", "f1.py", "f2.py", "f3.py"]
    window = 32
    first = list(teacher.text_windows(files, tokenizer, window=window, limit_tokens=4 * window, per_file=1))
    assert len(first) == 4 and all(len(t) == window and f == 0 for t, f in first)
    per_file = [len(list(teacher.text_windows([f], tokenizer, window=window))) for f in files]
    assert min(per_file) > 2
    # One window of each file: each window is one of its file's own.
    owners = []
    for tokens, _ in first:
        owners.append(next(i for i, f in enumerate(files)
                           if tokens in [w for w, _ in teacher.text_windows([f], tokenizer, window=window, per_file=10**6)]))
    assert sorted(owners) == [0, 1, 2, 3]
    everything = list(teacher.text_windows(files, tokenizer, window=window))
    assert len(everything) == sum(per_file)  # with no limit, every window of every file
    limited = list(teacher.text_windows(files, tokenizer, window=window, limit_tokens=5 * window + 3))
    assert sum(len(t) for t, _ in limited) <= 5 * window + 3 and len(limited) == 5


def test_soft_labels_are_the_targets_distribution_over_the_draft_vocabulary():
    """The soft loss is the cross-entropy against the target's top-k probabilities renormalized
    over the ids the draft head holds; rows not valid count for nothing; one id of probability 1
    is the plain cross-entropy."""
    torch.manual_seed(0)
    vocab, draft = 10, 6
    index = torch.full((vocab,), training.IGNORE, dtype=torch.long)
    index[torch.arange(draft) * 1 + 4] = torch.arange(draft)  # target ids 4..9 are draft ids 0..5
    logits = torch.randn(3, draft)
    top_ids = torch.tensor([[4, 0, 5], [9, 8, 1], [6, 7, 2]], dtype=torch.int32)
    top_probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.2, 0.1], [0.9, 0.05, 0.05]], dtype=torch.float16)
    valid = torch.tensor([True, True, False])
    got = training.soft_cross_entropy(logits, index, top_ids, top_probs, valid)
    logp = torch.log_softmax(logits, -1)
    p0 = torch.tensor([0.5, 0.2], dtype=torch.float16).float()
    p1 = torch.tensor([0.6, 0.2], dtype=torch.float16).float()
    row0 = -(p0 / p0.sum() * logp[0, [0, 1]]).sum()
    row1 = -(p1 / p1.sum() * logp[1, [5, 4]]).sum()
    torch.testing.assert_close(got, (row0 + row1) / 2)
    one = training.soft_cross_entropy(logits, index, torch.tensor([[4], [9], [6]], dtype=torch.int32),
                                      torch.ones(3, 1, dtype=torch.float16), torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(one, torch.nn.functional.cross_entropy(logits, torch.tensor([0, 5, 2])))
    assert training.soft_cross_entropy(logits, index, torch.zeros(3, 1, dtype=torch.int32),
                                       torch.ones(3, 1, dtype=torch.float16), valid) is None  # id 0: not drafted


def test_teach_keeps_the_targets_top_k(tokenizer):
    from engine.testing.tiny_models import build_model

    target = build_model(len(tokenizer), hidden=32, layers=2, seed=2)
    tokens = tokenizer("def add(a, b):\n    return a + b\nfor i in range(10): print(i)")["input_ids"]
    sample = teacher.teach(ModelRunner(target), tokens, AUX, first=2, top_k=5, kind="reply")
    runner = ModelRunner(target)
    probs = torch.softmax(runner.forward(tokens, n_logits=len(tokens)).float(), -1)
    want_probs, want_ids = probs.topk(5, -1)
    assert sample.kind == "reply" and sample.top_ids.dtype == torch.int32 and sample.top_probs.dtype == torch.float16
    assert torch.equal(sample.top_ids.long(), want_ids) and torch.equal(sample.top_ids[:, 0].long(), sample.labels)
    torch.testing.assert_close(sample.top_probs.float(), want_probs, atol=1e-3, rtol=1e-3)
    assert teacher.teach(ModelRunner(target), tokens, AUX).top_ids is None


def test_the_held_out_texts_are_the_targets_replies():
    from engine.distill.distill import split

    def sample(kind, n):
        return teacher.Sample(torch.zeros(4, 3), torch.full((4,), n), torch.zeros(4, dtype=torch.long), kind=kind)

    samples = [sample("reply", n) for n in range(20)] + [sample("text", 100 + n) for n in range(50)]
    held, trained = split(samples, 0.1, seed=3)
    assert len(held) == 2 and all(s.kind == "reply" for s in held)
    assert len(trained) == 68 and sum(s.kind == "text" for s in trained) == 50
    assert split(samples, 0.1, seed=3)[0][0] is held[0]  # seeded
    texts_only = [sample("text", n) for n in range(20)]
    held, trained = split(texts_only, 0.1, seed=0)
    assert len(held) == 2 and len(trained) == 18


def test_distilling_from_replies_and_text_files(target, tokenizer, prompts, tmp_path):
    """Replies and text files together, argmax labels (top_k=0) and the target's distribution
    both raise the held-out acceptance, and the record says how many replies were made."""
    import random

    rng = random.Random(1)
    folder = tmp_path / "texts"
    folder.mkdir()
    for n in range(6):
        (folder / f"t{n}.md").write_text(" ".join(rng.choice(WORDS) for _ in range(200)))
    for top_k in (0, 8):
        out = tmp_path / f"drafter{top_k}"
        run_distill(target, tokenizer, prompts, out, text_files=(folder,), text_tokens=2000, top_k=top_k, max_steps=150)
        record = json.loads((out / "config.json").read_text())["tandem_training"]
        assert record["replies"] == len(prompts) and record["texts"] > len(prompts) and record["top_k"] == top_k
        assert record["heldout_texts"] == 2
        assert record["heldout_tokens_per_pass"] > record["untrained_tokens_per_pass"] + 0.8, record
        data = read_data(out / "training")
        assert all((d.top_ids is None) == (top_k == 0) for d in data)
        kinds = [d.kind for d in data]  # made interleaved: a time limit leaves some of both
        assert "text" in kinds[: len(kinds) // 3] and "reply" in kinds[-len(kinds) // 3 :], kinds


def test_data_is_kept_as_it_is_made_and_a_data_time_limit_trains_on_what_is_there(target, tokenizer, prompts, tmp_path,
                                                                                monkeypatch):
    """A run stopped while making data keeps what it made (in shards); the next run goes on from
    there; with its data time spent it trains on what was made, and a later run reads that."""
    from engine.distill import distill as distill_module

    monkeypatch.setattr(distill_module, "SHARD_SAMPLES", 4)
    out = tmp_path / "drafter"

    def stop_in_the_data():  # once a shard is on disk
        return any((out / "training").glob("data-*.pt"))

    first = run_distill(target, tokenizer, prompts, out, max_steps=20)
    fresh = read_data(out / "training")  # all made in one go
    out = tmp_path / "stopped"
    list(distill(lambda: ModelRunner(target), target, tokenizer, set(), "tiny-target", prompts, out,
                 DistillSettings(reply_tokens=24, draft_vocab=300, max_steps=20, aux_layers=AUX), cancel=stop_in_the_data))
    kept = sorted((out / "training").glob("data-*.pt"))
    made = sum(len(torch.load(k, weights_only=False)) for k in kept)
    assert kept and 4 <= made < len(prompts) and read_data(out / "training") is None
    second = run_distill(target, tokenizer, prompts, out, max_steps=20, data_minutes=0.0)
    assert any(f"{made} replies and 0 texts from an earlier run" in e.message for e in second)
    assert any("data time (0 min) spent" in e.message for e in second)
    data = read_data(out / "training")
    assert len(data) == made and sorted((out / "training").glob("data-*.pt")) == kept  # the shards are the data
    for mine, theirs in zip(data, fresh):  # the same replies as a run that made them in one go
        assert torch.equal(mine.tokens, theirs.tokens) and torch.equal(mine.labels, theirs.labels)
    assert second[-1].phase == "done" and (out / "config.json").is_file()
    third = run_distill(target, tokenizer, prompts, out, max_steps=30)
    assert any(f"{made} texts from an earlier run" in e.message for e in third)
    assert len(first) and third[-1].phase == "done"


def test_data_written_whole_by_earlier_runs_is_still_read(tmp_path):
    """Before shards, a run wrote its complete data as one data.pt: a training folder of then
    trains again without making its data anew."""
    from engine.distill import distill as distill_module
    from engine.distill.teacher import Sample

    made = [Sample(aux=torch.randn(5, 12), tokens=torch.arange(5), labels=torch.arange(1, 6), first=2, top_ids=None,
                   top_probs=None, kind=kind) for kind in ("reply", "text")]
    assert read_data(tmp_path) is None
    distill_module._write_samples(made, tmp_path / "data.pt")
    data = read_data(tmp_path)
    assert [d.kind for d in data] == ["reply", "text"] and torch.equal(data[0].aux, made[0].aux)
