"""Emu3-Gen on ``transformers.Emu3ForConditionalGeneration`` (docs/MODELS.md, "Emu3-Gen").

* Prompt (``Emu3Processor(..., return_for_image_generation=True)``): BOS + caption + positive suffix +
  ``<|image start|>{H}*{W}<|image token|>``; 720x720 px = 90x90 visual tokens (8 px each).
* Body: ``H`` rows of (``W`` visual tokens + EOL ``<|extra_200|>``), then ``<|extra_201|>`` (end of frame)
  and ``<|image end|>``. EOL / end tokens are forced positions; visual token ids map to VQ codes through
  ``vocabulary_mapping`` (a lookup).
* CFG 3 with a *negative prompt* (same image header) as the unconditional branch, top-k 2048. The
  original combines log-softmax values; combining raw logits gives the same ``q`` (a per-row constant). Both rows
  decode at their own prompt lengths on one ``csd.cache.RaggedCache`` (``CFGRowsAdapter``; one forward per engine
  iteration).
* Pixels: ``model.decode_image_tokens`` (HF's Emu3 VQ decoder; values in about [-1, 1]).

Adding this model family took this file plus ``conf/model/emu3_gen.yaml``: the engine, processors and
acceptance rules are untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Emu3Config, Emu3ForConditionalGeneration

from csd.adapters.base import (
    BodyLayout,
    SamplingConfig,
    checks_weights,
    default_dtype,
    resolve_dtype,
    to_uint8,
)
from csd.adapters.lumina import CFGRowsAdapter, _local_dir, check_model_dir
from csd.adapters.shapes import (
    EMU3_HUB_SHAPES,
    EMU3_STAND_IN_SPECIAL,
    check_layers,
    emu3_vocabulary_map,
    real_text_config,
    rehearsal_shape,
    stand_in_ids,
)

PromptEncoder = Callable[[str], torch.Tensor]
#: pixels per visual token along each side (the released VQ model's spatial downsampling)
EMU3_DOWNSAMPLE = 8

# BAAI's Emu3-Gen defaults (README / generation example)
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, worst "
    "quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry."
)


def emu3_layout(rows: int, cols: int, eol: int, end_ids: tuple[int, ...], jacobi_tail: int) -> BodyLayout:
    """``rows`` x (``cols`` free + EOL), then the forced ``end_ids``."""
    forced = torch.tensor(([-1] * cols + [eol]) * rows + list(end_ids), dtype=torch.long)
    return BodyLayout.from_forced(forced, (rows, cols), jacobi_tail)


class Emu3Adapter(CFGRowsAdapter):
    def __init__(
        self,
        model: Emu3ForConditionalGeneration,
        encode: PromptEncoder,
        grid: tuple[int, int],
        end_ids: tuple[int, int, int],
        sampling: SamplingConfig,
        positive_suffix: str = POSITIVE_SUFFIX,
        negative_prompt: str = NEGATIVE_PROMPT,
        jacobi_tail: int = 0,
    ) -> None:
        """``encode(text)`` -> full prompt ids (BOS, text, image header); ``end_ids`` = (end of frame,
        image end, EOS): the first two close the body, EOS is the third trailing token HF's
        ``decode_image_tokens`` strips."""
        super().__init__(model.model.text_model, model.lm_head, sampling)
        self.model, self.encode = model, encode
        self.positive_suffix, self.negative_prompt = positive_suffix, negative_prompt
        mapping = model.model.vocabulary_mapping
        self.vocab_size = model.config.vq_config.codebook_size
        self.image_token_ids = torch.tensor([mapping.img2bpe[v] for v in range(self.vocab_size)], device=self.device)
        self.raw_image_columns = self.image_token_ids
        self.rows, self.cols = grid
        self.eos_id = end_ids[2]
        self.layout = emu3_layout(self.rows, self.cols, mapping.eol_token_id, end_ids[:2], jacobi_tail)

    def prompt_rows(self, prompt: str) -> list[torch.Tensor]:
        cond = self.encode(prompt + self.positive_suffix)
        return [cond, self.encode(self.negative_prompt)] if self.uses_cfg else [cond]

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        eos = torch.full((ids.shape[0], 1), self.eos_id, dtype=ids.dtype)
        with torch.no_grad():
            pixels = self.model.decode_image_tokens(
                image_tokens=torch.cat([ids, eos], dim=1).to(self.device), height=self.rows, width=self.cols
            )
        return to_uint8(pixels)

    def token_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[self.image_token_ids]

    def codebook(self) -> torch.Tensor:
        return self.model.model.vqmodel.quantize.embedding.weight

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "jacobi_tail": self.layout.jacobi_tail, "negative_prompt": self.negative_prompt}


# --------------------------------------------------------------------------------------------- loaders


#: Emu3-Gen's name and hub repository, for its missing-files error
EMU3_NAMES = ("Emu3-Gen", "BAAI/Emu3-Gen-hf")


def check_emu3_files(path: str, random_init: bool = False, layers: int | None = None, **_: object) -> None:
    """:func:`load_emu3_adapter`'s weights check (``csd.adapters.base.checks_weights``); the rehearsal
    (``random_init``) needs the known hub id or a local directory only."""
    check_layers(random_init, layers)
    if random_init:
        rehearsal_shape(path, EMU3_HUB_SHAPES)
    else:
        check_model_dir(path, *EMU3_NAMES)


def rehearsal_emu3(shape: str, layers: int | None, ratio: str, image_area: int, dtype: str,
                   device: str) -> tuple[Emu3ForConditionalGeneration, PromptEncoder, tuple[int, int], tuple[int, int, int]]:
    """Emu3-Gen's shape (``REAL_SHAPES`` ``shape``, transformers' default VQ config: the released one) with ``layers``
    decoder layers of random weights, no file read: the stand-in vocabulary of
    :func:`csd.adapters.shapes.emu3_vocabulary_map`, the grid of ``image_area`` at ``ratio`` with the 8x downsampling
    (720 x 720 px: 90 x 90), and the processor's prompt format (BOS, text, ``<|image start|>{H}*{W}<|image token|>``)
    over the stand-in tokenizer. Returns the model, the encoder, the grid and the end ids."""
    vocab = emu3_vocabulary_map()
    config = Emu3Config(text_config=real_text_config(shape, layers), vocabulary_map=vocab)
    with default_dtype(resolve_dtype(dtype)), torch.device(device):
        model = Emu3ForConditionalGeneration(config)
    w, h = (int(x) for x in ratio.split(":"))
    side = (image_area / (w * h)) ** 0.5 / EMU3_DOWNSAMPLE
    rows, cols = round(side * h), round(side * w)
    special = min(EMU3_STAND_IN_SPECIAL.values())  # text ids stay below the structural tokens

    def encode(text: str) -> torch.Tensor:
        header = [vocab["<|image start|>"], *stand_in_ids(f"{rows}*{cols}", special), vocab["<|image token|>"]]
        return torch.tensor([vocab["<|extra_203|>"], *stand_in_ids(text, special), *header], dtype=torch.long)

    end_ids = (vocab["<|extra_201|>"], vocab["<|image end|>"], vocab["<|endoftext|>"])
    return model.eval(), encode, (rows, cols), end_ids


@checks_weights(check_emu3_files)
def load_emu3_adapter(
    path: str,
    guidance_scale: float = 3.0,
    top_k: int = 2048,
    temperature: float = 1.0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    ratio: str = "1:1",
    image_area: int = 518400,
    positive_suffix: str = POSITIVE_SUFFIX,
    negative_prompt: str = NEGATIVE_PROMPT,
    jacobi_tail: int = 0,
    random_init: bool = False,
    layers: int | None = None,
    **_: object,
) -> Emu3Adapter:
    """Emu3-Gen (``BAAI/Emu3-Gen-hf``) from a hub id or local directory; ``image_area`` 518400 = 720x720 px.
    ``random_init`` with the hub id: the rehearsal (docs/MODELS.md, "Rehearsal", :func:`rehearsal_emu3`), ``layers``
    decoder layers (None: all)."""
    from transformers import Emu3Processor

    check_layers(random_init, layers)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    if random_init and rehearsal_shape(path, EMU3_HUB_SHAPES) is not None:
        model, encode, grid, end_ids = rehearsal_emu3(rehearsal_shape(path, EMU3_HUB_SHAPES), layers, ratio,
                                                      image_area, dtype, device)
        return Emu3Adapter(model, encode, grid, end_ids, sampling, positive_suffix, negative_prompt, jacobi_tail)
    model_dir = _local_dir(path, *EMU3_NAMES)
    processor = Emu3Processor.from_pretrained(model_dir)
    if random_init:  # a local directory's config and processor, random weights
        config = Emu3Config.from_pretrained(model_dir)
        if layers is not None:
            config.text_config.num_hidden_layers = layers
        with default_dtype(resolve_dtype(dtype)):
            model = Emu3ForConditionalGeneration(config)
    else:
        model = Emu3ForConditionalGeneration.from_pretrained(model_dir, dtype=resolve_dtype(dtype))
    tok = processor.tokenizer
    grid = processor.calculate_generate_size(ratio, image_area, processor.downsample_ratio)

    def encode(text: str) -> torch.Tensor:
        out = processor(text=text, return_for_image_generation=True, ratio=ratio, image_area=image_area, return_tensors="pt")
        return out["input_ids"][0]

    end_ids = (
        tok.convert_tokens_to_ids(processor.eof_token),
        tok.convert_tokens_to_ids(processor.image_end_token),
        tok.eos_token_id,
    )
    return Emu3Adapter(model.to(device), encode, grid, end_ids, sampling, positive_suffix, negative_prompt, jacobi_tail)


# ------------------------------------------------------------------------------------ tiny test model

TINY_PAD, TINY_BOS, TINY_EOS, TINY_BYTE0 = 0, 1, 2, 3


def tiny_emu3_config(codes: int = 8, seed: int = 0, hidden: int = 32, layers: int = 2) -> Emu3Config:
    """Emu3 vocabulary in miniature: bytes, ``<|visual tokenNNNNNN|>`` on shuffled ids, then the structural tokens."""
    first = TINY_BYTE0 + 256
    image_ids = (first + torch.randperm(codes, generator=torch.Generator().manual_seed(seed))).tolist()
    vocab = {f"<|visual token{code:06d}|>": bpe for code, bpe in enumerate(image_ids)}
    names = ["<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image end|>", "<|image token|>", "<image>"]
    vocab.update({name: first + codes + i for i, name in enumerate(names)})
    return Emu3Config(
        text_config=dict(
            vocab_size=first + codes + len(names), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            pad_token_id=TINY_PAD, bos_token_id=TINY_BOS, eos_token_id=TINY_EOS, attention_dropout=0.0,
        ),
        vq_config=dict(
            codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
            num_res_blocks=1, attn_resolutions=[], hidden_size=32, temporal_downsample_factor=4,
        ),
        vocabulary_map=vocab,
    )


def tiny_emu3_adapter(
    grid: tuple[int, int] = (3, 3),
    codes: int = 8,
    seed: int = 0,
    head_scale: float = 1.0,
    guidance_scale: float = 3.0,
    top_k: int = 0,
    temperature: float = 1.0,
    negative_prompt: str = "blurry",
    jacobi_tail: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    **_: object,
) -> Emu3Adapter:
    """A seeded random tiny Emu3 (real transformers classes) with a byte-level prompt encoder."""
    config = tiny_emu3_config(codes, seed)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    vocab = config.vocabulary_map
    rows, cols = grid

    def encode(text: str) -> torch.Tensor:
        header = [vocab["<|image start|>"], *(TINY_BYTE0 + b for b in f"{rows}*{cols}".encode()), vocab["<|image token|>"]]
        return torch.tensor([TINY_BOS, *(TINY_BYTE0 + b for b in text.encode()), *header], dtype=torch.long)

    end_ids = (vocab["<|extra_201|>"], vocab["<|image end|>"], TINY_EOS)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    model = model.to(device=device, dtype=resolve_dtype(dtype))
    return Emu3Adapter(model, encode, (rows, cols), end_ids, sampling, "", negative_prompt, jacobi_tail)
