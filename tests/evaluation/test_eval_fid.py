"""FID plumbing on a small feature module: identical sets ~0, shifted sets larger, reference cache reused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation.fid import generated_fid, inception_fid, load_reference, load_reference_stats, module_fid
from csd.evaluation.images import Preprocess, file_batches, uint8_batches
from csd.evaluation.images import to_tensor as img_to_tensor


class MeanColourFeatures(nn.Module):
    """4 features: per-channel means and the overall std (uint8 images in)."""

    num_features = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255
        return torch.cat([x.mean(dim=(2, 3)), x.flatten(1).std(dim=1, keepdim=True)], dim=1)


def images(shift: int = 0, n: int = 24) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 200, (3, 16, 16), generator=g) + shift).clamp(0, 255).to(torch.uint8) for _ in range(n)]


def fid(real: list[torch.Tensor], fake: list[torch.Tensor], cache: Path | None = None, key: str = "k") -> float:
    metric = module_fid(MeanColourFeatures())
    load_reference(metric, {"ref": key}, lambda: uint8_batches(real, 8), cache, torch.device("cpu"))
    return generated_fid(metric, uint8_batches(fake, 8), torch.device("cpu"))


def test_fid_self_is_zero_and_shift_is_positive() -> None:
    same = fid(images(), images())
    shifted = fid(images(), images(shift=50))
    assert abs(same) < 1e-3
    assert shifted > 100 * max(abs(same), 1e-4)


def test_reference_cache_is_reused(tmp_path: Path) -> None:
    first = fid(images(), images(shift=20), cache=tmp_path)
    assert len(list(tmp_path.glob("fid_ref_*.pt"))) == 1
    metric = module_fid(MeanColourFeatures())

    def must_not_run():
        raise AssertionError("reference recomputed despite the cache")

    assert load_reference(metric, {"ref": "k"}, must_not_run, tmp_path, torch.device("cpu"))
    assert generated_fid(metric, uint8_batches(images(shift=20), 8), torch.device("cpu")) == pytest.approx(first)


def test_reference_statistics_file_gives_the_same_fid(tmp_path: Path) -> None:
    """An .npz of the reference features' mean and unbiased covariance (ADM's reference-batch format) stands in for the
    reference images exactly; a file of the wrong width or without mu / sigma fails naming it."""
    import numpy as np

    feats = torch.cat([MeanColourFeatures()(b) for b in uint8_batches(images(), 8)]).double()
    np.savez(tmp_path / "ref.npz", mu=feats.mean(0).numpy(), sigma=torch.cov(feats.T).numpy())
    metric = module_fid(MeanColourFeatures())
    load_reference_stats(metric, tmp_path / "ref.npz")
    value = generated_fid(metric, uint8_batches(images(shift=20), 8), torch.device("cpu"))
    assert value == pytest.approx(fid(images(), images(shift=20)), rel=1e-6)
    np.savez(tmp_path / "wide.npz", mu=np.zeros(5), sigma=np.eye(5))
    np.savez(tmp_path / "other.npz", mean=np.zeros(4))
    with pytest.raises(ValueError, match=r"wide\.npz: mu \(5,\) and sigma \(5, 5\) do not match the 4 features"):
        load_reference_stats(module_fid(MeanColourFeatures()), tmp_path / "wide.npz")
    with pytest.raises(ValueError, match=r"other\.npz: FID reference statistics need arrays 'mu' and 'sigma'"):
        load_reference_stats(module_fid(MeanColourFeatures()), tmp_path / "other.npz")


def test_preprocess_and_mixed_sizes(tmp_path: Path) -> None:
    from PIL import Image

    for i, size in enumerate([(40, 30), (40, 30), (20, 50)]):
        Image.new("RGB", size, (i, 0, 0)).save(tmp_path / f"{i}.png")
    files = sorted(tmp_path.glob("*.png"))
    raw = list(file_batches(files, Preprocess(), batch_size=8))
    assert [tuple(b.shape) for b in raw] == [(2, 3, 30, 40), (1, 3, 50, 20)]
    cropped = list(file_batches(files, Preprocess(("resize_shorter:24", "center_crop:16")), batch_size=8))
    assert [tuple(b.shape) for b in cropped] == [(3, 3, 16, 16)]
    assert img_to_tensor(Image.new("RGB", (5, 4))).shape == (3, 4, 5)


def test_missing_inception_weights_are_actionable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingWeightsError, match="inception_weights"):
        inception_fid(weights_path=str(tmp_path / "nope.pth"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def offline(*args, **kwargs):
        from urllib.error import URLError

        raise URLError("no network")

    monkeypatch.setattr("torch_fidelity.feature_extractor_inceptionv3.load_state_dict_from_url", offline)
    with pytest.raises(MissingWeightsError, match="hub/checkpoints"):
        inception_fid()
