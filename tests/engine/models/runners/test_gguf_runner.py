"""GgufRunner computes what transformers' modules compute on a GGUF model, bit for bit, with
rows independent of how many share a pass; sessions and GGUF drafters use it."""
from __future__ import annotations

import pytest
import torch

from engine.core.settings import DecodeSettings
from engine.drafters.draft_model import DraftModelDrafter
from engine.models.loading.loader import load_model
from engine.models.runners.gguf_runner import GgufRunner, unsupported_reason
from engine.models.runners.interface import ContextTooLong
from engine.models.runners.invariant_attention import PREFILL_ROWS
from engine.models.runners.runner import ModelRunner
from engine.session.compare import compare
from engine.session.session import Session
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer, perturbed_copy
from kernels import attention

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(attention.fast_backend() is None, reason="no compiled attention kernel here")]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module", params=[("qwen2", "Q4_0"), ("llama", "Q8_0"), ("qwen3", "Q5_1")], ids=lambda p: "-".join(p))
def loaded(request, tokenizer, tmp_path_factory):
    arch, qtype = request.param
    model = build_model(arch, len(tokenizer), layers=3, seed=3)
    path = write_gguf(model, tokenizer, tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf", qtype)
    return load_model(path, "file", "cpu")


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _same(ours: torch.Tensor, theirs: torch.Tensor, model) -> bool:
    """Bit for bit where transformers' path has the batch-invariant attention kernel too (Llama,
    Qwen2); Qwen3's attention there is PyTorch's SDPA, which rounds differently."""
    if model.config._attn_implementation == "tandem_batch_invariant":
        return torch.equal(ours, theirs)
    return torch.allclose(ours, theirs, atol=1e-4 * theirs.abs().max().item())


def test_logits_are_transformers_through_prefill_and_decoding(loaded):
    vocab = loaded.model.config.vocab_size
    if loaded.model.config.model_type != "qwen3":
        assert loaded.model.config._attn_implementation == "tandem_batch_invariant"
    # Against transformers' fp32 cache, with an fp32 cache (the fp16 one: the next test).
    reference, runner = ModelRunner(loaded.model), GgufRunner(loaded.model, kv_dtype=torch.float32)
    prompt = _ids(20, 0, vocab)
    assert _same(runner.forward(prompt, 3), reference.forward(prompt, 3), loaded.model)
    token = prompt[-1]
    for step in range(8):
        ours, theirs = runner.forward([token], 1), reference.forward([token], 1)
        assert _same(ours, theirs, loaded.model), step
        token = int(theirs.argmax())
    # A verification block of 5 rows after a rollback, as speculation feeds it.
    runner.crop(22), reference.crop(22)
    block = _ids(5, 1, vocab)
    assert _same(runner.forward(block, 5), reference.forward(block, 5), loaded.model)
    assert runner.length == reference.length == 27


def test_a_row_does_not_depend_on_how_many_rows_share_the_pass(loaded):
    vocab = loaded.model.config.vocab_size
    runner = GgufRunner(loaded.model, initial_capacity=8)  # the cache grows twice on the way
    runner.forward(_ids(12, 2, vocab))
    block = _ids(6, 3, vocab)
    together = runner.forward(block, 6)
    runner.crop(12)
    one_by_one = torch.cat([runner.forward([t], 1) for t in block])
    assert torch.equal(together, one_by_one)


def test_a_layers_linears_in_one_call_give_the_bits_of_one_call_each(loaded):
    """q, k, v and gate, up run as one kernel call per group (gguf_linear.linear_group) where the
    file's blocks allow; the same runner with the groups taken apart gives the same bits."""
    vocab = loaded.model.config.vocab_size
    grouped, separate = GgufRunner(loaded.model), GgufRunner(loaded.model)
    for layer in separate.layers:
        layer.qkv = layer.gate_up = None
    assert all(layer.gate_up is not None for layer in grouped.layers)
    # A llama file stores Q and K with their rows reordered: those stay one call each.
    assert all((layer.qkv is None) == (loaded.model.config.model_type == "llama") for layer in grouped.layers)
    prompt = _ids(14, 4, vocab)
    assert torch.equal(grouped.forward(prompt, 3), separate.forward(prompt, 3))
    for rows in (1, 5):
        block = _ids(rows, 5 + rows, vocab)
        assert torch.equal(grouped.forward(block, rows), separate.forward(block, rows))


def test_the_fp16_cache_holds_the_rounded_keys_and_values_and_stays_close(loaded):
    """The default cache is fp16 (KV_DTYPE): what it stores is the fp32 runner's K/V rounded to
    fp16 (the first layer's, whose inputs are the same), and the logits stay close to it."""
    vocab = loaded.model.config.vocab_size
    half, full = GgufRunner(loaded.model), GgufRunner(loaded.model, kv_dtype=torch.float32)
    assert half.kv.k.dtype == torch.float16 and full.kv.k.dtype == torch.float32
    prompt = _ids(40, 6, vocab)
    ours, theirs = half.forward(prompt, 4), full.forward(prompt, 4)
    assert torch.equal(half.kv.k[0, :, :40], full.kv.k[0, :, :40].half())
    assert torch.equal(half.kv.v[0, :, :40], full.kv.v[0, :, :40].half())
    assert half.kv_bytes * 2 == full.kv_bytes
    assert not torch.equal(ours, theirs)
    p, q = theirs.log_softmax(-1), ours.log_softmax(-1)
    # nats; a tiny random model is touchier than a trained one (tandem fidelity measures that)
    assert float((p.exp() * (p - q)).sum(-1).max()) < 0.05


def test_a_long_prompt_prefills_with_fused_attention_and_stays_close(loaded):
    """Past PREFILL_ROWS rows transformers' path takes PyTorch's SDPA and GgufRunner its own
    kernel; a second long chunk attends to the first through the causal mask."""
    vocab = loaded.model.config.vocab_size
    reference, runner = ModelRunner(loaded.model), GgufRunner(loaded.model, kv_dtype=torch.float32)
    first, second = _ids(PREFILL_ROWS + 6, 4, vocab), _ids(PREFILL_ROWS + 3, 5, vocab)
    for chunk in (first, second):
        ours, theirs = runner.forward(chunk, 4), reference.forward(chunk, 4)
        assert torch.allclose(ours, theirs, atol=1e-4 * theirs.abs().max().item()), (ours - theirs).abs().max()
    assert torch.allclose(runner.forward([7], 1), reference.forward([7], 1), atol=1e-4 * 50)


def test_a_context_past_the_window_is_refused(loaded):
    runner = GgufRunner(loaded.model)
    with pytest.raises(ContextTooLong, match="exceeds the model's window"):
        runner.forward([5] * (loaded.model.config.max_position_embeddings + 1))


@pytest.mark.parametrize("drafter_precision", ["auto", "fp32"])
def test_sessions_and_gguf_drafters_run_on_it_and_speculation_stays_identical(tmp_path, tokenizer, drafter_precision):
    """A GGUF drafter on its file's blocks runs on GgufRunner too; re-quantized to int4 (what
    "auto" holds next to a GGUF target where the kernels run), on the fused int4 layers."""
    from engine.core.settings import DrafterOptions
    from engine.models.loading.loader import int4_available, int8_available
    from engine.models.runners.fused_runner import FusedRunner

    target = build_model("qwen2", len(tokenizer), layers=3, seed=5)
    drafter = perturbed_copy(target, 0.005, seed=9)
    target_path = write_gguf(target, tokenizer, tmp_path / "target.gguf", "Q4_0")
    drafter_path = write_gguf(drafter, tokenizer, tmp_path / "drafter.gguf", "Q8_0")
    session = Session.load(target_path, drafter_path, precision="file",
                           drafter_options=DrafterOptions(precision=drafter_precision))
    assert isinstance(session.target_runner(), GgufRunner)
    requantized = drafter_precision == "auto" and int8_available() and int4_available()
    assert isinstance(session.model_drafter.runner, FusedRunner if requantized else GgufRunner)
    result = compare(session, "def add(a, b):", DecodeSettings(max_new_tokens=24, draft_length=4))
    assert result.speculative.token_ids == result.plain.token_ids
    assert result.speculative.stats.accepted > 0


def test_models_it_cannot_run_say_why(tokenizer):
    plain = build_model("qwen2", len(tokenizer), layers=1)  # nn.Linear layers, not a file's
    assert unsupported_reason(plain) == "linear layers are not the GGUF file's"
    assert isinstance(DraftModelDrafter(plain, fused=False).runner, ModelRunner)
