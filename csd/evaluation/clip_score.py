"""CLIP score with open-clip-torch: ``scale * cos(image, prefix + caption)``, clamped at 0 per image, on the
mean, or not at all (docs/EVALUATION.md, "CLIP score"; the protocols' settings are in conf/eval/)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import open_clip
import torch
from PIL import Image

from csd.errors import MissingWeightsError
from csd.evaluation.images import RAW, Preprocess, load_rgb
from csd.hub import load_local_first
from csd.progress import bar

OPEN_CLIP_DIR = str(Path(open_clip.__file__).parent)


@dataclass
class ClipModel:
    """A CLIP model with its image preprocessing (PIL -> tensor) and tokenizer."""

    model: torch.nn.Module
    preprocess: Callable[[Any], torch.Tensor]
    tokenizer: Callable[[Sequence[str]], torch.Tensor]
    name: str


@contextmanager
def open_clip_errors_silenced() -> Iterator[None]:
    """Drop the ERROR lines open_clip logs on the root logger while it loads weights.

    open_clip logs a failed download (and an unknown tag) as an ERROR, then raises a ``RuntimeError`` with
    the same text; :func:`load_open_clip` turns that into its own one-line error, which should be the only one.
    """

    def keep(record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.pathname.startswith(OPEN_CLIP_DIR))

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _missing_file(pretrained: str | None) -> MissingWeightsError | None:
    """The error for a ``pretrained`` that names a file (a path or a file name) which does not exist."""
    if pretrained is not None and ("/" in pretrained or Path(pretrained).suffix) and not Path(pretrained).exists():
        return MissingWeightsError(f"CLIP weights file '{pretrained}' not found (eval.clip.pretrained).")
    return None


def _unavailable(model: str, pretrained: str | None, err: Exception) -> MissingWeightsError:
    return MissingWeightsError(
        f"CLIP weights {model}/{pretrained} are not available offline ({str(err)[:120]}...). Run once with "
        "internet to fill the Hugging Face cache, or set eval.clip.pretrained=/path/to/open_clip_pytorch_model.bin."
    )


def load_open_clip(
    model: str, pretrained: str | None, device: torch.device, model_config: str | None = None
) -> ClipModel:
    """``open_clip.create_model_and_transforms(model, pretrained=<tag or local file>)``.

    ``model_config``: a JSON file or folder of open_clip architecture configs to register first
    (for architectures open_clip does not ship). ``pretrained=None`` gives random weights. A tag's weights
    come from the local Hugging Face cache first, from the hub only when it is reachable (:mod:`csd.hub`).
    """
    if model_config is not None:
        open_clip.add_model_config(model_config)
    if (missing := _missing_file(pretrained)) is not None:
        raise missing
    try:
        with open_clip_errors_silenced():
            net, _, preprocess = load_local_first(
                lambda: open_clip.create_model_and_transforms(model, pretrained=pretrained, device=device),
                missing=(RuntimeError,),
            )
    except RuntimeError as err:
        raise _unavailable(model, pretrained, err) from err
    net.eval()
    return ClipModel(net, preprocess, open_clip.get_tokenizer(model), f"{model}/{pretrained}")


def check_open_clip(model: str, pretrained: str | None, model_config: str | None = None) -> None:
    """Raise the :class:`MissingWeightsError` :func:`load_open_clip` would, without building the network: the
    weights file, or the tag's weights in the cache (downloaded now when online, as open_clip would later).
    Hub and local-dir model names (``hf-hub:...``) find their weights only when loaded."""
    if model_config is not None:
        open_clip.add_model_config(model_config)
    if (missing := _missing_file(pretrained)) is not None:
        raise missing
    if pretrained is None or ":" in model:
        return
    tag = open_clip.get_pretrained_cfg(model.replace("/", "-"), pretrained)
    try:
        if tag:
            with open_clip_errors_silenced():
                load_local_first(lambda: open_clip.download_pretrained(tag), missing=(RuntimeError, OSError, ValueError))
        elif not Path(pretrained).is_file():
            raise RuntimeError(f"Pretrained value '{pretrained}' is not a known tag or valid file path")
    except Exception as err:  # open_clip turns any download failure into a RuntimeError when it loads
        raise _unavailable(model, pretrained, err) from err


#: where the score is clamped at 0: each image (csd-bench's default), the mean (torchmetrics ``CLIPScore``,
#: as SJD reports it) or nowhere (LANTERN's raw cosine)
CLAMPS = ("image", "mean", "none")
Clamp = Literal["image", "mean", "none"]


@torch.no_grad()
def clip_scores(
    clip: ClipModel,
    images: Sequence[Path | Image.Image],
    texts: Sequence[str],
    batch_size: int,
    device: torch.device,
    preprocess: Preprocess = RAW,
    prefix: str = "",
    scale: float = 100.0,
    clamp: Clamp = "image",
) -> np.ndarray:
    """Per-image ``scale * cos(image, prefix + caption)`` (same order), ``max(., 0)`` when ``clamp="image"``.

    ``preprocess`` runs on each image before the CLIP model's own preprocessing; :func:`clip_score_value`
    turns the per-image scores into the metric.
    """
    if len(images) != len(texts):
        raise ValueError("one caption per image is required")
    scores = []
    for start in bar(range(0, len(texts), batch_size), desc="CLIP score", unit="batch", leave=False):
        batch, caps = images[start : start + batch_size], texts[start : start + batch_size]
        pixels = torch.stack([clip.preprocess(preprocess(load_rgb(p))) for p in batch]).to(device)
        img = torch.nn.functional.normalize(clip.model.encode_image(pixels).float(), dim=-1)
        tokens = clip.tokenizer([prefix + c for c in caps]).to(device)
        txt = torch.nn.functional.normalize(clip.model.encode_text(tokens).float(), dim=-1)
        score = scale * (img * txt).sum(-1)
        scores.append((score.clamp(min=0) if clamp == "image" else score).cpu())
    return torch.cat(scores).numpy() if scores else np.zeros(0)


def clip_score_value(scores: np.ndarray, clamp: Clamp = "image") -> float:
    """The metric: the mean of the per-image scores, ``max(mean, 0)`` when ``clamp="mean"``."""
    mean = float(np.mean(scores))
    return max(mean, 0.0) if clamp == "mean" else mean
