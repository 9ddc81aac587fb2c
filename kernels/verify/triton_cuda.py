"""Verification as two Triton kernels each (CUDA; also runs under TRITON_INTERPRET=1 on CPU).

The whole decision stays on the device; the host reads two integers at the end (one sync).
Both rules split the vocabulary into chunks of BLOCK_V so that many programs share the V-long
reductions, then one small program finishes:

greedy   _greedy_partials  grid (k+1, chunks): max logit and its lowest index per row and chunk
         _greedy_finish    grid (1,): per-row argmax from the partials, first mismatch n with
                           the drafts, next token = argmax of row n
sampled  _sampled_partials grid (chunks,): every program recomputes the first rejection n from
                           k gathered p(x), q(x) and the uniforms (k loads: cheaper than another
                           launch), then the race keys r_j * w_j of its chunk for the residual
                           row and for the fallback row p_n; best key and lowest index of each
         _sampled_finish   grid (1,): best over chunks; the residual's draw, or p_n's when the
                           residual has no mass

Parity with the reference is by construction: the random numbers come in as tensors from
``reference.draw_randomness`` (same generator, same order), and the decision is made of float32
products, comparisons and max/min reductions, which do not depend on reduction order. Ties go to
the lowest index, as torch.argmax. Acceptance compares ``u * q(x) < p(x)`` (a product and a
compare: nothing for the compiler to fuse into an FMA).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.verify import reference
from kernels.verify.reference import Verdict

BLOCK_V = 2048  # vocabulary entries per program: 75 programs per row at V = 151,936


@triton.jit
def _greedy_partials(logits_ptr, stride_row, vocab, part_val_ptr, part_idx_ptr, n_chunks, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = offs < vocab
    vals = tl.load(logits_ptr + row * stride_row + offs, mask=inside, other=float("-inf")).to(tl.float32)
    best = tl.max(vals, axis=0)
    # Lowest index among the maxima; lanes past the vocabulary carry indices >= vocab, so a
    # real entry wins a tie with them (a row of -inf still answers its first real index).
    idx = tl.min(tl.where(vals == best, offs, vocab + BLOCK_V), axis=0)
    tl.store(part_val_ptr + row * n_chunks + chunk, best)
    tl.store(part_idx_ptr + row * n_chunks + chunk, idx)


@triton.jit
def _greedy_finish(part_val_ptr, part_idx_ptr, drafts_ptr, out_ptr, k, n_chunks, big,
                   BLOCK_ROWS: tl.constexpr, BLOCK_CHUNKS: tl.constexpr):
    rows = tl.arange(0, BLOCK_ROWS)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    inside = (rows[:, None] < k + 1) & (chunks[None, :] < n_chunks)
    at = rows[:, None] * n_chunks + chunks[None, :]
    vals = tl.load(part_val_ptr + at, mask=inside, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + at, mask=inside, other=big)
    best = tl.max(vals, axis=1)
    choice = tl.min(tl.where(vals == best[:, None], idxs, big), axis=1)  # [BLOCK_ROWS]
    drafts = tl.load(drafts_ptr + rows, mask=rows < k, other=-1)
    mismatch = (choice != drafts) & (rows < k)
    n = tl.min(tl.where(mismatch, rows, k), axis=0)
    nxt = tl.sum(tl.where(rows == n, choice, 0), axis=0)
    tl.store(out_ptr, n)
    tl.store(out_ptr + 1, nxt)


@triton.jit
def _sampled_partials(drafts_ptr, p_ptr, q_ptr, u_ptr, w_ptr, part_ptr, part_idx_ptr, out_ptr,
                      k, vocab, stride_p, stride_q, n_chunks,
                      HAS_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    chunk = tl.program_id(0)
    # -- the first rejection n (every program computes it; k loads) --
    i = tl.arange(0, BLOCK_K)
    live = i < k
    x = tl.load(drafts_ptr + i, mask=live, other=0)
    p_x = tl.load(p_ptr + i * stride_p + x, mask=live, other=0.0)
    if HAS_Q:
        q_x = tl.load(q_ptr + i * stride_q + x, mask=live, other=1.0)
    else:
        q_x = tl.full([BLOCK_K], 1.0, tl.float32)
    u = tl.load(u_ptr + i, mask=live, other=0.0)
    rejected = (~(u * q_x < p_x)) & live  # written as the reference's test, so NaN rejects too
    n = tl.min(tl.where(rejected, i, k), axis=0)
    x_n = tl.sum(tl.where(i == n, x, 0), axis=0)  # only meaningful when n < k
    if chunk == 0:
        tl.store(out_ptr, n)
    # -- this chunk of the residual row and of the fallback row p_n --
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = offs < vocab
    p_n = tl.load(p_ptr + n * stride_p + offs, mask=inside, other=0.0)
    rejected_here = (tl.zeros([BLOCK_V], tl.int32) + n) < k  # as a block: scalar & block masks mix badly
    if HAS_Q:
        q_n = tl.load(q_ptr + n * stride_q + offs, mask=inside & rejected_here, other=0.0)
        residual = tl.maximum(p_n - q_n, 0.0)
    else:
        residual = tl.where((offs == x_n) & rejected_here, 0.0, p_n)
    w = tl.load(w_ptr + offs, mask=inside, other=0.0)
    big = vocab + BLOCK_V
    keys = tl.where(inside, residual * w, -1.0)
    best = tl.max(keys, axis=0)
    tl.store(part_ptr + chunk, best)
    tl.store(part_idx_ptr + chunk, tl.min(tl.where(keys == best, offs, big), axis=0))
    keys = tl.where(inside, p_n * w, -1.0)
    best = tl.max(keys, axis=0)
    tl.store(part_ptr + n_chunks + chunk, best)
    tl.store(part_idx_ptr + n_chunks + chunk, tl.min(tl.where(keys == best, offs, big), axis=0))


@triton.jit
def _sampled_finish(part_ptr, part_idx_ptr, out_ptr, n_chunks, big, BLOCK_CHUNKS: tl.constexpr):
    c = tl.arange(0, BLOCK_CHUNKS)
    inside = c < n_chunks
    keys = tl.load(part_ptr + c, mask=inside, other=-1.0)
    idxs = tl.load(part_idx_ptr + c, mask=inside, other=big)
    best = tl.max(keys, axis=0)
    y = tl.min(tl.where(keys == best, idxs, big), axis=0)
    keys = tl.load(part_ptr + n_chunks + c, mask=inside, other=-1.0)
    idxs = tl.load(part_idx_ptr + n_chunks + c, mask=inside, other=big)
    fb_best = tl.max(keys, axis=0)
    fb = tl.min(tl.where(keys == fb_best, idxs, big), axis=0)
    # No mass left in the residual (rounding): draw from p_n itself, as the reference does.
    # An all-zero p_n as well answers index 0, as torch.argmax of zeros does.
    y = tl.where(best > 0, y, tl.where(fb_best > 0, fb, 0))
    tl.store(out_ptr + 1, y)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(max(n, 1)))


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """draft_tokens: [k] long; target_logits: [k+1, V] (any float dtype)."""
    logits = target_logits.contiguous()
    dev = logits.device
    k = draft_tokens.shape[0]
    vocab = logits.shape[-1]
    n_chunks = triton.cdiv(vocab, BLOCK_V)
    part_val = torch.empty((k + 1, n_chunks), dtype=torch.float32, device=dev)
    part_idx = torch.empty((k + 1, n_chunks), dtype=torch.int64, device=dev)
    drafts = draft_tokens.to(device=dev, dtype=torch.int64).contiguous()
    if k == 0:
        drafts = torch.full((1,), -1, dtype=torch.int64, device=dev)  # never read (masked)
    out = torch.empty(2, dtype=torch.int64, device=dev)
    _greedy_partials[(k + 1, n_chunks)](logits, logits.stride(0), vocab, part_val, part_idx, n_chunks, BLOCK_V=BLOCK_V)
    _greedy_finish[(1,)](part_val, part_idx, drafts, out, k, n_chunks, vocab + BLOCK_V,
                         BLOCK_ROWS=_pow2(k + 1), BLOCK_CHUNKS=_pow2(n_chunks))
    n, nxt = out.tolist()  # the one sync
    return Verdict(n, nxt)


def _decide(s: reference.Sampled) -> Verdict:
    """reference.decide in two kernels (module docstring)."""
    p = s.p.contiguous()
    dev = p.device
    k, vocab = s.x.shape[0], p.shape[-1]
    has_q = s.q is not None and k > 0
    q = s.q.contiguous() if has_q else p  # a valid pointer; unread without HAS_Q
    drafts = s.x.to(dtype=torch.int64).contiguous()
    u = s.u.to(dtype=torch.float32).contiguous()
    if k == 0:  # masked loads still need a real pointer
        drafts = torch.zeros(1, dtype=torch.int64, device=dev)
        u = torch.zeros(1, dtype=torch.float32, device=dev)
    w = s.w.to(dtype=torch.float32).contiguous()
    n_chunks = triton.cdiv(vocab, BLOCK_V)
    part = torch.empty((2, n_chunks), dtype=torch.float32, device=dev)
    part_idx = torch.empty((2, n_chunks), dtype=torch.int64, device=dev)
    out = torch.empty(2, dtype=torch.int64, device=dev)
    _sampled_partials[(n_chunks,)](drafts, p, q, u, w, part, part_idx, out, k, vocab, p.stride(0), q.stride(0), n_chunks,
                                   HAS_Q=has_q, BLOCK_K=_pow2(k), BLOCK_V=BLOCK_V)
    _sampled_finish[(1,)](part, part_idx, out, n_chunks, vocab + BLOCK_V, BLOCK_CHUNKS=_pow2(n_chunks))
    n, y = out.tolist()  # the one sync
    return Verdict(n, y)


sampled_verdict, verify_sampled = reference.sampled_backend(_decide)
