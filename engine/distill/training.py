"""Training an EAGLE-3 layer on what the target teaches (engine.distill.teacher), as it will draft.

EAGLE-3's "training-time test": a draft chains its own output as the next step's state, so
training unrolls ``steps`` draft steps in parallel over every position of a text. Entry j at
step 0 reads the target's states at j and token x_{j+1} and must predict the target's token
after j + 1; at step s the entry for j sits at position j + s, reads the layer's own output of
step s - 1 and the text's token x_{j+1+s} (where the earlier drafts were right, the text's
tokens are the drafted ones: what is accepted is exactly what training sees), and attends to
the real entries up to j and its own chain before it, as the drafter's cache holds them.

The held-out figure is the drafter's expected tokens per target pass at ``steps`` drafts
(1 + the expected run of correct drafts), measured the same way on texts it never trained on.

The layers train on whatever device they sit on (a GPU where there is one: ``training_device``);
the samples stay in host memory and each text goes over as it is trained on, and the target's
embedding table is read where the target is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.distill.teacher import Sample
from engine.drafters.eagle3_layers import Eagle3Layers, _rotate

IGNORE = -100


@dataclass(frozen=True)
class Scores:
    """What one pass over texts measured: the loss, and by draft step how many of the positions
    that count were drafted right with every draft before them right too."""

    loss: float
    positions: int
    runs: tuple[int, ...]

    @property
    def tokens_per_pass(self) -> float:
        """1 + the expected number of accepted drafts (greedy, ``len(runs)`` drafts a pass)."""
        if not self.positions:
            return 1.0
        return 1.0 + sum(r / self.positions for r in self.runs)


def training_device(wanted: str = "auto") -> torch.device:
    """Where the drafter trains: as the model is placed (engine.models.loading.placement:
    ``auto`` is a CUDA GPU, else Apple's MPS, else the CPU); a device named but not there is
    refused with the reason."""
    from engine.models.loading.placement import pick_device

    if wanted != "auto" and torch.device(wanted).type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"cannot train on {wanted!r}: choose auto, cpu, cuda or mps")
    device = pick_device(wanted)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA GPU is visible to torch here: train on the CPU (--train-device cpu)")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise ValueError("Apple's MPS is not available here: train on the CPU (--train-device cpu)")
    return device


def device_of(module: torch.nn.Module) -> torch.device:
    """The device a module's first tensor is on (the CPU for one that holds none)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def draft_index(layers: Eagle3Layers) -> torch.Tensor:
    """Target id -> draft id, IGNORE for ids the drafter's head lacks (on the layers' device)."""
    device = device_of(layers)
    index = torch.full((layers.spec.layers.vocab_size,), IGNORE, dtype=torch.long, device=device)
    draft_ids = torch.arange(layers.spec.draft_vocab_size, device=device)
    index[layers.target_ids(draft_ids)] = draft_ids
    return index


def unrolled(layers: Eagle3Layers, embed: torch.nn.Module, sample: Sample, index: torch.Tensor, steps: int,
             decay: float = 0.8) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Loss (weighted over steps), the per-step count of positions whose drafts were all right up
    to that step, and the number of positions that count (step 0's labels)."""
    layer = layers.layers[0]
    attn = layer.self_attn
    device, embed_device = device_of(layers), device_of(embed)
    T = len(sample) - 1  # entries j = 0 .. T-1 (the last position has no next token)
    tokens, labels = sample.tokens.to(device), sample.labels.to(device)
    top_ids = sample.top_ids.to(device) if sample.top_ids is not None else None
    top_probs = sample.top_probs.to(device) if sample.top_probs is not None else None
    H, KVH, D = attn.heads, attn.kv_heads, attn.head_dim
    group = H // KVH
    scale = D ** -0.5
    base = torch.arange(T, device=device)
    inv_freq = layers.inv_freq.to(device)
    hidden = layers.combine(sample.aux[:T].to(device).float())
    keys, values = [], []
    loss = torch.zeros((), device=device)
    still_right = torch.ones(T, dtype=torch.bool, device=device)
    runs = torch.zeros(steps, dtype=torch.long)
    counted = 0
    for s in range(steps):
        # The text has the token this step reads, and its label is one that counts.
        valid = (base + 1 + s <= T) & (base + 1 + s >= sample.first)
        token = tokens[(base + 1 + s).clamp(max=T)]
        label = torch.where(valid, index[labels[(base + 1 + s).clamp(max=T)]], torch.full_like(base, IGNORE))
        with torch.no_grad():  # the target's table: never trained
            embeds = embed(token.to(embed_device)).float().to(device)
        positions = (base + s).float()
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = (angles.cos() * layers.rope_scale)[:, None, :]
        sin = (angles.sin() * layers.rope_scale)[:, None, :]
        normed = layer.hidden_norm(hidden)
        residual = normed if layer.norm_before_residual else hidden
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        q = attn.q_proj(x).float().view(T, H, D)
        k = attn.k_proj(x).float().view(T, KVH, D)
        v = attn.v_proj(x).float().view(T, KVH, D)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        keys.append(k)
        values.append(v)
        # Real entries i <= j (step 0's keys), then this entry's own chain (steps 1 .. s).
        real = torch.einsum("jhd,ihd->hji", q, keys[0]) * scale
        real = real.masked_fill(base[None, None, :] > base[None, :, None], float("-inf"))
        chain = [torch.einsum("jhd,jhd->hj", q, keys[t])[..., None] * scale for t in range(1, s + 1)]
        weights = torch.softmax(torch.cat([real, *chain], dim=-1), dim=-1)
        out = torch.einsum("hji,ihd->jhd", weights[..., :T], values[0])
        for t in range(1, s + 1):
            out = out + weights[..., T + t - 1].transpose(0, 1)[..., None] * values[t]
        residual = residual + attn.o_proj(out.reshape(T, H * D)).float()
        hidden = residual + layer.mlp(layer.post_attention_layernorm(residual)).float()
        logits = layers.lm_head(layers.norm(hidden)).float()
        if top_ids is not None:
            soft = soft_cross_entropy(logits, index, top_ids[(base + 1 + s).clamp(max=T)],
                                      top_probs[(base + 1 + s).clamp(max=T)], valid)
            if soft is not None:
                loss = loss + decay ** s * soft
        elif (label != IGNORE).any():
            loss = loss + decay ** s * F.cross_entropy(logits, label, ignore_index=IGNORE)
        right = (logits.argmax(-1) == label) & (label != IGNORE)
        if s == 0:
            counted = int((label != IGNORE).sum())
        still_right = still_right & right
        runs[s] = int(still_right.sum())
    return loss, runs, counted


def soft_cross_entropy(logits: torch.Tensor, index: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor,
                       valid: torch.Tensor) -> torch.Tensor | None:
    """Cross-entropy of the drafter's logits [T, V_draft] against the target's distribution, as
    its k likeliest tokens [T, k] give it: their probabilities renormalized over those the draft
    vocabulary holds (the KL to that distribution, less its entropy: the same gradients). Rows
    not ``valid``, or whose k tokens are all outside the draft vocabulary, count for nothing;
    None when no row counts."""
    ids = index[top_ids.long()]
    probs = top_probs.float() * (ids != IGNORE) * valid[:, None]
    mass = probs.sum(-1)
    rows = mass > 0
    if not bool(rows.any()):
        return None
    probs = probs[rows] / mass[rows, None]
    logp = torch.log_softmax(logits[rows].float(), dim=-1).gather(1, ids[rows].clamp(min=0))
    return -(probs * logp).sum(-1).mean()


def evaluate(layers: Eagle3Layers, embed: torch.nn.Module, samples: list[Sample], steps: int) -> Scores:
    index = draft_index(layers)
    total, positions, runs = 0.0, 0, torch.zeros(steps, dtype=torch.long)
    with torch.no_grad():
        for sample in samples:
            if len(sample) < 2:
                continue
            loss, r, counted = unrolled(layers, embed, sample, index, steps)
            total += float(loss) * counted
            positions += counted
            runs += r
    return Scores(total / max(positions, 1), positions, tuple(int(r) for r in runs))


def trainable(layers: Eagle3Layers) -> list[torch.nn.Parameter]:
    """Everything but a shipped embedding (the target's table is never trained)."""
    params = []
    for name, parameter in layers.named_parameters():
        if name.startswith("embed_tokens"):
            continue
        parameter.requires_grad_(True)
        params.append(parameter)
    return params


def learning_rate(step: int, total: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
