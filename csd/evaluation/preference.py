"""Human-preference scores of text-image pairs: HPSv2.1 and ImageReward (docs/EVALUATION.md, "Preference scores").

- **HPSv2.1** (Wu et al. 2023, arXiv 2306.09341, ``tgxs002/HPSv2``): an open_clip ViT-H-14 fine-tuned on human
  preferences; ``hps(x, c) = cos(f_img(x), f_txt(c))``, the diagonal of ``image_features @ text_features.T`` in the
  released ``img_score.py`` (no logit scale). Built here on open_clip directly: the ``hpsv2`` package pins
  ``protobuf<4`` and ``pytest==7.2.0`` and ships its own open_clip copy.
- **ImageReward** (Xu et al. 2023, arXiv 2304.05977, ``THUDM/ImageReward``): BLIP (ViT-L/16 at 224 px, a BERT text
  encoder cross-attending to the image tokens) read out at ``[CLS]`` by an MLP, ``r = (mlp(h_cls) - mu) / sigma``
  with the released ``mu = 0.16717...``, ``sigma = 1.03334...``. Built here on transformers' BLIP modules (the
  ``image-reward`` package pins ``timm==0.6.13`` and ``fairscale``): the released ``ImageReward.pt`` is renamed onto
  ``BlipVisionModel`` / ``BlipTextModel`` (:func:`image_reward_state`), the renaming of transformers' BLIP conversion.

Weights are local files (``eval.hpsv2.weights``, ``eval.image_reward.weights``, ``eval.image_reward.tokenizer``),
checked before any network is built (:func:`check_preference_files`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation.clip_score import ClipModel, clip_scores
from csd.evaluation.context import EvalContext, MetricOutput
from csd.evaluation.images import load_rgb

HPS_FILE = "HPS_v2.1_compressed.pt"
HPS_ARCH = "ViT-H-14"
IMAGE_REWARD_FILE = "ImageReward.pt"
#: the released normalisation of the MLP's output (``ImageReward.py``: ``self.mean``, ``self.std``)
REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072
#: the released text length (``padding="max_length", truncation=True, max_length=35``)
REWARD_MAX_TOKENS = 35
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
FETCH = {
    "eval.hpsv2.weights": f"hf download xswu/HPSv2 {HPS_FILE} --local-dir <dir>",
    "eval.image_reward.weights": f"hf download THUDM/ImageReward {IMAGE_REWARD_FILE} --local-dir <dir>",
    "eval.image_reward.tokenizer": "hf download google-bert/bert-base-uncased --local-dir <dir>",
}


def require_weights(path: str | None, key: str) -> Path:
    """``path`` if it exists, else a one-line :class:`MissingWeightsError` naming ``key`` and the fetch command."""
    if path is None or not Path(path).expanduser().exists():
        what = f"{key} is not set" if path is None else f"{key}={path} not found"
        raise MissingWeightsError(f"{what}: fetch it with `{FETCH[key]}` and set {key}=<path>")
    return Path(path).expanduser()


def check_preference_files(names: Sequence[str], eval_cfg: Any) -> None:
    """The :class:`MissingWeightsError` the metrics ``names`` would raise for their weights, loading nothing."""
    if "hpsv2" in names:
        require_weights(eval_cfg.hpsv2.weights, "eval.hpsv2.weights")
    if "image_reward" in names:
        require_weights(eval_cfg.image_reward.weights, "eval.image_reward.weights")
        require_weights(eval_cfg.image_reward.tokenizer, "eval.image_reward.tokenizer")


# ------------------------------------------------------------------------------------------- HPSv2.1


def load_hpsv2(weights: str | None, device: torch.device, arch: str = HPS_ARCH, model_config: str | None = None) -> ClipModel:
    """open_clip ``arch`` (random init) with the HPSv2.1 checkpoint's ``state_dict`` loaded (strict)."""
    import open_clip

    path = require_weights(weights, "eval.hpsv2.weights")
    if model_config is not None:
        open_clip.add_model_config(model_config)
    net, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=None, device=device)
    state = torch.load(path, map_location=device, weights_only=True)
    net.load_state_dict(state.get("state_dict", state))
    net.eval()
    return ClipModel(net, preprocess, open_clip.get_tokenizer(arch), f"hpsv2.1/{arch}")


def hps_scores(clip: ClipModel, images: Sequence[Path | Image.Image], texts: Sequence[str], batch_size: int,
               device: torch.device) -> np.ndarray:
    """Per image ``cos(f_img(x), f_txt(c))``: CLIP score at scale 1, unclamped (the released scorer)."""
    return clip_scores(clip, images, texts, batch_size, device, scale=1.0, clamp="none")


# ------------------------------------------------------------------------------------------- ImageReward


class RewardHead(nn.Module):
    """The released MLP on the text encoder's ``[CLS]`` state: 768 -> 1024 -> 128 -> 64 -> 16 -> 1, no
    non-linearity (the released file comments its ReLUs out), dropout between (identity in eval)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                                    nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.layers(h)


class ImageReward(nn.Module):
    """``r(x, c) = (mlp(BERT(c | ViT(x))[CLS]) - REWARD_MEAN) / REWARD_STD`` on transformers' BLIP modules.

    ``vision``: a ``BlipVisionModel`` (or any module returning ``last_hidden_state`` ``[B, N, Dv]``), ``text``: a
    ``BlipTextModel`` without pooler (cross-attention onto the image tokens), ``head``: :class:`RewardHead`.
    """

    def __init__(self, vision: nn.Module, text: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.vision, self.text, self.head = vision, text, head

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` normalised pixels, ``[B, T]`` token ids and mask -> ``[B]`` rewards."""
        image = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image.shape[:-1], dtype=torch.long, device=image.device)
        h = self.text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image,
                      encoder_attention_mask=image_mask, return_dict=True).last_hidden_state[:, 0].float()
        return (self.head(h).squeeze(-1) - REWARD_MEAN) / REWARD_STD


