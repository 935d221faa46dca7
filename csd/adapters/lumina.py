"""Lumina-mGPT 7B on ``transformers.ChameleonForConditionalGeneration`` (docs/MODELS.md, "Lumina-mGPT 7B").

* Logits: ``model.model(...)`` then ``model.lm_head`` — never ``model(...)``, whose forward sets every
  image-token logit to the dtype minimum. The logits keep the full vocabulary; ``raw_image_columns``
  (the image-token BPE ids) lets the shared processor pipeline select the image codes.
* Prompt: BOS + ``"Generate an image of {W}x{H} according to the following prompt:\\n{caption}"`` +
  ``<reserved08706>`` (id 8710, the end of a conversation turn).
* Body: ``<racm3:break>`` (8197), the height and width grid tokens (``8804 + n``, ``n`` in 32-pixel
  units = 2 latent tokens), ``rows`` x (``cols`` image tokens + EOL 8803), ``<eoss>`` (8196). Every
  structural token is a forced position; the free positions are image tokens, whose ids map to VQ
  codes through ``vocabulary_mapping.bpe2img`` (a lookup table, not an offset).
* CFG (scale 3, on raw logits): the unconditional context is the sequence from ``<racm3:break>`` on
  (no prompt). Every row of every slot decodes on one ``csd.cache.RaggedCache`` with its own prompt length
  (the unconditional row's is 0), one forward per engine iteration, which gives the logits of a separate
  unconditional pass (tested). The unconditional row's first prediction has no context: its logits are the
  conditional row's, so CFG leaves it (the forced ``<racm3:break>``) unguided, as Lumina's CFG processor
  does before the image tokens start.
* Sampling: image top-k 2000, temperature 1; plain AR for the last ``jacobi_tail`` (~10) positions.
* Checkpoint conversion: Lumina stores every q_norm / k_norm weight and bias as ``[1, head_dim]``
  (one shard's values); HF expects ``[num_heads, head_dim]`` (k_norm: key-value heads), so they are
  ``repeat_interleave``'d once after loading (:func:`expand_qk_norms`).
* Pixels: Meta's VQGAN decoder (``csd.adapters.vqgan``); uint8 as Lumina does it, ``((x.clamp(-1, 1) + 1)
  / 2 * 255)`` truncated.

The Chameleon parts Anole shares (``csd.adapters.anole``) live here too: :class:`ChameleonAdapter` (the
``bpe2img`` token mapping, VQ decoding, embeddings and codebook), :func:`load_chameleon` (files, tokenizer, q/k
norms) and the tiny random model (:func:`tiny_chameleon_adapter`).
"""

from __future__ import annotations

import glob
import os
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedModel

from csd.adapters.base import (
    BodyLayout,
    ModelAdapter,
    SamplingConfig,
    checks_weights,
    default_dtype,
    resolve_dtype,
)
from csd.adapters.shapes import (
    CHAMELEON_FIRST_TEXT_ID,
    LUMINA_HUB_SHAPES,
    chameleon_vocabulary_map,
    check_layers,
    real_text_config,
    rehearsal_shape,
    stand_in_ids,
)
from csd.adapters.vqgan import (
    META_VQGAN_SOURCE,
    VQGANConfig,
    VQGANDecoder,
    check_vqgan_files,
    codes_from_rows,
    load_vqgan_decoder,
)
from csd.cache import RaggedCache
from csd.errors import MissingWeightsError
from csd.hub import download_command, load_local_first, model_files_present

TextEncoder = Callable[[str], torch.Tensor]
#: a Chameleon-family adapter class
C = TypeVar("C", bound="ChameleonAdapter")

PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{caption}"
LUMINA_PATCH_TOKENS = 2  # Lumina's grid unit: 32 px = 2 latent tokens of 16 px


