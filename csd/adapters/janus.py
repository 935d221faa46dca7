"""Janus-Pro on ``transformers.JanusForConditionalGeneration`` (docs/MODELS.md, "Janus-Pro 1B / 7B").

Image tokens are driven through ``model.model.language_model`` + ``model.model.generation_head``
(never ``model(...)``, whose forward applies the *text* head). Sampled codes are fed back with
``prepare_embeddings_for_image_generation``; prompt tokens use the text input embeddings. CFG rows
are ``[cond; uncond]`` where the unconditional prompt is the same ids with every token except BOS
and BOI replaced by the pad id (pads not masked), as the reference implementation does.

The decode step compiles (``engine.compile=true``, ``csd.fast.CompiledStep``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from transformers import JanusConfig, JanusForConditionalGeneration, PreTrainedModel

from csd.adapters.base import (
    BodyLayout,
    ModelAdapter,
    SamplingConfig,
    checks_weights,
    default_dtype,
    resolve_dtype,
    to_uint8,
)
from csd.adapters.shapes import (
    JANUS_HUB_SHAPES,
    JANUS_STAND_IN_SPECIAL,
    check_layers,
    real_janus_config,
    rehearsal_shape,
    stand_in_ids,
)
from csd.cache import RaggedCache
from csd.errors import MissingWeightsError
from csd.hub import download_command, load_local_first, model_files_present

PromptEncoder = Callable[[str], torch.Tensor]




class JanusAdapter(ModelAdapter):
    """Janus-Pro behind :class:`ModelAdapter`."""

    compilable = True

    def __init__(
        self,
        model: JanusForConditionalGeneration,
        encode: PromptEncoder,
        special_ids: tuple[int, int, int],
        sampling: SamplingConfig,
    ) -> None:
        self.model = model.eval()
        self.encode = encode
        self.bos_id, self.pad_id, self.boi_id = special_ids
        self.sampling = sampling
        self.device = next(model.parameters()).device
        vq = model.config.vq_config
        self.vocab_size = vq.num_embeddings
        self.image_token_ids = torch.arange(self.vocab_size)
        side = int(round(model.config.vision_config.num_image_tokens**0.5))
        self.layout = BodyLayout.raster(side, side)

    def decode_step(self, embeds: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Language model + image head: ``[rows, q, D]`` embeddings -> ``[rows, q, vocab_size]`` logits."""
        return self.head(self.features_step(embeds, cache, position_ids, attention_mask))

    def features_step(self, embeds: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.model.language_model(
            inputs_embeds=embeds, cache=cache, position_ids=position_ids, attention_mask=attention_mask,
            use_cache=cache is not None,
        ).last_hidden_state

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(features)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.body_inputs(ids)

    def decoder(self) -> PreTrainedModel:
        return self.model.model.language_model

    def prompt_inputs(self, prompt: str) -> torch.Tensor:
        """``[rows, T, D]`` input embeddings of :meth:`prompt_rows` (the CFG rows have the same length)."""
        return self.model.get_input_embeddings()(self.prompt_rows(prompt))

    def body_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(ids)

    def prompt_rows(self, prompt: str) -> torch.Tensor:
        """``[rows, T]`` prompt ids: the conditional row, then (CFG) the pad-replaced unconditional row."""
        cond = self.encode(prompt).to(self.device)
        if not self.uses_cfg:
            return cond.unsqueeze(0)
        keep = (cond == self.bos_id) | (cond == self.boi_id)
        uncond = torch.where(keep, cond, torch.full_like(cond, self.pad_id))
        return torch.stack([cond, uncond])

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return to_uint8(self.model.model.vqmodel.decode(ids.to(self.device)))

    def token_embeddings(self) -> torch.Tensor:
        return self.model.model.generation_embeddings.weight

    def codebook(self) -> torch.Tensor:
        return self.model.model.vqmodel.quantize.embedding.weight


# --------------------------------------------------------------------------------------------- loaders




def janus_missing(path: str) -> MissingWeightsError:
    """The error of a Janus-Pro checkpoint that is not at ``path`` (a hub id or a local directory)."""
    hub_id = path if "/" in path and not os.path.isabs(path) else "deepseek-community/Janus-Pro-7B"
    return MissingWeightsError(
        f"Janus-Pro files not found at {path!r}. Download them with `{download_command(hub_id)}` and set "
        "model.path=<dir> (or run without HF_HUB_OFFLINE on a machine that reaches the Hugging Face hub)."
    )


def check_janus_files(path: str, random_init: bool = False, layers: int | None = None, **_: object) -> None:
    """:func:`load_janus_adapter`'s files check (``csd.adapters.base.checks_weights``): the checkpoint, or with
    ``random_init`` a local directory's config or a known hub id's shape; ``layers`` only with ``random_init``."""
    check_layers(random_init, layers)
    if random_init:
        rehearsal_shape(path, JANUS_HUB_SHAPES)
    elif not model_files_present(path):
        raise janus_missing(path)


def stand_in_encoder(vocab_end: int) -> PromptEncoder:
    """The rehearsal's prompts without the tokenizer's files: Janus's template (BOS, ``<|User|>: {caption}\n\n
    <|Assistant|>:``, image start) with :func:`csd.adapters.shapes.stand_in_ids` below ``vocab_end`` (the ids before
    the tokenizer's special tokens), so a caption has about its real length."""
    bos, _, boi = JANUS_STAND_IN_SPECIAL

    def encode(caption: str) -> torch.Tensor:
        return torch.tensor([bos, *stand_in_ids(f"<|User|>: {caption}\n\n<|Assistant|>:", vocab_end), boi])

    return encode


@checks_weights(check_janus_files)
def load_janus_adapter(
    path: str,
    guidance_scale: float = 5.0,
    top_k: int = 0,
    temperature: float = 1.0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    random_init: bool = False,
    layers: int | None = None,
    **_: object,
) -> JanusAdapter:
    """Janus-Pro from a hub id or local directory. ``random_init``: the rehearsal (docs/MODELS.md, "Rehearsal"), the
    real shape with random weights and ``layers`` decoder layers (None: all), no weight read: a local directory's
    config and processor, or a known hub id's shape (``csd.adapters.shapes.rehearsal_shape``) with the stand-in
    tokenizer."""
    from transformers import JanusProcessor

    check_layers(random_init, layers)
    if random_init and rehearsal_shape(path, JANUS_HUB_SHAPES) is not None:
        config = real_janus_config(rehearsal_shape(path, JANUS_HUB_SHAPES), layers)
        with default_dtype(resolve_dtype(dtype)), torch.device(device):
            model = JanusForConditionalGeneration(config)
        sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k, temperature=temperature)
        return JanusAdapter(model, stand_in_encoder(JANUS_STAND_IN_SPECIAL[0]), JANUS_STAND_IN_SPECIAL, sampling)
    missing = janus_missing(path)
    if path.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(path)):
        raise missing

    def load() -> tuple[JanusProcessor, JanusForConditionalGeneration]:
        processor = JanusProcessor.from_pretrained(path)
        if random_init:
            config = JanusConfig.from_pretrained(path)
            if layers is not None:
                config.text_config.num_hidden_layers = layers
            with default_dtype(resolve_dtype(dtype)):
                return processor, JanusForConditionalGeneration(config)
        return processor, JanusForConditionalGeneration.from_pretrained(path, dtype=resolve_dtype(dtype))

    try:
        processor, model = load_local_first(load)
    except (OSError, ValueError) as err:  # hub clients raise OSError / HFValidationError subclasses
        raise missing from err
    tokenizer = processor.tokenizer

    def encode(caption: str) -> torch.Tensor:
        chat = [{"role": "user", "content": [{"type": "text", "text": caption}]}]
        text = processor.apply_chat_template(chat, add_generation_prompt=True)
        return processor(text=text, generation_mode="image", return_tensors="pt")["input_ids"][0]

    special = (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids(processor.image_start_token))
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k, temperature=temperature)
    return JanusAdapter(model.to(device), encode, special, sampling)


