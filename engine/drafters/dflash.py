"""A DFlash drafter: a few Qwen3-style layers that propose a whole block of tokens in one pass.

The target's states at several of its layers, for every position it has read, become the draft
layers' context: ``ctx = hidden_norm(fc(states))``, and each layer caches ``k_norm(k_proj(ctx))``
and ``v_proj(ctx)`` at those positions (kept across proposals, like any KV cache; rolled back
with the target). A proposal embeds a block [last chosen token, mask, mask, ...] at the next
positions with the target's own embedding, runs it through the layers with no causal mask inside
the block (every block row sees the whole context and the whole block), and reads drafts 1 ..
k from the rows after the first through the final norm and an LM head (the drafter's own
reduced one where it ships one, else the target's). The block's own keys are not kept.

A row's draft does not depend on the drafts before it, so each drafted token's q is its row's
distribution: speculative sampling stays exact. Layer ids count as DFlash's authors count them:
id d is the output of the target's layer d (the input of layer d + 1, as engine.models.runners
keeps them).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from engine.core.sampler import Sampler
from engine.drafters.base import Draft, DrafterBase, DrafterMismatch
from engine.drafters.eagle3_layers import DraftKV, Mlp, RmsNorm, _checkpoint_tensors, _rope, _rotate, fill_from_checkpoint
from engine.drafters.kept_states import KeptStates, keep_first
from engine.models.planning.speculators_config import SpeculatorError, SpeculatorSpec, check_belongs_to
from engine.models.runners.interface import Runner


class BlockAttention(torch.nn.Module):
    def __init__(self, spec: SpeculatorSpec) -> None:
        super().__init__()
        c = spec.layers
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.q_proj = torch.nn.Linear(c.hidden_size, c.heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = torch.nn.Linear(c.hidden_size, c.kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = torch.nn.Linear(c.hidden_size, c.kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = torch.nn.Linear(c.heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RmsNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RmsNorm(c.head_dim, c.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        k = _rotate(self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        return k.transpose(0, 1), v.transpose(0, 1)

    def forward(self, x: torch.Tensor, cache: DraftKV, context: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Block rows x [B, H] after ``context`` cached positions; every row sees all of them
        and the whole block."""
        n = x.shape[0]
        q = _rotate(self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim)), cos, sin).transpose(0, 1)
        k, v = self.keys_values(x, cos, sin)
        group = self.heads // self.kv_heads
        keys = torch.cat([cache.k[:, :context], k], dim=1).repeat_interleave(group, dim=0)
        values = torch.cat([cache.v[:, :context], v], dim=1).repeat_interleave(group, dim=0)
        out = F.scaled_dot_product_attention(q, keys, values)  # [heads, B, D], no mask
        return self.o_proj(out.transpose(0, 1).reshape(n, self.heads * self.head_dim))


