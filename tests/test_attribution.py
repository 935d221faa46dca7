"""Region attribution of relaxed acceptances (csd.evaluation.attribution, issue #17)."""

from __future__ import annotations

import numpy as np
import pytest

from csd import Decoder
from csd.evaluation.attribution import PairOutcome, divergence, failure_cost, region_labels
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
