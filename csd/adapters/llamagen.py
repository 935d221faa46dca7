"""LlamaGen (FoundationVision/LlamaGen): class-conditional GPT-B / L / XL and the text-conditional GPT-XL (docs/MODELS.md,
"LlamaGen").

The GPT is ours (:mod:`csd.adapters.llamagen_gpt`, on the ragged cache); the VQ16 decoder is transformers'
``JanusVQVAE`` (Janus reuses LlamaGen's tokenizer: the same layers and the same L2-normalised codebook lookup), loaded
from LlamaGen's checkpoint after renaming its decoder keys (:func:`vq_state_for_janus`).

CFG rows are ``[cond; uncond]``, LlamaGen's convention: the null class is id ``num_classes`` (the class table's dropout
row); the null caption is the learned ``uncond_embedding`` under the conditional caption's padding mask. A caption is
flan-t5-xl's encoding of at most 120 tokens (end-of-sequence included), left-padded to 120 positions whose padded
inputs are zero vectors (the padding flag, csd/adapters/llamagen_gpt.py). A class-conditional model's prompt is a class
id written as a decimal string (``dataset=imagenet_classes``).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from typing import Any

import torch
from transformers import JanusVQVAEConfig
from transformers.models.janus.modeling_janus import JanusVQVAE

from csd.adapters.base import (
    BodyLayout,
    ModelAdapter,
    SamplingConfig,
    checks_weights,
    resolve_dtype,
    to_uint8,
)
from csd.adapters.llamagen_gpt import LlamaGenConfig, LlamaGenGPT, checkpoint_state
from csd.adapters.vqgan import read_state_dict
from csd.errors import MissingWeightsError
from csd.hub import load_local_first, model_files_present

#: caption features per prompt (``--t5-feature-max-len``) and their width (flan-t5-xl's ``d_model``)
CAPTION_TOKENS, CAPTION_DIM = 120, 2048
#: the original's ``GPT_models`` shapes: layers, heads, width
GPT_SHAPES = {"GPT-B": (12, 12, 768), "GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280)}
#: the hub repositories of the released files (the t2i GPTs live apart from the c2i release)
C2I_REPO, T2I_REPO, T5_REPO = "FoundationVision/LlamaGen", "peizesun/llamagen_t2i", "google/flan-t5-xl"

CaptionEncoder = Callable[[str], torch.Tensor]


class LlamaGenAdapter(ModelAdapter):
    """A LlamaGen GPT + VQ16 decoder behind :class:`ModelAdapter`; ``encode_caption`` (t2i only) maps a caption to its
    ``[L, caption_dim]`` flan-t5 features (``L <= cls_token_num`` valid tokens)."""

    compilable = True

    def __init__(self, gpt: LlamaGenGPT, vq: JanusVQVAE, sampling: SamplingConfig,
                 encode_caption: CaptionEncoder | None = None, checkpoint: str = "") -> None:
        self.gpt, self.vq = gpt.eval(), vq.eval()
        self.config = gpt.config
        if (self.config.model_type == "t2i") != (encode_caption is not None):
            raise ValueError("a t2i LlamaGen needs a caption encoder; a c2i one takes none")
        if self.config.model_type == "c2i" and sampling.guidance_scale != 1 and self.config.class_dropout_prob <= 0:
            raise ValueError("guidance needs the null class row: this class table has none (class_dropout_prob=0)")
        self.encode_caption, self.checkpoint = encode_caption, checkpoint
        self.sampling = sampling
        self.device = gpt.device
        self.vocab_size = self.config.vocab_size
        self.image_token_ids = torch.arange(self.vocab_size)
        self.layout = BodyLayout.raster(self.config.grid, self.config.grid)

    def decode_step(self, embeds: torch.Tensor, cache: Any, position_ids: torch.Tensor | None = None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features_step(embeds, cache, position_ids, attention_mask))

    def features_step(self, embeds: torch.Tensor, cache: Any, position_ids: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.gpt(embeds, cache, position_ids, attention_mask)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.gpt.output(features)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.body_inputs(ids)

    def decoder(self) -> LlamaGenGPT:
        return self.gpt

    def body_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gpt.tok_embeddings(ids.long())

    def prompt_inputs(self, prompt: str) -> torch.Tensor:
        """``[rows, cls_token_num, D]``: the class (and null class) embedding, or the projected caption (and null
        caption), left-padded with zero vectors."""
        if self.config.model_type == "c2i":
            labels = [class_id(prompt, self.config.num_classes)] + [self.config.num_classes] * self.uses_cfg
            return self.gpt.cls_embedding(torch.tensor(labels, device=self.device))[:, None]
        features = self.encode_caption(prompt).to(device=self.device, dtype=self.gpt.dtype)
        valid = features.shape[0]
        rows = [features] + [self.gpt.cls_embedding.uncond_embedding[-valid:]] * self.uses_cfg
        projected = self.gpt.cls_embedding(torch.stack(rows))
        padding = projected.new_zeros(len(rows), self.config.cls_token_num - valid, projected.shape[-1])
        return torch.cat([padding, projected], dim=1)

    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return to_uint8(self.vq.decode(ids.to(self.vq.device)))

    def token_embeddings(self) -> torch.Tensor:
        return self.gpt.tok_embeddings.weight.detach()

    def codebook(self) -> torch.Tensor:
        """The L2-normalised code vectors the decoder reads."""
        return torch.nn.functional.normalize(self.vq.quantize.embedding.weight.detach(), dim=-1)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": f"llamagen_{self.config.model_type}", "checkpoint": self.checkpoint}


def class_id(prompt: str, num_classes: int) -> int:
    """The class id a class-conditional prompt names (a decimal string, ``dataset=imagenet_classes``); one clear line
    otherwise."""
    if not re.fullmatch(r"\d+", prompt.strip()) or not 0 <= int(prompt) < num_classes:
        raise ValueError(f"prompt {prompt[:60]!r} is not a class id: a class-conditional LlamaGen takes class ids "
                         f"0 .. {num_classes - 1} (use dataset=imagenet_classes)")
    return int(prompt)


# ------------------------------------------------------------------------------------------------ VQ16 decoder


def vq16_config(grid: int, codebook: int = 16384, embed_dim: int = 8, base_channels: int = 128,
                channel_multiplier: tuple[int, ...] = (1, 1, 2, 2, 4), latent_channels: int = 256,
                num_res_blocks: int = 2) -> JanusVQVAEConfig:
    """The ``JanusVQVAEConfig`` of LlamaGen's VQ16 (``VQ_16``: ``ch_mult`` 1,1,2,2,4, z 256, 16384 codes of dim 8) for
    a ``grid x grid`` token image."""
    return JanusVQVAEConfig(embed_dim=embed_dim, num_embeddings=codebook, latent_channels=latent_channels,
                            base_channels=base_channels, channel_multiplier=list(channel_multiplier),
                            num_res_blocks=num_res_blocks, num_patches=grid)


def decoder_only(config: JanusVQVAEConfig) -> JanusVQVAE:
    """A ``JanusVQVAE`` without its encoder half (decoding never reads it)."""
    vq = JanusVQVAE(config)
    del vq.encoder, vq.quant_conv
    return vq


#: LlamaGen's VQ decoder names -> ``JanusVQVAE``'s (the level order is the same: coarsest first)
VQ_RENAMES = ((r"decoder\.conv_blocks\.(\d+)\.res\.", r"decoder.up.\1.block."),
              (r"decoder\.conv_blocks\.(\d+)\.", r"decoder.up.\1."),
              (r"decoder\.mid\.0\.", "decoder.mid.block_1."), (r"decoder\.mid\.1\.", "decoder.mid.attn_1."),
              (r"decoder\.mid\.2\.", "decoder.mid.block_2."))


def vq_state_for_janus(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder side of LlamaGen's VQ checkpoint (``model`` of ``vq_ds16_*.pt``) in ``JanusVQVAE``'s names."""
    state = state.get("model", state)
    out = {}
    for key, value in state.items():
        if key.startswith(("decoder.", "post_quant_conv.")) or key == "quantize.embedding.weight":
            for pattern, replacement in VQ_RENAMES:
                key = re.sub(pattern, replacement, key)
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------- caption encoder


