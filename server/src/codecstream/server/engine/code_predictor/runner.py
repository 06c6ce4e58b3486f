"""`CodePredictorRunner`: codebooks 1-15 of a batch of frames, one position per pass.

Pass 0 reads the talker's last hidden state, pass 1 codebook 0's embedding, pass p >= 2 the
embedding of the code pass p - 1 sampled; passes 1..15 each end in the logits of their codebook and
sample it. Each pass runs the predictor's layers over the one new position, attending to the
positions before it through a KV cache that holds only this call's 16 positions (nothing carries
over between calls, so rows need no bookkeeping). Every buffer is made once for the largest batch,
so a call allocates nothing and a CUDA graph of it replays any batch up to that size.

The weights are the loaded vLLM-Omni module's own tensors (nothing is copied), plus two tables made
once: the codec embeddings projected into the predictor's width (a pass's input is then one row of
a table, not an embedding and a matmul), and the talker's stacked codec embeddings for the frame's
input to the next talker step.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

#: The open interval the noise is drawn from when the caller brings none (as code_predictor_noise).
_UNIFORM_EPS = 1e-20


@dataclasses.dataclass(frozen=True)
class PredictorShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    #: Codebooks per frame (16): passes per call, positions in the KV cache.
    groups: int
    vocab: int
    eps: float

    @classmethod
    def of(cls, config: Any) -> PredictorShape:
        heads = int(config.num_attention_heads)
        return cls(
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(config.num_key_value_heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            layers=int(config.num_hidden_layers),
            groups=int(config.num_code_groups),
            vocab=int(config.vocab_size),
            eps=float(config.rms_norm_eps),
        )


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class CodePredictorRunner:
    """Runs a loaded vLLM-Omni code predictor (`module`, its CodePredictorWrapper) with `ops`
    (torch_ops or triton_ops) for batches of up to `max_rows` frames."""

    def __init__(
        self,
        module: torch.nn.Module,
        residual_tables: torch.Tensor,
        max_rows: int,
        ops: ModuleType,
    ) -> None:
        self.shape = shape = PredictorShape.of(module.config)
        self.ops = ops
        self.max_rows = max_rows
        model = module.model
        self.layers = [
            LayerWeights(
                input_norm=layer.input_layernorm.weight,
                qkv=layer.self_attn.qkv_proj.weight,
                qkv_bias=layer.self_attn.qkv_proj.bias,
                q_norm=layer.self_attn.q_norm.weight,
                k_norm=layer.self_attn.k_norm.weight,
                o=layer.self_attn.o_proj.weight,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=layer.mlp.gate_up_proj.weight,
                down=layer.mlp.down_proj.weight,
            )
            for layer in model.layers
        ]
        self.norm = model.norm.weight
        self.lm_heads = [head.weight for head in module.lm_head]
        projection = module.small_to_mtp_projection
        self.projection = projection if isinstance(projection, torch.nn.Linear) else None
        weight = self.norm
        device, dtype = weight.device, weight.dtype
        # Position p's rotation (the module's own float32 tables, positions 0..groups).
        self.cos = model.rotary_emb.cos_cached.to(device)
        self.sin = model.rotary_emb.sin_cached.to(device)
        with torch.no_grad():
            # Pass p >= 2 reads row `code` of table p - 2: codebook p - 1's embedding, projected.
            self.input_tables = torch.stack(
                [self._project(embedding.weight.to(dtype)) for embedding in model.codec_embedding]
            )
        #: The talker's codec embeddings of codebooks 1..G-1, [G-1, V, talker hidden].
        self.residual_tables = residual_tables
        rows, groups = max_rows, shape.groups
        cache = (shape.layers, rows, shape.kv_heads, groups, shape.head_dim)
        self._k_cache = torch.zeros(cache, device=device, dtype=dtype)
        self._v_cache = torch.zeros(cache, device=device, dtype=dtype)
        self._stream = torch.zeros(rows, shape.hidden, device=device, dtype=dtype)
        self._codes = torch.zeros(rows, groups, device=device, dtype=torch.long)
        self._frame = torch.zeros(rows, residual_tables.shape[-1], device=device, dtype=residual_tables.dtype)
        self._uniforms: torch.Tensor | None = None

    def _project(self, rows: torch.Tensor) -> torch.Tensor:
        if self.projection is None:
            return rows
        return F.linear(rows, self.projection.weight, self.projection.bias)

    @torch.inference_mode()
    def predict(
        self,
        code0: torch.Tensor,
        code0_embedding: torch.Tensor,
        talker_hidden: torch.Tensor,
        text: torch.Tensor,
        *,
        uniforms: torch.Tensor | None,
        inv_temperature: float,
        top_k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the talker's next input embeddings [B, H], the frame's codes [B, G]) for codebook 0's
        codes [B], their embeddings, the talker's last hidden states and the text rows [B, H].
        `uniforms` [B, G-1, V]: the sampling noise (None: drawn here). The outputs are views of
        buffers the next call overwrites."""
        ops, shape = self.ops, self.shape
        rows = int(code0.shape[0])
        if rows > self.max_rows:
            raise ValueError(f"a batch of {rows} frames, the code predictor was built for {self.max_rows}")
        dtype = self._stream.dtype
        if uniforms is None:
            uniforms = self._own_uniforms(rows)
        codes = self._codes[:rows]
        codes[:, 0].copy_(code0.reshape(rows))
        stream = self._stream[:rows]
        for position in range(shape.groups):
            # Later positions' inputs are already in `stream`: the last pass's sampling wrote them.
            if position == 0:
                stream.copy_(self._project(talker_hidden.reshape(rows, -1).to(dtype)))
            elif position == 1:
                stream.copy_(self._project(code0_embedding.reshape(rows, -1).to(dtype)))
            delta = self._layers(stream, position, rows)
            if position == 0:
                continue  # its keys and values are what the later positions need
            _, normed = ops.add_rms_norm(stream, delta, self.norm, shape.eps)
            logits = F.linear(normed, self.lm_heads[position - 1])
            last = position == shape.groups - 1
            ops.sample_and_embed(
                logits,
                uniforms[:, position - 1],
                inv_temperature,
                top_k,
                None if last else self.input_tables[position - 1],
                codes[:, position],
                None if last else stream,
            )
        # A frame whose codebook 0 is not a code (codec EOS) carries zeros, as vLLM-Omni's does.
        valid = (codes[:, :1] >= 0) & (codes[:, :1] < shape.vocab)
        codes.mul_(valid)
        frame = self._frame[:rows]
        ops.frame_embedding(
            code0_embedding.reshape(rows, -1), self.residual_tables, codes[:, 1:], text.reshape(rows, -1), frame
        )
        return frame, codes

    def _layers(self, stream: torch.Tensor, position: int, rows: int) -> torch.Tensor:
        """Run every layer over one position; the last layer's MLP output, not yet added."""
        ops, shape = self.ops, self.shape
        cos, sin = self.cos[position], self.sin[position]
        delta = None
        for index, layer in enumerate(self.layers):
            _, normed = ops.add_rms_norm(stream, delta, layer.input_norm, shape.eps)
            qkv = F.linear(normed, layer.qkv, layer.qkv_bias)
            k_cache, v_cache = self._k_cache[index, :rows], self._v_cache[index, :rows]
            q = ops.qk_norm_rope_store(qkv, layer.q_norm, layer.k_norm, shape.eps, cos, sin, k_cache, v_cache, position)
            attended = ops.attention(q, k_cache, v_cache, position + 1)
            _, normed = ops.add_rms_norm(stream, F.linear(attended, layer.o), layer.post_norm, shape.eps)
            delta = F.linear(ops.silu_mul(F.linear(normed, layer.gate_up)), layer.down)
        return delta

    def _own_uniforms(self, rows: int) -> torch.Tensor:
        if self._uniforms is None:
            shape = self.shape
            self._uniforms = torch.empty(
                self.max_rows, shape.groups - 1, shape.vocab, device=self._stream.device, dtype=torch.float32
            )
        return self._uniforms[:rows].uniform_(_UNIFORM_EPS, 1.0 - _UNIFORM_EPS)
