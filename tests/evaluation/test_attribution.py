"""Region attribution of relaxed acceptances (csd.evaluation.attribution)."""

from __future__ import annotations

import numpy as np
import pytest

from csd import Decoder
from csd.evaluation.attribution import PairOutcome, divergence, failure_cost, marginal_cost, region_labels
from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.toy.domain import toy_prompts


def layout() -> np.ndarray:
    """A 4x4 grid: a 2x2 object in the middle on a textured background."""
    obj = np.zeros((4, 4), dtype=bool)
    obj[1:3, 1:3] = True
    return region_labels(obj, "textured")


def test_differences_are_found_in_exactly_the_changed_regions() -> None:
    regions = layout()
    ref = np.arange(16).reshape(4, 4)
    changed = ref.copy()
    changed[1, 2] = 99  # object
    changed[3, 0] = 98  # background
    changed[3, 3] = 97  # background
    d = divergence(ref, changed, regions)
    assert d.differing == {"object": 1, "smooth": 0, "textured": 2}
    assert d.first == "object"  # (1, 2) precedes (3, 0) in raster order
    only_background = ref.copy()
    only_background[0, 3] = 50
    assert divergence(ref, only_background, regions).first == "textured"
    same = divergence(ref, ref.copy(), regions)
    assert same.first is None and sum(same.differing.values()) == 0


def test_failure_is_charged_to_the_region_where_the_images_first_differ() -> None:
    regions = layout()
    kinds = np.full((4, 4), COMMIT_ACCEPTED)
    kinds[1, 1] = COMMIT_RELAXED  # one relaxed acceptance on the object
    kinds[0, 0] = kinds[3, 3] = COMMIT_RELAXED  # two on the background
    ref = np.zeros((4, 4), dtype=int)
    broken = ref.copy()
    broken[1, 1] = 5
    ok = {"count": True, "colour": True}
    pairs = [
        # the relaxed image breaks the count after diverging on the object
        PairOutcome(kinds, regions, divergence(ref, broken, regions), ok, {"count": False, "colour": True}),
        # a failure that SJD shares is not the relaxation's cost
        PairOutcome(kinds, regions, divergence(ref, broken, regions), {"count": False, "colour": True},
                    {"count": False, "colour": True}),
        # identical images cost nothing
        PairOutcome(np.full((4, 4), COMMIT_SAMPLED), regions, divergence(ref, ref, regions), ok, ok),
    ]
    cost = failure_cost(pairs, ["count", "colour"])
    assert cost["object"]["relaxed"] == 2 and cost["textured"]["relaxed"] == 4
    assert cost["object"]["failures_count"] == 1 and cost["textured"]["failures_count"] == 0
    assert cost["object"]["cost_count"] == pytest.approx(0.5) and cost["textured"]["cost_count"] == 0.0
    assert cost["object"]["failures_colour"] == 0
    assert np.isnan(cost["smooth"]["cost_count"])


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="background"):
        region_labels(np.zeros((2, 2), dtype=bool), "checkered")
    with pytest.raises(ValueError, match="shape mismatch"):
        divergence(np.zeros((2, 2)), np.zeros((2, 3)), layout())


@pytest.mark.slow
def test_relaxed_run_first_differs_from_sjd_at_its_first_relaxed_acceptance() -> None:
    """The premise of the failure attribution, on the shipped toy model: same prompt and seed, CSD's tokens equal
    SJD's up to CSD's first relaxed acceptance and differ there (the residual sample excludes the draft)."""
    sjd = Decoder(model="toy", method="sjd", device="cpu")
    csd = sjd.with_method("csd", **{"method.lam": 2.0, "method.delta": 1.0})
    checked = 0
    for i, prompt in enumerate(toy_prompts(4)):
        _, a = sjd.generate(prompt.text, seed=i)
        _, b = csd.generate(prompt.text, seed=i)
        relaxed = np.flatnonzero(b.commit_kind.numpy() == COMMIT_RELAXED)
        differ = np.flatnonzero(a.tokens.numpy() != b.tokens.numpy())
        if relaxed.size == 0:
            assert differ.size == 0
            continue
        checked += 1
        assert differ.size and differ[0] == relaxed[0]
    assert checked >= 2


def relaxed_pair(smooth: int, obj: int, fails: bool, sjd_passes: bool = True) -> PairOutcome:
    """A 4x4 smooth-background image with ``smooth`` relaxed acceptances in its first row (decoded first) and
    ``obj`` on a 2x2 object in rows 2-3; every pair first differs in row 0 when ``smooth`` > 0."""
    obj_cells = np.zeros((4, 4), dtype=bool)
    obj_cells[2:, :2] = True
    regions = region_labels(obj_cells, "smooth")
    kinds = np.full((4, 4), COMMIT_ACCEPTED)
    kinds[0, :smooth] = COMMIT_RELAXED
    flat = kinds[2:, :2].ravel()
    flat[:obj] = COMMIT_RELAXED
    kinds[2:, :2] = flat.reshape(2, 2)
    ref = np.zeros((4, 4), dtype=int)
    tokens = np.where(kinds == COMMIT_RELAXED, 1, ref)
    return PairOutcome(kinds, regions, divergence(ref, tokens, regions), {"overall": sjd_passes},
                       {"overall": not fails})


def test_marginal_cost_recovers_a_known_linear_model_that_decoding_order_hides() -> None:
    """Failures caused by object relaxations only (1 in 2 per object acceptance), never by the smooth ones decoded
    before them: the first-difference rule charges every failure to smooth; the linear model finds b_object = 0.5,
    b_smooth = 0, exactly (group means of a saturated design)."""
    pairs = [relaxed_pair(2, 0, fails=False) for _ in range(4)]  # smooth only: never fail
    pairs += [relaxed_pair(2, 1, fails=i < 2) for i in range(4)]  # + one object acceptance: half fail
    pairs += [relaxed_pair(0, 0, fails=False) for _ in range(4)]  # nothing relaxed
    pairs += [relaxed_pair(2, 2, fails=True, sjd_passes=False) for _ in range(3)]  # SJD fails too: left out
    clusters = [f"p{i}" for i in range(len(pairs))]
    first = failure_cost(pairs, ["overall"])
    assert first["smooth"]["failures_overall"] == 2 and first["object"]["failures_overall"] == 0
    cost = marginal_cost(pairs, clusters, "overall", n_boot=300)
    assert cost["object"]["value"] == pytest.approx(0.5) and cost["smooth"]["value"] == pytest.approx(0.0, abs=1e-12)
    assert cost["textured"]["value"] is None and cost["textured"]["interval"] is None
    assert cost["object"]["pairs"] == 12 and cost["object"]["failure_rate"] == pytest.approx(2 / 12)
    lo, hi = cost["object"]["interval"]
    assert lo < 0.5 < hi and hi > lo


def test_marginal_cost_of_failures_unrelated_to_relaxation_is_zero_within_its_interval() -> None:
    """Negative control: failures drawn independently of where (and how much) a run relaxed."""
    rng = np.random.default_rng(0)
    pairs = [relaxed_pair(int(rng.integers(0, 4)), int(rng.integers(0, 5)), fails=bool(rng.random() < 0.3))
             for _ in range(300)]
    cost = marginal_cost(pairs, [f"p{i // 2}" for i in range(300)], "overall", n_boot=300)
    for reg in ("object", "smooth"):
        lo, hi = cost[reg]["interval"]
        assert lo < 0 < hi, (reg, cost[reg])
    with pytest.raises(ValueError, match="3 pairs but 2 clusters"):
        marginal_cost(pairs[:3], ["a", "b"], "overall", n_boot=0)
