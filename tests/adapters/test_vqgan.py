"""The Chameleon VQGAN decoder (csd.adapters.vqgan) on tiny random configs.

Checked against (a) an independent functional formulation of the same taming layers written here,
(b) transformers' Chameleon VQ *encoder* blocks and quantizer (same block definitions, same codebook),
and (c) the checkpoint loader on a Meta-style ``vqgan.yaml`` + Lightning ``vqgan.ckpt``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import ChameleonVQVAE, ChameleonVQVAEConfig
from transformers.models.chameleon.modeling_chameleon import (
    ChameleonVQVAEEncoderAttnBlock,
    ChameleonVQVAEEncoderResnetBlock,
)

from csd.adapters.vqgan import (
    AttnBlock,
    ResnetBlock,
    VQGANConfig,
    VQGANDecoder,
    codes_from_rows,
    load_vqgan_decoder,
)
from csd.errors import MissingWeightsError

TINY = VQGANConfig(n_embed=16, embed_dim=4, z_channels=8, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                   attn_resolutions=(4,), resolution=16)


def random_decoder(cfg: VQGANConfig = TINY, seed: int = 0) -> VQGANDecoder:
    torch.manual_seed(seed)
    dec = VQGANDecoder(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a wrong wiring cannot hide behind init values
        for name, p in dec.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return dec


# ------------------------------------------------------------------ independent functional formulation


def f_norm(x, sd, prefix):
    return F.group_norm(x, 32, sd[prefix + ".weight"], sd[prefix + ".bias"], eps=1e-6)


def f_conv(x, sd, prefix, padding):
    return F.conv2d(x, sd[prefix + ".weight"], sd[prefix + ".bias"], padding=padding)


def f_swish(x):
    return x * torch.sigmoid(x)


def f_resblock(x, sd, p):
    h = f_conv(f_swish(f_norm(x, sd, p + ".norm1")), sd, p + ".conv1", 1)
    h = f_conv(f_swish(f_norm(h, sd, p + ".norm2")), sd, p + ".conv2", 1)
    skip = f_conv(x, sd, p + ".nin_shortcut", 0) if p + ".nin_shortcut.weight" in sd else x
    return skip + h


def f_attn(x, sd, p):
    b, c, hh, ww = x.shape
    y = f_norm(x, sd, p + ".norm")
    q, k, v = (f_conv(y, sd, f"{p}.{n}", 0).reshape(b, c, hh * ww) for n in "qkv")
    weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / c**0.5, dim=-1)  # [b, query, key]
    out = torch.einsum("bij,bcj->bci", weights, v).reshape(b, c, hh, ww)
    return x + f_conv(out, sd, p + ".proj_out", 0)


def functional_decode(sd: dict[str, torch.Tensor], cfg: VQGANConfig, codes: torch.Tensor) -> torch.Tensor:
    z = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    h = f_conv(z, sd, "post_quant_conv", 0)
    h = f_conv(h, sd, "decoder.conv_in", 1)
    h = f_resblock(h, sd, "decoder.mid.block_1")
    h = f_attn(h, sd, "decoder.mid.attn_1")
    h = f_resblock(h, sd, "decoder.mid.block_2")
    for level in reversed(range(len(cfg.ch_mult))):
        for i in range(cfg.num_res_blocks + 1):
            h = f_resblock(h, sd, f"decoder.up.{level}.block.{i}")
            if f"decoder.up.{level}.attn.{i}.q.weight" in sd:
                h = f_attn(h, sd, f"decoder.up.{level}.attn.{i}")
        if level:
            h = f_conv(h.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3), sd, f"decoder.up.{level}.upsample.conv", 1)
    return f_conv(f_swish(f_norm(h, sd, "decoder.norm_out")), sd, "decoder.conv_out", 1)


# ------------------------------------------------------------------------------------------------ tests


def test_output_shape_and_attention_placement():
    dec = random_decoder()
    codes = torch.randint(TINY.n_embed, (2, 3, 5))
    with torch.no_grad():
        out = dec(codes)
    assert out.shape == (2, 3, 3 * TINY.downsample, 5 * TINY.downsample)
    # attention only where the working resolution (16 // 4 = 4 at the coarsest level) is listed
    assert [len(dec.decoder.up[i].attn) for i in range(3)] == [0, 0, TINY.num_res_blocks + 1]
    assert torch.isfinite(out).all()


def test_decoder_matches_functional_formulation():
    dec = random_decoder()
    codes = torch.randint(TINY.n_embed, (2, 4, 3))
    with torch.no_grad():
        ours = dec(codes)
        ref = functional_decode(dec.state_dict(), TINY, codes)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_blocks_match_transformers_encoder_blocks():
    torch.manual_seed(1)
    vq_cfg = ChameleonVQVAEConfig(dropout=0.0)
    pairs = ((32, ResnetBlock(32, 64), ChameleonVQVAEEncoderResnetBlock(vq_cfg, 32, 64)),
             (64, AttnBlock(64), ChameleonVQVAEEncoderAttnBlock(64)))
    for channels, ours, theirs in pairs:
        with torch.no_grad():
            for p in ours.parameters():
                p.normal_(0.0, 0.2)
        theirs.load_state_dict(ours.state_dict())
        x = torch.randn(2, channels, 5, 3)
        with torch.no_grad():
            torch.testing.assert_close(ours.eval()(x), theirs.eval()(x), rtol=1e-4, atol=1e-5)


def hf_vq_with_codebook(dec: VQGANDecoder) -> ChameleonVQVAE:
    cfg = dec.config
    torch.manual_seed(3)
    vq = ChameleonVQVAE(ChameleonVQVAEConfig(
        embed_dim=cfg.embed_dim, num_embeddings=cfg.n_embed, latent_channels=cfg.z_channels, base_channels=cfg.ch,
        channel_multiplier=list(cfg.ch_mult), num_res_blocks=cfg.num_res_blocks, resolution=cfg.resolution,
    )).eval()
    vq.quantize.embedding.weight.data.copy_(dec.codebook)
    return vq


def test_code_path_round_trips_through_transformers_quantizer():
    """tokens (BPE rows + EOL) -> codes -> our codebook lookup -> HF's nearest-code quantizer -> same tokens."""
    dec = random_decoder()
    vq = hf_vq_with_codebook(dec)
    gen = torch.Generator().manual_seed(0)
    bpe_of_code = 100 + torch.randperm(TINY.n_embed, generator=gen)  # a permutation, not an offset
    bpe_to_code = torch.zeros(200, dtype=torch.long)
    bpe_to_code[bpe_of_code] = torch.arange(TINY.n_embed)
    codes = torch.randint(TINY.n_embed, (2, 3, 4), generator=gen)
    eol = torch.full((2, 3, 1), 7)
    rows = torch.cat([bpe_of_code[codes], eol], dim=-1).reshape(2, -1)
    assert torch.equal(codes_from_rows(rows, bpe_to_code, width=4), codes)
    with torch.no_grad():
        _, _, back = vq.quantize(dec.lookup(codes))
    assert torch.equal(back.view(2, 3, 4), codes)


