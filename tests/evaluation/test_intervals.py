"""Bootstrap intervals over prompts, paired comparisons with AR, FID's interval, and how the report shows them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.container import ErrorbarContainer

from csd.evaluate import evaluate_run
from csd.evaluation import PER_IMAGE_FILE
from csd.evaluation.fid import generated_fid, load_reference, module_fid
from csd.evaluation.fid_interval import (
    FeatureRecorder,
    Moments,
    fid_interval,
    jackknife_groups,
    jackknife_interval,
    moments_fid,
    psd_sqrt,
    reference_moments,
)
from csd.evaluation.intervals import paired_difference, paired_speedup, point_estimates, run_intervals
from csd.report import build_report
from csd.report.collect import results_frame
from csd.report.pareto import pareto_figure
from csd.report.table import FLAG, MIN_PROMPTS, NOTE_FLAG, interval_cell, markdown_table, paper_table
from tests.evaluation.test_eval_fid import MeanColourFeatures, images
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run
from tests.evaluation.test_eval_toy import SCENES, fake_toy, generated  # noqa: F401  (fake_toy: a fixture)


def covered(values: np.ndarray, prompt_ids: list[str], truth: float, seed: int) -> tuple[bool, float]:
    lo, hi = run_intervals(prompt_ids, {"clip_score": values.tolist()}, ["clip_score"], 1000, seed)["clip_score"]
    return lo <= truth <= hi, hi - lo


@pytest.mark.statistical
def test_prompt_bootstrap_covers_the_mean() -> None:
    rng = np.random.default_rng(1)
    ids = [f"p{i}" for i in range(40)]
    hits = [covered(rng.normal(3.0, 1.0, 40), ids, 3.0, seed)[0] for seed in range(200)]
    assert 0.90 <= np.mean(hits) <= 0.99


@pytest.mark.statistical
def test_few_prompts_give_too_narrow_intervals() -> None:
    # why the report marks intervals over fewer than MIN_PROMPTS prompts: the percentile bootstrap undercovers
    rng = np.random.default_rng(3)
    coverage = {}
    for n in (5, MIN_PROMPTS):
        ids = [f"p{i}" for i in range(n)]
        coverage[n] = np.mean([covered(rng.normal(3.0, 1.0, n), ids, 3.0, seed)[0] for seed in range(400)])
    assert coverage[5] < 0.87 and coverage[MIN_PROMPTS] >= 0.9  # measured: 0.835 and 0.905 (nominal 0.95)


@pytest.mark.statistical
def test_samples_of_a_prompt_are_resampled_together() -> None:
    # 50 prompts x 4 samples that share a strong prompt effect: 200 correlated images are worth ~50 independent ones
    rng = np.random.default_rng(2)
    prompts = [f"p{i}" for i in range(50) for _ in range(4)]
    images_as_prompts = [f"i{i}" for i in range(200)]
    cluster, naive, widths = [], [], []
    for seed in range(200):
        values = np.repeat(rng.normal(0.0, 1.0, 50), 4) + rng.normal(0.0, 0.2, 200)
        hit, width = covered(values, prompts, 0.0, seed)
        cluster.append(hit)
        widths.append(width)
        naive.append(covered(values, images_as_prompts, 0.0, seed)[0])
    assert 0.90 <= np.mean(cluster) <= 0.99
    assert np.mean(naive) < 0.8  # treating the samples as independent is overconfident
    assert np.mean(widths) == pytest.approx(2 * 1.96 * np.sqrt((1 + 0.04 / 4) / 50), rel=0.1)


def test_rates_and_task_means_follow_the_metric_definitions() -> None:
    per_image = {
        "drafts_accepted": [1, 0, 9], "drafts_proposed": [2, 8, 10],
        "geneval_correct": [1, 0, 1, 1], "geneval_tag": ["colors", "colors", "counting", "counting"],
    }
    rates = point_estimates(["a", "b", "c"], {k: per_image[k] for k in ("drafts_accepted", "drafts_proposed")})
    assert rates["acceptance_rate"] == pytest.approx(10 / 20)  # summed counters, not a mean of per-image rates
    scores = point_estimates(["a", "a", "b", "c"], {k: per_image[k] for k in ("geneval_correct", "geneval_tag")})
    assert scores == pytest.approx({"geneval_colors": 0.5, "geneval_counting": 1.0, "geneval_overall": 0.75})


def rows(values: list[float], latency: list[float | None] | None = None, samples: int = 1) -> list[dict[str, Any]]:
    """per_image.jsonl rows of ``len(values) / samples`` prompts."""
    out = [{"prompt_id": f"p{i // samples:03d}", "sample": i % samples, "clip_score": v} for i, v in enumerate(values)]
    for row, lat in zip(out, latency or [], strict=False):
        row["latency_s"] = lat
    return out


def test_identical_runs_differ_by_exactly_zero() -> None:
    rng = np.random.default_rng(3)
    run = rows(rng.normal(90, 5, 30).tolist(), rng.uniform(0.5, 2.0, 30).tolist(), samples=3)
    same = paired_difference(run, [dict(r) for r in run], "clip_score", 1000)
    assert same.value == 0.0 and same.interval == [0.0, 0.0] and same.n_images == 30
    speed = paired_speedup(run, [dict(r) for r in run], 1000)
    assert speed.value == 1.0 and speed.interval == [1.0, 1.0]


def test_pairing_removes_the_prompt_variance() -> None:
    rng = np.random.default_rng(4)
    ar = rng.normal(90, 5, 60)
    method = ar - 0.5 + rng.normal(0, 0.1, 60)
    d = paired_difference(rows(method.tolist()), rows(ar.tolist()), "clip_score", 1000)
    assert d.value == pytest.approx(method.mean() - ar.mean())
    assert -0.55 < d.interval[0] < d.interval[1] < -0.45  # excludes 0
    alone = run_intervals([f"p{i:03d}" for i in range(60)], {"clip_score": method.tolist()}, ["clip_score"], 1000)
    assert d.interval[1] - d.interval[0] < (alone["clip_score"][1] - alone["clip_score"][0]) / 20


def test_pairs_only_common_images_with_values() -> None:
    ar = rows([1.0] * 6, [2.0] * 6)
    method = rows([1.0] * 4, [1.0, None, 0.5, 0.5])  # prompts p004, p005 missing; p001 not timed
    speed = paired_speedup(method, ar, 200)
    assert speed.n_images == 4 and speed.value == pytest.approx(2.0 / (2.0 / 3))
    assert paired_difference(method, ar, "geneval_overall", 200) is None


# ------------------------------------------------------------------------------------------------ FID


def test_fid_interval_from_the_recorded_features() -> None:
    cpu = torch.device("cpu")
    results = {}
    for shift in (0, 60):
        metric = module_fid(MeanColourFeatures())
        load_reference(metric, {"ref": "k"}, lambda: (torch.stack(images()[i:i + 8]) for i in range(0, 24, 8)), None, cpu)
        with FeatureRecorder(metric.inception) as recorder:
            value = generated_fid(metric, (torch.stack(images(shift)[i:i + 5]) for i in range(0, 24, 5)), cpu)
        feats = recorder.features
        assert torch.equal(feats, MeanColourFeatures()(torch.stack(images(shift))).double())  # records order
        ref_mean, ref_cov = reference_moments(metric)
        ref_sqrt = psd_sqrt(ref_cov)
        assert moments_fid(Moments.of(feats, ref_sqrt), ref_mean, ref_cov, ref_sqrt) == pytest.approx(value, rel=1e-5, abs=1e-5)
        left_out = Moments.of(feats, ref_sqrt) - Moments.of(feats[:4], ref_sqrt)
        assert moments_fid(left_out, ref_mean, ref_cov, ref_sqrt) == pytest.approx(
            moments_fid(Moments.of(feats[4:], ref_sqrt), ref_mean, ref_cov, ref_sqrt), rel=1e-6, abs=1e-9)
        ids = [f"p{i // 2}" for i in range(24)]  # 2 samples per prompt
        results[shift] = (value, fid_interval(metric, feats, ids, 1))
    (same, (lo0, hi0)), (shifted, (lo, hi)) = results[0], results[60]
    assert lo0 == 0.0 and abs(same) < hi0 < lo < shifted < hi  # clipped at 0; a real shift is outside the no-shift interval
    assert fid_interval(metric, feats, ids, 0) is None
    with pytest.raises(ValueError, match="24 generated FID features for 23 records"):
        fid_interval(metric, feats, ids[:23], 1)


def test_jackknife_groups_keep_prompts_together() -> None:
    ids = [f"p{i // 3}" for i in range(90)]
    group = jackknife_groups(ids)
    assert len(set(group)) == 20 and all(len(set(group[i:i + 3])) == 1 for i in range(0, 90, 3))
    assert sorted(set(jackknife_groups(ids[:12]))) == [0, 1, 2, 3]  # 4 prompts: delete-one-prompt


@pytest.mark.statistical
def test_jackknife_covers_the_expected_fid() -> None:
    """Gaussian features, N = 60, D = 8: the interval covers E[FID_60] (FID's small-set bias included) ~95 %."""
    rng = np.random.default_rng(6)
    d, n = 8, 60
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    ref_cov = torch.as_tensor(mix @ mix.T + 0.1 * np.eye(d))
    ref_mean = torch.zeros(d, dtype=torch.float64)
    root = np.linalg.cholesky(1.2 * ref_cov.numpy())

    def draw() -> torch.Tensor:
        return torch.as_tensor(rng.normal(size=(n, d)) @ root.T + 0.1)

    ref_sqrt = psd_sqrt(ref_cov)
    expected = np.mean([moments_fid(Moments.of(draw(), ref_sqrt), ref_mean, ref_cov, ref_sqrt) for _ in range(2000)])
    ids = [f"p{i}" for i in range(n)]
    hits = []
    for _ in range(200):
        lo, hi = jackknife_interval(draw(), ids, ref_mean, ref_cov)
        hits.append(lo <= expected <= hi)
    assert 0.90 <= np.mean(hits) <= 0.99


# --------------------------------------------------------------------------------------- evaluate stage


def test_metrics_json_has_intervals_and_per_image_rows(tmp_path: Path, fake_toy: None) -> None:  # noqa: F811
    run = make_run(tmp_path / "csd", method="csd", n_images=4, relaxed_every=4, method_params={"lam": 0.5, "delta": 0.3},
                   metas=SCENES, images=[generated(i) for i in range(4)])
    cfg = eval_cfg(tmp_path, **{"eval.toy.render": "tests.evaluation.test_eval_toy.render_scene", "eval.bootstrap": 200})
    result = evaluate_run(run, cfg)
    on_disk = json.loads((run / "metrics.json").read_text())
    assert on_disk["intervals"] == result["intervals"]
    assert on_disk["protocol"]["bootstrap"]["resamples"] == 200 and on_disk["protocol"]["bootstrap"]["unit"].startswith("prompt")
    lines = [json.loads(line) for line in (run / PER_IMAGE_FILE).read_text().splitlines()]
    assert [(r["prompt_id"], r["sample"]) for r in lines] == [(f"p{i:03d}", 0) for i in range(4)]
    assert [r["scene_position"] for r in lines] == [None, True, False, None]  # only prompts with a relation count
    columns = {k: [r[k] for r in lines] for k in lines[0]}
    point = point_estimates(columns["prompt_id"], columns)
    m = result["metrics"]
    for name in ("clip_score", "step_compression", "nfe_mean", "latency_mean", "acceptance_rate", "relaxed_rate",
                 "scene_acc_overall", "scene_acc_position", "scene_acc_colour", "fid"):
        lo, hi = result["intervals"][name]
        assert lo <= hi
        if name != "fid":
            assert point[name] == pytest.approx(m[name])
            assert lo <= m[name] <= hi
    off = evaluate_run(run, eval_cfg(tmp_path, **{"eval.toy.render": "tests.evaluation.test_eval_toy.render_scene", "eval.bootstrap": 0}))
    assert off["intervals"] == {} and "bootstrap" not in off["protocol"]


def test_batched_latency_comes_from_the_probe(tmp_path: Path) -> None:
    run = make_run(tmp_path / "b", method="sjd", n_images=4)
    recs = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for rec in recs[2:]:
        rec["latency_s"] = None  # decoded in a batch
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    info = json.loads((run / "run.json").read_text())
    probe = {"prompt_id": "p002", "sample": 0, "latency_s": 7.0, "prefill_s": 1.0, "decode_s": 6.0}
    (run / "run.json").write_text(json.dumps(info | {"latency_probe": [probe]}))
    result = evaluate_run(run, eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed"]}))
    lines = [json.loads(line) for line in (run / PER_IMAGE_FILE).read_text().splitlines()]
    assert [r["latency_s"] for r in lines] == [recs[0]["latency_s"], recs[1]["latency_s"], 7.0, None]
    assert result["metrics"]["latency_mean"] == pytest.approx((recs[0]["latency_s"] + recs[1]["latency_s"] + 7.0) / 3)
    assert result["intervals"]["latency_mean"][1] <= 7.0


# ---------------------------------------------------------------------------------------------- report


def fake_run(method: str, clip: list[float], latency: list[float], **params: Any) -> dict[str, Any]:
    """A ``load_run`` result with per-image rows and the intervals evaluate would have written."""
    per_image = rows(clip, latency)
    ids = [r["prompt_id"] for r in per_image]
    columns = {"clip_score": clip, "latency_s": latency}
    metrics = point_estimates(ids, columns)
    return {"run_dir": f"runs/{method}{params}", "per_image": per_image,
            "run": {"method": method, "method_params": {"window": 1 if method == "ar" else 16, **params}, "model": "toy", "dataset": "toy",
                    "n_records": len(clip)},
            "metrics": metrics, "intervals": run_intervals(ids, columns, list(metrics), 500)}


def sweep_frame() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    ar = rng.normal(90, 4, 40)
    lat = rng.uniform(1.0, 2.0, 40)
    results = [
        fake_run("ar", ar.tolist(), lat.tolist()),
        fake_run("ar", ar.tolist(), lat.tolist(), seed_copy=1),  # the same images again
        fake_run("csd", (ar - 5 + rng.normal(0, 0.5, 40)).tolist(), (lat / 2).tolist(), lam=0.5),
        fake_run("csd", (ar + rng.normal(0, 0.5, 40)).tolist(), (lat / 1.5).tolist(), lam=0.1),
    ]
    return results_frame(results, n_boot=500)


def test_report_flags_differences_whose_interval_contains_zero() -> None:
    df = sweep_frame()
    by_label = df.set_index("label")
    assert by_label.loc["csd lam=0.5", "speedup"] == pytest.approx(2.0)
    assert by_label.loc["csd lam=0.5", "d_clip_score_hi"] < -4
    assert by_label.loc["csd lam=0.1", "d_clip_score_lo"] < 0 < by_label.loc["csd lam=0.1", "d_clip_score_hi"]
    markdown, notes = markdown_table(df)
    lines = {line.split("|")[1].strip(): line for line in markdown.splitlines()[2:]}
    assert FLAG in lines["csd lam=0.1"] and FLAG not in lines["csd lam=0.5"]
    assert "0 [0, 0] " + FLAG in lines["ar seed_copy=1"]  # identical AR runs: exactly no difference
    assert NOTE_FLAG in notes and "nan" not in markdown
    table = paper_table(df)
    assert {"CLIP lo", "CLIP hi", "Δ CLIP", "Δ CLIP lo", "Δ CLIP hi", "speed-up lo"} <= set(table.columns)
    assert (table["CLIP lo"] <= table["CLIP"]).all() and (table["CLIP"] <= table["CLIP hi"]).all()


def test_interval_cells() -> None:
    assert interval_cell(93.866, 93.12, 94.61) == "93.9 [93.1, 94.6]"
    assert interval_cell(0.0606, 0.0512, 0.0803) == "0.061 [0.051, 0.080]"
    assert interval_cell(-0.3, -0.8, 0.2, no_difference=0.0) == f"-0.3 [-0.8, 0.2] {FLAG}"
    assert interval_cell(2.5, 2.5, 2.5 + 1e-15) == "2.5 [2.5, 2.5]"
    assert interval_cell(1.0, float("nan"), float("nan")) == "1" and interval_cell(float("nan"), 0, 1) is None


def test_pareto_draws_error_bars() -> None:
    df = sweep_frame()
    fig = pareto_figure(df, ["speedup"], ["clip_score"], "toy")
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == len(df)  # every run has a CLIP interval; the three non-reference runs a speed-up one
    assert sum(c.has_xerr for c in bars) == 3 and all(c.has_yerr for c in bars)
    plt.close(fig)


def test_report_files_show_intervals(tmp_path: Path) -> None:
    from tests.evaluation.test_report import fixture_sweep

    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    out = build_report(sweep, eval_cfg(tmp_path, **{"eval.bootstrap": 100}))
    runs = pd.read_csv(out / "runs.csv")
    assert {"latency_mean_lo", "latency_mean_hi", "speedup_lo", "speedup_hi"} <= set(runs.columns)
    assert "[" in (out / "table_toy.md").read_text() and "percentile-bootstrap" in (out / "report.md").read_text()
