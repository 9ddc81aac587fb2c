"""EAGLE-3 drafters from checkpoints that test code writes in both published layouts
(tests/engine/drafters/eagle3_checkpoints.py, which never imports the engine's reader): greedy
output identical to plain decoding on the transformers runner and on a GGUF file's runner (and
through ``tandem compare``), the exact sampling law, a cache that follows the accepted context,
and clear refusals of a drafter made for another model."""
from __future__ import annotations

import pytest
import torch

from engine.cli import main as cli_main
from engine.core.events import Finished, Stats
from engine.core.sampler import Sampler
from engine.core.settings import PREFILL_CHUNK, DecodeSettings
from engine.decode.decoding import speculative_decode
from engine.drafters import DrafterMismatch
from engine.drafters.eagle3 import Eagle3Drafter, load_eagle3_drafter
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.models.runners.gguf_runner import GgufRunner
from engine.models.runners.runner import ModelRunner
from engine.session.session import Session
from engine.testing.tiny_gguf import build_model as build_small_init_model
from engine.testing.tiny_models import build_model
from tests.engine.drafters import eagle3_checkpoints as checkpoints
from tests.engine.drafters.made_for_target_checks import (
    PROMPTS,
    assert_greedy_is_plain,
    assert_turns_reuse_the_prefix,
    rechecked,
    sampled_outcomes,
    token_ids,
)
from tests.engine.helpers import run_to_end
from tests.stats_helpers import assert_same_distribution, exact_law

LAYERS = 4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tokenizer):
    """A target whose text repeats itself at times (a small initialisation), so that a drafter
    repeating the target's own guess is accepted there."""
    return build_small_init_model("qwen2", len(tokenizer), layers=LAYERS, seed=2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, target, tokenizer):
    """A Speculators checkpoint (full vocabulary, the target's embedding) and an EAGLE authors'
    one (a reduced vocabulary of every other id, its own embedding)."""
    root = tmp_path_factory.mktemp("eagle3")
    reduced = list(range(0, len(tokenizer), 2))
    return {
        "speculators": checkpoints.save_speculators(root / "tiny-speculator.eagle3", target, checkpoints.copy_of_target(target),
                                                    [1, 2, LAYERS]),
        "eagle-authors": checkpoints.save_eagle_authors(root / "tiny-eagle3", target,
                                                        checkpoints.copy_of_target(target, seed=1, draft_ids=reduced),
                                                        [1, 2, LAYERS], draft_ids=reduced),
    }


def drafter_for(folder, target) -> Eagle3Drafter:
    return load_eagle3_drafter(folder, target, "tiny-target", ("tiny-target",))


@pytest.mark.parametrize("layout", ["speculators", "eagle-authors"])
def test_both_layouts_load_with_their_vocabulary_maps(folders, target, tokenizer, layout):
    drafter = drafter_for(folders[layout], target)
    assert drafter.layers.spec.layout == layout and drafter.aux_layers == (1, 2, LAYERS)
    ids_drafted = drafter.layers.target_ids(torch.arange(drafter.layers.spec.draft_vocab_size))
    expected = list(range(len(tokenizer))) if layout == "speculators" else list(range(0, len(tokenizer), 2))
    assert ids_drafted.tolist() == expected
    # The Speculators checkpoint ships no embedding: it reads the target's own table.
    assert (drafter.embed is target.get_input_embeddings()) == (layout == "speculators")


@pytest.mark.parametrize("layout", ["speculators", "eagle-authors"])
def test_greedy_output_is_plain_decodings(folders, target, tokenizer, layout):
    assert_greedy_is_plain(drafter_for(folders[layout], target), target, tokenizer, (1, 2, 4, None), layout)


