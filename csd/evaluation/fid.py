"""FID with torchmetrics, with reference statistics cached on disk.

The reference side of a FID is the same for every run of a sweep, so its feature statistics
(sum, outer-product sum, count: exactly torchmetrics' ``real_*`` states) are stored under a key
built from (reference identity, preprocessing, feature extractor) and loaded instead of recomputed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.error import URLError

import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from csd.errors import MissingWeightsError
from csd.progress import bar

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
_REAL_STATES = ("real_features_sum", "real_features_cov_sum", "real_features_num_samples")


def inception_fid(feature: int = 2048, weights_path: str | None = None) -> FrechetInceptionDistance:
    """torchmetrics FID on torch-fidelity's Inception-v3; weights from ``weights_path`` or the torch hub cache.

    The network resizes its uint8 input to 299 x 299 itself (torchmetrics 1.9: ``interpolate(mode="bilinear",
    align_corners=False, antialias=True)``, an identity on 299 x 299 input) and scales by ``(x - 128) / 128``.
    """
    if weights_path is not None and not Path(weights_path).expanduser().exists():
        raise MissingWeightsError(f"Inception weights not found at '{weights_path}' (eval.fid.inception_weights).")
    try:
        return FrechetInceptionDistance(
            feature=feature,
            reset_real_features=False,
            feature_extractor_weights_path=None if weights_path is None else str(Path(weights_path).expanduser()),
        )
    except (URLError, OSError) as err:
        raise MissingWeightsError(
            f"FID needs the Inception-v3 weights ({INCEPTION_FILE}) and could not download them ({err}). "
            f"On a machine with internet run any FID once, or copy the file to $TORCH_HOME/hub/checkpoints/ "
            f"or set eval.fid.inception_weights=/path/to/{INCEPTION_FILE}."
        ) from err


def module_fid(feature: nn.Module) -> FrechetInceptionDistance:
    """torchmetrics FID on a custom feature module (uint8 ``[B, 3, H, W]`` in, ``[B, D]`` out)."""
    return FrechetInceptionDistance(feature=feature, reset_real_features=False)


def cache_key(parts: dict[str, Any]) -> str:
    """Stable hash of the JSON-serialisable description of a reference set and its features."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def module_digest(module: nn.Module) -> str:
    """sha256 of a feature network's weights (every parameter and buffer: name, dtype, shape, bytes), for the
    reference cache's key: a network retrained under the same name must not reuse the old network's statistics."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load_reference(
    metric: FrechetInceptionDistance,
    key_parts: dict[str, Any],
    batches: Callable[[], Iterable[torch.Tensor]],
    cache_dir: str | Path | None,
    device: torch.device,
) -> bool:
    """Fill the metric's reference (``real``) statistics, from the cache when possible.

    ``batches`` is only called on a cache miss. Returns True when the cache was used.
    """
    path = None if cache_dir is None else Path(cache_dir) / f"fid_ref_{cache_key(key_parts)}.pt"
    if path is not None and path.exists():
        cached = torch.load(path, map_location=device, weights_only=True)
        for name in _REAL_STATES:
            setattr(metric, name, cached[name])
        return True
    for batch in bar(batches(), desc="FID reference", unit="batch", leave=False):
        metric.update(batch.to(device), real=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {name: getattr(metric, name).cpu() for name in _REAL_STATES}
        tmp = path.with_suffix(".tmp")
        torch.save({**state, "key": key_parts}, tmp)
        tmp.replace(path)
    return False


def load_reference_stats(metric: FrechetInceptionDistance, path: str | Path) -> None:
    """Fill the metric's reference states from a statistics file: an ``.npz`` with the reference features' mean ``mu
    [D]`` and covariance ``sigma [D, D]`` (the format of ADM's reference batches, e.g. ``VIRTUAL_imagenet256_labeled.npz``
    for ImageNet 256). They enter as the sums of a two-sample set whose mean and unbiased covariance are exactly ``mu``
    and ``sigma`` under torchmetrics' formulas (``sum = 2 mu``, ``cov_sum = sigma + 2 mu mu^T``)."""
    import numpy as np

    with np.load(Path(path).expanduser()) as stats:
        if "mu" not in stats or "sigma" not in stats:
            raise ValueError(f"{path}: FID reference statistics need arrays 'mu' and 'sigma', found {sorted(stats)}")
        mu, sigma = (torch.from_numpy(stats[k]).double() for k in ("mu", "sigma"))
    dim = metric.real_features_sum.shape[0]
    if mu.shape != (dim,) or sigma.shape != (dim, dim):
        raise ValueError(f"{path}: mu {tuple(mu.shape)} and sigma {tuple(sigma.shape)} do not match the {dim} features "
                         "of eval.fid.feature")
    device = metric.real_features_sum.device
    metric.real_features_sum = (2 * mu).to(device)
    metric.real_features_cov_sum = (sigma + 2 * torch.outer(mu, mu)).to(device)
    metric.real_features_num_samples = torch.tensor(2, device=device)


def generated_fid(
    metric: FrechetInceptionDistance, batches: Iterable[torch.Tensor], device: torch.device
) -> float:
    """Add the generated images and compute FID against the already loaded reference."""
    for batch in bar(batches, desc="FID generated", unit="batch", leave=False):
        metric.update(batch.to(device), real=False)
    return float(metric.compute())
