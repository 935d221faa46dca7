"""A small CLIP-style dual encoder for the toy domain, loadable through open-clip-torch.

The architecture is an ordinary open_clip ``CLIP`` (ViT image tower on 32x32 px with 4x4 patches,
causal text transformer) registered under the name :data:`CLIP_NAME` from the JSON config shipped
next to the weights. Its tokenizer is open_clip's built-in BPE ``SimpleTokenizer`` (the vocabulary
ships inside the package, so nothing is downloaded); the text embedding table therefore keeps the
full 49408 rows and the weights are stored in fp16 to stay small.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import open_clip
import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

from csd.toy import CLIP_DIR

CLIP_NAME = "toy-clip"
CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 96, "head_width": 32, "patch_size": 4},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 3},
}
CONFIG_FILE = CLIP_DIR / f"{CLIP_NAME}.json"
WEIGHTS_FILE = CLIP_DIR / "toy_clip.safetensors"


def register_toy_clip() -> None:
    """Make :data:`CLIP_NAME` known to ``open_clip`` (idempotent; writes the config if it is missing)."""
    if not CONFIG_FILE.exists():
        CLIP_DIR.mkdir(parents=True, exist_ok=True)
        CONFIG_FILE.write_text(json.dumps(CLIP_CONFIG, indent=2) + "\n")
    if CLIP_NAME not in open_clip.list_models():
        open_clip.add_model_config(CONFIG_FILE)


def load_toy_clip(device: str | torch.device = "cpu") -> tuple[torch.nn.Module, Callable, Callable]:
    """``(model, preprocess, tokenizer)`` of the shipped toy CLIP, via ``open_clip`` only."""
    if not WEIGHTS_FILE.exists():
        raise FileNotFoundError(
            f"toy CLIP weights missing at {WEIGHTS_FILE}; run `python -m experiments.train_toy --stages clip`"
        )
    register_toy_clip()
    model, _, preprocess = open_clip.create_model_and_transforms(CLIP_NAME, pretrained=str(WEIGHTS_FILE),
                                                                 device=device)
    return model.eval(), preprocess, open_clip.get_tokenizer(CLIP_NAME)


def image_tensor(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, 32, 32, 3]`` -> normalised ``[B, 3, 32, 32]`` (what ``preprocess`` does to one 32 px PIL image)."""
    x = torch.as_tensor(np.asarray(images)).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(OPENAI_DATASET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


@torch.no_grad()
def similarity(model: torch.nn.Module, tokenizer: Callable, images: np.ndarray | torch.Tensor,
               captions: list[str]) -> torch.Tensor:
    """Cosine similarity ``[n_images, n_captions]`` of L2-normalised embeddings."""
    device = next(model.parameters()).device
    img = model.encode_image(image_tensor(images).to(device), normalize=True)
    txt = model.encode_text(tokenizer(captions).to(device), normalize=True)
    return img @ txt.T


def clip_scores(model: torch.nn.Module, tokenizer: Callable, images: np.ndarray | torch.Tensor,
                captions: list[str]) -> torch.Tensor:
    """Per-pair CLIP score ``100 * max(cos, 0)`` of ``images[i]`` with ``captions[i]`` (torchmetrics convention)."""
    return 100 * similarity(model, tokenizer, images, captions).diagonal().clamp_min(0)


def retrieval_accuracy(model: torch.nn.Module, tokenizer: Callable, images: np.ndarray | torch.Tensor,
                       captions: list[str]) -> float:
    """Top-1 image->text accuracy among ``captions`` (a hit if the retrieved caption's text is the true one)."""
    best = similarity(model, tokenizer, images, captions).argmax(-1).tolist()
    return float(np.mean([captions[j] == captions[i] for i, j in enumerate(best)]))
