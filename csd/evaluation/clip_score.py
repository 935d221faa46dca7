"""CLIP score with open-clip-torch: ``100 * max(cos(image, text), 0)`` per image (docs/EVALUATION.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
from tqdm import tqdm

from csd.adapters.base import MissingWeightsError
from csd.evaluation.images import load_rgb


@dataclass
class ClipModel:
    """A CLIP model with its image preprocessing (PIL -> tensor) and tokenizer."""

    model: torch.nn.Module
    preprocess: Callable[[Any], torch.Tensor]
    tokenizer: Callable[[Sequence[str]], torch.Tensor]
    name: str


def load_open_clip(
    model: str, pretrained: str | None, device: torch.device, model_config: str | None = None
) -> ClipModel:
    """``open_clip.create_model_and_transforms(model, pretrained=<tag or local file>)``.

    ``model_config``: a JSON file or folder of open_clip architecture configs to register first
    (for architectures open_clip does not ship). ``pretrained=None`` gives random weights.
    """
    if model_config is not None:
        open_clip.add_model_config(model_config)
    if pretrained is not None and ("/" in pretrained or Path(pretrained).suffix) and not Path(pretrained).exists():
        raise MissingWeightsError(f"CLIP weights file '{pretrained}' not found (eval.clip.pretrained).")
    try:
        net, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained, device=device)
    except RuntimeError as err:
        raise MissingWeightsError(
            f"CLIP weights {model}/{pretrained} are not available offline ({str(err)[:120]}...). Run once with "
            "internet to fill the Hugging Face cache, or set eval.clip.pretrained=/path/to/open_clip_pytorch_model.bin."
        ) from err
    net.eval()
    return ClipModel(net, preprocess, open_clip.get_tokenizer(model), f"{model}/{pretrained}")


@torch.no_grad()
def clip_scores(
    clip: ClipModel, image_paths: Sequence[Path], texts: Sequence[str], batch_size: int, device: torch.device
) -> np.ndarray:
    """Per-image CLIP score of each image against its caption (same order)."""
    if len(image_paths) != len(texts):
        raise ValueError("one caption per image is required")
    scores = []
    for start in tqdm(range(0, len(texts), batch_size), desc="CLIP score", unit="batch", leave=False):
        paths, caps = image_paths[start : start + batch_size], texts[start : start + batch_size]
        pixels = torch.stack([clip.preprocess(load_rgb(p)) for p in paths]).to(device)
        img = torch.nn.functional.normalize(clip.model.encode_image(pixels).float(), dim=-1)
        txt = torch.nn.functional.normalize(clip.model.encode_text(clip.tokenizer(list(caps)).to(device)).float(), dim=-1)
        scores.append((100.0 * (img * txt).sum(-1)).clamp(min=0).cpu())
    return torch.cat(scores).numpy() if scores else np.zeros(0)