def test_a_shipped_16_bit_embedding_is_held_at_16_bits_with_the_same_drafts(tmp_path, target, tokenizer):
    """Published checkpoints carry a bf16 copy of the target's embedding, often the drafter's
    largest tensor: it stays bf16 in memory, and the drafts are those of the same values in fp32."""
    weights = checkpoints.copy_of_target(target, seed=3)
    half = drafter_for(checkpoints.save_speculators(tmp_path / "bf16", target, weights, [1, 2, LAYERS], embed=True,
                                                    embed_dtype=torch.bfloat16), target)
    widened = drafter_for(checkpoints.save_speculators(tmp_path / "fp32", target, weights, [1, 2, LAYERS], embed=True,
                                                       embed_dtype=torch.float32), target)
    assert half.embed.weight.dtype == torch.bfloat16 and widened.embed.weight.dtype == torch.float32
    widened.embed.weight.data = half.embed.weight.detach().float()  # the bf16 values, held in fp32
    prompt = token_ids(tokenizer, PROMPTS[0])
    drafts = []
    for drafter in (half, widened):
        runner = ModelRunner(target)
        drafter.attach_target(runner)
        runner.forward(prompt)
        drafter.prepare(prompt + [5])
        drafts.append(drafter.propose(prompt + [5], 4, Sampler(DecodeSettings(mode="sample", temperature=1.0, seed=7), "cpu")))
    assert drafts[0].tokens == drafts[1].tokens and torch.equal(drafts[0].probs, drafts[1].probs)
    assert_greedy_is_plain(half, target, tokenizer, (3,), "bf16 embedding")


def test_reduced_vocabulary_drafts_only_its_ids(folders, target, tokenizer):
    drafter = drafter_for(folders["eagle-authors"], target)
    runner = ModelRunner(target)
    drafter.attach_target(runner)
    prompt = token_ids(tokenizer, PROMPTS[0])
    runner.forward(prompt)
    drafter.prepare(prompt + [5])
    draft = drafter.propose(prompt + [5], 4, Sampler(DecodeSettings(mode="sample", temperature=1.0), "cpu"))
    assert all(t % 2 == 0 for t in draft.tokens)
    assert float(draft.probs[:, 1::2].sum()) == 0.0  # q is zero outside the draft vocabulary


RecheckedEagle3 = rechecked(Eagle3Drafter, lambda d: Eagle3Drafter(d.layers, d.aux_layers, d.embed))


def test_drafts_follow_the_accepted_context_only(folders, target, tokenizer):
    base = drafter_for(folders["speculators"], target)
    drafter = RecheckedEagle3(base.layers, base.aux_layers, base.embed)
    accepted = drafted = 0
    for seed in range(3):
        settings = DecodeSettings(mode="sample", temperature=1.5, top_k=2, max_new_tokens=24, draft_length=3, seed=seed)
        prompt = token_ids(tokenizer, PROMPTS[1])
        result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt, settings, set()))
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert drafter.checks >= 12 and 0 < accepted < drafted


@pytest.mark.parametrize("layout", ["speculators", "eagle-authors"])
def test_speculative_sampling_keeps_the_target_distribution(folders, target, tokenizer, layout):
    """The full-vocabulary drafter is accepted often; the reduced one's q is zero on the odd ids
    the target's top-2 holds, so its tokens come from the residual draw."""
    top_k, temperature, n_tokens, trials = 2, 1.5, 4, 1000
    law = exact_law(target, token_ids(tokenizer, PROMPTS[0]), n_tokens, temperature, top_k)
    samples, drafted, accepted = sampled_outcomes(drafter_for(folders[layout], target), target, tokenizer, law, trials=trials,
                                                  temperature=temperature, top_k=top_k, n_tokens=n_tokens, draft_length=2)
    assert drafted >= trials and accepted < drafted
    assert accepted > 0 or layout == "eagle-authors"
    assert_same_distribution(samples, torch.tensor(list(law.values())))


# -- on a GGUF file's runner, through the session and the CLI -------------------------------------

@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory, tokenizer):
    """A Q8_0 file and an EAGLE-3 checkpoint made from the model written to it."""
    from engine.testing.tiny_gguf import build_model as build_gguf_model
    from engine.testing.tiny_gguf import write_gguf

    root = tmp_path_factory.mktemp("gguf-eagle3")
    model = build_gguf_model("qwen2", len(tokenizer), layers=LAYERS, seed=4)
    path = write_gguf(model, tokenizer, root / "tiny-target-q8_0.gguf", "Q8_0")
    folder = checkpoints.save_speculators(root / "tiny-target-speculator.eagle3", model, checkpoints.copy_of_target(model),
                                          None, verifier="someone/tiny-target")
    return path, folder


