"""Reading EAGLE-3 and DFlash drafter configs in their published layouts (the shapes of
RedHatAI's Speculators configs, the EAGLE authors' flat configs and z-lab's DFlash ones), and
checking that a drafter belongs to its target, without torch."""
from __future__ import annotations

import pytest

from engine.models.planning.speculators_config import (
    SpeculatorError,
    check_belongs_to,
    default_aux_layers,
    is_speculator_config,
    model_family_name,
    parse_speculator,
)

LAYER = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "max_position_embeddings": 40960, "vocab_size": 151936}

SPECULATORS_EAGLE3 = {
    "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.1.0",
    "draft_vocab_size": 32000, "norm_before_residual": True, "target_hidden_size": None,
    "transformer_layer_config": LAYER,
    "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                           "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                           "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]}},
}
AUTHORS_EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], **LAYER, "draft_vocab_size": 32000,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32], "use_aux_hidden_state": True}}
ZLAB_DFLASH = {"architectures": ["DFlashDraftModel"], **{**LAYER, "model_type": "qwen3", "num_hidden_layers": 5},
               "block_size": 16, "num_target_layers": 36,
               "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}
QWEN3_8B = {"hidden_size": 4096, "vocab_size": 151936, "num_hidden_layers": 36}


def test_speculators_eagle3():
    spec = parse_speculator(SPECULATORS_EAGLE3)
    assert (spec.algorithm, spec.layout, spec.label) == ("eagle3", "speculators", "EAGLE-3")
    assert spec.draft_vocab_size == 32000 and spec.target_hidden_size == 4096 and spec.norm_before_residual
    assert spec.layers.head_dim == 128 and spec.layers.kv_heads == 8 and spec.speculative_tokens == 3
    assert spec.verifier_name == "Qwen/Qwen3-8B" and spec.aux_layer_ids is None
    # No ids in the config: EAGLE-3's default for the target's depth.
    assert check_belongs_to(spec, QWEN3_8B, "Qwen3-8B-Q4_K_M.gguf", "x", ("Qwen3-8B-Q4_K_M.gguf",)) == (2, 18, 33)
    assert default_aux_layers(28) == (2, 14, 25)


def test_eagle_authors_layout_and_its_layer_ids():
    spec = parse_speculator(AUTHORS_EAGLE3, "AngelSlim/Qwen3-8B_eagle3")
    assert spec.layout == "eagle-authors" and spec.aux_layer_ids == (1, 17, 32) and spec.verifier_name is None
    # Without a verifier name only the shapes are checked.
    assert check_belongs_to(spec, QWEN3_8B, "my-qwen3", "d", ("my-qwen3",)) == (1, 17, 32)


def test_dflash_configs_are_read():
    spec = parse_speculator(ZLAB_DFLASH)
    assert (spec.algorithm, spec.layout, spec.block_size, spec.speculative_tokens) == ("dflash", "dflash-authors", 16, 15)
    assert spec.aux_layer_ids == (1, 9, 17, 25, 33) and spec.mask_token_id == 151669 and spec.layers.qk_norm
    speculators = {"speculators_model_type": "dflash", "transformer_layer_config": {**LAYER, "model_type": "qwen3"},
                   "block_size": 8, "aux_hidden_state_layer_ids": [1, 9, 17], "mask_token_id": 5,
                   "speculators_config": {"algorithm": "dflash", "verifier": {"name_or_path": "Qwen/Qwen3-8B"}}}
    spec = parse_speculator(speculators)
    assert spec.block_size == 8 and spec.speculative_tokens == 7 and spec.aux_layer_ids == (1, 9, 17)


def test_what_is_not_a_drafter_made_for_a_target():
    assert not is_speculator_config({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8})
    assert not is_speculator_config(None)
    with pytest.raises(SpeculatorError, match="not an EAGLE-3 or DFlash drafter"):
        parse_speculator({"architectures": ["Qwen2ForCausalLM"]}, "plain")
    with pytest.raises(SpeculatorError, match="is a 'mlp' speculator"):
        parse_speculator({**SPECULATORS_EAGLE3, "speculators_model_type": "mlp"}, "mlp-one")
    with pytest.raises(SpeculatorError, match="lacks or garbles a field"):
        parse_speculator({**SPECULATORS_EAGLE3, "transformer_layer_config": {"hidden_size": 8}}, "broken")


def test_a_drafter_for_another_model_is_refused_with_what_differs():
    spec = parse_speculator(SPECULATORS_EAGLE3)
    with pytest.raises(SpeculatorError, match="hidden size 4096; Qwen3-4B has 2560"):
        check_belongs_to(spec, {"hidden_size": 2560, "vocab_size": 151936, "num_hidden_layers": 36}, "Qwen3-4B", "d")
    with pytest.raises(SpeculatorError, match="151,936-token vocabulary; Llama's has 128,256"):
        check_belongs_to(spec, {"hidden_size": 4096, "vocab_size": 128256, "num_hidden_layers": 32}, "Llama", "d")
    with pytest.raises(SpeculatorError, match="made for Qwen/Qwen3-8B, not Qwen3-8B-Base"):
        check_belongs_to(spec, QWEN3_8B, "Qwen3-8B-Base", "d", ("Qwen3-8B-Base.gguf",))
    with pytest.raises(SpeculatorError, match=r"reads target layers \[2, 18, 40\]"):
        check_belongs_to(parse_speculator({**SPECULATORS_EAGLE3, "eagle_aux_hidden_state_layer_ids": [2, 18, 40]}),
                         QWEN3_8B, "Qwen3-8B", "d")


@pytest.mark.parametrize("name, family", [
    ("Qwen/Qwen3-8B", "qwen3-8b"), ("Qwen3-8B-Q4_K_M.gguf", "qwen3-8b"), ("qwen3-8b-q8_0.gguf", "qwen3-8b"),
    ("/models/Llama-3.1-8B-Instruct/", "llama-3.1-8b-instruct"), ("Qwen3-8B-AWQ", "qwen3-8b"), (None, None),
])
def test_model_family_names(name, family):
    assert model_family_name(name) == family