# ------------------------------------------------------------------------------------ tiny test model

TINY_PAD, TINY_BOS, TINY_EOS, TINY_BOI, TINY_BYTE0 = 0, 1, 2, 3, 4


def tiny_byte_encoder(caption: str) -> torch.Tensor:
    """Janus's prompt template over bytes: BOS ``<|User|>: {caption}\\n\\n<|Assistant|>:`` BOI."""
    text = f"<|User|>: {caption}\n\n<|Assistant|>:".encode()
    return torch.tensor([TINY_BOS, *(TINY_BYTE0 + b for b in text), TINY_BOI])


def tiny_janus_config(grid: int = 8, codebook: int = 64, hidden: int = 32, layers: int = 2) -> JanusConfig:
    """A Janus config small enough for CPU tests (constraints from docs/MODELS.md)."""
    return JanusConfig(
        text_config=dict(
            model_type="llama", vocab_size=TINY_BYTE0 + 256, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            bos_token_id=TINY_BOS, pad_token_id=TINY_PAD, eos_token_id=TINY_EOS,
        ),
        vision_config=dict(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=grid * 16, patch_size=16,
            projection_dim=hidden, num_image_tokens=grid * grid, mlp_ratio=2,
        ),
        vq_config=dict(
            embed_dim=4, num_embeddings=codebook, latent_channels=8, base_channels=32, channel_multiplier=[1, 1],
            num_res_blocks=1, projection_dim=hidden, image_token_embed_dim=hidden, num_patches=grid,
        ),
        image_token_id=TINY_BYTE0 + 255,
    )


def tiny_janus_adapter(
    grid: int = 8,
    codebook: int = 64,
    seed: int = 0,
    head_scale: float = 1.0,
    input_gain: float = 1.0,
    guidance_scale: float = 5.0,
    top_k: int = 0,
    temperature: float = 1.0,
    device: str = "cpu",
    dtype: str = "float32",
    **_: object,
) -> JanusAdapter:
    """A seeded random tiny Janus (real transformers classes) for smoke runs and tests.

    ``head_scale`` multiplies the image head's weights: random init gives near-uniform logits, and a
    larger scale makes the target distributions peaked and position-dependent, as a trained model's are.
    ``input_gain`` multiplies the generation aligner's output, the image tokens' input embeddings: at random
    init they are about 500 times smaller than the prompt's, so the targets hardly depend on the image tokens
    already decoded (the same image whatever the drafts); a gain of a few hundred makes the next target move
    with the previous tokens, as a trained model's does (tests/helpers.py ``rejecting_janus``).
    """
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_janus_config(grid, codebook))
    with torch.no_grad():
        for p in model.model.generation_head.parameters():
            p.mul_(head_scale)
        for p in model.model.generation_aligner.hidden_layers[-1].parameters():
            p.mul_(input_gain)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k, temperature=temperature)
    model = model.to(device=device, dtype=resolve_dtype(dtype))
    return JanusAdapter(model, tiny_byte_encoder, (TINY_BOS, TINY_PAD, TINY_BOI), sampling)
