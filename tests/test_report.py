"""Report stage on a fixture sweep: speed-up vs AR, tables, Pareto front, content plots, Hydra callback."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from csd.evaluation import evaluate_run
from csd.report import SweepReportCallback, build_report
from csd.report.pareto import pareto_front
from tests.test_eval_fixtures import REPO, eval_cfg, make_run


def fixture_sweep(root: Path, tmp_path: Path) -> Path:
    """AR, SJD and two CSD runs of one model, evaluated with speed + content metrics only."""
    (root / "multirun.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("{}\n")
    runs = [
        make_run(root / "0_ar", "ar", latency=4.0),
        make_run(root / "1_sjd", "sjd", latency=2.0),
        make_run(root / "2_csd", "csd", latency=1.0, method_params={"lam": 0.5, "delta": 0.3}, relaxed_every=4),
        make_run(root / "3_csd", "csd", latency=1.6, method_params={"lam": 0.1, "delta": 0.3}, relaxed_every=8),
    ]
    cfg = eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed", "content"]})
    for run in runs:
        evaluate_run(run, cfg)
    return root


def test_pareto_front() -> None:
    # maximise x, minimise y: (3, 1) dominates (2, 2); (1, 0) is best on y
    assert pareto_front([1, 2, 3], [0, 2, 1], maximize_y=False).tolist() == [True, False, True]


def test_build_report_from_sweep(tmp_path: Path) -> None:
    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    out = build_report(sweep, eval_cfg(tmp_path))
    assert out == sweep / "report"
    runs = pd.read_csv(out / "runs.csv")
    speedups = dict(zip(runs["run_dir"].map(lambda p: Path(p).name), runs["speedup"], strict=True))
    assert speedups == pytest.approx({"0_ar": 1.0, "1_sjd": 2.0, "2_csd": 4.0, "3_csd": 2.5})
    table = pd.read_csv(out / "table_toy.csv")
    assert table["method"].tolist() == ["ar", "sjd", "csd", "csd"]
    assert table["lambda"].tolist()[2:] == [0.1, 0.5]
    assert {"latency (s)", "speed-up", "step compression"} <= set(table.columns)
    markdown = (out / "table_toy.md").read_text()
    assert "| method" in markdown and "nan" not in markdown  # AR has no lambda: an empty cell
    for name in ("pareto_toy.png", "acceptance_heatmaps_toy.png", "acceptance_vs_entropy_toy.png"):
        assert (out / name).stat().st_size > 0
    assert "pareto_toy.png" in (out / "report.md").read_text()


def test_report_from_run_list_and_callback(tmp_path: Path) -> None:
    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    out = build_report([sweep / "0_ar", sweep / "2_csd"], eval_cfg(tmp_path, **{"eval.report.out_dir": str(tmp_path / "r")}))
    assert len(pd.read_csv(out / "runs.csv")) == 2
    config = OmegaConf.merge(eval_cfg(tmp_path), {"stage": "all", "hydra": {"sweep": {"dir": str(sweep)}}})
    SweepReportCallback().on_multirun_end(config)
    assert (sweep / "report" / "table_toy.csv").exists()


def test_unevaluated_sweep_is_an_error(tmp_path: Path) -> None:
    make_run(tmp_path / "s" / "0_ar")
    with pytest.raises(FileNotFoundError, match="no evaluated runs"):
        build_report(tmp_path / "s", eval_cfg(tmp_path))


@pytest.mark.parametrize("name", ["paper_janus_pro_7b", "paper_janus_pro_1b", "paper_lumina_mgpt_7b",
                                  "ablation_lambda_delta", "toy_paper"])
def test_experiment_presets_compose(name: str) -> None:
    from hydra import compose, initialize_config_dir

    preset = OmegaConf.load(REPO / f"conf/experiment/{name}.yaml")
    for entry in preset.defaults:
        group, option = next(iter(entry.items()))
        if not (REPO / "conf" / group.split("/")[-1] / f"{option}.yaml").exists():
            pytest.skip(f"conf/{group.split('/')[-1]}/{option}.yaml not written yet")
    defaults = OmegaConf.load(REPO / "conf/config.yaml").defaults
    wired = any("experiment" in str(d) for d in defaults)
    overrides = [f"experiment={name}"] if wired else ["+eval=default", "+logger=wandb", f"+experiment={name}"]
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.hydra.sweeper.params
    assert cfg.logger.group == name and cfg.eval.metrics
