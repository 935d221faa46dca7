"""The matched-compression search (csd.report.matched) on synthetic monotone knob -> compression functions."""

from __future__ import annotations

import pytest

from csd.report.matched import bracketing_mixture, match_compression


def sjd_plus(lam: float) -> float:
    """A CSD-like curve: SJD's 3.45x at lam -> 0, saturating at 6x."""
    return 3.45 + 2.55 * lam / (lam + 0.3)


@pytest.mark.parametrize("gain", [1.10, 1.25, 1.50])
def test_converges_on_increasing_knob(gain: float) -> None:
    target = 3.45 * gain
    m = match_compression(sjd_plus, target, 1e-3, 10.0, tol=0.005, max_evals=30)
    assert m.reachable
    assert abs(m.compression / target - 1) <= 0.005
    # the knob solves the curve: lam = 0.3 (c - 3.45) / (6 - c)
    assert m.knob == pytest.approx(0.3 * (target - 3.45) / (6 - target), rel=0.05)
    assert len(m.evaluations) <= 30


def test_decreasing_knob_and_linear_midpoints() -> None:
    # Amplify-like: a knob whose growth lowers compression
    def curve(k: float) -> float:
        return 5.0 - 0.5 * k

    m = match_compression(curve, 4.0, 0.0, 4.0, increasing=False, log_scale=False, tol=0.001)
    assert m.reachable and m.knob == pytest.approx(2.0, abs=0.02)


def test_unreachable_target_is_reported_not_extrapolated() -> None:
    m = match_compression(sjd_plus, 7.0, 1e-3, 10.0)  # the curve saturates below 6
    assert not m.reachable
    assert m.knob == 10.0 and m.compression == pytest.approx(sjd_plus(10.0))
    assert len(m.evaluations) == 2  # only the two ends were measured
    low = match_compression(sjd_plus, 3.0, 1e-3, 10.0)  # below SJD itself
    assert not low.reachable and low.knob == 1e-3


def test_budget_exhausted_returns_the_closest_evaluation() -> None:
    m = match_compression(sjd_plus, 3.45 * 1.25, 1e-3, 10.0, tol=1e-9, max_evals=4)
    assert len(m.evaluations) == 4 and not m.reachable
    assert abs(m.error) == min(abs(c - m.target) for _, c in m.evaluations)


def test_bad_brackets() -> None:
    with pytest.raises(ValueError, match="lo < hi"):
        match_compression(sjd_plus, 4.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="lo > 0"):
        match_compression(sjd_plus, 4.0, 0.0, 1.0)



def test_bracketing_mixture_hits_the_target_exactly() -> None:
    c = [3.2, 5.1, 3.9, 4.4]  # unsorted, as measured
    for target in (3.5, 3.9, 4.0, 5.0):
        i, j, w = bracketing_mixture(target, c)
        assert c[i] <= target <= c[j]
        assert w * c[i] + (1 - w) * c[j] == pytest.approx(target)
        assert sorted(c).index(c[j]) == sorted(c).index(c[i]) + 1  # neighbours, not any bracketing pair
    assert bracketing_mixture(3.2, c)[2] == 1.0


def test_bracketing_mixture_never_extrapolates() -> None:
    assert bracketing_mixture(3.1, [3.2, 5.1]) is None
    assert bracketing_mixture(5.2, [3.2, 5.1]) is None
    assert bracketing_mixture(3.2, [3.2]) == (0, 0, 1.0)
    assert bracketing_mixture(3.3, []) is None