def test_a_gguf_target_keeps_its_own_runner_and_output(gguf_target):
    path, folder = gguf_target
    session = Session.load(path, folder, precision="file")
    drafter = session.drafter("model")
    assert isinstance(drafter, LookupFirstDrafter) and isinstance(drafter.model, Eagle3Drafter)
    assert drafter.model.aux_layers == (2, LAYERS // 2, LAYERS - 3)  # EAGLE-3's default ids
    assert isinstance(session.target_runner(drafter), GgufRunner)
    prompt = session.encode(PROMPTS[0])
    for k in (2, None):
        plain = [e for e in session.plain(prompt, DecodeSettings(max_new_tokens=24)) if isinstance(e, Finished)][0]
        settings = DecodeSettings(max_new_tokens=24, draft_length=k)
        spec = [e for e in session.speculative(prompt, settings) if isinstance(e, Finished)][0]
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_a_prompt_of_several_prefill_chunks_is_prefilled_in_chunks_with_the_same_output(gguf_target):
    """The drafter keeps each chunk's states as the target computes them: a pasted file is
    prefilled in chunks with its progress shown, as without a drafter, and the output is plain's."""
    path, folder = gguf_target
    session = Session.load(path, folder, precision="file")
    prompt = session.encode(PROMPTS[0] * 30)  # the tiny model's window is 512 tokens
    assert PREFILL_CHUNK < len(prompt) < 512 - 16
    plain = [e for e in session.plain(prompt, DecodeSettings(max_new_tokens=16)) if isinstance(e, Finished)][0]
    events = list(session.speculative(prompt, DecodeSettings(max_new_tokens=16, draft_length=3)))
    progress = [e.stats.prompt_done for e in events if isinstance(e, Stats) and e.stats.prompt_done < len(prompt)]
    assert progress == [PREFILL_CHUNK * i for i in range(1, len(progress) + 1)] and len(progress) >= 1
    spec = events[-1]
    assert isinstance(spec, Finished) and spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_a_conversations_turns_reuse_the_prefix_of_both_caches(gguf_target, tokenizer):
    path, folder = gguf_target
    assert_turns_reuse_the_prefix(Session.load(path, folder, precision="file"), tokenizer,
                                  DecodeSettings(max_new_tokens=16, draft_length=3))


@pytest.fixture(scope="module")
def gguf_draft_model(gguf_target, tokenizer):
    """A separate draft model (of the target's vocabulary) to race the EAGLE-3 drafter against."""
    from engine.testing.tiny_gguf import build_model as build_gguf_model
    from engine.testing.tiny_gguf import write_gguf

    return write_gguf(build_gguf_model("qwen2", len(tokenizer), layers=2, seed=5), tokenizer,
                      gguf_target[0].parent / "tiny-draft-q8_0.gguf", "Q8_0")


def test_raced_against_a_draft_model_loaded_beside_it(gguf_target, gguf_draft_model):
    """The demo's race of a drafter made for the target against the draft model: both draft for
    one target in one session, so the two lanes' greedy outputs are the same tokens."""
    from engine.drafters import DraftModelDrafter
    from engine.session.side_by_side import SideBySideResult, side_by_side

    path, folder = gguf_target
    draft = gguf_draft_model
    session = Session.load(path, folder, precision="file", draft_model_path=draft)
    assert isinstance(session.drafter("model").model, Eagle3Drafter) and "EAGLE-3" in session.drafter_name
    beside = session.drafter("draft_model")
    assert isinstance(getattr(beside, "model", beside), DraftModelDrafter)
    assert session.draft_model_name == "tiny-draft-q8_0.gguf"
    settings = DecodeSettings(max_new_tokens=24, draft_length=3)
    result = [item for item in side_by_side(session, PROMPTS[0], settings, "model", against="draft_model")
              if isinstance(item, SideBySideResult)][0]
    assert result.identical and result.divergence is None
    assert result.plain.stats.drafted > 0 and result.speculative.stats.drafted > 0
    plain = [e for e in session.plain(session.encode(PROMPTS[0]), settings) if isinstance(e, Finished)][0]
    assert result.speculative.token_ids == plain.token_ids

    alone = Session.load(path, folder, precision="file")
    assert alone.draft_model_name is None
    with pytest.raises(ValueError, match="no separate draft model"):
        alone.drafter("draft_model")


def test_cli_compare_with_an_eagle3_drafter(gguf_target, capsys):
    path, folder = gguf_target
    code = cli_main(["compare", "--target", str(path), "--drafter-model", str(folder), "--max-new-tokens", "16",
                     "--draft-length", "3", PROMPTS[1]])
    out = capsys.readouterr().out
    assert code == 0 and "outputs: identical" in out, out


def test_cli_compare_races_the_drafter_against_a_draft_model(gguf_target, gguf_draft_model, capsys):
    path, folder = gguf_target
    code = cli_main(["compare", "--target", str(path), "--drafter-model", str(folder), "--race-with", str(gguf_draft_model),
                     "--max-new-tokens", "16", "--draft-length", "3", PROMPTS[1]])
    out = capsys.readouterr().out
    assert code == 0 and "outputs: identical" in out, out
    assert "=== with tiny-draft-q8_0.gguf" in out and "speedup over tiny-draft-q8_0.gguf" in out
    rate = next(line for line in out.splitlines() if line.startswith("acceptance rate"))
    assert rate.split()[2].endswith("%") and rate.split()[3].endswith("%")  # both runs drafted
    with pytest.raises(SystemExit, match="--race-with races a drafter made for the target"):
        cli_main(["compare", "--target", str(path), "--drafter-model", str(gguf_draft_model), "--race-with",
                  str(gguf_draft_model), PROMPTS[1]])


# -- refusals -----------------------------------------------------------------------------------

def test_a_drafter_for_another_model_is_refused(tmp_path, target, tokenizer):
    other = build_model(len(tokenizer), hidden=48, layers=LAYERS, seed=3)
    wide = checkpoints.save_speculators(tmp_path / "wide", other, checkpoints.copy_of_target(other), [1, 2, 3])
    with pytest.raises(DrafterMismatch, match="hidden size 48; tiny-target has 64"):
        drafter_for(wide, target)
    named = checkpoints.save_speculators(tmp_path / "named", target, checkpoints.copy_of_target(target), [1, 2, 3],
                                         verifier="Qwen/Qwen3-8B")
    with pytest.raises(DrafterMismatch, match="was made for Qwen/Qwen3-8B, not tiny-target"):
        drafter_for(named, target)
    deep = checkpoints.save_speculators(tmp_path / "deep", target, checkpoints.copy_of_target(target), [1, 2, 9])
    with pytest.raises(DrafterMismatch, match=r"reads target layers \[1, 2, 9\]; tiny-target has layers 0-3"):
        drafter_for(deep, target)


def test_a_checkpoint_missing_a_tensor_is_named(tmp_path, target):
    from safetensors.torch import load_file, save_file

    folder = checkpoints.save_speculators(tmp_path / "broken", target, checkpoints.copy_of_target(target), [1, 2, 3])
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["layers.0.self_attn.k_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(DrafterMismatch, match=r"broken: its weights lack layers\.0\.self_attn\.k_proj\.weight"):
        drafter_for(folder, target)


def test_a_long_prompt_is_read_through_its_last_window_of_entries(folders, target, tokenizer):
    """A row attends to the last ``window`` entries, so entries older than that before the first
    proposal are never computed: the drafts are those of a drafter that computed every entry.
    A kept prefix that ends inside the skipped part keeps nothing of the drafter's cache."""
    window = 8
    prompt = token_ids(tokenizer, " ".join(PROMPTS) * 8)
    assert len(prompt) > 64 + window  # past the cache's first capacity
    drafts = []
    for read_window in (window, 10_000):  # skipping, and computing every entry
        drafter = drafter_for(folders["speculators"], target)
        for layer in drafter.layers.layers:
            layer.self_attn.window = window
        drafter.read_window = read_window
        runner = ModelRunner(target)
        drafter.attach_target(runner)
        runner.forward(prompt)
        drafter.prepare(prompt + [5])
        drafts.append(drafter.propose(prompt + [5], 4, Sampler(DecodeSettings(mode="sample", temperature=1.0, seed=11), "cpu")))
        assert drafter.caches[0].first == (len(prompt) - window if read_window == window else 0)
    skipped, every = drafts
    assert skipped.tokens == every.tokens
    torch.testing.assert_close(skipped.probs, every.probs, atol=1e-5, rtol=1e-4)

    assert drafter.keep_prefix(len(prompt)) == len(prompt) - 1  # the drafter that computed every entry
    skipping = drafter_for(folders["speculators"], target)
    skipping.read_window = window
    runner = ModelRunner(target)
    skipping.attach_target(runner)
    runner.forward(prompt)
    skipping.prepare(prompt + [5])
    skipping.propose(prompt + [5], 2, Sampler(DecodeSettings(), "cpu"))
    assert skipping.keep_prefix(window) == 0 and skipping.length == 0  # inside the skipped entries: reset
    assert skipping.keep_prefix(0) == 0


def test_a_catch_up_computes_the_last_entrys_output_and_every_entrys_keys(folders, target, tokenizer):
    """Entries that only fill the cache skip the attention, MLP and head: the last entry's logits
    and every cached key and value are those of computing every entry's output."""
    drafter = drafter_for(folders["speculators"], target)
    runner = ModelRunner(target)
    runner.aux_layers = drafter.aux_layers
    prompt = token_ids(tokenizer, " ".join(PROMPTS))
    runner.forward(prompt)
    layers = drafter.layers
    results = []
    for outputs in (None, 1):
        caches = layers.new_caches()
        with torch.inference_mode():
            hidden = layers.combine(runner.aux[: len(prompt) - 1].float())
            embeds = drafter.embed(torch.tensor(prompt[1:])).float()
            logits, out = layers.step(hidden, embeds, caches, 0, outputs=outputs)
        results.append((logits[-1], out[-1], caches))
    (all_logits, all_out, all_caches), (last_logits, last_out, last_caches) = results
    assert last_logits.shape == all_logits.shape
    torch.testing.assert_close(last_logits, all_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last_out, all_out, atol=1e-5, rtol=1e-5)
    n = len(prompt) - 1
    for a, b in zip(all_caches, last_caches):
        assert torch.equal(a.k[:, :n], b.k[:, :n]) and torch.equal(a.v[:, :n], b.v[:, :n])


def test_prompt_lookup_drafts_beside_it_and_it_keeps_every_passs_states(folders, target, tokenizer, gguf_target):
    """Prompt lookup drafts some passes without the drafter's layer (here whenever a token
    recurs: forced), which keeps the target's states of every pass, lookup's too, and drafts
    the others; the output is plain decoding's. Through the session the wrapper keeps the
    drafter's cache across turns; with lookup off the drafter drafts alone."""
    from engine.core.settings import DrafterOptions
    from engine.decode.decoding import plain_decode

    base = drafter_for(folders["speculators"], target)
    drafter = LookupFirstDrafter(RecheckedEagle3(base.layers, base.aux_layers, base.embed), min_match=1, lookup_prior=50.0)
    settings = DecodeSettings(max_new_tokens=48, draft_length=3)
    prompt = token_ids(tokenizer, PROMPTS[1])
    plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, settings, set()))
    result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt, settings, set()))
    assert result.token_ids == plain.token_ids
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0 and drafter.model.checks > 0

    path, folder = gguf_target
    session = Session.load(path, folder, precision="file")
    wrapped = session.drafter("model")
    assert wrapped.name.endswith("+ prompt lookup")
    assert_turns_reuse_the_prefix(session, tokenizer, DecodeSettings(max_new_tokens=16, draft_length=3))
    alone = Session.load(path, folder, precision="file", drafter_options=DrafterOptions(lookup=False))
    assert isinstance(alone.drafter("model"), Eagle3Drafter)
