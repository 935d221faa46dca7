"""Where on the image drafts were accepted: per-position commit kinds on the token grid.

``commit_kind`` / ``commit_iter`` / ``entropy`` are per body position; forced structural positions
(e.g. Lumina-mGPT's end-of-line tokens) are dropped before reshaping to the ``grid`` (rows, cols).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED


def _free(record: dict[str, Any], field: str) -> np.ndarray:
    kinds = np.asarray(record["commit_kind"])
    return np.asarray(record[field])[kinds != COMMIT_FORCED]


def on_grid(record: dict[str, Any], field: str) -> np.ndarray:
    """A per-position field of a record as a ``[rows, cols]`` array over the free positions."""
    rows, cols = record["grid"]
    values = _free(record, field)
    if values.size != rows * cols:
        raise ValueError(f"{values.size} free positions do not fill the {rows}x{cols} grid of {record['prompt_id']}")
    return values.reshape(rows, cols)


def acceptance_maps(records: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-cell means over images: ``accepted`` (draft accepted, either rule), ``relaxed``, ``commit_iter``.

    ``commit_iter`` is normalised per image by its last iteration, so maps of runs with different
    step counts are comparable (0 = first iteration, 1 = last).
    """
    kinds = np.stack([on_grid(r, "commit_kind") for r in records])
    iters = np.stack([on_grid(r, "commit_iter") for r in records]).astype(float)
    iters /= np.maximum(iters.reshape(len(records), -1).max(axis=1), 1)[:, None, None]
    return {
        "accepted": np.isin(kinds, (COMMIT_ACCEPTED, COMMIT_RELAXED)).mean(axis=0),
        "relaxed": (kinds == COMMIT_RELAXED).mean(axis=0),
        "commit_iter": iters.mean(axis=0),
    }


def acceptance_by_entropy(records: Sequence[dict[str, Any]], bins: int | Sequence[float] = 10) -> dict[str, list]:
    """Accepted and relaxed share of positions binned by target entropy (nats), pooled over images.

    Returns bin edges, per-bin position counts, and the two shares (NaN for empty bins).
    """
    kinds = np.concatenate([_free(r, "commit_kind") for r in records])
    ent = np.concatenate([_free(r, "entropy") for r in records]).astype(float)
    edges = np.histogram_bin_edges(ent, bins=bins)
    idx = np.clip(np.digitize(ent, edges[1:-1]), 0, len(edges) - 2)
    counts = np.bincount(idx, minlength=len(edges) - 1)
    accepted = np.bincount(idx, weights=np.isin(kinds, (COMMIT_ACCEPTED, COMMIT_RELAXED)), minlength=len(counts))
    relaxed = np.bincount(idx, weights=kinds == COMMIT_RELAXED, minlength=len(counts))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "edges": edges.tolist(),
            "count": counts.tolist(),
            "accepted": (accepted / counts).tolist(),
            "relaxed": (relaxed / counts).tolist(),
        }


def region_grid(labels: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """Downsample a pixel label map to the token grid: a cell is object (True) if most of its pixels are."""
    rows, cols = grid
    h, w = labels.shape
    ys = (np.arange(h) * rows) // h
    xs = (np.arange(w) * cols) // w
    obj = np.zeros((rows, cols))
    np.add.at(obj, (ys[:, None], xs[None, :]), (labels != 0).astype(float))
    area = np.bincount(ys, minlength=rows)[:, None] * np.bincount(xs, minlength=cols)[None, :]
    return obj / area > 0.5
