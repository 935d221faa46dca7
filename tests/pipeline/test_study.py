"""stage=study on the toy model, at a tiny size: end to end, resumable, unreachable targets reported,
bad study configs refused in one line before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from csd import study
from csd.cli import run_stages
from csd.errors import ConfigError
from csd.presets import CONF_DIR
from csd.records import RECORDS_FILE
from tests.evaluation.test_eval_fixtures import REPO

RULES = {
    "csd": {"method": "csd", "knob": "lam", "lo": 0.01, "hi": 30.0, "increasing": True, "log_scale": True, "overrides": {"delta": 1.0}},
    "addition": {"method": "addition", "knob": "c", "lo": 0.001, "hi": 0.5, "increasing": True, "log_scale": True, "overrides": {}},
}


def study_cfg(root: Path, *overrides: str, rules: dict | None = None) -> DictConfig:
    """experiment=entropy_study at a tiny size: 4 prompts, csd and addition (``rules``), x1.25 (reachable) and x50
    (not); ``overrides`` apply to the tiny study."""
    args = ["experiment=entropy_study", "dataset.n_prompts=4", "engine.batch_size=4", "engine.progress=false",
            "study.targets=[1.25,50.0]", "study.calibration_prompts=4", "study.max_evals=6",
            "study.tol=0.1", "eval.bootstrap=50", f"eval.fid.cache_dir={root / 'cache'}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=args)
    with open_dict(cfg):
        cfg.run_dir = str(root / "study")
        cfg.study.rules = OmegaConf.create(rules or RULES)
    for override in overrides:
        key, value = override.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    return cfg


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("study")
    run_stages(study_cfg(root))
    return root / "study"


@pytest.mark.slow
def test_study_runs_end_to_end(finished: Path) -> None:
    out = finished / "study"
    for name in ("study.json", "study.md", "quality_vs_compression.png", "relaxed_by_region.png",
                 "relaxed_by_entropy.png", "entropy_by_region_ar.png", "cost_by_region.png"):
        assert (out / name).stat().st_size > 0, name
    result = json.loads((out / "study.json").read_text())
    sjd = result["references"]["sjd"]["step_compression"]["value"]
    for rule in ("csd", "addition"):
        reachable, unreachable = result["rules"][rule]
        assert reachable["run"] == f"{rule}_x1.25" and (finished / reachable["run"] / "metrics.json").exists()
        quality = reachable["quality"]
        # calibrated on all 4 prompts with the runs' seeds: the run's images are the calibration's, and land in tol
        assert quality["step_compression"]["value"] == pytest.approx(reachable["calibration"]["compression"], rel=1e-12)
        assert quality["step_compression"]["value"] == pytest.approx(1.25 * sjd, rel=0.1)
        for name in ("scene_acc_object", "scene_acc_overall", "clip_score", "fid"):
            lo, hi = quality[name]["interval"]
            assert lo <= quality[name]["value"] <= hi, name
        # every relaxed acceptance of the run is counted in exactly one region of SJD's image
        records = [json.loads(line) for line in (finished / reachable["run"] / RECORDS_FILE).read_text().splitlines()]
        relaxed = sum(r["relaxed_accepts"] for r in records)
        assert relaxed > 0 and sum(c["relaxed"] for c in reachable["cost_by_region"].values()) == relaxed
        by_entropy = reachable["relaxed_by_entropy"]  # every position in one entropy bin, relaxed share in [0, 1]
        assert sum(by_entropy["count"]) == 4 * 16 * 16 and by_entropy["edges"][:2] == [0.0, 1e-3]
        assert sum(n * r for n, r in zip(by_entropy["count"], by_entropy["relaxed"], strict=True) if n) == pytest.approx(relaxed)
        marginal = reachable["marginal_cost"]
        sjd_passes = sum(json.loads(line)["scene_overall"] for line in (finished / "sjd" / "per_image.jsonl").open())
        assert all(marginal[reg]["pairs"] == sjd_passes for reg in marginal)
        # x50 is out of reach: recorded with the compression reached, never run
        assert "run" not in unreachable and unreachable["unmatched"] == "unreachable"
        assert unreachable["calibration"]["compression"] < unreachable["calibration"]["target"]
        assert not (finished / f"{rule}_x50.00").exists()
    ar = result["ar_entropy_by_region"]
    assert sum(h["n"] for h in ar.values()) == 4 * 16 * 16  # every AR position of the 4 images, in one region
    assert "unreachable" in (out / "study.md").read_text()
    # x50 lies beyond every rule's runs: no mixture, never extrapolated
    assert all(cells[1]["outside"] for cells in result["at_targets"].values())
    assert "Quality at exactly the target step compression" in (out / "study.md").read_text()


@pytest.mark.slow
def test_rerun_regenerates_nothing(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [p for p in finished.rglob("*") if p.name in (RECORDS_FILE, "metrics.json", study.CALIBRATION_FILE)]
    stamps = {p: p.stat().st_mtime_ns for p in files}

    def no_decoding(*args: object) -> float:
        raise AssertionError("calibration decoded again")

    monkeypatch.setattr(study.Calibrator, "compression", no_decoding)
    run_stages(study_cfg(finished.parent))
    assert len(files) == 1 + 2 * 4  # the cache, records and metrics of ar, sjd, csd_x1.25, addition_x1.25
    assert {p: p.stat().st_mtime_ns for p in files} == stamps


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("study.rules.csd.lo=abc", "study.rules.csd.lo='abc' must be a finite number >= 0"),
        ("study.rules.foo={method: foo, knob: c, lo: 0.1, hi: 1.0, increasing: true, log_scale: true, overrides: {}}",
         "study.rules.foo.method='foo': choose one of"),
        ("study.rules.csd.knob=c", "study.rules.csd.knob='c' must be a real-valued hyper-parameter of method=csd"),
        ("study.rules.csd.hi=0.001", "study.rules.csd: need lo < hi"),
        ("study.rules.csd.overrides.delta=2.0", "study.rules.csd at lam=0.01: method.delta=2.0 must be in [0, 1]"),
        ("study.targets=[0.9]", "study.targets=[0.9] must be a non-empty list of finite numbers > 1"),
    ],
)
def test_bad_study_config_is_one_line_before_any_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             override: str, message: str) -> None:
    cfg = study_cfg(tmp_path, override)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("csd.compose.build_adapter", no_model)
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        from csd.validate import validate

        validate(cfg)
        study.check_study(cfg)
    assert not (tmp_path / "study").exists()


@pytest.mark.slow
def test_cli_refuses_a_bad_study_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "run.py"), "experiment=entropy_study", "study.rules.csd.knob=c",
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: study.rules.csd.knob='c' must be a real-valued hyper-parameter of method=csd (it has ['delta', 'entropy_norm', 'lam'])"
    ]
    assert not (tmp_path / "ar").exists()


def test_quality_at_exact_targets_mixes_the_bracketing_runs(tmp_path: Path) -> None:
    """Each target is met exactly by mixing the two runs on either side of it (SJD is every rule's lossless end):
    per-image means mix with the weight that gives the target's compression; beyond the furthest run: outside."""
    compression = {"sjd": [3.0, 3.0, 3.0, 3.0], "r_x1.10": [4.0, 4.0, 4.0, 4.0], "r_x1.50": [5.0, 7.0, 6.0, 6.0]}
    scene = {"sjd": [1, 1, 1, 0], "r_x1.10": [1, 0, 1, 0], "r_x1.50": [0, 0, 1, 0]}
    for run, values in compression.items():
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.json").write_text(json.dumps({"metrics": {"step_compression": sum(values) / 4}}))
        rows = [{"prompt_id": f"p{i}", "sample": 0, "step_compression": c, "scene_overall": bool(s)}
                for i, (c, s) in enumerate(zip(values, scene[run], strict=True))]
        (tmp_path / run / "per_image.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entries = [{"run": "r_x1.10"}, {"run": "r_x1.50"}, {"unmatched": "unreachable"}]
    low, high, beyond = study.at_targets(tmp_path, entries, [1.1, 1.5, 3.0], ["step_compression", "scene_acc_overall"],
                                         n_boot=200)
    assert low["mixture"] == pytest.approx({"sjd": 0.7, "r_x1.10": 0.3})  # 0.7 * 3 + 0.3 * 4 = 3.3
    assert high["mixture"] == pytest.approx({"r_x1.10": 0.75, "r_x1.50": 0.25})  # 0.75 * 4 + 0.25 * 6 = 4.5
    for cell, gain in ((low, 1.1), (high, 1.5)):
        assert cell["quality"]["step_compression"]["value"] == pytest.approx(gain * 3.0)
    assert low["quality"]["step_compression"]["interval"] == pytest.approx([3.3, 3.3])  # constant per image
    assert high["quality"]["scene_acc_overall"]["value"] == pytest.approx(0.75 * 0.5 + 0.25 * 0.25)
    lo, hi = high["quality"]["scene_acc_overall"]["interval"]
    assert lo < 0.75 * 0.5 + 0.25 * 0.25 < hi
    assert beyond == {"gain": 3.0, "target": 9.0, "outside": [3.0, 6.0]}


def test_rule_labels_let_one_method_appear_with_different_overrides(tmp_path: Path) -> None:
    """Labels are free; ``method`` names the rule (CSD with and without its TV gate in one study)."""
    gated = {**RULES["csd"], "overrides": {"delta": 0.99}}
    cfg = study_cfg(tmp_path, rules={"csd": RULES["csd"], "csd_gated": gated})
    study.check_study(cfg)
    assert study.rule_method(cfg.study.rules.csd_gated, 2.0).method.delta == 0.99
    assert study.rule_method(cfg.study.rules.csd, 2.0).method.delta == 1.0
    assert study.rule_method(cfg.study.rules.csd_gated, 2.0).method.lam == 2.0


@pytest.mark.slow
def test_figures_when_no_rule_reaches_a_target(tmp_path: Path) -> None:
    """A study whose every target is unreachable (a tiny or high-entropy study can end so) still draws its figures;
    the relaxed-by-entropy figure, which has no run to show, is left out."""
    cell = {"value": 0.5, "interval": [0.4, 0.6]}
    ref = {"step_compression": {"value": 3.0, "interval": [2.9, 3.1]}, "scene_acc_overall": cell, "clip_score": cell,
           "fid": cell}
    entropy = {reg: {"n": 4, "count": [4] + [0] * 15, "edges": study.entropy_edges(256).tolist(), "mean": 0.0}
               for reg in ("object", "smooth", "textured")}
    result = {"references": {"ar": ref, "sjd": ref}, "ar_entropy_by_region": entropy,
              "rules": {"r": [{"gain": 1.25, "unmatched": "unreachable"}]}}
    study.figures(result, tmp_path, ["overall"])
    drawn = sorted(p.name for p in tmp_path.iterdir())
    assert drawn == ["cost_by_region.png", "entropy_by_region_ar.png", "quality_vs_compression.png",
                     "relaxed_by_region.png"]


@pytest.mark.slow
def test_entropy_regimes_preset_is_one_valid_study_per_temperature() -> None:
    """experiment=entropy_regimes: a sweep over the three chosen temperatures (results/entropy_regimes/regimes.md),
    one study directory each, named by the temperature; every regime's study config passes the study's checks."""
    from csd.validate import validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        sweep = compose(config_name="config", overrides=["experiment=entropy_regimes"], return_hydra_config=True)
        assert sweep.hydra.mode.name == "MULTIRUN" and sweep.stage == "study"
        assert sweep.hydra.sweeper.params == {"model.temperature": "1.7,2.1,2.4"}
        assert OmegaConf.to_container(sweep.hydra.sweep, resolve=False)["subdir"] == "T${model.temperature}"
        for temperature in (1.7, 2.1, 2.4):
            cfg = compose(config_name="config", overrides=["experiment=entropy_regimes", f"model.temperature={temperature}"])
            with open_dict(cfg):
                cfg.run_dir = "unused"
            validate(cfg)
            assert cfg.model.temperature == temperature and cfg.model.guidance_scale == 1.5
        study.check_study(cfg)  # the rules and brackets, the same in every regime
    assert set(cfg.study.rules) == {"csd", "csd_gated", "entropy_sjd", "amplify", "addition"}


@pytest.mark.slow
def test_the_study_loads_its_model_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration and every run of a study decode with one adapter (and, compiled, one compiled step): the
    weights load once, never twice at the same time, and the graphs compile once for the study."""
    import functools

    import csd.adapters.toy as toy
    from csd.fast import CompiledStep

    loads, steps, loader, init = [], [], toy.load_toy_adapter, CompiledStep.__init__

    @functools.wraps(loader)  # the loader's return annotation tells what the model supports
    def counted(*args, **kwargs):
        loads.append(kwargs.get("device"))
        return loader(*args, **kwargs)

    def counted_step(self, *args, **kwargs):
        steps.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(toy, "load_toy_adapter", counted)
    monkeypatch.setattr(CompiledStep, "__init__", counted_step)
    run_stages(study_cfg(tmp_path, "engine.compile=true", "engine.compile_backend=eager",
                         rules={"csd": RULES["csd"]}))
    assert (tmp_path / "study" / "csd_x1.25" / "metrics.json").exists()  # calibrated, then run
    assert len(loads) == 1 and len(steps) == 1
