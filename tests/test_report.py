"""Report stage on a fixture sweep: speed-up vs AR, tables, Pareto front, content plots, Hydra callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from omegaconf import OmegaConf

from csd.evaluation import evaluate_run
from csd.report import SweepReportCallback, build_report
from csd.report.collect import results_frame
from csd.report.pareto import pareto_front, plot_pareto
from csd.report.table import table_context
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


def fake_result(method: str, latency: float = 1.0, **params: Any) -> dict[str, Any]:
    """A ``load_run`` result without files: method parameters as ``run.json`` records them, fixed quality."""
    method_params = {"window": 1 if method == "ar" else 16, "init": "random", "coupling": "none", **params}
    return {"run_dir": f"runs/{method}", "run": {"method": method, "method_params": method_params, "model": "toy",
                                                 "dataset": "toy", "n_records": 4},
            "metrics": {"latency_mean": latency, "step_compression": 1.0 / latency, "fid": 0.1, "clip_score": 90.0}}


def pareto_texts(df: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Figure, list[Text]]:
    """The drawn Pareto figure of ``df`` (kept open) and every non-empty text on it."""
    figures: list[Figure] = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_pareto(df, ["speedup", "step_compression"], ["fid", "clip_score"], "toy", tmp_path / "pareto.png")
    fig = figures[0]
    fig.canvas.draw()
    return fig, [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def test_labels_carry_the_swept_values() -> None:
    sweep = [fake_result("ar", 2.0)] + [fake_result("csd", lam=lam, delta=0.5, entropy_norm="none") for lam in (0.1, 0.5)]
    assert results_frame(sweep)["label"].tolist() == ["ar", "csd lam=0.1", "csd lam=0.5"]
    grid = [fake_result("csd", lam=lam, delta=delta) for lam in (0.1, 0.5) for delta in (0.3, 0.5)]
    assert results_frame(grid)["label"].tolist() == [f"csd lam={a} delta={b}" for a in (0.1, 0.5) for b in (0.3, 0.5)]
    one = results_frame([fake_result("csd", lam=0.1, delta=0.5, entropy_norm="none"), fake_result("addition", c=0.1)])
    assert one["label"].tolist() == ["csd lam=0.1 delta=0.5 entropy_norm=none", "addition c=0.1"]


def test_pareto_names_every_run_without_overprinting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the two CSD runs land on the same point of every panel
    sweep = [fake_result("ar", 2.0), fake_result("csd", lam=0.1, delta=0.5), fake_result("csd", lam=0.5, delta=0.5)]
    fig, texts = pareto_texts(results_frame(sweep), tmp_path, monkeypatch)
    labels = [t for t in texts if t.get_text().startswith(("ar", "csd"))]
    assert {"ar", "csd lam=0.1", "csd lam=0.5"} <= {t.get_text() for t in labels}
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)


def test_pareto_without_ar_says_how_to_add_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = [fake_result("csd", 1.0, lam=0.1), fake_result("csd", 0.8, lam=0.5)]
    fig, texts = pareto_texts(results_frame(sweep), tmp_path, monkeypatch)
    assert sum("eval.report.extra_runs" in t.get_text() for t in texts) == 2  # both speed-up panels
    plt.close(fig)


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
    assert table["method"].tolist() == ["ar", "sjd", "csd lam=0.1", "csd lam=0.5"]  # delta is the same: left out
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
    assert cfg.logger.group == name and "metrics" in cfg.eval


def test_table_heading_names_the_evaluation_protocol() -> None:
    runs = pd.DataFrame({"dataset": ["coco2017", "coco2017"], "protocol": ["sjd", "sjd"]})
    assert table_context(runs) == "coco2017; eval protocol: sjd"
    mixed = runs.assign(protocol=["sjd", "lantern"])
    assert "MIXED eval protocols lantern, sjd" in table_context(mixed)
    assert table_context(runs.assign(protocol=[None, None])) == "coco2017"  # speed-only runs record none
