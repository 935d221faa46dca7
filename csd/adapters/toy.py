"""Adapter for the embedded toy model (``csd/toy``): a tiny Llama over captions + 256 patch codes.

Prompt = ``<bos>``, the left-padded caption, ``<boi>`` (see :mod:`csd.toy.vocab`); the null caption
used for the unconditional CFG row has the same length, so no attention mask is needed. Body tokens
are patch codes ``0 .. V-1``; LM id = ``N_TEXT + code``.
"""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache, LlamaForCausalLM, LlamaModel

from csd.adapters.base import BodyLayout, DecodeContext, MissingWeightsError, ModelAdapter, SamplingConfig
from csd.fast import StaticDispatch, make_static_decoder
from csd.ragged import RaggedCache, RaggedDispatch
from csd.toy import LM_DIR, TOKENIZER_FILE
from csd.toy.model import load_toy_lm
from csd.toy.tokenizer import GRID, PatchTokenizer
from csd.toy.vocab import N_TEXT, encode_caption

#: the strongest guidance whose checker pass rate on 64 held-out prompts ties the best (no CFG,
#: within noise); stronger guidance makes the toy model draw extra objects (csd/toy/MODEL_CARD.md)
DEFAULT_GUIDANCE = 1.5


class ToyAdapter(RaggedDispatch, StaticDispatch, ModelAdapter):
    """Drives the toy LM token by token with a ``DynamicCache``; rows are ``[cond, uncond]`` under CFG.
    Batched decoding (``start_batch`` ...) runs on a ``csd.ragged.RaggedCache`` (compiled: fixed capacity, the
    StaticDecoder's compiled step)."""

    def __init__(self, lm: LlamaForCausalLM, tokenizer: PatchTokenizer, sampling: SamplingConfig,
                 device: str | torch.device = "cpu", cache: str = "dynamic", compile: bool = False,
                 max_cache_len: int | None = None, compile_backend: str = "inductor") -> None:
        self.device = torch.device(device)
        self.lm = lm.to(self.device).eval()
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.vocab_size = tokenizer.vocab_size
        self.image_token_ids = torch.arange(self.vocab_size)
        self.layout = BodyLayout.raster(GRID, GRID)
        self.static = make_static_decoder(
            self.decode_step, self.lm.config, self.layout.length, cache, compile, max_cache_len, compile_backend
        )

    def decode_step(self, ids: torch.Tensor, cache: Cache | RaggedCache, position_ids: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """LM + the image-code columns of its head: ``[rows, q]`` ids -> ``[rows, q, vocab_size]`` logits
        (``position_ids`` / ``attention_mask``: those of a ``RaggedCache`` forward)."""
        hidden = self.lm.model(
            input_ids=ids, cache=cache, position_ids=position_ids, attention_mask=attention_mask, use_cache=True
        ).last_hidden_state
        return self.lm.lm_head(hidden)[..., N_TEXT:N_TEXT + self.vocab_size]

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

    def prefill(self, prompt: str) -> DecodeContext:
        ids = self.prompt_inputs(prompt)
        if self.static is not None:
            self.static.prefill(ids[:, :-1])
            return DecodeContext(cache=self.static, prompt_tail=ids[:, -1:])
        cache = DynamicCache(config=self.lm.config)
        with torch.no_grad():
            self.lm.model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
        return DecodeContext(cache=cache, prompt_tail=ids[:, -1:])

    def forward(self, ctx: DecodeContext, ids: torch.Tensor, with_prompt_tail: bool = False) -> torch.Tensor:
        rows = ctx.prompt_tail.shape[0]
        window = (ids.to(self.device).long() + N_TEXT).view(1, -1).expand(rows, -1)
        if with_prompt_tail:
            window = torch.cat([ctx.prompt_tail, window], dim=1)
        return self.run_step(window, ctx.cache)

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokenizer.decode(ids.cpu())

    def token_embeddings(self) -> torch.Tensor:
        return self.lm.get_input_embeddings().weight[N_TEXT:N_TEXT + self.vocab_size].detach()

    def codebook(self) -> torch.Tensor:
        return self.tokenizer.centroids

    def describe(self) -> dict:
        return {**super().describe(), "model": "toy", "checkpoint": str(LM_DIR)}


def load_toy_adapter(guidance_scale: float = DEFAULT_GUIDANCE, top_k: int | None = 0, temperature: float = 1.0,
                     device: str = "cpu", dtype: str = "float32", cache: str = "dynamic", compile: bool = False,
                     max_cache_len: int | None = None, compile_backend: str = "inductor") -> ToyAdapter:
    """The shipped toy model (``csd/toy/assets``) behind the :class:`ModelAdapter` interface (``top_k`` 0 or None:
    no top-k; ``cache="static"`` / ``compile``: the fast path of :mod:`csd.fast`)."""
    missing = [p for p in (TOKENIZER_FILE, LM_DIR / "config.json", LM_DIR / "model.safetensors") if not p.exists()]
    if missing:
        raise MissingWeightsError(
            f"toy model files missing: {', '.join(map(str, missing))}; "
            "recreate them with `python experiments/train_toy.py` (about 3 hours on 2 CPU cores, or `--device cuda`)"
        )
    lm = load_toy_lm(LM_DIR, dtype=getattr(torch, dtype))
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    return ToyAdapter(lm, PatchTokenizer.load(TOKENIZER_FILE), sampling, device, cache, compile, max_cache_len,
                      compile_backend)
