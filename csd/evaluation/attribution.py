"""What a relaxed acceptance costs, by region (docs/EVALUATION.md, "Matched-compression study"): a relaxed run against SJD on the same prompt and seed.

Both runs draw an image's random numbers from the same per-image stream in the same order, so their tokens are
identical up to the first position where the relaxed rule accepted a draft that SJD's ``min(1, q/p)`` test
rejected (SJD then commits a residual sample, which differs from the draft), and every later difference follows
from that one (raster decoding). Two attributions per (prompt, seed) pair:

* **differences**: the positions where the two images' tokens differ, counted per region of the SJD image's
  layout (object cells vs the scene's background kind, ``smooth`` | ``textured``);
* **failure cost**: when the relaxed image fails a scene-checker category that the SJD image passes, the
  failure is charged to the region of the *first* differing position, the causal origin of the divergence.
  A region's cost is the charged failures divided by the relaxed acceptances it received. Exact as a causal
  origin, but biased by decoding order: a region decoded late (objects, mid-image) is rarely the first
  difference, so its relaxed acceptances are rarely charged even when they do the damage;
* **marginal cost**: a linear probability model over the pairs whose SJD image passes a category,
  ``fail_i = a + sum_r b_r n_ir`` (``n_ir`` = relaxed acceptances of image ``i`` in region ``r``), fitted by least
  squares: ``b_r`` is the added failure probability per relaxed acceptance in region ``r``, whatever its place in
  decoding order, assuming effects add up (it saturates when most images fail). Cluster-bootstrap intervals over
  prompts (:mod:`csd.evaluation.intervals`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from csd.evaluation.intervals import SEED, Resamples, percentile_interval
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

    def relaxed_in(self, region: str) -> int:
        """Relaxed acceptances of the relaxed run in ``region``."""
        return int(((self.commit_kind == COMMIT_RELAXED) & (self.regions == region)).sum())


def failure_cost(pairs: Iterable[PairOutcome], categories: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per region: relaxed acceptances, the failures charged to it per category (see the module docstring)
    and ``cost_<category>`` = charged failures / relaxed acceptances (NaN without relaxed acceptances)."""
    out: dict[str, dict[str, float]] = {reg: {"relaxed": 0, **{f"failures_{c}": 0 for c in categories}} for reg in REGIONS}
    for pair in pairs:
        for reg in REGIONS:
            out[reg]["relaxed"] += pair.relaxed_in(reg)
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


def marginal_cost(pairs: Sequence[PairOutcome], clusters: Sequence[str], category: str, n_boot: int,
                  seed: int = SEED) -> dict[str, dict[str, Any]]:
    """Per region: ``b_r`` of the linear probability model of the module docstring with its 95 % interval
    (resampling ``clusters``, one per pair, e.g. the prompt), over the pairs whose SJD image passes ``category``;
    also ``pairs`` (how many) and ``failure_rate`` (their share that the relaxed image fails). Regions without a
    relaxed acceptance in those pairs get ``value`` None."""
    if len(pairs) != len(clusters):
        raise ValueError(f"{len(pairs)} pairs but {len(clusters)} clusters")
    keep = [i for i, pair in enumerate(pairs) if pair.reference_check.get(category)]
    fail = np.array([0.0 if pairs[i].check.get(category) else 1.0 for i in keep])
    counts = np.array([[pairs[i].relaxed_in(reg) for reg in REGIONS] for i in keep], dtype=float).reshape(
        len(keep), len(REGIONS))
    used = [j for j in range(len(REGIONS)) if counts[:, j].any()]
    out: dict[str, dict[str, Any]] = {reg: {"value": None, "interval": None} for reg in REGIONS}
    if keep and used:
        design = np.column_stack([np.ones(len(keep)), counts[:, used]])
        point = np.linalg.lstsq(design, fail, rcond=None)[0]
        resamples = Resamples.draw([clusters[i] for i in keep], n_boot, seed)
        draws = []
        for w in resamples.counts[:, resamples.index] if n_boot else []:  # w[i]: times pair i is drawn
            gram = design.T @ (w[:, None] * design)
            if np.linalg.matrix_rank(gram) == gram.shape[0]:
                draws.append(np.linalg.solve(gram, design.T @ (w * fail)))
        draws_arr = np.array(draws).reshape(len(draws), len(used) + 1)
        for k, j in enumerate(used):
            out[REGIONS[j]] = {"value": float(point[k + 1]), "interval": percentile_interval(draws_arr[:, k + 1])}
    for reg in REGIONS:
        out[reg] |= {"pairs": len(keep), "failure_rate": float(fail.mean()) if keep else float("nan")}
    return out
