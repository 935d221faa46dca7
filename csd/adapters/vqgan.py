"""The Chameleon / Lumina-mGPT VQGAN *decoder* (docs/MODELS.md, "Lumina-mGPT 7B (Chameleon)").

transformers ships only the encoder half of Chameleon's VQ model, so the decoder is written here. It
is Meta's taming-style VQGAN (``vqgan.yaml`` + ``vqgan.ckpt``): codebook lookup (no L2 norm) ->
``post_quant_conv`` (1x1) -> decoder: ``conv_in``; mid resblock / attention / resblock; up levels from
coarsest to finest, each ``num_res_blocks + 1`` resblocks (plus attention at ``attn_resolutions``)
followed by a nearest 2x upsample + 3x3 conv (all but the finest level); GroupNorm(32) - swish -
``conv_out``. Module names match the checkpoint keys ``decoder.*``, ``post_quant_conv.*`` and
``quantize.embedding.weight`` so the state dict loads as is.

Token ids: the language model emits BPE ids; :func:`codes_from_rows` maps them to VQ code indices
with a lookup table (Chameleon's ``vocabulary_mapping.bpe2img`` is a permutation, not an offset) and
drops the end-of-line column Lumina-mGPT appends to every row.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from csd.errors import MissingWeightsError

VQGAN_PREFIXES = ("decoder.", "post_quant_conv.", "quantize.embedding.weight")


@dataclass(frozen=True)
class VQGANConfig:
    """The decoder hyper-parameters of ``vqgan.yaml`` (``model.params`` + its ``ddconfig``).

    Defaults are Chameleon's released values (8192 codes of dim 256, 16x downsampling).
    """

    n_embed: int = 8192
    embed_dim: int = 256
    z_channels: int = 256
    ch: int = 128
    out_ch: int = 3
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    resolution: int = 512

    @property
    def downsample(self) -> int:
        """Pixels per latent token along each side."""
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> VQGANConfig:
        """From ``vqgan.yaml``'s ``model.params`` mapping (``lossconfig`` and encoder-only keys ignored)."""
        dd = params["ddconfig"]
        return cls(
            n_embed=int(params["n_embed"]),
            embed_dim=int(params["embed_dim"]),
            z_channels=int(dd["z_channels"]),
            ch=int(dd["ch"]),
            out_ch=int(dd["out_ch"]),
            ch_mult=tuple(int(m) for m in dd["ch_mult"]),
            num_res_blocks=int(dd["num_res_blocks"]),
            attn_resolutions=tuple(int(r) for r in dd.get("attn_resolutions") or ()),
            resolution=int(dd["resolution"]),
        )

    @classmethod
    def from_yaml(cls, path: str) -> VQGANConfig:
        import yaml

        with open(path) as f:
            return cls.from_params(yaml.safe_load(f)["model"]["params"])


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """``x + conv2(swish(norm2(conv1(swish(norm1(x))))))``, with a 1x1 ``nin_shortcut`` when channels change."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention over all ``h*w`` positions (1x1 q/k/v/proj convs), residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (proj(y).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))  # [b, hw, c]
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(c)) v
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Upsample(nn.Module):
    """Nearest-neighbour 2x, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Decoder(nn.Module):
    """taming's ``Decoder`` (no timestep embedding, no tanh): latent ``[B, z, h, w]`` -> pixels ``[B, 3, h*f, w*f]``."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        levels = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        res = cfg.resolution // cfg.downsample
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        # self.up[i] is level i (finest = 0), built coarsest first as in the checkpoint's layout
        up: list[nn.Module] = [nn.Module() for _ in range(levels)]
        for level in reversed(range(levels)):
            block_out = cfg.ch * cfg.ch_mult[level]
            blocks, attns = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if res in cfg.attn_resolutions:
                    attns.append(AttnBlock(block_in))
            up[level].block, up[level].attn = blocks, attns
            if level != 0:
                up[level].upsample = Upsample(block_in)
                res *= 2
        self.up = nn.ModuleList(up)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for i, block in enumerate(stage.block):
                h = block(h)
                if len(stage.attn) > 0:
                    h = stage.attn[i](h)
            if level != 0:
                h = stage.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VQGANDecoder(nn.Module):
    """Code indices ``[B, h, w]`` -> pixels ``[B, 3, h*f, w*f]`` in about [-1, 1]."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        self.config = cfg
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(cfg.n_embed, cfg.embed_dim)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = Decoder(cfg)

    @property
    def codebook(self) -> torch.Tensor:
        """``[n_embed, embed_dim]`` code vectors."""
        return self.quantize.embedding.weight

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, h, w]`` code indices -> quantised latent ``[B, embed_dim, h, w]`` (raw codebook rows, no L2 norm)."""
        return self.quantize.embedding(codes).permute(0, 3, 1, 2)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(self.lookup(codes)))


def codes_from_rows(ids: torch.Tensor, bpe_to_code: torch.Tensor, width: int) -> torch.Tensor:
    """Lumina rows of BPE ids ``[B, rows * (width + 1)]`` (each row ends with EOL) -> codes ``[B, rows, width]``.

    ``bpe_to_code[bpe_id]`` is the VQ code of an image token id (``bpe2img`` as a dense table).
    """
    grid = ids.reshape(ids.shape[0], -1, width + 1)[..., :width]
    return bpe_to_code.to(ids.device)[grid]


def read_state_dict(ckpt_path: str) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of Meta's Lightning-style ``vqgan.ckpt`` (or a flat ``.safetensors`` export); any other checkpoint
    dict as it is (LlamaGen's ``.pt`` files, which also pickle their training arguments)."""
    if ckpt_path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(ckpt_path)
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # Lightning / LlamaGen checkpoints pickle training metadata next to the weights; the file is the user's download
        # of the official release
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    return ckpt.get("state_dict", ckpt)


#: where the tokenizer files come from, for Lumina-mGPT (the missing-file message's second sentence)
META_VQGAN_SOURCE = (
    "Download the Chameleon tokenizer files "
    "(https://ai.meta.com/resources/models-and-libraries/chameleon-downloads/, gated) and point "
    "model.vqgan_config / model.vqgan_ckpt at tokenizer/vqgan.yaml and tokenizer/vqgan.ckpt "
    "(Lumina-mGPT keeps them in ckpts/chameleon/tokenizer/)."
)


def check_vqgan_files(config_path: str, ckpt_path: str, source: str = META_VQGAN_SOURCE) -> None:
    """A ``MissingWeightsError`` naming the first of ``vqgan.yaml`` / ``vqgan.ckpt`` that is not a file, then ``source``
    (how to get the files)."""
    for what, path in (("vqgan.yaml", config_path), ("vqgan.ckpt", ckpt_path)):
        if not path or not os.path.isfile(path):
            raise MissingWeightsError(f"Chameleon VQGAN {what} not found at {path!r}. {source}")


def load_vqgan_decoder(
    config_path: str, ckpt_path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    source: str = META_VQGAN_SOURCE,
) -> VQGANDecoder:
    """Build the decoder from ``vqgan.yaml`` and load the decoder-side keys of ``vqgan.ckpt`` (strict); a missing
    file raises ``MissingWeightsError`` naming it, then ``source`` (how to get the files)."""
    check_vqgan_files(config_path, ckpt_path, source)
    decoder = VQGANDecoder(VQGANConfig.from_yaml(config_path))
    state = {k: v for k, v in read_state_dict(ckpt_path).items() if k.startswith(VQGAN_PREFIXES)}
    decoder.load_state_dict(state, strict=True)
    return decoder.to(device=device, dtype=dtype).eval()