def test_lookup_equals_transformers_quantized_latent_and_grid_round_trips():
    """image -> HF encoder -> codes; our lookup of those codes is HF's quantised latent, and decoding the
    codes gives an image that HF's encoder maps back onto a grid of the same shape."""
    dec = random_decoder()
    vq = hf_vq_with_codebook(dec)
    image = torch.rand(1, 3, 12, 8) * 2 - 1
    with torch.no_grad():
        enc = vq.encode(image)
        codes = enc.image_tokens.view(1, 3, 2)
        torch.testing.assert_close(dec.lookup(codes), enc.quantized_last_hidden_state)
        again = vq.encode(dec(codes)).image_tokens
    assert again.numel() == codes.numel()


def test_loader_reads_meta_yaml_and_lightning_checkpoint(tmp_path):
    dec = random_decoder(seed=5)
    params = {
        "embed_dim": TINY.embed_dim, "n_embed": TINY.n_embed,
        "ddconfig": {"double_z": False, "z_channels": TINY.z_channels, "resolution": TINY.resolution, "in_channels": 3,
                     "out_ch": 3, "ch": TINY.ch, "ch_mult": list(TINY.ch_mult), "num_res_blocks": TINY.num_res_blocks,
                     "attn_resolutions": list(TINY.attn_resolutions), "dropout": 0.0},
        "lossconfig": {"target": "ignored"},
    }
    (tmp_path / "vqgan.yaml").write_text(yaml.safe_dump({"model": {"target": "VQModel", "params": params}}))
    state = dict(dec.state_dict())
    state["encoder.conv_in.weight"] = torch.zeros(1)  # encoder / loss keys are skipped, decoder keys strict
    state["loss.logvar"] = torch.zeros(1)
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "vqgan.ckpt")
    loaded = load_vqgan_decoder(str(tmp_path / "vqgan.yaml"), str(tmp_path / "vqgan.ckpt"))
    assert loaded.config == TINY
    codes = torch.randint(TINY.n_embed, (1, 2, 2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(codes), dec(codes))
    with pytest.raises(MissingWeightsError, match="vqgan.ckpt"):
        load_vqgan_decoder(str(tmp_path / "vqgan.yaml"), str(tmp_path / "missing.ckpt"))
