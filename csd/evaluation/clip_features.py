"""A CLIP image encoder as a FID feature extractor (the toy's "CLIP-FID")."""

from __future__ import annotations

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from torch import nn

from csd.evaluation.clip_score import ClipModel


class ClipImageFeatures(nn.Module):
    """uint8 ``[B, 3, H, W]`` -> unit-norm CLIP image embeddings ``[B, D]``.

    Reproduces the model's own preprocessing (shorter-side resize, centre crop, normalisation) on
    tensors, read from its torchvision ``Compose``, so generated and reference images are
    treated exactly as CLIP treats them.
    """

    def __init__(self, clip: ClipModel) -> None:
        super().__init__()
        self.clip = clip.model
        steps = getattr(clip.preprocess, "transforms", [])
        norm = next((t for t in steps if isinstance(t, T.Normalize)), None)
        crop = next((t for t in steps if isinstance(t, T.CenterCrop)), None)
        if norm is None or crop is None:
            raise ValueError("the CLIP preprocessing must contain a CenterCrop and a Normalize step")
        self.size = list(crop.size)
        self.register_buffer("mean", torch.tensor(norm.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(norm.std).view(1, 3, 1, 1), persistent=False)
        with torch.no_grad():
            self.num_features = int(self.forward(torch.zeros(1, 3, *self.size, dtype=torch.uint8)).shape[-1])

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.mean.device).float() / 255.0
        x = TF.resize(x, min(self.size), interpolation=T.InterpolationMode.BICUBIC, antialias=True)
        x = TF.center_crop(x, self.size)
        x = (x - self.mean) / self.std
        return nn.functional.normalize(self.clip.encode_image(x).float(), dim=-1)
