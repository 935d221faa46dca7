"""LlamaGen's GPT (FoundationVision/LlamaGen, ``autoregressive/models/gpt.py``), written for the ragged cache.

docs/MODELS.md, "LlamaGen": a Llama decoder (RMSNorm, SwiGLU, no biases) whose first ``cls_token_num`` positions hold
the condition (one class embedding, or 120 projected flan-t5-xl caption features) and whose image tokens carry a 2-D
rotary embedding of their grid cell. The condition positions get a zero rotary table, so their queries and keys are
zero vectors: every query scores every condition key 0, and the condition reaches the image only through the values.

What differs from the original's module, on purpose:

* The attention runs on ``csd.cache.RaggedCache`` (``cache.update(k, v, layer)``, the 4D additive mask and position
  ids its ``extend`` returns), or without a cache (a causal mask; the tests' oracle).
* The caption's padding mask travels inside the keys. LlamaGen left-pads a caption to 120 positions and hides the
  padded positions from every query with a per-image mask; here each key carries :data:`MASK_CHANNELS` extra channels,
  the first ``-PADDING_BIAS`` at a padded position and 0 elsewhere, and each query a 1 there, so that
  ``q . k`` gains ``-PADDING_BIAS`` on padded keys: their softmax weight underflows to exactly 0 as under the original's
  mask, with no per-image state outside the cache (rollback and compaction move the flag with its key). A padded
  position is recognised by its input: the zero vector (the original zeroes the padded caption features, and the
  caption projection has no bias). Only ``t2i`` models carry the channels.
* Position ids are cache indices: index ``p < cls_token_num`` is a condition position, ``p >= cls_token_num`` the grid
  cell ``p - cls_token_num`` (also past the grid, for a padded window's dummy entries, whose outputs nobody reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: extra key / query channels of a ``t2i`` model's attention (the padding flag, then zeros: head dims stay multiples
#: of 8, which the fused attention kernels want)
MASK_CHANNELS = 8
#: what a padded caption key subtracts from every score before scaling: exp(-PADDING_BIAS / sqrt(head_dim)) is 0 in
#: every float format for any real score, and the value fits float16
PADDING_BIAS = 1.0e4


def find_multiple(n: int, k: int) -> int:
    """The smallest multiple of ``k`` that is ``>= n``."""
    return n if n % k == 0 else n + k - n % k


@dataclass
class LlamaGenConfig:
    """The original's ``ModelArgs`` at inference, in the names ``csd.cache.RaggedCache`` and ``csd.plan`` read.

    ``grid``: image tokens per side (``block_size = grid ** 2``); ``class_dropout_prob > 0`` gives the class table its
    null row (id ``num_classes``), as in training. ``head_dim`` is the cache's (the attention head plus, for ``t2i``,
    :data:`MASK_CHANNELS`).
    """

    model_type: str = "c2i"
    hidden_size: int = 1280
    num_hidden_layers: int = 36
    num_attention_heads: int = 20
    num_key_value_heads: int | None = None
    multiple_of: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    vocab_size: int = 16384
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    caption_dim: int = 2048
    cls_token_num: int = 1
    grid: int = 16

    def __post_init__(self) -> None:
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type={self.model_type!r}: choose 'c2i' or 't2i'")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.hidden_size % self.num_attention_heads or self.attention_head_dim % 4:
            raise ValueError(f"hidden_size={self.hidden_size} must split into {self.num_attention_heads} heads of a "
                             "size divisible by 4 (the 2-D rotary rotates pairs, half by row, half by column)")

    @property
    def attention_head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim + (MASK_CHANNELS if self.model_type == "t2i" else 0)

    @property
    def rms_norm_eps(self) -> float:
        """``norm_eps`` under the transformers name (``drafter=eagle`` sizes its head's layer from it)."""
        return self.norm_eps

    @property
    def intermediate_size(self) -> int:
        """The SwiGLU width: ``2/3 * 4 * hidden`` rounded up to ``multiple_of`` (the original's ``FeedForward``)."""
        return find_multiple(int(2 * 4 * self.hidden_size / 3), self.multiple_of)


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, normalised in float32 and cast back before the weight (as the original)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary_angles(config: LlamaGenConfig, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [N, q, head_dim / 2]`` of positions ``[N, q]``: grid cell ``n = p - cls_token_num`` turns its first
    ``head_dim / 4`` pairs by ``row(n) * f_i`` and the others by ``col(n) * f_i``, ``f_i = base^(-4i / head_dim)``;
    condition positions (``p < cls_token_num``) get cos = sin = 0 (the original's ``precompute_freqs_cis_2d``)."""
    half = config.attention_head_dim // 2
    freqs = 1.0 / (config.rope_base ** (torch.arange(0, half, 2, device=position_ids.device)[: half // 2].float() / half))
    cell = (position_ids - config.cls_token_num).clamp(min=0)
    row, col = (cell // config.grid).float(), (cell % config.grid).float()
    angles = torch.cat([row[..., None] * freqs, col[..., None] * freqs], dim=-1)
    image = (position_ids >= config.cls_token_num)[..., None]
    return torch.where(image, angles.cos(), 0.0), torch.where(image, angles.sin(), 0.0)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[2i], x[2i+1])`` of ``x [N, q, H, d]`` by the angles of ``cos, sin [N, q, d / 2]``, in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    c, s = cos[:, :, None], sin[:, :, None]
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2).type_as(x)


def flag_channels(first: torch.Tensor, heads: int) -> torch.Tensor:
    """``[N, q, heads, MASK_CHANNELS]``: channel 0 is ``first [N, q]`` in every head, the others 0."""
    n, q = first.shape
    rest = first.new_zeros(n, q, heads, MASK_CHANNELS - 1)
    return torch.cat([first[:, :, None, None].expand(n, q, heads, 1), rest], dim=-1)


class Attention(nn.Module):
    """Self-attention with the fused ``wqkv`` projection, 2-D rotary, and (``t2i``) the padding-flag channels."""

    def __init__(self, config: LlamaGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        d, heads, kv = config.attention_head_dim, config.num_attention_heads, config.num_key_value_heads
        self.wqkv = nn.Linear(config.hidden_size, (heads + 2 * kv) * d, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], padded: torch.Tensor | None,
                cache: Any, mask: torch.Tensor) -> torch.Tensor:
        n, q, _ = x.shape
        c = self.config
        d, heads, kv = c.attention_head_dim, c.num_attention_heads, c.num_key_value_heads
        xq, xk, xv = self.wqkv(x).split([heads * d, kv * d, kv * d], dim=-1)
        xq = apply_rotary(xq.view(n, q, heads, d), *rotary)
        xk = apply_rotary(xk.view(n, q, kv, d), *rotary)
        xv = xv.view(n, q, kv, d)
        if padded is not None:  # the padding flag: queries 1, keys -PADDING_BIAS where padded (module docstring)
            xq = torch.cat([xq, flag_channels(torch.ones_like(padded, dtype=x.dtype), heads)], dim=-1)
            xk = torch.cat([xk, flag_channels(-PADDING_BIAS * padded.to(x.dtype), kv)], dim=-1)
            xv = torch.cat([xv, flag_channels(torch.zeros_like(padded, dtype=x.dtype), kv)], dim=-1)
        xq, keys, values = (t.transpose(1, 2) for t in (xq, xk, xv))
        if cache is not None:
            keys, values = cache.update(keys, values, self.layer_idx)
        if kv != heads:
            keys, values = (t.repeat_interleave(heads // kv, dim=1) for t in (keys, values))
        out = F.scaled_dot_product_attention(xq, keys, values, attn_mask=mask, scale=1.0 / math.sqrt(d))
        return self.wo(out[..., :d].transpose(1, 2).reshape(n, q, c.hidden_size))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        width = config.intermediate_size
        self.w1 = nn.Linear(config.hidden_size, width, bias=False)
        self.w3 = nn.Linear(config.hidden_size, width, bias=False)
        self.w2 = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention, then the feed-forward."""

    def __init__(self, config: LlamaGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = Attention(config, layer_idx)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.ffn_norm = RMSNorm(config.hidden_size, config.norm_eps)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], padded: torch.Tensor | None,
                cache: Any, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rotary, padded, cache, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class CaptionProjection(nn.Module):
    """``fc2(gelu_tanh(fc1 x))``, no biases: flan-t5-xl features -> model width; the learned null caption."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.cap_proj = nn.Module()
        self.cap_proj.fc1 = nn.Linear(config.caption_dim, config.hidden_size, bias=False)
        self.cap_proj.fc2 = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.register_buffer("uncond_embedding", torch.zeros(config.cls_token_num, config.caption_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.cap_proj.fc2(F.gelu(self.cap_proj.fc1(features), approximate="tanh"))


class ClassEmbedding(nn.Module):
    """The class table; with ``class_dropout_prob > 0`` its last row (id ``num_classes``) is the null class."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(config.num_classes + (config.class_dropout_prob > 0), config.hidden_size)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


class LlamaGenGPT(nn.Module):
    """The decoder: module names follow the released checkpoints' keys (``tok_embeddings``, ``layers.{i}.attention.wqkv``,
    ``cls_embedding.*``, ``norm``, ``output``), so their state dicts load as they are."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_embedding = ClassEmbedding(config) if config.model_type == "c2i" else CaptionProjection(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def forward(self, inputs_embeds: torch.Tensor, cache: Any = None, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings ``[N, q, D]`` -> last hidden states ``[N, q, D]`` after the final norm. ``cache`` None:
        a full sequence from position 0 (``position_ids`` default ``0 .. q - 1``, a causal mask)."""
        n, q, _ = inputs_embeds.shape
        if position_ids is None:
            position_ids = torch.arange(q, device=inputs_embeds.device).expand(n, q)
        if attention_mask is None:
            causal = torch.ones(q, q, dtype=torch.bool, device=inputs_embeds.device).tril()
            attention_mask = torch.zeros(q, q, dtype=inputs_embeds.dtype, device=inputs_embeds.device)
            attention_mask = attention_mask.masked_fill(~causal, torch.finfo(inputs_embeds.dtype).min)[None, None]
        padded = inputs_embeds.eq(0).all(-1) if self.config.model_type == "t2i" else None
        rotary = rotary_angles(self.config, position_ids)
        h = inputs_embeds
        for layer in self.layers:
            h = layer(h, rotary, padded, cache, attention_mask)
        return self.norm(h)


# ----------------------------------------------------------------------------------------- checkpoint layouts

#: LANTERN's transformers-style layout (``jadohu/LlamaGen-T2I``: ``LlamaForCausalLM`` names) -> ours, per layer
HF_LAYER_KEYS = {
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
}
#: the original's keys that hold no weight of ours: the training-time codebook-usage buffer never appears here, but
#: some released GPT checkpoints pickle the rotary table ``freqs_cis`` (the original's sampler drops it too)
IGNORED_KEYS = ("freqs_cis",)


def from_hf_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LANTERN's HF layout -> the original's: ``model.`` prefix off, ``embed_tokens`` -> ``tok_embeddings``, ``lm_head``
    -> ``output``, q / k / v projections concatenated into ``wqkv`` (rows: queries, keys, values, as the original
    splits them; no rotary permutation: both rotate interleaved pairs)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        name = key.removeprefix("model.")
        if name == "lm_head.weight":
            out["output.weight"] = value
        elif name.startswith("embed_tokens."):
            out["tok_embeddings." + name.removeprefix("embed_tokens.")] = value
        elif name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                qkv.setdefault(index, {})[rest.split(".")[1]] = value
            else:
                out[f"layers.{index}.{HF_LAYER_KEYS.get(rest, rest)}"] = value
        else:
            out[name] = value
    for index, parts in qkv.items():
        out[f"layers.{index}.attention.wqkv.weight"] = torch.cat([parts["q_proj"], parts["k_proj"], parts["v_proj"]])
    return out


def checkpoint_state(raw: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The GPT weights of a loaded checkpoint in the original's key layout: the released ``.pt`` files wrap them in
    ``model`` (DDP), ``module`` (DeepSpeed) or ``state_dict``; LANTERN's HF layout is converted."""
    for wrapper in ("model", "module", "state_dict"):
        if isinstance(raw.get(wrapper), dict):
            raw = raw[wrapper]
            break
    state = {k: v for k, v in raw.items() if k not in IGNORED_KEYS}
    if any(k.startswith(("model.", "lm_head.")) for k in state):
        state = from_hf_layout(state)
    return state
