"""``experiments/synth_run.py`` and ``experiments/bench_eval_scale.py`` on a committed toy run as the template: the
synthetic run is a run the evaluate stage accepts (records in the generate stage's format, run.json's settings, PNGs
of the template's size), and the benchmark's records stage reports its bytes, count and peak."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from csd.evaluate import compute_metrics
from csd.evaluation.context import EvalContext
from csd.records import load_records
from experiments import bench_eval_scale
from experiments.synth_run import image_size, write_reference, write_run

TEMPLATE = Path(__file__).resolve().parents[2] / "results" / "toy_paper" / "1_sjd"


def test_a_synthetic_run_is_a_run_the_evaluate_stage_accepts(tmp_path: Path) -> None:
    run = write_run(TEMPLATE, tmp_path / "synth", 5)
    template = load_records(TEMPLATE)[0]
    assert image_size(TEMPLATE, template)[0] > 0
    records = load_records(run)
    assert [r["prompt_id"] for r in records] == [f"synth-{i:06d}" for i in range(5)]
    for r in records:
        assert len(r["tokens"]) == len(template["tokens"]) and r["grid"] == template["grid"]
        assert r["step_compression"] == len(r["tokens"]) / r["nfe"] and r["nfe"] == max(r["commit_iter"]) + 1
        with Image.open(run / r["image"]) as im:
            assert im.size == image_size(TEMPLATE, template)  # the template keeps no PNG: its tokens decoded
    assert json.loads((run / "run.json").read_text())["n_images"] == 5
    cfg = OmegaConf.create({"metrics": ["speed", "content"], "strict": True, "bootstrap": 0,
                            "content": {"entropy_bins": 20}, "toy": {"models": []}})
    ctx = EvalContext.load(run, cfg, "cpu")
    result = {"metrics": {}, "protocol": {}, "content": {}, "intervals": {}, "skipped": {}}
    compute_metrics(ctx, ["speed", "content"], result)
    assert result["metrics"]["step_compression"] == pytest.approx(np.mean([r["step_compression"] for r in records]))
    wide = write_run(TEMPLATE, tmp_path / "wide", 2, grid=(4, 97), images=False)
    assert all(len(r["tokens"]) == 388 for r in load_records(wide)) and not list((wide / "images").iterdir())
    assert len(EvalContext.load(wide, cfg, "cpu").records) == 2  # its run.json describes the other grid
    assert len(list(write_reference(TEMPLATE, tmp_path / "ref", 3).glob("*.png"))) == 3


def test_the_records_stage_measures_a_fresh_process(tmp_path: Path) -> None:
    run = bench_eval_scale.synthetic(TEMPLATE, tmp_path, 4)
    assert (run / ".synth_done").exists() and bench_eval_scale.synthetic(TEMPLATE, tmp_path, 4) == run
    got = bench_eval_scale.read_records(run, Path(__file__).resolve().parents[2])
    assert got["rc"] == 0 and got["n"] == 4 and got["peak_mb"] > 0 and got["read_s"] > 0
    assert got["bytes_per_image"] == (run / "records.jsonl").stat().st_size / 4
