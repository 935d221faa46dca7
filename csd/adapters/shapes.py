"""The real checkpoints' transformer shapes, read from their transformers ``config.json`` on the Hugging Face hub and
kept here, so that the memory planner (``csd.plan``) and the rehearsal mode (``model.random_init=true``: the real
shape with random weights, no file read; docs/MODELS.md, "Rehearsal") need no file.

Also the rehearsal's stand-in text tokenizer (:func:`stand_in_ids`): without the tokenizer's files, a caption becomes
one id per word or punctuation mark, from a stable hash into the real text vocabulary. An English caption's BPE
length is about that (the DeepSeek tokenizer turns "Hello, how are you?" into 6 tokens after BOS, as many as its
words and marks), so prompts, caches and CFG rows have their real lengths; the ids themselves mean nothing.
"""

from __future__ import annotations

import hashlib
import re

#: Transformer shapes of the real checkpoints (their transformers ``config.json`` on the Hugging Face hub; used
#: offline, no file is read): hidden, intermediate, layers, attention heads, KV heads, text vocabulary.
REAL_SHAPES: dict[str, dict[str, int]] = {
    # deepseek-community/Janus-Pro-7B config.json, text_config (DeepSeek-LLM 7B)
    "janus_pro_7b": dict(hidden=4096, intermediate=11008, layers=30, heads=32, kv_heads=32, vocab=102400),
    # deepseek-community/Janus-Pro-1B config.json, text_config (DeepSeek-LLM 1.3B)
    "janus_pro_1b": dict(hidden=2048, intermediate=5632, layers=24, heads=16, kv_heads=16, vocab=102400),
    # Alpha-VLLM/Lumina-mGPT-7B-768 config.json (Chameleon 7B; the same for 512 and 1024 px)
    "lumina_mgpt_7b": dict(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, vocab=65536),
    # Anole-7B = Chameleon-7B with fine-tuned image-token rows of the output head (GAIR-NLP/anole README,
    # "Methodology"); Chameleon-7B's shapes as torchtune's chameleon_7b builder states them
    "anole_7b": dict(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, vocab=65536),
    # BAAI/Emu3-Gen-hf config.json, text_config (grouped-query attention: 8 KV heads)
    "emu3_gen": dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=184622),
}
#: Emu3-Gen's image grid at 720x720 px (image_area 518400) with its 8x spatial downsampling: 90 x 90 tokens
EMU3_GRID = (90, 90)
#: the hub checkpoints of the Janus-Pro presets and their :data:`REAL_SHAPES` entries
JANUS_HUB_SHAPES = {"deepseek-community/Janus-Pro-7B": "janus_pro_7b", "deepseek-community/Janus-Pro-1B": "janus_pro_1b"}
#: Janus-Pro's BOS (the DeepSeek tokenizer's ``<｜begin▁of▁sentence｜>``), pad and image-start ids in the rehearsal:
#: BOS as the tokenizer has it; pad and ``<begin_of_image>`` stand-ins among its added tokens
JANUS_STAND_IN_SPECIAL = (100000, 100015, 100016)
#: ids below this one are left to the special tokens in stand-in prompts
STAND_IN_FIRST_ID = 1000
_WORDS = re.compile(r"\w+|[^\w\s]")


def real_janus_config(name: str, layers: int | None = None):  # -> transformers.JanusConfig
    """A Janus-Pro config of the real shape (:data:`REAL_SHAPES` ``name``; 24x24 image tokens, 16384 codes), with
    ``layers`` decoder layers (None: the checkpoint's), no file read."""
    from transformers import JanusConfig

    s = REAL_SHAPES[name]
    text = dict(model_type="llama", vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                num_hidden_layers=layers or s["layers"], num_attention_heads=s["heads"],
                num_key_value_heads=s["kv_heads"], max_position_embeddings=16384)
    vq = dict(num_embeddings=16384, num_patches=24, projection_dim=s["hidden"], image_token_embed_dim=s["hidden"])
    return JanusConfig(text_config=text, vision_config=dict(projection_dim=s["hidden"]), vq_config=vq)


def real_text_config(name: str) -> dict[str, int]:
    """The transformers text-config keys of :data:`REAL_SHAPES` ``name``."""
    s = REAL_SHAPES[name]
    return dict(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"])


def stand_in_ids(text: str, end: int) -> list[int]:
    """One id per word or punctuation mark of ``text``, a stable hash of it into ``[STAND_IN_FIRST_ID, end)``."""
    span = end - STAND_IN_FIRST_ID
    return [STAND_IN_FIRST_ID + int.from_bytes(hashlib.sha1(w.encode()).digest()[:8], "little") % span
            for w in _WORDS.findall(text)]
