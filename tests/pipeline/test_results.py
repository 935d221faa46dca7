"""The committed toy results are reproducible: same config and seed -> same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csd import Decoder
from csd.drafters.eagle import EagleDrafter
from csd.drafters.pjd import PJDDrafter
from csd.records import load_records

RESULTS = Path(__file__).resolve().parents[2] / "results"
RUNS = sorted(RESULTS.glob("toy_paper/*/run.json"))


@pytest.mark.slow
@pytest.mark.parametrize("run_json", [p for p in RUNS if p.parent.name.split("_", 1)[1] in ("ar", "csd", "sjd_pac")], ids=lambda p: p.parent.name)
def test_committed_toy_run_reproduces(run_json):
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    params = {f"method.{k}": v for k, v in info["method_params"].items()}
    params["model.temperature"] = info["model_info"]["temperature"]
    dec = Decoder(model="toy", method=info["method"], device="cpu", **params)
    _, gen = dec.generate(record["prompt"], seed=record["seed"])
    assert gen.tokens.tolist() == record["tokens"]
    assert gen.nfe == record["nfe"]


STUDY = RESULTS / "entropy_study"


@pytest.mark.slow
@pytest.mark.parametrize("run", ["csd_gated_x1.10", "entropy_sjd_x1.10", "amplify_x1.25"])
def test_committed_study_run_reproduces_at_batch_1(run):
    """The study decodes at batch 16; its calibrated knobs give the same tokens one image at a time."""
    test_committed_toy_run_reproduces(STUDY / run / "run.json")


REGIMES = RESULTS / "entropy_regimes"


@pytest.mark.slow
@pytest.mark.parametrize("run", ["T1.7/csd_gated_x1.10", "T2.1/amplify_x1.25", "T2.4/entropy_sjd_x1.50"])
def test_committed_regime_run_reproduces_at_batch_1(run):
    """A run of the entropy-regimes study (batch 16, at its regime's sampling temperature): its first image at
    batch 1."""
    test_committed_toy_run_reproduces(REGIMES / run / "run.json")


@pytest.mark.slow
@pytest.mark.parametrize("run", ["0_sjd", "3_lantern", "4_sjd_tree"])
def test_committed_drafter_run_reproduces(run):
    """A run on the toy's shipped EAGLE head (a chain, or its static tree): the drafter's keys go to drafter.*, the
    rule's to method.*."""
    run_json = RESULTS / "toy_drafters" / run / "run.json"
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    params = dict(info["method_params"])
    assert params.pop("drafter") == "eagle"
    overrides = {f"{'drafter' if k in EagleDrafter.PARAMS else 'method'}.{k}": "null" if v is None else v
                 for k, v in params.items()}
    dec = Decoder(model="toy", method=info["method"], device="cpu", drafter="eagle", **overrides)
    _, gen = dec.generate(record["prompt"], seed=record["seed"])
    assert gen.tokens.tolist() == record["tokens"]
    assert gen.nfe == record["nfe"]


@pytest.mark.slow
def test_committed_zipar_run_reproduces():
    """A ZipAR run (``experiment=toy_zipar``, window_size 4): its first image, token for token."""
    run_json = RESULTS / "toy_zipar" / "1_sjd" / "run.json"
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    assert info["method_params"] == {"drafter": "zipar", "window_size": 4}
    dec = Decoder(model="toy", method=info["method"], device="cpu", drafter="zipar", **{"drafter.window_size": 4})
    _, gen = dec.generate(record["prompt"], seed=record["seed"])
    assert gen.tokens.tolist() == record["tokens"]
    assert gen.nfe == record["nfe"]


def test_committed_results_exist():
    assert len(RUNS) == 12, "run experiments/reproduce_toy_results.sh"
    assert (RESULTS / "toy_paper/report/table_toy.md").exists()
    assert (RESULTS / "ablation_lambda_delta/report/pareto_toy.png").exists()
    assert len(list(RESULTS.glob("toy_drafters/*/run.json"))) == 5
    assert (STUDY / "study/study.md").exists() and (STUDY / "study/quality_vs_compression.png").exists()
    assert len(list(REGIMES.glob("T*/*/run.json"))) == 3 * 17
    assert (REGIMES / "report/regimes.md").exists() and (REGIMES / "report/regimes.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("run", ["2_sjd", "3_csd"])
def test_committed_spatial_run_reproduces_at_batch_1(run):
    """A PJD run of ``experiment=toy_spatial`` (batch 16): its first image at batch 1, token for token."""
    run_json = RESULTS / "toy_spatial" / run / "run.json"
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    params = dict(info["method_params"])
    assert params.pop("drafter") == "pjd"
    overrides = {f"{'drafter' if k in PJDDrafter.PARAMS else 'method'}.{k}": v for k, v in params.items()}
    dec = Decoder(model="toy", method=info["method"], device="cpu", drafter="pjd", **overrides)
    _, gen = dec.generate(record["prompt"], seed=record["seed"])
    assert gen.tokens.tolist() == record["tokens"]
    assert gen.nfe == record["nfe"]