def caption_encoder(tokenize: Callable[[str], list[int]], t5: torch.nn.Module, pad_id: int,
                    max_tokens: int = CAPTION_TOKENS) -> CaptionEncoder:
    """LlamaGen's caption features: the lower-cased, stripped caption's token ids (at most ``max_tokens``, the
    end-of-sequence token included), padded to ``max_tokens`` and encoded with that attention mask, as
    ``language/t5.py`` does; returns the ``[L, d_model]`` features of the ``L`` valid tokens."""

    @torch.no_grad()
    def encode(caption: str) -> torch.Tensor:
        ids = tokenize(caption.lower().strip())[:max_tokens]
        device = next(t5.parameters()).device
        padded = torch.full((1, max_tokens), pad_id, dtype=torch.long, device=device)
        padded[0, : len(ids)] = torch.tensor(ids, device=device)
        mask = (torch.arange(max_tokens, device=device) < len(ids)).long()[None]
        return t5(input_ids=padded, attention_mask=mask).last_hidden_state[0, : len(ids)]

    return encode


def t5_missing(path: str) -> MissingWeightsError:
    """The error of a flan-t5-xl that is not at ``path`` (``model.t5``)."""
    return MissingWeightsError(
        f"flan-t5-xl not found at {path!r}. Download it with `hf download {T5_REPO} --local-dir <dir>` and set "
        "model.t5=<dir>."
    )


