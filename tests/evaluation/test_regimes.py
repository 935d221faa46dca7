"""The cross-regime table and figure (csd/report/regimes.py, experiments/entropy_regimes.py) on fixture study
directories: the loss vs AR at a target is the study's mixture of two runs minus AR, paired over prompts; regimes
are ordered by AR's entropy; a directory that is not a finished study is refused in one line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from csd.evaluation.intervals import paired_difference
from csd.report.regimes import mixed_rows, regime_summary
from experiments import entropy_regimes

SCENE = {"ar": [1, 1, 1, 0, 1, 1], "sjd": [1, 1, 1, 0, 1, 1], "r_x1.10": [1, 0, 1, 0, 1, 1],
         "r_x1.50": [0, 0, 1, 0, 0, 1]}
CLIP = {"ar": [90.0, 80, 85, 70, 95, 90], "sjd": [90.0, 80, 85, 70, 95, 90], "r_x1.10": [85.0, 60, 85, 65, 95, 80],
        "r_x1.50": [40.0, 50, 80, 60, 30, 85]}
REGIONS = {"object": 0.01, "smooth": 0.02, "textured": 0.04}


def write_run(root: Path, name: str, temperature: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    rows = [{"prompt_id": f"p{i}", "sample": 0, "scene_overall": bool(s), "clip_score": c, "tag": "text"}
            for i, (s, c) in enumerate(zip(SCENE[name], CLIP[name], strict=True))]
    (run / "per_image.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.json").write_text(json.dumps({"metrics": {}}))
    info = {"vocab_size": 256, "temperature": temperature, "guidance_scale": 1.5}
    (run / "run.json").write_text(json.dumps({"model_info": info}))


def fixture_study(root: Path, temperature: float, entropy: float) -> Path:
    """A finished study's files as csd.study writes them: runs ar, sjd, r_x1.10, r_x1.50; x1.25 lies between the
    two rule runs (weight 0.25 on r_x1.10), x2.00 beyond them."""
    for name in SCENE:
        write_run(root, name, temperature)
    cell = {"value": 5 / 6, "interval": [0.5, 1.0]}
    study = {"targets": [1.1, 1.25, 2.0],
             "references": {"ar": {"scene_acc_overall": cell, "clip_score": {"value": 85.0, "interval": None}}},
             "ar_entropy_by_region": {"object": {"n": 100, "mean": entropy}, "smooth": {"n": 300, "mean": 3 * entropy},
                                      "textured": {"n": 0, "mean": math.nan}},
             "rules": {"r": [{"gain": g, "run": f"r_x{g:.2f}", "relaxed_by_region": {
                 k: {"relaxed_rate": v * g} for k, v in REGIONS.items()}} for g in (1.1, 1.5)]
                 + [{"gain": 2.0, "unmatched": "unreachable"}]},
             "at_targets": {"r": [{"gain": 1.1, "mixture": {"sjd": 0.0, "r_x1.10": 1.0}},
                                  {"gain": 1.25, "mixture": {"r_x1.10": 0.25, "r_x1.50": 0.75}},
                                  {"gain": 2.0, "outside": [3.0, 4.5]}]}}
    (root / "study").mkdir()
    (root / "study" / "study.json").write_text(json.dumps(study))
    return root


def rows(root: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (root / name / "per_image.jsonl").read_text().splitlines()]


def test_mixed_rows_mix_every_numeric_column_per_image(tmp_path: Path) -> None:
    root = fixture_study(tmp_path, 1.7, 0.5)
    a, b = rows(root, "r_x1.10"), rows(root, "r_x1.50")
    b[2]["clip_score"] = None
    mixed = mixed_rows(a, b[1:], 0.25)  # p0 is in one run only: left out
    assert [r["prompt_id"] for r in mixed] == ["p1", "p2", "p3", "p4", "p5"] and "tag" not in mixed[0]
    assert mixed[0]["scene_overall"] == pytest.approx(0.0) and mixed[3]["scene_overall"] == pytest.approx(0.25)
    assert mixed[0]["clip_score"] == pytest.approx(0.25 * 60 + 0.75 * 50) and mixed[1]["clip_score"] is None


def test_loss_vs_ar_is_the_mixture_minus_ar_paired(tmp_path: Path) -> None:
    root = fixture_study(tmp_path, 1.7, 0.5)
    summary = regime_summary(root, n_boot=200)
    assert summary["entropy_mean"] == pytest.approx((100 * 0.5 + 300 * 1.5) / 400)
    assert summary["entropy_over_log_v"] == pytest.approx(summary["entropy_mean"] / math.log(256))
    assert summary["temperature"] == 1.7 and summary["sjd_loss"]["scene_acc_overall"] == {"value": 0.0,
                                                                                        "interval": [0.0, 0.0]}
    at_10, at_25, beyond = summary["loss"]["r"]
    mean = {name: sum(v) / 6 for name, v in SCENE.items()}
    assert at_10["loss"]["scene_acc_overall"]["value"] == pytest.approx(mean["r_x1.10"] - mean["ar"])
    want = 0.25 * mean["r_x1.10"] + 0.75 * mean["r_x1.50"] - mean["ar"]
    cell = at_25["loss"]["scene_acc_overall"]
    assert cell["value"] == pytest.approx(want) and cell["interval"][0] < want < cell["interval"][1]
    clip = {name: sum(v) / 6 for name, v in CLIP.items()}
    assert at_25["loss"]["clip_score"]["value"] == pytest.approx(0.25 * clip["r_x1.10"] + 0.75 * clip["r_x1.50"]
                                                                 - clip["ar"])
    # a negative control: the unpaired difference of the two rule runs is a different number
    other = paired_difference(rows(root, "r_x1.50"), rows(root, "ar"), "scene_acc_overall", 0)
    assert other is not None and other.value != pytest.approx(want)
    assert beyond == {"gain": 2.0, "outside": [3.0, 4.5]}
    assert summary["regions"]["r"][1] == {"gain": 1.5, "rates": {k: pytest.approx(v * 1.5) for k, v in REGIONS.items()}}


@pytest.mark.slow
def test_build_orders_regimes_by_entropy_and_cli_refuses_a_non_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    high = fixture_study(tmp_path / "T2.1", 2.1, 1.0)
    low = fixture_study(tmp_path / "T1.7", 1.7, 0.2)
    out = tmp_path / "report"
    monkeypatch.setattr(sys, "argv", ["entropy_regimes.py", str(high), str(low), "--out", str(out), "--bootstrap", "50"])
    entropy_regimes.main()
    summary = json.loads((out / "regimes.json").read_text())
    assert [r["temperature"] for r in summary] == [1.7, 2.1]
    text = (out / "regimes.md").read_text()
    assert text.index("T=1.7, g=1.5") < text.index("T=2.1, g=1.5") and "unreached" in text
    assert "| T=1.7, g=1.5 | r | x1.50 | 0.0150 | 0.0300 | 0.0600 |" in text
    assert (out / "regimes.png").stat().st_size > 0
    (tmp_path / "bare").mkdir()
    monkeypatch.setattr(sys, "argv", ["entropy_regimes.py", str(tmp_path / "bare")])
    with pytest.raises(SystemExit) as exit_info:
        entropy_regimes.main()
    assert exit_info.value.code == 2
    assert f"{tmp_path / 'bare'} is not a finished study directory" in capsys.readouterr().err.splitlines()[-1]


def test_regimes_figure_keeps_its_legends_off_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from csd.report.regimes import figure
    from tests.evaluation.test_figures import covered_axes, cut_parts, legends

    regimes = [regime_summary(fixture_study(tmp_path / f"T{t}", t, e), n_boot=20) for t, e in ((1.7, 0.2), (2.1, 1.0))]
    kept: list[plt.Figure] = []
    monkeypatch.setattr(plt, "close", kept.append)
    figure(regimes, tmp_path)
    (fig,) = kept
    fig.canvas.draw()
    assert len(legends(fig)) == 2 and not covered_axes(fig) and not cut_parts(fig)
    plt.close(fig)
