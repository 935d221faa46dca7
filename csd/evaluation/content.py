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
    step counts are comparable (0 = first iteration, 1 = last). One image at a time: memory is one grid's, whatever
    the number of images; the sums run in image order, as a mean over stacked grids adds them, so the values are that
    mean's to the bit.
    """
    sums: dict[str, np.ndarray] = {}
    for record in records:
        kinds = on_grid(record, "commit_kind")
        iters = on_grid(record, "commit_iter").astype(float)
        iters /= max(iters.max(), 1)
        cells = {"accepted": np.isin(kinds, (COMMIT_ACCEPTED, COMMIT_RELAXED)).astype(float),
                 "relaxed": (kinds == COMMIT_RELAXED).astype(float), "commit_iter": iters}
        for key, value in cells.items():
            if key in sums:
                sums[key] += value
            else:
                sums[key] = value
    if not records:
        raise ValueError("no records: acceptance maps need at least one image")
    return {key: value / len(records) for key, value in sums.items()}


def acceptance_by_entropy(records: Sequence[dict[str, Any]], bins: int | Sequence[float] = 10) -> dict[str, list]:
    """Accepted and relaxed share of positions binned by target entropy (nats), pooled over images.

    Returns bin edges (``bins`` edges, or that many equal bins from the least to the largest entropy, as
    ``np.histogram_bin_edges``), per-bin position counts, and the two shares (NaN for empty bins). One image at a time
    (a first pass for the range when ``bins`` is a number): memory is one image's, the counts exact.
    """
    if isinstance(bins, (int, np.integer)):
        ranges = [(float(e.min()), float(e.max())) for e in (_free(r, "entropy") for r in records) if e.size]
        span = np.array([min(lo for lo, _ in ranges), max(hi for _, hi in ranges)]) if ranges else np.zeros(0)
        edges = np.histogram_bin_edges(span, bins=bins)
    else:
        edges = np.histogram_bin_edges(np.zeros(0), bins=bins)
    counts = np.zeros(len(edges) - 1, dtype=np.int64)
    accepted, relaxed = np.zeros(len(counts)), np.zeros(len(counts))
    for record in records:
        kinds = _free(record, "commit_kind")
        idx = np.clip(np.digitize(_free(record, "entropy").astype(float), edges[1:-1]), 0, len(edges) - 2)
        counts += np.bincount(idx, minlength=len(counts))
        accepted += np.bincount(idx, weights=np.isin(kinds, (COMMIT_ACCEPTED, COMMIT_RELAXED)), minlength=len(counts))
        relaxed += np.bincount(idx, weights=kinds == COMMIT_RELAXED, minlength=len(counts))
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
