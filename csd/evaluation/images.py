"""Reading images for metrics: named preprocessing steps and size-homogeneous uint8 batches.

The steps reproduce the image handling of published evaluation code (docs/EVALUATION.md,
"Image transforms"); each maps an RGB PIL image to an RGB PIL image, so FID and CLIP score share them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from csd.registry import IMAGE_STEPS, step_error

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _center_square(image: Image.Image, side: int) -> Image.Image:
    """Centre ``side`` x ``side`` crop with torchvision's offsets ``round((size - side) / 2)`` (half to even)."""
    w, h = image.size
    if side > min(w, h):
        raise ValueError(f"cannot centre-crop {side} px from a {w}x{h} image")
    left, top = int(round((w - side) / 2.0)), int(round((h - side) / 2.0))
    return image.crop((left, top, left + side, top + side))


def crop_long_edge(image: Image.Image) -> Image.Image:
    """Square centre crop of side min(w, h): BigGAN's ``CenterCropLongEdge``, as LANTERN / GigaGAN apply it."""
    return _center_square(image, min(image.size))


def center_crop(image: Image.Image, size: int) -> Image.Image:
    return _center_square(image, size)


def resize_shorter(image: Image.Image, size: int) -> Image.Image:
    """Shorter side to ``size`` px, aspect kept (sides rounded), PIL bicubic."""
    w, h = image.size
    scale = size / min(w, h)
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BICUBIC)


def lanczos(image: Image.Image, size: int) -> Image.Image:
    """``size`` x ``size``, PIL Lanczos on the 8-bit image (LANTERN's ``image.resize((s, s), Image.LANCZOS)``)."""
    return image.resize((size, size), Image.LANCZOS)


def bilinear(image: Image.Image, size: int) -> Image.Image:
    """``size`` x ``size`` (aspect not kept): ``torch.nn.functional.interpolate(mode="bilinear",
    align_corners=False)``, no antialiasing, in float, rounded to 8 bits (pytorch-fid's resize inside its
    Inception, and SJD's resize before CLIP)."""
    x = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1)[None]
    y = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    return Image.fromarray(y[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy())


def pil_bilinear(image: Image.Image, size: int) -> Image.Image:
    """``size`` x ``size`` (aspect not kept), PIL bilinear on the 8-bit image: torchvision's
    ``transforms.Resize([size, size])`` on a PIL image (the improved precision / recall code LANTERN releases)."""
    return image.resize((size, size), Image.BILINEAR)


def clean_bicubic(image: Image.Image, size: int) -> Image.Image:
    """``size`` x ``size``, clean-fid's "clean" resize: PIL bicubic on each channel as a float image,
    clipped to [0, 255]; rounded to 8 bits here (clean-fid keeps the floats)."""
    pixels = np.asarray(image, dtype=np.float32)  # a float32 channel becomes a mode "F" PIL image
    channels = [np.asarray(Image.fromarray(pixels[:, :, c].copy()).resize((size, size), Image.BICUBIC))
                for c in range(3)]
    return Image.fromarray(np.rint(np.stack(channels, axis=2).clip(0, 255)).astype(np.uint8))


#: step name -> its function (whether it takes a size: ``csd.registry.IMAGE_STEPS``, where the config checks read it)
STEPS: dict[str, Callable[..., Image.Image]] = {
    "crop_long_edge": crop_long_edge,
    "center_crop": center_crop,
    "resize_shorter": resize_shorter,
    "lanczos": lanczos,
    "bilinear": bilinear,
    "pil_bilinear": pil_bilinear,
    "clean_bicubic": clean_bicubic,
}


@dataclass(frozen=True)
class Preprocess:
    """Named image steps (:data:`STEPS`), applied in order; no steps = the raw image.

    Applied identically to generated and reference images before FID features, and to generated
    images before the CLIP model's own preprocessing.
    """

    steps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        problems = [p for s in self.steps if (p := step_error(s))]
        if problems:
            raise ValueError(problems[0])

    def __call__(self, image: Image.Image) -> Image.Image:
        for step in self.steps:
            name, _, size = step.partition(":")
            fn = STEPS[name]
            image = fn(image, int(size)) if IMAGE_STEPS[name] else fn(image)
        return image

    def describe(self) -> list[str]:
        return list(self.steps)


RAW = Preprocess()


def load_rgb(image: str | Path | Image.Image) -> Image.Image:
    """An image file, or an image already in memory (a run's, csd.decode.RunImages), in RGB."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    with Image.open(image) as im:
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


def file_batches(images: Iterable[Path | Image.Image], preprocess: Preprocess, batch_size: int) -> Iterator[torch.Tensor]:
    """Load (files; images in memory as they are), preprocess and batch images."""
    return uint8_batches((to_tensor(preprocess(load_rgb(p))) for p in images), batch_size)
