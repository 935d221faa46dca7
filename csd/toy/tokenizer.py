"""Image tokenizer of the toy model: a k-means codebook over 2x2-pixel patches.

A 32x32 image is cut into a 16x16 grid of 2x2 patches (raster order), each replaced by its nearest
centroid. 2x2 patches (12 numbers) keep shape edges and 2-px stripes nearly lossless with a 256-code
codebook, whereas 4x4 patches of a 64x64 image would need far more codes for the same fidelity and
make the language model 4x more expensive per pixel of detail that matters to the checker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PATCH = 2
GRID = 16


def to_patches(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, 32, 32, 3]`` -> float ``[B, 256, 12]`` (raster order of the 16x16 patch grid)."""
    x = torch.as_tensor(images).float()
    b = x.shape[0]
    x = x.reshape(b, GRID, PATCH, GRID, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, GRID * GRID, PATCH * PATCH * 3)


def from_patches(patches: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_patches` (float in, float out)."""
    b = patches.shape[0]
    x = patches.reshape(b, GRID, GRID, PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, GRID * PATCH, GRID * PATCH, 3)


class PatchTokenizer:
    """Nearest-centroid encoder / centroid-lookup decoder over a ``[V, 12]`` codebook."""

    def __init__(self, centroids: torch.Tensor) -> None:
        self.centroids = centroids.float()

    @property
    def vocab_size(self) -> int:
        return int(self.centroids.shape[0])

    def encode(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, 32, 32, 3]`` -> codes ``[B, 256]`` (int64)."""
        patches = to_patches(images)
        return torch.cdist(patches, self.centroids.to(patches.device)[None]).argmin(-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, 256]`` -> uint8 images ``[B, 32, 32, 3]``."""
        patches = self.centroids.to(codes.device)[codes.long()]
        return from_patches(patches).round().clamp(0, 255).to(torch.uint8)

    def save(self, path: str | Path) -> None:
        save_file({"centroids": self.centroids.contiguous()}, str(path))

    @classmethod
    def load(cls, path: str | Path) -> PatchTokenizer:
        return cls(load_file(str(path))["centroids"])

    @classmethod
    def fit(cls, images: np.ndarray, vocab_size: int = 256, iters: int = 30, seed: int = 0) -> PatchTokenizer:
        """Weighted k-means over the distinct patches of ``images``.

        Each distinct patch is weighted by the square root of its frequency, so rare but important
        patches (object edges) are not drowned by flat background patches.
        """
        gen = torch.Generator().manual_seed(seed)
        unique, counts = torch.unique(to_patches(images).reshape(-1, PATCH * PATCH * 3), dim=0, return_counts=True)
        weights = counts.float().sqrt()
        centroids = _kmeans_pp_init(unique, weights, vocab_size, gen)
        for _ in range(iters):
            assign = _nearest(unique, centroids)
            sums = torch.zeros_like(centroids).index_add_(0, assign, unique * weights[:, None])
            mass = torch.zeros(vocab_size).index_add_(0, assign, weights)
            empty = mass == 0
            centroids = torch.where(empty[:, None], centroids, sums / mass.clamp_min(1e-8)[:, None])
            if empty.any():  # re-seed dead codes on the worst-reconstructed patches
                err = (unique - centroids[assign]).pow(2).sum(-1) * weights
                centroids[empty] = unique[err.topk(int(empty.sum())).indices]
        return cls(centroids)


def _nearest(points: torch.Tensor, centroids: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    return torch.cat([torch.cdist(points[i:i + chunk], centroids).argmin(-1) for i in range(0, len(points), chunk)])


def _kmeans_pp_init(points: torch.Tensor, weights: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ seeding (distance-squared sampling, weighted)."""
    first = torch.multinomial(weights, 1, generator=gen)
    centroids = [points[first[0]]]
    dist = (points - centroids[0]).pow(2).sum(-1)
    for _ in range(k - 1):
        idx = torch.multinomial(dist * weights + 1e-12, 1, generator=gen)[0]
        centroids.append(points[idx])
        dist = torch.minimum(dist, (points - points[idx]).pow(2).sum(-1))
    return torch.stack(centroids)
