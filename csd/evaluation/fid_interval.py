"""FID's 95 % interval: a delete-a-group jackknife over prompts of the generated set, reference statistics fixed.

docs/EVALUATION.md#confidence-intervals. FID is not resampled with the bootstrap of
:mod:`csd.evaluation.intervals`: a bootstrap resample repeats images, which FID reads as lost diversity, so
resampled FIDs sit far above the estimate. Leaving out a group of prompts repeats nothing. With ``g``
groups, ``theta_k`` = FID without group ``k``, the variance is ``(g - 1) / g * sum_k (theta_k - mean theta)^2``
(Kott 2001, the delete-a-group jackknife) and the interval ``FID +- t_{g-1} * se``, clipped at 0. It is an
interval for FID at this number of images (E[FID_N], FID's small-set bias included). In a simulation like
tests/evaluation/test_intervals.py's (Gaussian features, D = 16, N = 20, 60, 300; 300 runs each) it covered E[FID_N] in
98 / 98 / 94 % of runs, a percentile bootstrap in 2 / 1 / 25 %.

The generated images' features are recorded as torchmetrics' FID extracts them (:class:`FeatureRecorder`);
each left-out FID comes from the whole set's sums minus the group's (:class:`Moments`, :func:`moments_fid`),
against the reference mean and covariance held in torchmetrics' ``real_*`` sums: one D x D eigen-decomposition
per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import nn

from csd.evaluation.intervals import LEVEL, SEED

#: jackknife groups of prompts (fewer prompts: one group each, the delete-one jackknife)
GROUPS = 20


class FeatureRecorder:
    """Records the outputs of a feature extractor while active (a forward hook): the generated images'
    features as torchmetrics' FID extracts them, so the interval costs no second extraction."""

    def __init__(self, extractor: nn.Module) -> None:
        self.extractor, self.chunks = extractor, []

    def __enter__(self) -> FeatureRecorder:
        self.handle = self.extractor.register_forward_hook(lambda _m, _i, out: self.chunks.append(out.detach()))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()

    @property
    def features(self) -> torch.Tensor:
        """``[N, D]`` float64, in the order the images went through."""
        return torch.cat([c.double().reshape(len(c), -1) for c in self.chunks])


def reference_moments(metric: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased covariance of the reference features from torchmetrics' ``real_*`` sums (as ``compute``)."""
    n = metric.real_features_num_samples
    mean = metric.real_features_sum.double() / n
    cov = (metric.real_features_cov_sum.double() - n * torch.outer(mean, mean)) / (n - 1)
    return mean, cov


def psd_sqrt(cov: torch.Tensor) -> torch.Tensor:
    """Symmetric square root of a covariance (eigenvalues clipped at 0)."""
    vals, vecs = torch.linalg.eigh((cov + cov.T) / 2)
    return (vecs * vals.clamp(min=0).sqrt()) @ vecs.T


@dataclass(frozen=True)
class Moments:
    """Sums over a set of generated features ``x`` (``[n, D]``): count, ``sum x``, ``sum |x|^2`` and
    ``sum y y^T`` with ``y = x S_r^1/2`` (``S_r``: the reference covariance). A subset's moments are subtracted
    from the whole set's to leave it out."""

    n: float
    total: torch.Tensor
    sq_norm: torch.Tensor
    second: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, ref_sqrt: torch.Tensor) -> Moments:
        y = x @ ref_sqrt
        return cls(float(len(x)), x.sum(0), x.square().sum(), y.T @ y)

    def __sub__(self, other: Moments) -> Moments:
        return Moments(self.n - other.n, self.total - other.total, self.sq_norm - other.sq_norm,
                       self.second - other.second)


def moments_fid(m: Moments, ref_mean: torch.Tensor, ref_cov: torch.Tensor, ref_sqrt: torch.Tensor) -> float:
    """FID of the generated set with moments ``m`` against fixed reference moments (Heusel et al. 2017, eq. 6):

    d^2 = |mu_g - mu_r|^2 + tr S_r + tr S_g - 2 tr sqrt(S_r^1/2 S_g S_r^1/2), with S_g the unbiased covariance
    (as torchmetrics); the last trace is the sum of the square roots of the eigenvalues of the symmetric
    ``S_r^1/2 S_g S_r^1/2 = (sum y y^T - n mu_y mu_y^T) / (n - 1)``, ``mu_y = mu_g S_r^1/2``.
    """
    mean = m.total / m.n
    mean_y = mean @ ref_sqrt
    inner = (m.second - m.n * torch.outer(mean_y, mean_y)) / (m.n - 1)
    trace_g = (m.sq_norm - m.n * mean.square().sum()) / (m.n - 1)
    trace_term = torch.linalg.eigvalsh((inner + inner.T) / 2).clamp(min=0).sqrt().sum()
    return float((mean - ref_mean).square().sum() + ref_cov.trace() + trace_g - 2 * trace_term)


def jackknife_groups(prompt_ids: Sequence[str], groups: int = GROUPS, seed: int = SEED) -> np.ndarray:
    """Group of each image: the distinct prompts in a seeded random order, dealt round-robin into
    ``min(groups, prompts)`` groups (all samples of a prompt in one group)."""
    names, index = np.unique(np.asarray(prompt_ids, dtype=object).astype(str), return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(names))
    return (order % min(groups, len(names)))[index]


def jackknife_interval(features: torch.Tensor, prompt_ids: Sequence[str], ref_mean: torch.Tensor,
                       ref_cov: torch.Tensor, level: float = LEVEL) -> list[float] | None:
    """``FID +- t_{g-1} * se`` (lower end clipped at 0), se from the delete-a-group jackknife (module docstring);
    None with under 2 groups or when a left-out group would leave fewer than 2 images."""
    group = torch.as_tensor(jackknife_groups(prompt_ids), device=features.device)
    g = int(group.max()) + 1
    if g < 2 or len(features) - int(torch.bincount(group).max()) < 2:
        return None
    ref_sqrt = psd_sqrt(ref_cov)
    whole = Moments.of(features, ref_sqrt)
    full = moments_fid(whole, ref_mean, ref_cov, ref_sqrt)
    left_out = np.array([moments_fid(whole - Moments.of(features[group == k], ref_sqrt), ref_mean, ref_cov, ref_sqrt)
                         for k in range(g)])
    se = float(np.sqrt((g - 1) / g * np.square(left_out - left_out.mean()).sum()))
    half = float(stats.t.ppf(0.5 + level / 2, g - 1)) * se
    return [max(0.0, full - half), full + half]


def fid_interval(metric: Any, features: torch.Tensor, prompt_ids: Sequence[str], n_boot: int) -> list[float] | None:
    """The interval of the FID held by torchmetrics' ``metric`` (reference states filled, possibly from the cache)
    for the generated ``features`` ``[N, D]`` in records order; None when intervals are off (``n_boot = 0``)."""
    if n_boot == 0:
        return None
    if len(features) != len(prompt_ids):
        raise ValueError(f"{len(features)} generated FID features for {len(prompt_ids)} records")
    ref_mean, ref_cov = (m.to(features.device) for m in reference_moments(metric))
    return jackknife_interval(features, prompt_ids, ref_mean, ref_cov)
