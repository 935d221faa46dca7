"""The toy model's language model: a tiny ``transformers.LlamaForCausalLM`` over captions + image codes."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from csd.toy.vocab import N_TEXT, PAD_ID, PROMPT_LEN

IMAGE_TOKENS = 256
#: RoPE base of the shipped LM (``train_toy.py --rope-theta`` changes it for a new one)
ROPE_THETA = 10000.0


def toy_lm_config(codebook_size: int = 256, hidden: int = 128, layers: int = 4, heads: int = 4,
                  rope_theta: float = ROPE_THETA) -> LlamaConfig:
    """Config of the toy LM: vocabulary = caption words then ``codebook_size`` image codes."""
    return LlamaConfig(
        vocab_size=N_TEXT + codebook_size,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=PROMPT_LEN + IMAGE_TOKENS,
        rope_theta=rope_theta,
        pad_token_id=PAD_ID,
        bos_token_id=1,
        eos_token_id=None,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def load_toy_lm(directory: str | Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Load the shipped checkpoint (``config.json`` + ``model.safetensors``) in eval mode."""
    return LlamaForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
