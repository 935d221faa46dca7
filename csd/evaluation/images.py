"""Reading images for metrics: configurable preprocessing and size-homogeneous uint8 batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize`` px, then centre-crop ``center_crop`` px (each optional).

    Applied identically to generated and reference images before feature extraction. Both null
    means raw images (SJD's protocol); LANTERN's is ``resize: 256, center_crop: 256``.
    """

    resize: int | None = None
    center_crop: int | None = None

    def __call__(self, image: Image.Image) -> Image.Image:
        if self.resize is not None:
            w, h = image.size
            scale = self.resize / min(w, h)
            image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BICUBIC)
        if self.center_crop is not None:
            w, h = image.size
            s = self.center_crop
            left, top = (w - s) // 2, (h - s) // 2
            image = image.crop((left, top, left + s, top + s))
        return image

    def describe(self) -> dict[str, int | None]:
        return asdict(self)


def load_rgb(path: str | Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def to_tensor(image: Image.Image | np.ndarray) -> torch.Tensor:
    """``[3, H, W]`` uint8 tensor from a PIL image or an ``[H, W, 3]`` uint8 array."""
    return torch.from_numpy(np.array(image, dtype=np.uint8, copy=True)).permute(2, 0, 1)


def list_images(directory: str | Path) -> list[Path]:
    """Image files directly inside ``directory``, sorted by name."""
    return sorted(p for p in Path(directory).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def uint8_batches(images: Iterable[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    """Stack ``[3, H, W]`` images into batches; a size change starts a new batch (raw COCO sizes vary)."""
    batch: list[torch.Tensor] = []
    for img in images:
        if batch and (len(batch) == batch_size or img.shape != batch[0].shape):
            yield torch.stack(batch)
            batch = []
        batch.append(img)
    if batch:
        yield torch.stack(batch)


def file_batches(paths: Iterable[Path], preprocess: Preprocess, batch_size: int) -> Iterator[torch.Tensor]:
    """Load, preprocess and batch image files."""
    return uint8_batches((to_tensor(preprocess(load_rgb(p))) for p in paths), batch_size)
