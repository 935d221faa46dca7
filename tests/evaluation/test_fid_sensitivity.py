"""experiments/fid_sensitivity.py on a tiny slice of a committed toy run: one row per variant, the base variant's Δ is
0, the intervals hold their values, and the tables are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cleanfid")
pytest.importorskip("pytorch_fid")

from experiments.fid_sensitivity import BASE, main  # noqa: E402
from tests.evaluation.test_eval_fixtures import REPO  # noqa: E402

RUN = REPO / "results" / "toy_paper" / "0_ar"


def test_script_writes_one_row_per_variant(tmp_path: Path) -> None:
    chosen = ["pytorch-fid (its InceptionV3's torch bilinear on [0, 1])", "none (the toy's own FID pipeline)"]
    main([str(RUN), "--max-images", "6", "--variants", *chosen, "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "table.json").read_text())
    assert [r["variant"] for r in rows] == [BASE, *chosen]
    assert rows[0]["delta"] == 0 and all(r["images"] == 6 and r["groups"] == 6 for r in rows)
    for r in rows:
        assert r["fid_lo"] <= r["fid"] <= r["fid_hi"] and r["delta_lo"] <= r["delta"] <= r["delta_hi"]
    assert (tmp_path / "table.md").read_text().count("| ") > 3 * len(rows)
