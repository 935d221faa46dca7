"""Adapter for the embedded toy model (``csd/toy``): a tiny Llama over captions + 256 patch codes.

Prompt = ``<bos>``, the left-padded caption, ``<boi>`` (see :mod:`csd.toy.vocab`); the null caption
used for the unconditional CFG row has the same length, so no attention mask is needed. Body tokens
are patch codes ``0 .. V-1``; LM id = ``N_TEXT + code``.
"""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM, LlamaModel

from csd.adapters.base import BodyLayout, ModelAdapter, SamplingConfig
from csd.cache import RaggedCache
from csd.errors import MissingWeightsError
from csd.toy import (
    EAGLE_HEAD_FILE,
    LM_DIR,
    OUTLINE_EAGLE_HEAD_FILE,
    OUTLINE_LM_DIR,
    SPATIAL_HEADS_FILE,
    TEXTURED_EAGLE_HEAD_FILE,
    TEXTURED_LM_DIR,
    TOKENIZER_FILE,
)
from csd.toy.model import load_toy_lm
from csd.toy.tokenizer import GRID, PatchTokenizer
from csd.toy.vocab import N_TEXT, READS, caption_problem, encode_caption

#: the strongest guidance whose checker pass rate on 64 held-out prompts ties the best (no CFG,
#: within noise); stronger guidance makes the toy model draw extra objects (csd/toy/MODEL_CARD.md)
DEFAULT_GUIDANCE = 1.5