def load_flan_t5(path: str, dtype: torch.dtype, device: str) -> CaptionEncoder:
    """flan-t5-xl's tokenizer and encoder (transformers' ``T5EncoderModel``) from a hub id or a local directory."""
    from transformers import AutoTokenizer, T5EncoderModel

    def load() -> tuple[Any, T5EncoderModel]:
        return AutoTokenizer.from_pretrained(path), T5EncoderModel.from_pretrained(path, dtype=dtype)

    try:
        tokenizer, t5 = load_local_first(load)
    except (OSError, ValueError) as err:
        raise t5_missing(path) from err

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, max_length=CAPTION_TOKENS, truncation=True, add_special_tokens=True)["input_ids"]

    return caption_encoder(tokenize, t5.to(device).eval(), tokenizer.pad_token_id)


# ------------------------------------------------------------------------------------------------------- loaders


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """A ``.pt`` checkpoint, or a directory of ``*.safetensors`` / ``pytorch_model*.bin`` shards (LANTERN's HF layout)."""
    if os.path.isdir(path):
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for shard in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            state.update(load_file(shard))
        for shard in sorted(glob.glob(os.path.join(path, "pytorch_model*.bin"))):
            state.update(torch.load(shard, map_location="cpu", weights_only=True))
        return state
    return read_state_dict(path)


def load_gpt(config: LlamaGenConfig, path: str) -> LlamaGenGPT:
    """The GPT with the weights of ``path`` (released key layout or LANTERN's HF layout), strictly: a missing or an
    unexpected key fails naming it."""
    gpt = LlamaGenGPT(config)
    gpt.load_state_dict(checkpoint_state(read_weights(path)), strict=True)
    return gpt


def require_files(files: dict[str, str], repos: dict[str, str]) -> None:
    """One line naming the first missing file and how to download it."""
    for what, path in files.items():
        if not os.path.exists(path):
            name = os.path.basename(path.rstrip("/"))
            raise MissingWeightsError(
                f"LlamaGen {what} not found at {path!r}. Download it with `hf download {repos[what]} {name} "
                f"--local-dir <dir>` and set model.path=<dir> (or model.{what}=<file>)."
            )


def llamagen_files(kind: str, path: str, gpt_ckpt: str, vq_ckpt: str) -> tuple[str, str]:
    """The GPT and VQ checkpoint paths of ``model.path`` / ``model.gpt_ckpt`` / ``model.vq_ckpt``."""
    gpt_file, vq_file = (os.path.join(os.path.expanduser(path), f) for f in (gpt_ckpt, vq_ckpt))
    repo = T2I_REPO if kind == "t2i" else C2I_REPO
    require_files({"gpt_ckpt": gpt_file, "vq_ckpt": vq_file}, {"gpt_ckpt": repo, "vq_ckpt": repo})
    return gpt_file, vq_file


def check_llamagen_files(kind: str, path: str, gpt_ckpt: str, vq_ckpt: str, t5: str = T5_REPO, **_: object) -> None:
    """:func:`load_llamagen_adapter`'s weights check (``csd.adapters.base.checks_weights``): the two checkpoints and,
    text-to-image, flan-t5-xl."""
    llamagen_files(kind, path, gpt_ckpt, vq_ckpt)
    if kind == "t2i" and not model_files_present(t5):
        raise t5_missing(t5)


