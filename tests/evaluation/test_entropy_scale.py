"""experiments/entropy_scale.py on the committed study's AR run: the scale it reports agrees with the study's
per-region entropy summary (computed through the region maps), and bad input is one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from experiments.entropy_scale import entropy_scale
from tests.evaluation.test_eval_fixtures import REPO

AR = REPO / "results" / "entropy_study" / "ar"


def test_scale_matches_the_study_summary() -> None:
    scale = entropy_scale(AR)
    regions = json.loads((AR.parent / "study" / "study.json").read_text())["ar_entropy_by_region"]
    n = sum(r["n"] for r in regions.values())
    assert scale["positions"] == n == 400 * 256 and scale["vocab"] == 256
    assert scale["mean"] == pytest.approx(sum(r["mean"] * r["n"] for r in regions.values()) / n, rel=1e-9)
    assert scale["mean_over_log_v"] == pytest.approx(scale["mean"] / math.log(256))
    assert 0 <= scale["q10"] <= scale["q50"] <= scale["q90"] <= math.log(256)
    assert 0 < scale["below_1e-3"] < 1


@pytest.mark.slow
def test_cli_table_and_bad_input(tmp_path) -> None:
    out = tmp_path / "scale.md"
    done = subprocess.run([sys.executable, "-m", "experiments.entropy_scale", str(AR), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert done.stdout == out.read_text() and "| toy | ar | 256 | 400 |" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "experiments.entropy_scale", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and f"{tmp_path} is not a run directory (no run.json)" in bad.stderr
