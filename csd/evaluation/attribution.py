"""What a relaxed acceptance costs, by region (issue #17): a relaxed run against SJD on the same prompt and seed.

Both runs draw an image's random numbers from the same per-image stream in the same order, so their tokens are
identical up to the first position where the relaxed rule accepted a draft that SJD's ``min(1, q/p)`` test
rejected (SJD then commits a residual sample, which differs from the draft), and every later difference follows
from that one (raster decoding). Two attributions per (prompt, seed) pair:

* **differences**: the positions where the two images' tokens differ, counted per region of the SJD image's
  layout (object cells vs the scene's background kind, ``smooth`` | ``textured``);
* **failure cost**: when the relaxed image fails a scene-checker category that the SJD image passes, the
  failure is charged to the region of the *first* differing position, the causal origin of the divergence.
  A region's cost is the charged failures divided by the relaxed acceptances it received.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from csd.records import COMMIT_RELAXED

REGIONS = ("object", "smooth", "textured")


def region_labels(object_cells: np.ndarray, background: str) -> np.ndarray:
    """``[rows, cols]`` region name per token cell: ``object`` where ``object_cells``, else ``background``."""
    if background not in REGIONS[1:]:
        raise ValueError(f"background={background!r}: expected one of {REGIONS[1:]}")
    return np.where(object_cells, "object", background)


@dataclass(frozen=True)
class Divergence:
    """Where two token grids of one (prompt, seed) differ: counts per region and the first differing cell's region."""

    differing: dict[str, int]
    first: str | None


def divergence(reference: np.ndarray, tokens: np.ndarray, regions: np.ndarray) -> Divergence:
    """Compare ``tokens`` with ``reference`` (both ``[rows, cols]``) over the ``regions`` map of the reference."""
    if not reference.shape == tokens.shape == regions.shape:
        raise ValueError(f"shape mismatch: reference {reference.shape}, tokens {tokens.shape}, regions {regions.shape}")
    diff = reference != tokens
    counts = {reg: int((diff & (regions == reg)).sum()) for reg in REGIONS}
    flat = np.flatnonzero(diff.ravel())  # raster order = decoding order
    return Divergence(counts, str(regions.ravel()[flat[0]]) if flat.size else None)


@dataclass(frozen=True)
class PairOutcome:
    """One (prompt, seed): the relaxed run's commit kinds on the grid, both runs' check results, the divergence."""

    commit_kind: np.ndarray
    regions: np.ndarray
    divergence: Divergence
    reference_check: dict[str, Any]
    check: dict[str, Any]


def failure_cost(pairs: Iterable[PairOutcome], categories: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per region: relaxed acceptances, the failures charged to it per category (see the module docstring)
    and ``cost_<category>`` = charged failures / relaxed acceptances (NaN without relaxed acceptances)."""
    out: dict[str, dict[str, float]] = {reg: {"relaxed": 0, **{f"failures_{c}": 0 for c in categories}} for reg in REGIONS}
    for pair in pairs:
        for reg in REGIONS:
            out[reg]["relaxed"] += int(((pair.commit_kind == COMMIT_RELAXED) & (pair.regions == reg)).sum())
        origin = pair.divergence.first
        if origin is None:
            continue
        for cat in categories:
            if pair.reference_check.get(cat) and not pair.check.get(cat):
                out[origin][f"failures_{cat}"] += 1
    for counts in out.values():
        for cat in categories:
            counts[f"cost_{cat}"] = counts[f"failures_{cat}"] / counts["relaxed"] if counts["relaxed"] else float("nan")
    return out