@checks_weights(check_llamagen_files)
def load_llamagen_adapter(kind: str, gpt_model: str, image_size: int, path: str, gpt_ckpt: str, vq_ckpt: str,
                          t5: str = T5_REPO, guidance_scale: float = 1.0, top_k: int | None = None,
                          temperature: float = 1.0, dtype: str = "bfloat16", device: str = "cpu",
                          **_: object) -> LlamaGenAdapter:
    """A released LlamaGen (``conf/model/llamagen_*.yaml``): ``gpt_ckpt`` / ``vq_ckpt`` are file names in ``path`` (or
    paths); ``gpt_ckpt`` may be a directory in LANTERN's HF layout."""
    if gpt_model not in GPT_SHAPES:
        raise ValueError(f"model.gpt_model={gpt_model!r}: choose one of {sorted(GPT_SHAPES)}")
    if image_size % 16:
        raise ValueError(f"model.image_size={image_size} must be a multiple of 16 (VQ16)")
    gpt_file, vq_file = llamagen_files(kind, path, gpt_ckpt, vq_ckpt)
    layers, heads, width = GPT_SHAPES[gpt_model]
    grid = image_size // 16
    config = LlamaGenConfig(model_type=kind, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                            cls_token_num=CAPTION_TOKENS if kind == "t2i" else 1, grid=grid)
    torch_dtype = resolve_dtype(dtype)
    encode = load_flan_t5(t5, torch_dtype, device) if kind == "t2i" else None
    gpt = load_gpt(config, gpt_file).to(device=device, dtype=torch_dtype)
    vq = decoder_only(vq16_config(grid))
    vq.load_state_dict(vq_state_for_janus(read_state_dict(vq_file)), strict=True)
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    return LlamaGenAdapter(gpt, vq.to(device), sampling, encode, checkpoint=gpt_file)


# --------------------------------------------------------------------------------------------------- tiny models

TINY_PAD, TINY_EOS, TINY_BYTE0 = 0, 1, 2


def tiny_llamagen_config(kind: str, grid: int = 4, codebook: int = 16, hidden: int = 32, layers: int = 2,
                         heads: int = 2, num_classes: int = 1000, caption_dim: int = 16, caption_tokens: int = 12,
                         ) -> LlamaGenConfig:
    """A LlamaGen config small enough for CPU tests."""
    return LlamaGenConfig(model_type=kind, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                          multiple_of=16, vocab_size=codebook, num_classes=num_classes, caption_dim=caption_dim,
                          cls_token_num=caption_tokens if kind == "t2i" else 1, grid=grid)


def tiny_vq16_config(grid: int, codebook: int) -> JanusVQVAEConfig:
    """A VQ16-shaped decoder config of two levels (one 2x upsampling), 32 channels, codes of dim 4."""
    return vq16_config(grid, codebook, embed_dim=4, base_channels=32, channel_multiplier=(1, 1), latent_channels=32,
                       num_res_blocks=1)


def tiny_caption_encoder(caption_dim: int, max_tokens: int, seed: int) -> CaptionEncoder:
    """A seeded random tiny T5 encoder (transformers' ``T5EncoderModel`` from a config) over bytes, end-of-sequence 1."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    config = T5Config(vocab_size=TINY_BYTE0 + 256, d_model=caption_dim, d_kv=8, d_ff=2 * caption_dim, num_layers=1,
                      num_heads=2, pad_token_id=TINY_PAD, eos_token_id=TINY_EOS)
    t5 = T5EncoderModel(config).eval()

    def tokenize(text: str) -> list[int]:
        return [TINY_BYTE0 + b for b in text.encode()][: max_tokens - 1] + [TINY_EOS]

    return caption_encoder(tokenize, t5, TINY_PAD, max_tokens)


def tiny_llamagen_adapter(kind: str = "c2i", grid: int = 4, codebook: int = 16, seed: int = 0, head_scale: float = 1.0,
                          guidance_scale: float = 4.0, top_k: int | None = None, temperature: float = 1.0,
                          device: str = "cpu", dtype: str = "float32", **_: object) -> LlamaGenAdapter:
    """A seeded random tiny LlamaGen (``model=llamagen_c2i_tiny`` / ``llamagen_t2i_tiny``) with a tiny VQ16-shaped
    decoder. ``head_scale`` multiplies the output head (peaked targets, as a trained model's); the null caption is
    random, as the original initialises it."""
    config = tiny_llamagen_config(kind, grid, codebook)
    encode = tiny_caption_encoder(config.caption_dim, config.cls_token_num, seed + 1) if kind == "t2i" else None
    torch.manual_seed(seed)
    gpt = LlamaGenGPT(config)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.5)
        for norm in [gpt.norm] + [m for layer in gpt.layers for m in (layer.attention_norm, layer.ffn_norm)]:
            norm.weight.fill_(1.0)
        gpt.output.weight.mul_(head_scale)
        if kind == "t2i":
            gpt.cls_embedding.uncond_embedding.normal_(0.0, config.caption_dim ** -0.5)
    vq = decoder_only(tiny_vq16_config(grid, codebook))
    sampling = SamplingConfig(guidance_scale=guidance_scale, top_k=top_k or 0, temperature=temperature)
    gpt = gpt.to(device=device, dtype=resolve_dtype(dtype))
    return LlamaGenAdapter(gpt, vq.to(device), sampling, encode, checkpoint=f"tiny seed {seed}")
