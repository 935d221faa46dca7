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
import os
import re

from csd.errors import ConfigError, MissingWeightsError

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
#: the hub checkpoints of the presets and their :data:`REAL_SHAPES` entries
JANUS_HUB_SHAPES = {"deepseek-community/Janus-Pro-7B": "janus_pro_7b", "deepseek-community/Janus-Pro-1B": "janus_pro_1b"}
LUMINA_HUB_SHAPES = {f"Alpha-VLLM/Lumina-mGPT-7B-{px}": "lumina_mgpt_7b" for px in (512, 768, 1024)}
ANOLE_HUB_SHAPES = {"leloy/Anole-7b-v0.1-hf": "anole_7b"}
EMU3_HUB_SHAPES = {"BAAI/Emu3-Gen-hf": "emu3_gen"}
#: Emu3's stand-in vocabulary: its 32768 visual tokens fill the last ids of the 184622 (as in the released tokenizer,
#: where ``<|visual token000000|>`` follows the structural tokens); the structural ids next to them (``<|extra_200|>``
#: 151846 is the released end-of-line id the planner uses; the others are stand-ins)
EMU3_FIRST_VISUAL_ID, EMU3_CODES = 151854, 32768
EMU3_STAND_IN_SPECIAL = {"<|extra_200|>": 151846, "<|extra_201|>": 151847, "<|extra_203|>": 151849,
                         "<|endoftext|>": 151850, "<|image start|>": 151851, "<|image end|>": 151852,
                         "<|image token|>": 151853}
#: Chameleon's image tokens: 8192 codes at BPE ids 4 .. 8195 in the stand-in vocabulary (the released tokenizer holds
#: them in that range too; its ``bpe2img`` permutation is read from the tokenizer when present); text ids from 9000
CHAMELEON_FIRST_IMAGE_ID, CHAMELEON_CODES, CHAMELEON_FIRST_TEXT_ID = 4, 8192, 9000
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


def real_text_config(name: str, layers: int | None = None) -> dict[str, int]:
    """The transformers text-config keys of :data:`REAL_SHAPES` ``name``, with ``layers`` decoder layers (None: the
    checkpoint's)."""
    s = REAL_SHAPES[name]
    return dict(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                num_hidden_layers=layers or s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"])


def chameleon_vocabulary_map() -> dict[str, int]:
    """The stand-in ``vocabulary_map`` of a Chameleon rehearsal: ``<image>`` and the image tokens, named as the
    released tokenizer names them (``IMGIMG`` + the code's digits as letters A-J + ``Z``)."""
    names = {"IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z": CHAMELEON_FIRST_IMAGE_ID + code
             for code in range(CHAMELEON_CODES)}
    return {"<image>": 8711, **names}


def check_layers(random_init: bool, layers: int | None) -> None:
    """``model.layers`` is the rehearsal's: one line when it comes without ``model.random_init=true``."""
    if layers is not None and not random_init:
        raise ConfigError(f"model.layers={layers} builds that many decoder layers of random weights (the rehearsal): "
                          "set model.random_init=true too, or model.layers=null for the checkpoint")


def emu3_vocabulary_map() -> dict[str, int]:
    """The stand-in ``vocabulary_map`` of an Emu3 rehearsal: the structural tokens and the visual tokens, named as the
    released tokenizer names them (``<|visual token000123|>``)."""
    visual = {f"<|visual token{code:06d}|>": EMU3_FIRST_VISUAL_ID + code for code in range(EMU3_CODES)}
    return {**EMU3_STAND_IN_SPECIAL, **visual}


def rehearsal_shape(path: str, known: dict[str, str]) -> str | None:
    """Where the rehearsal's shape comes from: the :data:`REAL_SHAPES` entry of a known hub id ``path`` (``known``: hub
    id -> entry; no file read), or None for a local directory (its config); else one line."""
    if os.path.isdir(os.path.expanduser(path)):
        return None
    if path in known:
        return known[path]
    raise MissingWeightsError(f"model.random_init=true builds the shape of a local checkpoint directory or of "
                              f"{' / '.join(known)} (no file read); model.path={path!r} is neither")


def stand_in_ids(text: str, end: int, first: int = STAND_IN_FIRST_ID) -> list[int]:
    """One id per word or punctuation mark of ``text``, a stable hash of it into ``[first, end)``."""
    return [first + int.from_bytes(hashlib.sha1(w.encode()).digest()[:8], "little") % (end - first)
            for w in _WORDS.findall(text)]