class ToyAdapter(ModelAdapter):
    """Drives the toy LM; rows are ``[cond, uncond]`` under CFG (the null caption has the caption's length)."""

    compilable = True
    eagle_head = EAGLE_HEAD_FILE
    spatial_heads = SPATIAL_HEADS_FILE
    reads = READS

    @classmethod
    def caption_problem(cls, caption: str) -> str | None:
        return caption_problem(caption)

    name = "toy"
    checkpoint = LM_DIR

    def __init__(self, lm: LlamaForCausalLM, tokenizer: PatchTokenizer, sampling: SamplingConfig,
                 device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.lm = lm.to(self.device).eval()
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.vocab_size = tokenizer.vocab_size
        self.image_token_ids = torch.arange(self.vocab_size)
        self.layout = BodyLayout.raster(GRID, GRID)

    def decode_step(self, ids: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """LM + the image-code columns of its head: ``[rows, q]`` ids -> ``[rows, q, vocab_size]`` logits."""
        return self.head(self.features_step(ids, cache, position_ids, attention_mask))

    def features_step(self, ids: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm.model(
            input_ids=ids, cache=cache, position_ids=position_ids, attention_mask=attention_mask, use_cache=cache is not None
        ).last_hidden_state

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(features)[..., N_TEXT:N_TEXT + self.vocab_size]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.model.embed_tokens(self.body_inputs(ids))

    def decoder(self) -> LlamaModel:
        return self.lm.model

    def prompt_inputs(self, prompt: str) -> torch.Tensor:
        """``[rows, PROMPT_LEN]`` ids: the caption, then (CFG) the null caption (same length by construction)."""
        rows = [encode_caption(prompt)]
        if self.uses_cfg:
            rows.append(encode_caption(None))
        return torch.stack(rows).to(self.device)

    def body_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.long() + N_TEXT

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokenizer.decode(ids.cpu())

    def token_embeddings(self) -> torch.Tensor:
        return self.lm.get_input_embeddings().weight[N_TEXT:N_TEXT + self.vocab_size].detach()

    def codebook(self) -> torch.Tensor:
        return self.tokenizer.centroids

    def describe(self) -> dict:
        return {**super().describe(), "model": self.name, "checkpoint": str(self.checkpoint)}


class TexturedToyAdapter(ToyAdapter):
    """The second embedded model (``model=toy_textured``): the toy LM continued on the textured domain
    (``csd/toy/MODEL_CARD.md``), with its own EAGLE head; it ships no spatial heads (``drafter.heads`` names trained
    ones)."""

    name = "toy_textured"
    checkpoint = TEXTURED_LM_DIR
    eagle_head = TEXTURED_EAGLE_HEAD_FILE
    spatial_heads = None


class OutlineToyAdapter(ToyAdapter):
    """The third embedded model (``model=toy_textured_outline``): the toy LM continued on the textured domain with
    jittered object outlines (``csd/toy/MODEL_CARD.md``), with its own EAGLE head and no spatial heads."""

    name = "toy_textured_outline"
    checkpoint = OUTLINE_LM_DIR
    eagle_head = OUTLINE_EAGLE_HEAD_FILE
    spatial_heads = None


def _load(cls: type[ToyAdapter], remake: str, guidance_scale: float, top_k: int | None, temperature: float,
          device: str, dtype: str) -> ToyAdapter:
    lm_dir = cls.checkpoint
    missing = [p for p in (TOKENIZER_FILE, lm_dir / "config.json", lm_dir / "model.safetensors") if not p.exists()]
    if missing:
        raise MissingWeightsError(f"{cls.name} model files missing: {', '.join(map(str, missing))}; recreate them with "
                                  f"{remake}")
    lm = load_toy_lm(lm_dir, dtype=getattr(torch, dtype))
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    return cls(lm, PatchTokenizer.load(TOKENIZER_FILE), sampling, device)


def load_toy_adapter(guidance_scale: float = DEFAULT_GUIDANCE, top_k: int | None = 0, temperature: float = 1.0,
                     device: str = "cpu", dtype: str = "float32") -> ToyAdapter:
    """The shipped toy model (``csd/toy/assets``) behind the :class:`ModelAdapter` interface (``top_k`` 0 or None:
    no top-k)."""
    return _load(ToyAdapter, "`python -m experiments.train_toy` (about 3 hours on 2 CPU cores, or `--device cuda`)",
                 guidance_scale, top_k, temperature, device, dtype)


def load_toy_textured_adapter(guidance_scale: float = DEFAULT_GUIDANCE, top_k: int | None = 0,
                              temperature: float = 1.0, device: str = "cpu", dtype: str = "float32") -> TexturedToyAdapter:
    """The textured toy (``csd/toy/assets/textured``), as :func:`load_toy_adapter`."""
    return _load(TexturedToyAdapter, "the textured recipe of `python -m experiments.train_toy` (csd/toy/MODEL_CARD.md)",
                 guidance_scale, top_k, temperature, device, dtype)


def load_toy_textured_outline_adapter(guidance_scale: float = DEFAULT_GUIDANCE, top_k: int | None = 0,
                                      temperature: float = 1.0, device: str = "cpu",
                                      dtype: str = "float32") -> OutlineToyAdapter:
    """The outline toy (``csd/toy/assets/textured_outline``), as :func:`load_toy_adapter`."""
    return _load(OutlineToyAdapter, "the outline recipe of `python -m experiments.train_toy` (csd/toy/MODEL_CARD.md)",
                 guidance_scale, top_k, temperature, device, dtype)


def load_toy_draft_adapter(layers: int = 1, guidance_scale: float = DEFAULT_GUIDANCE, top_k: int | None = 0,
                           temperature: float = 1.0, device: str = "cpu", dtype: str = "float32") -> ToyAdapter:
    """A layer-skip draft model of the toy (``model=toy_draft``, docs/ALGORITHMS.md "Draft model"): the shipped toy
    LM's first ``layers`` decoder layers, then its own final norm and output head, with the toy's weights as they are
    (an early exit, not trained as such)."""
    adapter = load_toy_adapter(guidance_scale, top_k, temperature, device, dtype)
    decoder = adapter.lm.model
    if not 1 <= layers < len(decoder.layers):
        raise ValueError(f"model.layers={layers}: the toy has {len(decoder.layers)} decoder layers; a layer-skip draft "
                         f"keeps 1 .. {len(decoder.layers) - 1} of them")
    decoder.layers = decoder.layers[:layers]
    decoder.config.num_hidden_layers = layers
    return adapter
