"""DFlash drafters (a block of drafts from one pass) from checkpoints that test code writes in
z-lab's layout and the Speculators one: greedy output identical to plain decoding at every draft
length, on the transformers runner and a GGUF file's, and through ``tandem compare``; the exact
sampling law with per-row draft distributions; a context cache that follows the accepted text."""
from __future__ import annotations

import pytest
import torch

from engine.cli import main as cli_main
from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.decode.decoding import speculative_decode
from engine.drafters import DrafterMismatch
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.drafters.made_for_target import load_made_for_target
from engine.models.runners.gguf_runner import GgufRunner
from engine.models.runners.runner import ModelRunner
from engine.session.session import Session
from engine.testing.tiny_gguf import build_model
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

LAYERS, MASK = 4, 0

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tokenizer):
    return build_model("qwen2", len(tokenizer), layers=LAYERS, seed=3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, target, tokenizer):
    root = tmp_path_factory.mktemp("dflash")
    reduced = list(range(0, len(tokenizer), 3))
    return {
        "dflash-authors": checkpoints.save_dflash_authors(root / "tiny-dflash-b8", target, [0, 2], MASK),
        "speculators": checkpoints.save_dflash_speculators(root / "tiny-speculator.dflash", target, [1, 3], MASK, reduced),
    }


def drafter_for(folder, target) -> DFlashDrafter:
    drafter = load_made_for_target(folder, target, "tiny-target", ("tiny-target",))
    assert isinstance(drafter, DFlashDrafter)
    return drafter


def test_layouts_load_with_their_layer_ids_and_heads(folders, target, tokenizer):
    authors = drafter_for(folders["dflash-authors"], target)
    # DFlash counts layer outputs; the runners keep layer inputs, one further on.
    assert authors.aux_layers == (1, 3) and authors.block_size == 8 and authors.mask_token_id == MASK
    assert authors.head is target.get_output_embeddings()  # no head of its own: the target's
    reduced = drafter_for(folders["speculators"], target)
    assert reduced.aux_layers == (2, 4) and reduced.head is reduced.layers.lm_head
    assert reduced._target_ids.tolist() == list(range(0, len(tokenizer), 3))


@pytest.mark.parametrize("layout", ["dflash-authors", "speculators"])
def test_greedy_output_is_plain_decodings(folders, target, tokenizer, layout):
    # 12: more than a block holds, cut to 7
    assert_greedy_is_plain(drafter_for(folders[layout], target), target, tokenizer, (1, 3, 7, 12, None), layout)


RecheckedDFlash = rechecked(DFlashDrafter, lambda d: DFlashDrafter(d.layers, d.aux_layers, d.embed, d.head, d.mask_token_id,
                                                                   d.block_size, d.vocab))


def test_the_context_follows_the_accepted_text(folders, target, tokenizer):
    base = drafter_for(folders["dflash-authors"], target)
    drafter = RecheckedDFlash(base.layers, base.aux_layers, base.embed, base.head, base.mask_token_id, base.block_size, base.vocab)
    for seed in range(2):
        settings = DecodeSettings(mode="sample", temperature=1.5, top_k=2, max_new_tokens=20, draft_length=4, seed=seed)
        result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, token_ids(tokenizer, PROMPTS[1]), settings, set()))
        assert isinstance(result, Finished)
    assert drafter.checks >= 8


def test_speculative_sampling_keeps_the_target_distribution(folders, target, tokenizer):
    top_k, temperature, n_tokens = 2, 1.5, 4
    law = exact_law(target, token_ids(tokenizer, PROMPTS[0]), n_tokens, temperature, top_k)
    samples, drafted, _ = sampled_outcomes(drafter_for(folders["speculators"], target), target, tokenizer, law, trials=1000,
                                           temperature=temperature, top_k=top_k, n_tokens=n_tokens, draft_length=3)
    assert drafted >= 1000
    assert_same_distribution(samples, torch.tensor(list(law.values())))


def test_a_drafter_without_a_mask_token_is_refused(tmp_path, target):
    import json

    folder = checkpoints.save_dflash_authors(tmp_path / "no-mask", target, [0, 2], MASK)
    config = json.loads((folder / "config.json").read_text())
    del config["dflash_config"]["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterMismatch, match="names no mask_token_id"):
        drafter_for(folder, target)


def test_a_gguf_target_through_the_session_and_compare(tmp_path, tokenizer, capsys):
    from engine.testing.tiny_gguf import write_gguf

    model = build_model("qwen2", len(tokenizer), layers=LAYERS, seed=5)
    path = write_gguf(model, tokenizer, tmp_path / "tiny-target-q8_0.gguf", "Q8_0")
    folder = checkpoints.save_dflash_authors(tmp_path / "tiny-target-dflash", model, [0, 2], MASK)
    session = Session.load(path, folder, precision="file")
    drafter = session.drafter("model")
    assert isinstance(drafter, LookupFirstDrafter) and isinstance(session.target_runner(drafter), GgufRunner)
    drafter = drafter.model  # inside prompt lookup's wrapper
    assert isinstance(drafter, DFlashDrafter)
    # On the CPU its linears run int8, as an EAGLE-3's (the session's "auto" drafter weights).
    from engine.quant.quantize import Int8Linear, int8_available

    assert int8_available() and all(not isinstance(m, torch.nn.Linear) for m in drafter.layers.modules())
    assert any(isinstance(m, Int8Linear) for m in drafter.layers.modules())
    code = cli_main(["compare", "--target", str(path), "--drafter-model", str(folder), "--max-new-tokens", "16",
                     "--draft-length", "5", PROMPTS[0]])
    assert code == 0 and "outputs: identical" in capsys.readouterr().out
    # The adaptive draft length, through the session (the server's and the app's path).
    prompt = session.encode(PROMPTS[1])
    plain = [e for e in session.plain(prompt, DecodeSettings(max_new_tokens=20)) if isinstance(e, Finished)][0]
    spec = [e for e in session.speculative(prompt, DecodeSettings(max_new_tokens=20)) if isinstance(e, Finished)][0]
    assert spec.token_ids == plain.token_ids
    assert_turns_reuse_the_prefix(session, tokenizer, DecodeSettings(max_new_tokens=16, draft_length=5))
