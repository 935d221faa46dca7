"""Speed, acceptance and content metrics on records with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from csd.evaluation.content import acceptance_by_entropy, acceptance_maps, on_grid, region_grid
from csd.evaluation.speed import latency_stats, speed_metrics, speedup
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_SAMPLED, load_records
from tests.evaluation.test_eval_fixtures import make_run


def test_latency_stats() -> None:
    stats = latency_stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert stats["latency_mean"] == pytest.approx(4.0)
    assert stats["latency_median"] == pytest.approx(3.0)
    assert stats["latency_p90"] == pytest.approx(7.6)


def test_speedup() -> None:
    assert speedup(ar_latency_mean=10.0, latency_mean=2.5) == pytest.approx(4.0)


def test_speed_metrics_counts(tmp_path: Path) -> None:
    recs = load_records(make_run(tmp_path / "r", method="csd", n_images=2, grid=(2, 4), relaxed_every=4))
    m = speed_metrics(recs)
    # per image: 8 positions, odd ones accepted (4), of which positions 1 and 5 relaxed; 16 proposed
    assert m["acceptance_rate"] == pytest.approx(4 / 16)
    assert m["relaxed_rate"] == pytest.approx(2 / 4)
    assert m["filter_pass_rate"] == pytest.approx(0.5)
    assert m["step_compression"] == pytest.approx(8 / 4)
    assert m["latency_mean"] == pytest.approx(1.0)


def test_ar_rates_are_nan(tmp_path: Path) -> None:
    m = speed_metrics(load_records(make_run(tmp_path / "r", method="ar", n_images=2)))
    assert math.isnan(m["acceptance_rate"]) and m["step_compression"] == pytest.approx(1.0)


def test_forced_positions_dropped_from_grid() -> None:
    # a 2x2 grid with an end-of-line token after each row (Lumina-style)
    kinds = [COMMIT_SAMPLED, COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_ACCEPTED, COMMIT_SAMPLED, COMMIT_FORCED]
    rec = {"prompt_id": "x", "grid": [2, 2], "commit_kind": kinds, "commit_iter": [0, 0, 0, 1, 2, 2],
           "entropy": [0.1, 0.2, 0.0, 0.3, 0.4, 0.0]}
    assert on_grid(rec, "commit_kind").tolist() == [[0, 1], [1, 0]]
    maps = acceptance_maps([rec])
    assert maps["accepted"].tolist() == [[0, 1], [1, 0]]
    assert maps["commit_iter"].tolist() == [[0, 0], [0.5, 1]]


def test_acceptance_by_entropy(tmp_path: Path) -> None:
    recs = load_records(make_run(tmp_path / "r", method="sjd", n_images=1, grid=(2, 2)))
    # entropies 0, .5, 1, 1.5 ; accepted positions 1 and 3
    curve = acceptance_by_entropy(recs, bins=[0.0, 0.75, 2.0])
    assert curve["count"] == [2, 2]
    assert curve["accepted"] == [0.5, 0.5]


def test_region_grid_majority() -> None:
    labels = np.zeros((8, 8), dtype=int)
    labels[:4, :4] = 3  # object fills the top-left cell of a 2x2 grid
    labels[4:6, 4:8] = 1  # half of the bottom-right cell
    assert region_grid(labels, (2, 2)).tolist() == [[True, False], [False, False]]