class BlockLayer(torch.nn.Module):
    def __init__(self, spec: SpeculatorSpec) -> None:
        super().__init__()
        c = spec.layers
        self.self_attn = BlockAttention(spec)
        self.mlp = Mlp(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RmsNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cache, context, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cache, context, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashLayers(torch.nn.Module):
    def __init__(self, spec: SpeculatorSpec, own_head: bool) -> None:
        super().__init__()
        c = spec.layers
        self.spec = spec
        self.fc = torch.nn.Linear(len(spec.aux_layer_ids or ()) * spec.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = torch.nn.ModuleList(BlockLayer(spec) for _ in range(c.num_layers))
        self.norm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = torch.nn.Linear(c.hidden_size, spec.draft_vocab_size, bias=False) if own_head else None
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.inv_freq, self.rope_scale = _rope(spec)

    def angles(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(start, start + n, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * self.rope_scale)[:, None, :], (angles.sin() * self.rope_scale)[:, None, :]

    def add_context(self, states: torch.Tensor, caches: list[DraftKV], start: int) -> None:
        """The target's states [n, len(ids) * H] at positions start .. into every layer's cache."""
        ctx = self.hidden_norm(self.fc(states))
        cos, sin = self.angles(start, ctx.shape[0])
        for layer, cache in zip(self.layers, caches):
            k, v = layer.self_attn.keys_values(ctx, cos, sin)
            cache.write(start, k, v)

    def block(self, embeds: torch.Tensor, caches: list[DraftKV], start: int) -> torch.Tensor:
        """Hidden states [B, H] of the block rows at positions start .. after ``start`` cached."""
        cos, sin = self.angles(start, embeds.shape[0])
        x = embeds
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cache, start, cos, sin)
        return self.norm(x)


class DFlashDrafter(DrafterBase):
    free = False

    def __init__(self, layers: DFlashLayers, aux_layers: tuple[int, ...], embed: torch.nn.Module, head: torch.nn.Module,
                 mask_token_id: int, block_size: int, vocab_size: int, name: str = "DFlash") -> None:
        self.layers = layers
        self.aux_layers = tuple(aux_layers)
        self.embed = embed
        self.head = layers.lm_head if layers.lm_head is not None else head
        self.mask_token_id = mask_token_id
        self.block_size = block_size
        self.vocab = vocab_size
        self.name = name
        self.target: Runner | None = None
        self._target_ids = layers.d2t + torch.arange(layers.spec.draft_vocab_size) if layers.lm_head is not None else None
        self.reset()

    def attach_target(self, runner: Runner) -> None:
        runner.aux_layers = self.aux_layers
        self.target = runner

    def reset(self) -> None:
        c = self.layers.spec.layers
        self.caches = [DraftKV(c.kv_heads, c.head_dim) for _ in self.layers.layers]
        self.length = 0  # target positions whose context K/V every layer holds
        self._states = KeptStates()

    def keep_prefix(self, n: int) -> int:
        # A context position's K/V come from the target's states there alone.
        return keep_first(self, min(self.length, n))

    def prepare(self, prompt: list[int]) -> None:
        self._states.keep(self.target.aux, self.target.aux_start, self.target.length, "the drafter's layer states")

    def observe(self, valid_length: int) -> None:
        self._states.keep(self.target.aux, self.target.aux_start, valid_length, "the drafter's layer states")
        # Positions beyond the accepted ones leave the context (their K/V are overwritten).
        self.length = min(self.length, valid_length)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        k = min(k, self.block_size - 1)
        if k <= 0:
            return Draft(())
        seen = self.target.length  # positions 0 .. seen-1 have states; context[seen] is the anchor
        if seen != len(context) - 1 or self._states.kept != seen:
            raise RuntimeError(f"DFlash drafter out of step: target holds {seen}, kept {self._states.kept}")
        if self._states.rows:
            new = self._states.take().float()
            self.layers.add_context(new, self.caches, seen - new.shape[0])
        self.length = seen
        block = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long)
        block[0] = context[-1]
        hidden = self.layers.block(self.embed(block).float(), self.caches, seen)
        logits = self.head(hidden[1 : k + 1]).float()
        drafted, dists = [], []
        for row in logits:
            token, dist = sampler.choose(self._full_vocabulary(row))
            drafted.append(token)
            if dist is not None:
                dists.append(dist)
        return Draft(tuple(drafted), torch.stack(dists) if dists else None)

    def _full_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        if self._target_ids is None:
            return logits
        full = torch.full((self.vocab,), float("-inf"))
        full[self._target_ids] = logits
        return full


def load_dflash_drafter(folder: Path, spec: SpeculatorSpec, target_model, target_name: str,
                        target_names: tuple[str, ...] = (), quantize: bool = False) -> DFlashDrafter:
    """A DFlash drafter for ``target_model`` (DrafterMismatch, the user's message, when it does
    not fit or its files are incomplete)."""
    name = Path(folder).name
    try:
        config = target_model.config.get_text_config().to_dict()
        ids = check_belongs_to(spec, config, target_name, name, target_names)
        if spec.mask_token_id is None:
            raise SpeculatorError(f"{name}: its config names no mask_token_id, which DFlash drafts with")
        if not 0 <= int(spec.mask_token_id) < spec.layers.vocab_size:
            raise SpeculatorError(f"{name}: its mask_token_id {spec.mask_token_id} is outside the vocabulary")
        tensors = _checkpoint_tensors(folder)
        layers = DFlashLayers(spec, own_head="lm_head.weight" in tensors)
        fill_from_checkpoint(layers, tensors, name,
                             identity_d2t=layers.lm_head is None or spec.draft_vocab_size == spec.layers.vocab_size)
    except SpeculatorError as exc:
        raise DrafterMismatch(str(exc)) from exc
    if quantize:  # as an EAGLE-3's: a quarter of the fp32 layers' bytes, read at every block
        from engine.quant.quantize import int8_available, quantize_linears

        if int8_available():
            quantize_linears(layers, include_head=True)
    # DFlash counts a layer's output; the runners keep a layer's input: id d is input d + 1.
    return DFlashDrafter(layers.eval(), tuple(i + 1 for i in ids), target_model.get_input_embeddings(),
                         target_model.get_output_embeddings(), int(spec.mask_token_id), spec.block_size or 16,
                         spec.layers.vocab_size, name=f"DFlash ({name})")