def image_reward_transform(size: int = 224) -> Callable[[Image.Image], torch.Tensor]:
    """The released preprocessing: bicubic resize of the shorter side, centre crop, CLIP normalisation."""
    return T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size), T.ToTensor(),
                      T.Normalize(CLIP_MEAN, CLIP_STD)])


def image_reward_state(released: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``ImageReward.pt``'s keys (``blip.visual_encoder.*`` timm ViT, ``blip.text_encoder.*`` BLIP's BERT, ``mlp.*``)
    renamed onto :class:`ImageReward`'s (``vision.*`` BlipVisionModel, ``text.*`` BlipTextModel, ``head.*``)."""
    vit = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
           "patch_embed.proj": "embeddings.patch_embedding", "norm1": "layer_norm1", "norm2": "layer_norm2",
           "attn.qkv": "self_attn.qkv", "attn.proj": "self_attn.projection", "blocks": "encoder.layers"}
    out = {}
    for key, value in released.items():
        if key.startswith("blip.visual_encoder."):
            name = key[len("blip.visual_encoder."):]
            name = "post_layernorm" + name[len("norm"):] if name.startswith("norm.") else name
            for old, new in vit.items():
                name = name.replace(old, new)
            out[f"vision.{name}"] = value
        elif key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out[f"text.{key[len('blip.text_encoder.'):]}"] = value
        elif key.startswith("mlp."):
            out[f"head.{key[len('mlp.'):]}"] = value
    return out


def load_image_reward(weights: str | None, tokenizer: str | None, device: torch.device) -> tuple[ImageReward, Any]:
    """The released ImageReward v1.0 (ViT-L/16, BERT-base with cross-attention every layer, ``med_config.json``) and
    BLIP's tokenizer (bert-base-uncased plus ``[DEC]`` and ``[ENC]``: vocabulary 30524)."""
    from transformers import BertTokenizer, BlipTextConfig, BlipVisionConfig
    from transformers.models.blip.modeling_blip import BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    path = require_weights(weights, "eval.image_reward.weights")
    tok = BertTokenizer.from_pretrained(str(require_weights(tokenizer, "eval.image_reward.tokenizer")))
    tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    vision = BlipVisionModel(BlipVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                              num_attention_heads=16, image_size=224, patch_size=16, layer_norm_eps=1e-6))
    text = BlipTextModel(BlipTextConfig(vocab_size=30524, hidden_size=768, encoder_hidden_size=1024,
                                        intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                                        max_position_embeddings=512, layer_norm_eps=1e-12), add_pooling_layer=False)
    model = ImageReward(vision, text, RewardHead(768))
    model.load_state_dict(image_reward_state(torch.load(path, map_location="cpu", weights_only=True)))
    return model.to(device).eval(), tok


def image_rewards(model: ImageReward, tokenizer: Any, images: Sequence[Path | Image.Image], texts: Sequence[str],
                  batch_size: int, device: torch.device, size: int = 224) -> np.ndarray:
    """Per image ImageReward of (image, its prompt), in batches."""
    transform, out = image_reward_transform(size), []
    for start in range(0, len(images), batch_size):
        batch, caps = images[start:start + batch_size], list(texts[start:start + batch_size])
        pixels = torch.stack([transform(load_rgb(p)) for p in batch]).to(device)
        tokens = tokenizer(caps, padding="max_length", truncation=True, max_length=REWARD_MAX_TOKENS,
                           return_tensors="pt").to(device)
        out.append(model(pixels, tokens["input_ids"], tokens["attention_mask"]).float().cpu())
    return torch.cat(out).numpy() if out else np.zeros(0)


# ------------------------------------------------------------------------------------------- metrics


def hpsv2_metric(ctx: EvalContext) -> MetricOutput:
    """Mean HPSv2.1 of (image, prompt); per image ``hpsv2``."""
    clip = load_hpsv2(ctx.eval.hpsv2.weights, ctx.device)
    scores = hps_scores(clip, ctx.images, [r["prompt"] for r in ctx.records], ctx.eval.batch_size, ctx.device)
    return MetricOutput({"hpsv2": float(np.mean(scores))}, {"hpsv2": scores.tolist()},
                        {"hpsv2": {"model": clip.name, "weights": ctx.eval.hpsv2.weights}})


def image_reward_metric(ctx: EvalContext) -> MetricOutput:
    """Mean ImageReward of (image, prompt); per image ``image_reward``."""
    r = ctx.eval.image_reward
    model, tokenizer = load_image_reward(r.weights, r.tokenizer, ctx.device)
    scores = image_rewards(model, tokenizer, ctx.images, [rec["prompt"] for rec in ctx.records], ctx.eval.batch_size,
                           ctx.device)
    return MetricOutput({"image_reward": float(np.mean(scores))}, {"image_reward": scores.tolist()},
                        {"image_reward": {"model": "ImageReward-v1.0 on transformers BLIP", "weights": r.weights}})