class CFGRowsAdapter(ModelAdapter):
    """A decoder-only HF model and its full-vocabulary head whose CFG rows are prompts of their own lengths.

    Subclasses give the prompt rows (conditional first, then unconditional when CFG is on); a row may be empty
    (its first prediction, which has no context, is the conditional row's: ``csd.ragged.SlotBatch``). ``base`` is
    the text decoder (its config sizes the cache), ``lm_head`` the full-vocabulary head. Eager only.
    """

    def __init__(self, base: PreTrainedModel, lm_head: nn.Module, sampling: SamplingConfig) -> None:
        self.base = base.eval()
        self.lm_head = lm_head.eval()
        self.sampling = sampling
        self.device = lm_head.weight.device

    @abstractmethod
    def prompt_rows(self, prompt: str) -> list[torch.Tensor]:
        """1-D prompt ids per CFG row (``[cond]`` or ``[cond, uncond]``); a row may be empty."""

    def prompt_inputs(self, prompt: str) -> list[torch.Tensor]:
        """:meth:`prompt_rows` on the device, each row at its own length."""
        return [row.to(self.device) for row in self.prompt_rows(prompt)]

    def body_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.long()

    def decoder(self) -> PreTrainedModel:
        return self.base

    def decode_step(self, ids: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None,
                    attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Decoder + full-vocabulary head: ``[N, q]`` ids -> ``[N, q, V_raw]`` logits."""
        return self.head(self.features_step(ids, cache, position_ids, attention_mask))

    def features_step(self, ids: torch.Tensor, cache: RaggedCache | None, position_ids: torch.Tensor | None,
                      attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.base(
            input_ids=ids, cache=cache, position_ids=position_ids, attention_mask=attention_mask,
            use_cache=cache is not None,
        ).last_hidden_state

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.base.get_input_embeddings()(self.body_inputs(ids))


@dataclass(frozen=True)
class ChameleonTokens:
    """Structural token ids of Lumina-mGPT's image format (defaults: the released tokenizer, docs/MODELS.md)."""

    bos: int = 0
    pad: int = 1
    image_start: int = 8197  # <racm3:break>
    image_end: int = 8196  # <eoss>
    eol: int = 8803  # <reserved08799>
    end_of_turn: int = 8710  # <reserved08706>
    grid_base: int = 8804  # <reserved08800>; grid token n is grid_base + n

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChameleonTokens:
        """Read every id from the tokenizer (the defaults are only documentation of the released one)."""
        names = {
            "image_start": "<racm3:break>",
            "image_end": "<eoss>",
            "eol": "<reserved08799>",
            "end_of_turn": "<reserved08706>",
            "grid_base": "<reserved08800>",
        }
        ids = {field: tokenizer.convert_tokens_to_ids(tok) for field, tok in names.items()}
        unknown = [names[f] for f, i in ids.items() if i is None or i == tokenizer.unk_token_id]
        if unknown:
            raise ValueError(f"Lumina-mGPT tokenizer lacks the image-format tokens {unknown}")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(bos=tokenizer.bos_token_id, pad=pad, **ids)


def lumina_layout(rows: int, cols: int, tokens: ChameleonTokens, jacobi_tail: int) -> BodyLayout:
    """Header (break, height grid, width grid), ``rows`` x (``cols`` free + EOL), ``<eoss>``; forced ids >= 0."""
    header = [tokens.image_start, tokens.grid_base + rows // LUMINA_PATCH_TOKENS, tokens.grid_base + cols // LUMINA_PATCH_TOKENS]
    row = [-1] * cols + [tokens.eol]
    forced = torch.tensor(header + row * rows + [tokens.image_end], dtype=torch.long)
    return BodyLayout.from_forced(forced, (rows, cols), jacobi_tail)


class ChameleonAdapter(CFGRowsAdapter):
    """A ``ChameleonForConditionalGeneration`` with Meta's VQGAN decoder: the parts Lumina-mGPT and Anole share.

    Image-token ids map to VQ codes through ``vocabulary_mapping.bpe2img`` (a permutation, not an offset): the
    target's index ``v`` is token id ``image_token_ids[v]``, ``bpe_to_code`` is the inverse as a dense table. A
    family says where its body's image tokens sit (:meth:`body_codes`), its prompt rows and its layout.
    """

    def __init__(
        self,
        model: ChameleonForConditionalGeneration,
        encode: TextEncoder,
        tokens: ChameleonTokens,
        vqgan: VQGANDecoder,
        grid: tuple[int, int],
        sampling: SamplingConfig,
        jacobi_tail: int = 0,
    ) -> None:
        super().__init__(model.model, model.lm_head, sampling)
        self.model, self.encode, self.tokens, self.vqgan = model, encode, tokens, vqgan.eval()
        bpe2img = model.model.vocabulary_mapping.bpe2img
        self.vocab_size = vqgan.config.n_embed
        img2bpe = {code: bpe for bpe, code in bpe2img.items()}
        self.image_token_ids = torch.tensor([img2bpe[v] for v in range(self.vocab_size)], device=self.device)
        self.raw_image_columns = self.image_token_ids
        self.bpe_to_code = torch.zeros(model.config.vocab_size, dtype=torch.long, device=self.device)
        self.bpe_to_code[self.image_token_ids] = torch.arange(self.vocab_size, device=self.device)
        self.rows, self.cols = grid
        self.layout = self.body_layout(jacobi_tail)

    @abstractmethod
    def body_layout(self, jacobi_tail: int) -> BodyLayout:
        """The family's image body on the ``rows`` x ``cols`` grid."""

    @abstractmethod
    def body_codes(self, ids: torch.Tensor) -> torch.Tensor:
        """Body token ids ``[B, layout.length]`` (on the device) -> VQ codes ``[B, rows, cols]``."""

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        """Meta's decoder, then uint8 as Meta's and Lumina's code do it: ``((x.clamp(-1, 1) + 1) / 2 * 255)``
        truncated."""
        codes = self.body_codes(ids.to(self.device))
        with torch.no_grad():
            pixels = self.vqgan(codes)
        return ((pixels.float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu()

    def token_embeddings(self) -> torch.Tensor:
        return self.model.model.embed_tokens.weight[self.image_token_ids]

    def codebook(self) -> torch.Tensor:
        return self.vqgan.codebook

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "jacobi_tail": self.layout.jacobi_tail, "vq_downsample": self.vqgan.config.downsample}


class LuminaAdapter(ChameleonAdapter):
    def body_layout(self, jacobi_tail: int) -> BodyLayout:
        return lumina_layout(self.rows, self.cols, self.tokens, jacobi_tail)

    def prompt_rows(self, prompt: str) -> list[torch.Tensor]:
        px = self.vqgan.config.downsample
        text = PROMPT_TEMPLATE.format(width=self.cols * px, height=self.rows * px, caption=prompt)
        cond = torch.cat([torch.tensor([self.tokens.bos]), self.encode(text), torch.tensor([self.tokens.end_of_turn])])
        return [cond, cond[:0]] if self.uses_cfg else [cond]

    def body_codes(self, ids: torch.Tensor) -> torch.Tensor:
        return codes_from_rows(ids[:, 3:-1], self.bpe_to_code, self.cols)


# --------------------------------------------------------------------------------------------- loaders


def _checkpoint_tensors(model_dir: str, suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Tensors whose names end with ``suffixes``, read lazily from a safetensors (or ``.bin``) checkpoint."""
    found: dict[str, torch.Tensor] = {}
    shards = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if shards:
        from safetensors import safe_open

        for shard in shards:
            with safe_open(shard, framework="pt") as f:
                found.update({k: f.get_tensor(k) for k in f.keys() if k.endswith(suffixes)})
        return found
    for shard in sorted(glob.glob(os.path.join(model_dir, "pytorch_model*.bin"))):
        state = torch.load(shard, map_location="cpu", weights_only=True)
        found.update({k: v for k, v in state.items() if k.endswith(suffixes)})
    return found


QK_NORM_SUFFIXES = tuple(f"self_attn.{n}.{p}" for n in ("q_norm", "k_norm") for p in ("weight", "bias"))


@torch.no_grad()
def expand_qk_norms(model: ChameleonForConditionalGeneration, stored: dict[str, torch.Tensor]) -> list[str]:
    """Copy Lumina's ``[1, head_dim]`` q/k-norm tensors into HF's ``[heads, head_dim]`` ones, ``repeat_interleave``'d.

    ``stored`` maps checkpoint names to tensors; k_norm expands to key-value heads (the parameter's own
    first dimension). Tensors already at HF's shape are copied as they are. Returns the names set.
    """
    params = dict(model.named_parameters())
    for name, value in stored.items():
        target = params[name]
        target.copy_(value.to(target.dtype).repeat_interleave(target.shape[0] // value.shape[0], dim=0))
    return sorted(stored)


def model_dir_missing(path: str, what: str, hub_hint: str) -> MissingWeightsError:
    """The error of a ``what`` checkpoint (hub repository ``hub_hint``) that is not at ``path``."""
    return MissingWeightsError(
        f"{what} files not found at {path!r}. Download them with `{download_command(hub_hint)}` and set model.path=<dir>."
    )


def check_model_dir(path: str, what: str, hub_hint: str) -> None:
    """:func:`_local_dir`'s error, without downloading anything (``csd.hub.model_files_present``)."""
    if not model_files_present(path):
        raise model_dir_missing(path, what, hub_hint)


def _local_dir(path: str, what: str, hub_hint: str) -> str:
    """A local snapshot directory for ``path`` (a directory or a hub id), else MissingWeightsError."""
    if os.path.isdir(path):
        return path
    from huggingface_hub import snapshot_download

    try:
        return load_local_first(lambda: snapshot_download(path))
    except Exception as err:  # every hub failure means the same thing to the user: the files are not here
        raise model_dir_missing(path, what, hub_hint) from err


def load_chameleon(
    path: str, what: str, hub_hint: str, dtype: str, device: str, layers: int | None = None
) -> tuple[ChameleonForConditionalGeneration, ChameleonTokens, TextEncoder]:
    """A Chameleon-family checkpoint (a local directory or a hub id), its image-format token ids and its text
    encoder (no special tokens added). ``layers`` (the rehearsal of a local directory): its config and tokenizer with
    that many decoder layers of random weights (None: all), no weight read.

    Lumina-mGPT's q/k norms are converted (:func:`expand_qk_norms`); a checkpoint already in transformers' layout
    loads unchanged. Any other shape mismatch is an error; missing files raise ``MissingWeightsError`` naming
    ``hf download <hub_hint>``.
    """
    from transformers import AutoTokenizer

    model_dir = _local_dir(path, what, hub_hint)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise MissingWeightsError(f"{model_dir!r} has no config.json; download {hub_hint} into it")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if layers is not None:
        config = ChameleonConfig.from_pretrained(model_dir)
        config.num_hidden_layers = layers
        with default_dtype(resolve_dtype(dtype)), torch.device(device):
            model = ChameleonForConditionalGeneration(config)
        return model.eval(), ChameleonTokens.from_tokenizer(tokenizer), tokenizer_encoder(tokenizer)
    model, info = ChameleonForConditionalGeneration.from_pretrained(
        model_dir, dtype=resolve_dtype(dtype), ignore_mismatched_sizes=True, output_loading_info=True
    )
    fixed = expand_qk_norms(model, _checkpoint_tensors(model_dir, QK_NORM_SUFFIXES))
    mismatched = {m[0] if isinstance(m, tuple) else m for m in info.get("mismatched_keys", [])}
    unexpected = sorted(mismatched - set(fixed))
    if unexpected:
        raise ValueError(f"{what} checkpoint: unexpected shape mismatches {unexpected[:5]}")

    return model.to(device), ChameleonTokens.from_tokenizer(tokenizer), tokenizer_encoder(tokenizer)


def tokenizer_encoder(tokenizer: Any) -> TextEncoder:
    """Text -> ids of ``tokenizer`` without special tokens."""
    def encode(text: str) -> torch.Tensor:
        return torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)

    return encode


def load_chameleon_adapter(
    cls: type[C],
    path: str,
    vqgan_config: str,
    vqgan_ckpt: str,
    grid: Callable[[int], tuple[int, int]],
    names: tuple[str, str, str],
    known: dict[str, str],
    guidance_scale: float = 3.0,
    top_k: int = 2000,
    temperature: float = 1.0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    jacobi_tail: int = 0,
    random_init: bool = False,
    layers: int | None = None,
    **_: object,
) -> C:
    """A ``cls`` adapter on a Chameleon-family checkpoint (:func:`load_chameleon`) plus Meta's VQGAN decoder (fp32).

    ``grid(pixels per token)`` is the token grid; ``names`` = (the family's name, its hub repository, where its
    VQGAN files come from), for the missing-files errors. ``random_init``: the rehearsal (docs/MODELS.md,
    "Rehearsal"), :func:`rehearsal_chameleon` for a known hub id (``known``: hub id -> its ``REAL_SHAPES`` entry), or a
    local directory's config and tokenizer with random weights; ``layers`` decoder layers (None: all).
    """
    check_layers(random_init, layers)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    if random_init:
        vqgan = VQGANDecoder(VQGANConfig()).to(device=device).eval()  # Chameleon's released decoder shape, fp32
        shape = rehearsal_shape(path, known)
        if shape is not None:
            model, tokens, encode = rehearsal_chameleon(shape, layers, dtype, device)
        else:
            model, tokens, encode = load_chameleon(path, names[0], names[1], dtype, device, layers)
    else:
        what, hub_hint, vqgan_source = names
        vqgan = load_vqgan_decoder(vqgan_config, vqgan_ckpt, device=device, dtype=torch.float32, source=vqgan_source)
        model, tokens, encode = load_chameleon(path, what, hub_hint, dtype, device)
    return cls(model, encode, tokens, vqgan, grid(vqgan.config.downsample), sampling, jacobi_tail)


def rehearsal_chameleon(shape: str, layers: int | None, dtype: str,
                        device: str) -> tuple[ChameleonForConditionalGeneration, ChameleonTokens, TextEncoder]:
    """Chameleon-7B's shape (``REAL_SHAPES`` ``shape``) with ``layers`` decoder layers of random weights, no file read:
    the image tokens of :func:`csd.adapters.shapes.chameleon_vocabulary_map`, the released image-format ids
    (:class:`ChameleonTokens`' defaults) and the stand-in tokenizer above them."""
    config = ChameleonConfig(**real_text_config(shape, layers), vocabulary_map=chameleon_vocabulary_map())
    with default_dtype(resolve_dtype(dtype)), torch.device(device):
        model = ChameleonForConditionalGeneration(config)

    def encode(text: str) -> torch.Tensor:
        return torch.tensor(stand_in_ids(text, config.vocab_size, CHAMELEON_FIRST_TEXT_ID), dtype=torch.long)

    return model.eval(), ChameleonTokens(), encode


def check_chameleon_files(path: str, vqgan_config: str, vqgan_ckpt: str, names: tuple[str, str, str],
                          known: dict[str, str], random_init: bool = False, layers: int | None = None) -> None:
    """:func:`load_chameleon_adapter`'s missing-files errors (``names`` as there), without loading anything: the
    rehearsal (``random_init``) needs no VQGAN file and a known hub id (``known``) or a local directory."""
    check_layers(random_init, layers)
    if random_init:
        rehearsal_shape(path, known)
        return
    what, hub_hint, vqgan_source = names
    check_vqgan_files(vqgan_config, vqgan_ckpt, vqgan_source)
    check_model_dir(path, what, hub_hint)


def lumina_names(resolution: int) -> tuple[str, str, str]:
    """:func:`load_chameleon_adapter`'s ``names`` of Lumina-mGPT at ``resolution``."""
    return "Lumina-mGPT", f"Alpha-VLLM/Lumina-mGPT-7B-{resolution}", META_VQGAN_SOURCE


def check_lumina_files(path: str, vqgan_config: str, vqgan_ckpt: str, resolution: int = 768, random_init: bool = False,
                       layers: int | None = None, **_: object) -> None:
    """:func:`load_lumina_adapter`'s weights check (``csd.adapters.base.checks_weights``)."""
    check_chameleon_files(path, vqgan_config, vqgan_ckpt, lumina_names(resolution), LUMINA_HUB_SHAPES, random_init,
                          layers)


@checks_weights(check_lumina_files)
def load_lumina_adapter(path: str, vqgan_config: str, vqgan_ckpt: str, resolution: int = 768, jacobi_tail: int = 10,
                        **params: Any) -> LuminaAdapter:
    """Lumina-mGPT 7B (``Alpha-VLLM/Lumina-mGPT-7B-{512,768,1024}``) plus Meta's VQGAN decoder; the other keys are
    :func:`load_chameleon_adapter`'s (CFG 3, top-k 2000, temperature 1, bf16 by default).

    ``resolution`` must match the checkpoint (square images, ``resolution // 16`` tokens a side).
    """
    return load_chameleon_adapter(LuminaAdapter, path, vqgan_config, vqgan_ckpt, lambda px: (resolution // px,) * 2,
                                  lumina_names(resolution), LUMINA_HUB_SHAPES, jacobi_tail=jacobi_tail, **params)


# ------------------------------------------------------------------------------------ tiny test model

TINY_BYTE0 = 2  # ids 0, 1: BOS, pad; then 256 byte tokens; then image tokens; then structural tokens


def tiny_vocabulary(codes: int, seed: int) -> tuple[dict[str, int], ChameleonTokens, int]:
    """A Chameleon-style vocabulary: image tokens named ``IMGIMG<letters>Z`` (letters A-J = digits) on
    shuffled ids, so ``bpe2img`` is a genuine permutation. Returns (vocabulary_map, tokens, vocab size)."""
    gen = torch.Generator().manual_seed(seed)
    first = TINY_BYTE0 + 256
    image_ids = (first + torch.randperm(codes, generator=gen)).tolist()
    vocab = {"<s>": 0, "<pad>": 1, "<image>": TINY_BYTE0 + 255}
    for code, bpe in enumerate(image_ids):
        vocab["IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"] = bpe
    special = first + codes
    tokens = ChameleonTokens(
        bos=0, pad=1, image_start=special, image_end=special + 1, eol=special + 2, end_of_turn=special + 3, grid_base=special + 4
    )
    return vocab, tokens, special + 4 + 16


def tiny_byte_encoder(text: str) -> torch.Tensor:
    return torch.tensor([TINY_BYTE0 + b for b in text.encode()], dtype=torch.long)


def tiny_vqgan_config(codes: int) -> VQGANConfig:
    """Two levels (2 px per token), one attention resolution, GroupNorm(32)-compatible widths."""
    return VQGANConfig(
        n_embed=codes, embed_dim=4, z_channels=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8
    )


def tiny_lumina_config(codes: int = 8, seed: int = 0, hidden: int = 32, layers: int = 2) -> tuple[ChameleonConfig, ChameleonTokens]:
    vocab, tokens, vocab_size = tiny_vocabulary(codes, seed)
    config = ChameleonConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=tokens.bos,
        pad_token_id=tokens.pad, eos_token_id=tokens.end_of_turn, vocabulary_map=vocab,
        vq_config=dict(embed_dim=4, num_embeddings=codes, latent_channels=8, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, resolution=8),
    )
    return config, tokens


def tiny_chameleon_adapter(
    cls: type[C],
    grid: tuple[int, int] = (3, 3),
    codes: int = 8,
    seed: int = 0,
    head_scale: float = 1.0,
    guidance_scale: float = 3.0,
    top_k: int = 0,
    temperature: float = 1.0,
    jacobi_tail: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    **_: object,
) -> C:
    """A ``cls`` adapter (Lumina-mGPT, Anole) on a seeded random tiny Chameleon (:func:`tiny_lumina_config`), a tiny
    random VQGAN decoder and a byte-level prompt encoder, for smoke runs and tests.

    ``head_scale`` multiplies ``lm_head``: larger values make the targets peaked and position-dependent.
    The q/k norms get distinct per-head values, so the tiny model exercises HF's per-head layout.
    """
    config, tokens = tiny_lumina_config(codes, seed)
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config)
    vqgan = VQGANDecoder(tiny_vqgan_config(codes))
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.normal_(1.0, 0.1)
                norm.bias.normal_(0.0, 0.1)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    model = model.to(device=device, dtype=resolve_dtype(dtype))
    return cls(model, tiny_byte_encoder, tokens, vqgan.to(device=device), tuple(grid), sampling, jacobi_tail)


def tiny_lumina_adapter(jacobi_tail: int = 2, **params: Any) -> LuminaAdapter:
    """A seeded random tiny Lumina-mGPT (:func:`tiny_chameleon_adapter`'s keys; the last 2 positions plain AR)."""
    return tiny_chameleon_adapter(LuminaAdapter, jacobi_tail=jacobi_tail, **params)
