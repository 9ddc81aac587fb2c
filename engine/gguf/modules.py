"""The torch modules a GGUF model runs on: its weights stay the file's bytes.

    GgufLinear     a linear layer on quantized blocks (kernels.gguf_linear: inputs quantized per
                   block as llama.cpp does; batch-invariant)
    DenseLinear    a linear layer on an F32 / F16 / BF16 matrix of the file, batch-invariant too
    GgufEmbedding  the token embedding: only the rows looked up are dequantized

Each keeps its tensors as plain attributes, not parameters or buffers: they are views of the
memory-mapped file, and ``model.to()`` / ``state_dict()`` must neither copy nor save them.
"""
from __future__ import annotations

import torch
from torch import nn

from kernels import gguf_linear

# Verification passes have at most MAX_DRAFT_LENGTH + 1 rows (engine.core.settings); up to this
# many, DenseLinear computes each row on its own so a row's result never depends on the others.
# Prompt prefill (more rows) is batched: plain and speculative decoding prefill the same way.
_ROW_BY_ROW = 64


class GgufLinear(nn.Module):
    """y = x W^T (+ bias) with W a GGUF tensor's quantized rows ``raw`` [N, row_bytes].

    ``out_order``: a permutation applied to the outputs (llama-family files store Q and K with
    their rows permuted for llama.cpp's rotary layout; reordering the N outputs undoes it without
    copying the weight). ``pack``: let the kernels hold their own layout of the weight where they
    have one (a copy in memory, kernels.gguf_linear). fp32 in, fp32 out."""

    def __init__(self, raw: torch.Tensor, qtype, n: int, k: int, bias: torch.Tensor | None = None,
                 out_order: torch.Tensor | None = None, pack: bool = True) -> None:
        super().__init__()
        self.weight_blocks = gguf_linear.prepare(raw, qtype, n, k, pack=pack)
        self.in_features, self.out_features = k, n
        self.bias = None if bias is None else bias.float()
        self.out_order = out_order

    @property
    def type_name(self) -> str:
        return self.weight_blocks.qtype.name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.out_order is None:
            return gguf_linear.linear(x.float(), self.weight_blocks, self.bias)
        y = gguf_linear.linear(x.float(), self.weight_blocks).index_select(-1, self.out_order)
        return y if self.bias is None else y + self.bias

    def dense_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of W as fp32 [len(ids), K] (a drafter's pruned head keeps a subset)."""
        if self.out_order is not None:
            ids = self.out_order.index_select(0, ids)
        raw = self.weight_blocks.raw.index_select(0, ids)
        return gguf_linear.dequantize(raw, self.weight_blocks.qtype, len(ids), self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, type={self.type_name}, bias={self.bias is not None}"


class DenseLinear(nn.Module):
    """A linear layer on a float matrix of the file ([N, K]; F16 / BF16 are widened to fp32
    once, F32 stays a view of the file). Small calls go row by row (see ``_ROW_BY_ROW``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, out_order: torch.Tensor | None = None) -> None:
        super().__init__()
        self.dense = weight if weight.dtype == torch.float32 else weight.float()
        if out_order is not None:
            self.dense = self.dense.index_select(0, out_order)
        self.out_features, self.in_features = self.dense.shape
        self.bias = None if bias is None else bias.float()

    @property
    def type_name(self) -> str:
        return "F32"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.float().reshape(-1, self.in_features)
        if rows.shape[0] <= _ROW_BY_ROW:
            y = torch.cat([nn.functional.linear(row[None], self.dense, self.bias) for row in rows])
        else:
            y = nn.functional.linear(rows, self.dense, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dense_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense.index_select(0, ids)


class GgufEmbedding(nn.Module):
    """Token embedding over a GGUF tensor [V, H]: a lookup dequantizes the rows asked for, never
    the whole table. ``scale`` multiplies the result (Gemma scales its embeddings by sqrt(H))."""

    def __init__(self, data: torch.Tensor, type_name: str, vocab: int, hidden: int, scale: float | None = None) -> None:
        super().__init__()
        self.data = data
        self.qtype = None if data.dtype != torch.uint8 else gguf_linear.T[type_name]
        self.num_embeddings, self.embedding_dim = vocab, hidden
        self.scale = scale
        if self.qtype is None and data.dtype != torch.float32:
            self.data = data.float()  # F16 / BF16: widened once (small models only store these)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if self.qtype is None:
            rows = self.data.index_select(0, flat)
        else:
            rows = gguf_linear.dequantize(self.data.index_select(0, flat), self.qtype, flat.numel(), self.embedding_dim)
        if self.scale is not None:
            rows = rows * self.scale
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        kind = "F32" if self.qtype is None else self.qtype.name
        return f"{self.num_embeddings}, {self.embedding_dim}, type={kind}"
