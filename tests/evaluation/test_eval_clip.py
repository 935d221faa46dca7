"""CLIP score: matched captions score higher than shuffled ones; open_clip loading, offline errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation.clip_features import ClipImageFeatures
from csd.evaluation.clip_score import ClipModel, clip_scores, load_open_clip

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
TINY_CLIP = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


class ColourClip(nn.Module):
    """Image embedding = centred mean colour; text embedding = the named colour, centred the same way."""

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) - 0.5

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        table = torch.tensor([c for c in COLOURS.values()], dtype=torch.float32) / 255 - 0.5
        return table[ids]


def colour_clip() -> ClipModel:
    names = list(COLOURS)
    return ClipModel(
        ColourClip(),
        lambda im: torch.from_numpy(np.asarray(im.resize((4, 4)), dtype=np.float32) / 255).permute(2, 0, 1),
        lambda texts: torch.tensor([names.index(t) for t in texts]),
        "colour",
    )


def write_colour_images(tmp_path: Path) -> list[Path]:
    paths = []
    for name, rgb in COLOURS.items():
        paths.append(tmp_path / f"{name}.png")
        Image.new("RGB", (8, 8), rgb).save(paths[-1])
    return paths


def test_matched_beats_shuffled(tmp_path: Path) -> None:
    paths = write_colour_images(tmp_path)
    matched = clip_scores(colour_clip(), paths, ["red", "green", "blue"], batch_size=2, device=torch.device("cpu"))
    shuffled = clip_scores(colour_clip(), paths, ["green", "blue", "red"], batch_size=2, device=torch.device("cpu"))
    assert matched == pytest.approx([100.0] * 3, abs=1e-3)
    assert shuffled == pytest.approx([0.0] * 3)  # cosine -1/3, clamped at 0


def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-test-clip.json"
    path.write_text(json.dumps(TINY_CLIP))
    return path


def test_open_clip_local_weights_roundtrip(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    torch.manual_seed(0)
    random = load_open_clip("tiny-test-clip", None, torch.device("cpu"), str(cfg))
    weights = tmp_path / "tiny.pt"
    torch.save(random.model.state_dict(), weights)
    loaded = load_open_clip("tiny-test-clip", str(weights), torch.device("cpu"), str(cfg))
    paths = write_colour_images(tmp_path)
    texts = ["a red square", "a green square", "a blue square"]
    a = clip_scores(random, paths, texts, 8, torch.device("cpu"))
    b = clip_scores(loaded, paths, texts, 8, torch.device("cpu"))
    assert a == pytest.approx(b, abs=1e-4)
    assert ((a >= 0) & (a <= 100)).all()
    feats = ClipImageFeatures(loaded)
    out = feats(torch.randint(0, 255, (2, 3, 40, 48), dtype=torch.uint8))
    assert feats.num_features == 16 and out.shape == (2, 16)
    assert torch.allclose(out.norm(dim=1), torch.ones(2))


def test_missing_clip_weights_are_actionable(tmp_path: Path) -> None:
    with pytest.raises(MissingWeightsError, match="eval.clip.pretrained"):
        load_open_clip("tiny-test-clip", str(tmp_path / "missing.bin"), torch.device("cpu"), str(tiny_config(tmp_path)))
    with pytest.raises(MissingWeightsError, match="offline"):
        load_open_clip("tiny-test-clip", "openai", torch.device("cpu"), str(tiny_config(tmp_path)))
