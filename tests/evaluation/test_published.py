"""The SJD-PAC comparison preset composes and validates, and the report prints its published numbers beside ours."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from csd.errors import ConfigError
from csd.evaluate import evaluate_run
from csd.report import build_report
from csd.validate import validate
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run
from tests.pipeline.test_config import make_cfg

PRESET = "experiment=paper_sjd_pac_table"


def test_the_preset_composes_and_validates_for_every_row(tmp_path: Path) -> None:
    import torch

    head = tmp_path / "head.pt"
    torch.save({}, head)  # a head file's format (its weights are read when the run starts)
    cfg = make_cfg(PRESET)
    assert cfg.eval.protocol == "sjd" and cfg.dataset.caption_rule == "sjd"
    assert cfg.published.lumina_mgpt_7b.coco2017.sjd_pac == {"step_compression": 4.51, "speedup": 3.80, "fid": 30.69}
    for method in ("ar", "gsd", "sjd_pac"):
        validate(make_cfg(PRESET, f"method={method}"))
    validate(make_cfg(PRESET, "model=emu3_gen", "dataset=partiprompts", "method=sjd_pac"))
    for method in ("lantern_pp", "eagle_sd"):  # the EAGLE head's static tree: a trained head per model
        row = make_cfg(PRESET, f"method={method}", f"drafter.head={head}")
        validate(row)
        assert (row.drafter.name, row.drafter.tree, row.method.name) == ("eagle", "wide", method)
    assert make_cfg(PRESET, "method=lantern_pp").method._target_ == make_cfg("method=lantern").method._target_
    with pytest.raises(ConfigError, match="published.emu3_gen.coco2017.sjd_pac.speedup"):
        validate(make_cfg(PRESET, "published.emu3_gen.coco2017.sjd_pac.speedup=-1"))
    assert make_cfg().published == {}


def test_the_report_shows_the_published_column(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cfg = eval_cfg(tmp_path, **{"eval.metrics": ["speed"]})
    for name, method, latency in (("0_ar", "ar", 4.0), ("1_sjd", "sjd", 2.0), ("2_sjd_pac", "sjd_pac", 1.0)):
        evaluate_run(make_run(sweep / name, method, model="lumina_mgpt_7b", dataset="coco2017", latency=latency), cfg)
    cfg.published = OmegaConf.load("conf/experiment/paper_sjd_pac_table.yaml").published
    out = build_report(sweep, cfg)
    table = pd.read_csv(out / "published_lumina_mgpt_7b_coco2017.csv")
    assert table["method"].tolist()[:3] == ["ar", "sjd", "sjd_pac"]  # ours first, then published-only rows
    assert {"lantern_pp", "sjd2"} <= set(table["method"])
    rows = table.set_index("method")
    assert rows.loc["sjd_pac", "speed-up"] == pytest.approx(4.0) and rows.loc["sjd_pac", "speed-up published"] == 3.80
    assert rows.loc["sjd", "step compression published"] == 2.22 and pd.isna(rows.loc["sjd2", "speed-up"])
    assert "FID" not in rows and rows.loc["gsd", "FID published"] == 33.12  # ours unmeasured: no column
    markdown = (out / "published_lumina_mgpt_7b_coco2017.md").read_text()
    assert "speed-up published" in markdown and "3.80x" in markdown and "30.69" in markdown
    assert "ours and published" in (out / "report.md").read_text()
    assert not (out / "published_emu3_gen_coco2017.md").exists() or "sjd_pac" in (out / "published_emu3_gen_coco2017.md").read_text()


def test_the_new_scores_get_paired_differences_from_ar() -> None:
    from csd.report.collect import results_frame
    from csd.report.table import paper_table

    def result(method: str, shift: float) -> dict:
        rows = [{"prompt_id": f"p{i}", "sample": 0, "latency_s": 1.0, "hpsv2": 0.25 + shift, "image_reward": 0.1 + shift,
                 "in_reference_manifold": int(i % 2 == 0 or shift > 0), "dpg_score": 50.0 + 100 * shift} for i in range(6)]
        return {"run_dir": f"runs/{method}", "per_image": rows, "intervals": {},
                "run": {"method": method, "method_params": {"window": 1 if method == "ar" else 16}, "model": "toy",
                        "dataset": "toy", "n_records": 6},
                "metrics": {"latency_mean": 1.0, "hpsv2": 0.25 + shift, "image_reward": 0.1 + shift,
                            "precision": 0.5 if shift == 0 else 1.0, "dpg_score": 50.0 + 100 * shift}}

    df = results_frame([result("ar", 0.0), result("sjd", 0.01)], n_boot=50)
    sjd = df[df["method"] == "sjd"].iloc[0]
    assert sjd["d_hpsv2"] == pytest.approx(0.01) and sjd["d_image_reward"] == pytest.approx(0.01)
    assert sjd["d_precision"] == pytest.approx(0.5) and sjd["d_dpg_score"] == pytest.approx(1.0)
    assert {"HPSv2.1", "Δ HPSv2.1", "ImageReward", "Δ precision", "DPG", "Δ DPG"} <= set(paper_table(df).columns)
