"""Matched-compression comparison of relaxed rules (docs/EVALUATION.md, "Matched-compression study"): find the knob value at which a rule reaches a
target step compression (the study then runs the rule at that knob, csd/study.py).

A relaxed rule has one knob that trades quality for compression (CSD's ``lam``, Addition's ``c``, Amplify's
``k``, ...). Compression is assumed monotone in the knob over the searched bracket (increasing, or decreasing
with ``increasing=False``); it is measured, so it is noisy, and the search stops at a tolerance on the
compression, not on the knob. A target outside what the bracket reaches is reported as unreachable with the
compression that was reached, never extrapolated.

A calibrated knob hits its target on the calibration prompts only; on the full prompt set each run lands near,
not at, the target. :func:`bracketing_mixture` gives the exact target on the full set without extrapolating: the
two measured operating points on either side of it and the mixing weight at which a per-image random choice
between them has exactly the target's mean step compression. Mean step compression and every per-image mean
metric of such a mixture are the same mixture of the two runs' means, so its quality is an attainable point on
the segment between them (the convex hull of measured operating points).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class KnobMatch:
    """Outcome of :func:`match_compression`: the knob closest to ``target`` and every evaluation made."""

    target: float
    knob: float
    compression: float
    reachable: bool
    evaluations: list[tuple[float, float]] = field(default_factory=list)

    @property
    def error(self) -> float:
        return self.compression - self.target


def match_compression(
    measure: Callable[[float], float], target: float, lo: float, hi: float, *, increasing: bool = True,
    log_scale: bool = True, tol: float = 0.02, max_evals: int = 10,
) -> KnobMatch:
    """Bisect the knob in ``[lo, hi]`` until ``|measure(knob) / target - 1| <= tol`` (relative) or ``max_evals``.

    Both ends are measured first; if the target lies outside ``[measure(lo), measure(hi)]`` (in the
    monotone direction) the end that comes closest is returned with ``reachable=False``. Midpoints are
    geometric when ``log_scale`` (knobs spanning decades, e.g. ``lam``), else arithmetic.
    """
    if not lo < hi:
        raise ValueError(f"need lo < hi, got lo={lo}, hi={hi}")
    if log_scale and lo <= 0:
        raise ValueError(f"log_scale needs lo > 0, got lo={lo}")
    if max_evals < 2:
        raise ValueError(f"max_evals must be >= 2 (both ends), got {max_evals}")
    evals: list[tuple[float, float]] = []

    def run(knob: float) -> float:
        value = float(measure(knob))
        evals.append((knob, value))
        return value

    sign = 1.0 if increasing else -1.0
    c_lo, c_hi = run(lo), run(hi)
    if sign * (target - c_lo) <= 0 or sign * (c_hi - target) <= 0:
        close = min(evals, key=lambda e: abs(e[1] - target))
        reachable = abs(close[1] / target - 1) <= tol
        return KnobMatch(target, close[0], close[1], reachable, evals)
    while len(evals) < max_evals:
        mid = math.sqrt(lo * hi) if log_scale else (lo + hi) / 2
        c_mid = run(mid)
        if abs(c_mid / target - 1) <= tol:
            break
        if sign * (c_mid - target) < 0:
            lo = mid
        else:
            hi = mid
    best = min(evals, key=lambda e: abs(e[1] - target))
    return KnobMatch(target, best[0], best[1], abs(best[1] / target - 1) <= tol, evals)



def bracketing_mixture(target: float, compressions: Sequence[float]) -> tuple[int, int, float] | None:
    """``(i, j, w)`` with ``w * c_i + (1 - w) * c_j = target``, ``c_i <= target <= c_j`` neighbours in sorted
    order of the measured ``compressions``; None when ``target`` lies outside ``[min, max]`` (never extrapolated).
    A target equal to a measured point gets all the weight on it (``w`` = 1 or 0)."""
    order = sorted(range(len(compressions)), key=lambda k: compressions[k])
    for i, j in zip(order, order[1:], strict=False):
        c_i, c_j = compressions[i], compressions[j]
        if c_i <= target <= c_j:
            return i, j, 1.0 if c_j == c_i else (c_j - target) / (c_j - c_i)
    if len(order) == 1 and compressions[order[0]] == target:
        return order[0], order[0], 1.0
    return None
