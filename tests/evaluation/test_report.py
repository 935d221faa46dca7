"""Report stage on a fixture sweep: speed-up vs AR, tables, Pareto front, content plots, Hydra callback."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.text import Text
from omegaconf import OmegaConf

from csd.evaluate import evaluate_run
from csd.report import SweepReportCallback, build_report, content_plots
from csd.report.collect import find_run_dirs, results_frame
from csd.report.content_plots import heatmap_figure
from csd.report.pareto import outliers, pareto_front, plot_pareto
from csd.report.table import SMALL_N, console_tables, markdown_table, table_context, write_tables
from tests.evaluation.test_eval_fixtures import REPO, eval_cfg, make_run


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
    assert one["label"].tolist() == ["csd", "addition"]  # the methods' defaults (conf/method/*.yaml): no labels


def test_labels_name_only_what_differs_from_the_method_defaults() -> None:
    pac = fake_result("sjd_pac", window=64, coupling="maximal", draft_record="uniform", tree_width=4, tree_depth=3,
                      pac_code_parity=False)
    runs = [pac, fake_result("csd", lam=0.3, delta=0.5, entropy_norm="none"), fake_result("sjd", window=32),
            fake_result("ar", 2.0)]
    assert results_frame(runs)["label"].tolist() == ["sjd_pac", "csd lam=0.3", "sjd window=32", "ar"]
    # a method without a conf/method file keeps its own keys
    assert results_frame([fake_result("mystery", q=1)])["label"].tolist() == ["mystery q=1"]


def test_labels_of_a_drafter_sweep_name_the_drafter_under_current_names() -> None:
    chain = {"window": 16, "coupling": "none", "draft_record": "onehot"}
    tree = {"window": 64, "coupling": "maximal", "draft_record": "uniform", "tree_width": 4, "tree_depth": 3,
            "pac_code_parity": False}  # as runs record them
    sweep = [fake_result(m, **p) for m in ("sjd", "csd") for p in (chain, tree)]
    assert results_frame(sweep)["label"].tolist() == ["sjd chain", "sjd pac_tree", "csd chain", "csd pac_tree"]
    widths = [fake_result("sjd", **{**tree, "tree_width": k}) for k in (2, 4)] + [fake_result("sjd", **chain)]
    assert results_frame(widths)["label"].tolist() == ["sjd pac_tree width=2", "sjd pac_tree width=4", "sjd chain"]
    only_tree = results_frame([fake_result("sjd", **{**tree, "tree_depth": 2}), fake_result("sjd_pac", **tree)])
    assert only_tree["label"].tolist() == ["sjd pac_tree depth=2", "sjd_pac"]  # not the method's own drafter: named
    # a rule and a drafter of one's own (no conf/ files here): the drafter named, the rule's own keys
    own = fake_result("floor", drafter="echo", window=4, floor=0.5)
    assert results_frame([own])["label"].tolist() == ["floor echo floor=0.5"]


def test_run_dirs_in_natural_order(tmp_path: Path) -> None:
    for name in ("0_ar", "10_csd_mc", "11_csd_pac", "1_sjd", "2_mcsjd"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text("{}")
    assert [p.name for p in find_run_dirs(tmp_path)] == ["0_ar", "1_sjd", "2_mcsjd", "10_csd_mc", "11_csd_pac"]


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
    assert sum("eval.report.extra_runs" in t.get_text() for t in texts) == 1  # once, under the title
    assert [ax.get_xlabel() for ax in fig.axes] == ["step compression"] * 2  # no empty speed-up panels
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
    # delta is the same in both but not csd's default (0.5): named
    assert table["method"].tolist() == ["ar", "sjd", "csd lam=0.1 delta=0.3", "csd lam=0.5 delta=0.3"]
    assert table["lambda"].tolist()[2:] == [0.1, 0.5]
    assert {"latency (s)", "speed-up", "step compression"} <= set(table.columns)
    markdown = (out / "table_toy.md").read_text()
    assert "| method" in markdown and "nan" not in markdown  # AR has no lambda: an empty cell
    assert (runs["n_prompts"] == 4).all() and f"{SMALL_N} fewer than 20 prompts" in markdown  # 4 prompts: marked
    # the methods' defaults the labels leave out, beyond their drafter's (csd's window 16 is the chain's)
    assert "the defaults (`conf/method/<method>.yaml`, beyond its drafter's `conf/drafter/<drafter>.yaml`, the " \
           "chain unless named): ar window=1; sjd; csd lam=0.1 delta=0.5 entropy_norm=none." in markdown
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


def quality_sweep(fids: Sequence[float]) -> pd.DataFrame:
    """An AR run plus one run per method of the paper table with the given FIDs (AR's first), spread speed-ups."""
    methods = ["ar", "sjd", "mcsjd", "sjd_pac", "gsd", "addition", "amplify", "entropy_sjd", "cool_sd", "csd",
               "csd_mc", "csd_pac"][:len(fids)]
    results = [fake_result(m, 2.0 / (1 + 0.1 * i), lam=0.3) for i, m in enumerate(methods)]
    for res, fid in zip(results, fids, strict=True):
        res["metrics"]["fid"] = fid
    return results_frame(results)


def test_pareto_legend_clears_the_title_and_panels_keep_the_width(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fig, texts = pareto_texts(quality_sweep([0.008 + 0.001 * i for i in range(12)]), tmp_path, monkeypatch)
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    (title,) = [t for t in texts if t.get_text() == "toy"]
    assert not legend.overlaps(title.get_window_extent(renderer))
    panels = [ax.get_window_extent(renderer) for ax in fig.axes]
    assert not any(legend.overlaps(p) for p in panels)
    width = max(p.x1 for p in panels) - min(p.x0 for p in panels)
    assert width > 0.75 * fig.bbox.width
    plt.close(fig)


def test_pareto_clips_an_outlier_and_writes_its_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fids = [0.008, 0.009, 0.0085, 0.006, 0.0088, 1.2, 0.0062, 0.0059]
    fig, texts = pareto_texts(quality_sweep(fids), tmp_path, monkeypatch)
    fid_axes = [ax for ax in fig.axes if ax.get_ylabel() == "FID"]
    assert len(fid_axes) == 2
    for ax in fid_axes:
        lo, hi = ax.get_ylim()
        assert hi < 0.1 and lo < 0.0059  # the other runs are spread over the panel, not flattened at its bottom
        assert (0.009 - 0.0059) / (hi - lo) > 0.5
    assert sum(t.get_text() == "↑ 1.2" for t in texts) == 2  # the clipped value, written in each FID panel
    plt.close(fig)


def test_pareto_shows_each_measured_quality_and_no_empty_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    df = quality_sweep([0.008, 0.009, 0.007]).assign(scene_acc_overall=[0.8, 0.78, 0.7])
    figures: list[Figure] = []
    monkeypatch.setattr(plt, "close", figures.append)
    ys = OmegaConf.load(REPO / "conf/eval/default.yaml").report.pareto_y
    plot_pareto(df, ["speedup", "step_compression"], ys, "toy", tmp_path / "pareto.png")
    labels = {ax.get_ylabel() for ax in figures[0].axes}
    assert labels == {"scene accuracy", "FID", "CLIP score"}  # GenEval was not measured: no panel
    plt.close(figures[0])


def maps(accepted: float, relaxed: float) -> dict[str, Any]:
    grid = np.arange(16.0).reshape(4, 4) / 15
    return {"accepted": accepted * grid, "relaxed": relaxed * grid, "commit_iter": grid}


def test_heatmaps_say_which_panels_carry_nothing_and_labels_do_not_overprint() -> None:
    long = "csd_pac tree_width=8 tree_depth=4 lam=0.3 delta=0.7 entropy_norm=log_vocab"
    fig = heatmap_figure([("ar", maps(0, 0)), ("sjd", maps(0.8, 0)), (long, maps(0.8, 0.01))])
    fig.canvas.draw()
    assert len(fig.findobj(AxesImage)) == 1 + 2 + 3  # AR: commit order only; SJD: no relaxed map
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    assert sum("no draft accepted" in t.get_text() for t in texts) == 1
    assert sum("no relaxed accept" in t.get_text() for t in texts) == 2
    boxes = [t.get_window_extent() for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)
    lossless = heatmap_figure([("ar", maps(0, 0)), ("sjd", maps(0.8, 0))])
    assert not any("relaxed" in ax.get_title() for ax in lossless.axes)  # a column no run fills is dropped
    plt.close(lossless)


def test_content_plots_follow_the_table_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[list[str]] = []
    original = content_plots.heatmap_figure
    monkeypatch.setattr("csd.report.build.heatmap_figure", lambda runs: drawn.append([r[0] for r in runs]) or original(runs))
    out = build_report(fixture_sweep(tmp_path / "sweep", tmp_path), eval_cfg(tmp_path))
    assert drawn == [pd.read_csv(out / "table_toy.csv")["method"].tolist()]


def with_intervals(df: pd.DataFrame, n_prompts: int) -> pd.DataFrame:
    """``df`` with CLIP, scene accuracy and (but AR's) speed-up intervals around the values, on ``n_prompts``."""
    out = df.assign(scene_acc_overall=0.8, n_prompts=n_prompts, n_prompts_paired=n_prompts)
    for column, half in (("clip_score", 1.0), ("scene_acc_overall", 0.04), ("speedup", 0.05)):
        out[f"{column}_lo"], out[f"{column}_hi"] = out[column] - half, out[column] + half
    out.loc[out["method"] == "ar", ["speedup_lo", "speedup_hi"]] = np.nan  # AR's speed-up is 1 by definition
    return out


def test_console_table_is_compact_and_names_the_full_one(tmp_path: Path) -> None:
    runs = [fake_result("ar", 2.0)] + [fake_result("csd", 1.0 + 0.01 * i, lam=0.05 * i, delta=0.7) for i in range(11)]
    df = with_intervals(results_frame(runs), 400)
    text = console_tables(df, tmp_path)
    lines = text.splitlines()
    assert max(len(line) for line in lines if not line.startswith("full table")) <= 110
    header = next(line for line in lines if line.startswith("| method"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["method", "knobs", "speed-up", "step compression",
                                                                  "scene acc."]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| csd")]
    assert rows[1][:2] == ["csd", "lam=0.05 delta=0.7"]
    assert f"full table: {tmp_path / 'table_toy.md'}" in text


def test_intervals_on_few_prompts_are_marked_once_per_table(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    few = with_intervals(results_frame([fake_result("ar", 2.0), fake_result("csd", 1.0, lam=0.3)]), 2)
    markdown, notes = markdown_table(few)
    assert markdown.count(SMALL_N) == 5  # each run's CLIP and scene accuracy, the CSD run's speed-up
    assert sum(SMALL_N in note for note in notes) == 1
    with caplog.at_level("WARNING"):
        write_tables(few, tmp_path)
    assert sum("fewer than 20 prompts" in r.getMessage() for r in caplog.records) == 1
    assert SMALL_N in console_tables(few, tmp_path)
    many = with_intervals(results_frame([fake_result("ar", 2.0), fake_result("csd", 1.0, lam=0.3)]), 400)
    assert SMALL_N not in markdown_table(many)[0] + "".join(markdown_table(many)[1])


def test_outliers_are_far_off_the_others_and_their_intervals() -> None:
    nan = [np.nan] * 4
    assert outliers([90.0, 90.1, 85.0, 89.9], nan, nan).tolist() == [False, False, True, False]
    # the same points with +-1.2 intervals: 85 is some intervals away from the others, not off the scale
    clip = np.array([90.0, 90.1, 85.0, 89.9])
    assert not outliers(clip, clip - 1.2, clip + 1.2).any()
    fid = np.array([0.008, 0.009, 0.238, 0.006])
    assert outliers(fid, fid - 0.004, fid + 0.004).tolist() == [False, False, True, False]
    assert not outliers([0.008, 0.009, 0.238], [np.nan] * 3, [np.nan] * 3).any()  # three runs: none clipped


def test_speedups_name_their_ar_run_and_warn_when_it_was_timed_elsewhere(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The report says which AR run its speed-ups divide by, and warns in one line when that run's run.json names
    another host or other software versions than a run it is compared with: their latencies come from two machines."""
    import json

    from csd.report.collect import load_run

    runs = [make_run(tmp_path / "0_ar", "ar", latency=4.0), make_run(tmp_path / "1_sjd", "sjd", latency=2.0),
            make_run(tmp_path / "2_sjd", "sjd", latency=2.5, method_params={"window": 8})]
    hosts = ["gpu-node-1", "laptop", "laptop"]
    cfg = eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed"]})
    for run, host in zip(runs, hosts, strict=True):
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(info | {"host": host, "versions": {"torch": "2.14.1"}}))
        evaluate_run(run, cfg)
    caplog.clear()
    with caplog.at_level("INFO", logger="csd"):
        results_frame([load_run(run) for run in runs], n_boot=0)
    said = [r.getMessage() for r in caplog.records]
    assert any("speed-ups of toy/toy divide by the AR run" in m and str(runs[0]) in m for m in said), said
    warned = [m for m in said if "timed on another machine" in m]
    assert len(warned) == 1 and "gpu-node-1" in warned[0] and "laptop" in warned[0] and "2 of" in warned[0], said
    caplog.clear()
    info = json.loads((runs[0] / "run.json").read_text())
    (runs[0] / "run.json").write_text(json.dumps(info | {"host": "laptop"}))
    with caplog.at_level("INFO", logger="csd"):
        results_frame([load_run(run) for run in runs], n_boot=0)
    assert not [r for r in caplog.records if "timed on another machine" in r.getMessage()]
