"""Codes to embeddings: 16 codebook lookups, summed per group (semantic, acoustic) and projected.

Parameter names follow the official checkpoint (`quantizer.rvq_first.vq.layers.0._codebook.*`).
A codebook entry is `embedding_sum / max(cluster_usage, 1e-5)`; the division is done once, when
the weights change, into one stacked table so decoding is a single gather.
"""

from __future__ import annotations

import torch
from codecstream.decoder.config import DecoderConfig
from torch import nn

_USAGE_FLOOR = 1e-5


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class _VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _LayerList(nn.Module):
    def __init__(self, count: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VectorQuantization(size, dim) for _ in range(count)])


class _ResidualGroup(nn.Module):
    """One group of codebooks sharing an output projection (the encoder-side input_proj is unused here)."""

    def __init__(self, count: int, size: int, dim: int, outer_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)
        self.vq = _LayerList(count, size, dim)

    def tables(self) -> torch.Tensor:
        return torch.stack(
            [
                layer._codebook.embedding_sum / layer._codebook.cluster_usage.clamp(min=_USAGE_FLOOR)[:, None]
                for layer in self.vq.layers
            ]
        )


class SplitQuantizer(nn.Module):
    """(B, T, num_quantizers) integer codes -> (B, codebook_dim, T) embeddings."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        dim = config.codebook_dim // 2
        semantic = config.num_semantic_quantizers
        self.num_semantic = semantic
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.rvq_first = _ResidualGroup(semantic, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = _ResidualGroup(config.num_quantizers - semantic, config.codebook_size, dim, config.codebook_dim)
        self.register_buffer("table", torch.zeros(config.num_quantizers * config.codebook_size, dim), persistent=False)
        self.register_buffer("offsets", torch.arange(config.num_quantizers) * config.codebook_size, persistent=False)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        tables = torch.cat([self.rvq_first.tables(), self.rvq_rest.tables()])
        self.table.copy_(tables.reshape(-1, tables.shape[-1]))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        vectors = nn.functional.embedding(codes + self.offsets, self.table)  # (B, T, Q, dim)
        first = vectors[:, :, : self.num_semantic].sum(dim=2).transpose(1, 2)
        rest = vectors[:, :, self.num_semantic :].sum(dim=2).transpose(1, 2)
        return self.rvq_first.output_proj(first) + self.rvq_rest.output_proj(rest)
