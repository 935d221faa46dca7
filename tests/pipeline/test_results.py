"""The committed toy results are reproducible: same config and seed -> same tokens; their images (not committed) are
decodes of those tokens, byte for byte the PNGs the runs wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from csd import Decoder
from csd.decode import RunImages
from csd.drafters.eagle import EagleDrafter
from csd.drafters.hawk import HawkDrafter
from csd.drafters.pjd import PJDDrafter
from csd.drafters.ssd import SSDDrafter
from csd.evaluation.toy import scene_checks
from csd.records import load_records, png_bytes
from csd.study import Images

RESULTS = Path(__file__).resolve().parents[2] / "results"
RUNS = sorted(RESULTS.glob("toy_paper/*/run.json"))


@pytest.mark.slow
@pytest.mark.parametrize("run_json", [p for p in RUNS if p.parent.name.split("_", 1)[1] in ("ar", "csd", "sjd_pac")], ids=lambda p: p.parent.name)
def test_committed_toy_run_reproduces(run_json):
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    params = {f"method.{k}": v for k, v in info["method_params"].items()}
    params["model.temperature"] = info["model_info"]["temperature"]
    dec = Decoder(model=info["model"], method=info["method"], device="cpu", **params)
    _, gen = dec.generate(record["prompt"], seed=record["seed"])
    assert gen.tokens.tolist() == record["tokens"]
    assert gen.nfe == record["nfe"]


STUDY = RESULTS / "entropy_study"


@pytest.mark.slow
@pytest.mark.parametrize("run", ["csd_gated_x1.10", "entropy_sjd_x1.10", "amplify_x1.25"])
def test_committed_study_run_reproduces_at_batch_1(run):
    """The study decodes at batch 16; its calibrated knobs give the same tokens one image at a time."""
    test_committed_toy_run_reproduces(STUDY / run / "run.json")


@pytest.mark.slow
@pytest.mark.parametrize("study", ["entropy_study_textured", "entropy_study_textured_outline"])
def test_committed_textured_toy_run_reproduces(study):
    """model=toy_textured's and model=toy_textured_outline's AR runs (each study's reference, batch 16): the first
    image at batch 1."""
    test_committed_toy_run_reproduces(RESULTS / study / "ar" / "run.json")


REGIMES = RESULTS / "entropy_regimes"


@pytest.mark.slow
@pytest.mark.parametrize("run", ["T1.7/csd_gated_x1.10", "T2.1/amplify_x1.25", "T2.4/entropy_sjd_x1.50"])
def test_committed_regime_run_reproduces_at_batch_1(run):
    """A run of the entropy-regimes study (batch 16, at its regime's sampling temperature): its first image at
    batch 1."""
    test_committed_toy_run_reproduces(REGIMES / run / "run.json")


#: the drafters of the committed toy_drafters runs checked below
DRAFTERS = {"eagle": EagleDrafter, "hawk": HawkDrafter, "ssd": SSDDrafter}


@pytest.mark.slow
@pytest.mark.parametrize("run", ["0_sjd", "3_lantern", "4_sjd_tree", "5_hawk", "ssd_r1", "7_vvs_similarity"])
def test_committed_drafter_run_reproduces(run):
    """A run on the toy's shipped heads (EAGLE's chain or static tree, VVS's skipping on it; Hawk's and SSD's spatial
    heads): the drafter's keys go to drafter.*, the rule's to method.*."""
    run_json = RESULTS / "toy_drafters" / run / "run.json"
    info = json.loads(run_json.read_text())
    record = load_records(run_json.parent)[0]
    params = dict(info["method_params"])
    drafter = params.pop("drafter")
    overrides = {f"{'drafter' if k in DRAFTERS[drafter].PARAMS else 'method'}.{k}": "null" if v is None else v
                 for k, v in params.items()}
    dec = Decoder(model="toy", method=info["method"], device="cpu", drafter=drafter, **overrides)
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
    # the sweep (4), 4_sjd_tree, ssd_r0..2, 5_hawk, 6_pjd, 7_vvs_uniform, 7_vvs_similarity
    assert len(list(RESULTS.glob("toy_drafters/*/run.json"))) == 4 + 1 + 3 + 1 + 1 + 2
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


#: sha256 of the PNG of each run's first record as the run wrote it (committed until the images became decodes)
COMMITTED_PNGS = {
    "toy_paper/0_ar": "f6e67cb5830245b916408e91f557fe7ae1e0a019bfdd7cb434b09c4a2a4d0ae2",
    "toy_paper/9_csd": "8712bf96f78b2e347428abab79ef995a25fc342748d67c1992dc23ca54637a1a",
    "entropy_regimes/T2.4/csd_x1.50": "a3231956f3a5e306c446e22b4defa04e611108d07ebb9f8f565150a3bf754b77",
    "entropy_study/amplify_x1.25": "772ebc49bff11c7c2c9f5a8ffc17a0f3e3d7b96e8386ddb98a2f7e6eb5c6fe1b",
    "toy_drafters/4_sjd_tree": "ce9d1070a81812cf0fe3efc74f1760657b0c0820b0da6a6a847b00dddc8fd11f",
    "toy_zipar/1_sjd": "8432bead30dba533722d86bb6311644aa4cb51da05a3ea0cc1799907ec0725e2",
}


@pytest.mark.parametrize("run", COMMITTED_PNGS)
def test_committed_run_decodes_to_the_png_it_wrote(run):
    images = RunImages(RESULTS / run)
    assert hashlib.sha256(png_bytes(images.decode(images.records[0]))).hexdigest() == COMMITTED_PNGS[run]


def test_committed_runs_carry_no_images():
    if shutil.which("git") is None or not (RESULTS.parent / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=RESULTS.parent, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked and not [p for p in tracked if "/images/" in p]
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/toy_paper/0_ar/images/toy-0000_s0.png"],
                             cwd=RESULTS.parent)
    assert ignored.returncode == 0  # a decode or a rerun does not add them back


@pytest.mark.parametrize("run", ["toy_paper/9_csd", "entropy_study/csd_x1.10"])
def test_committed_runs_evaluation_inputs_decode(run):
    """Without PNGs the scene checker sees, in the decodes, what the run's evaluation saw in its PNGs (per_image.jsonl)."""
    run_dir = RESULTS / run
    records = load_records(run_dir)[:6]
    images = RunImages(run_dir, records)
    checks = scene_checks(records, [Image.fromarray(images.decode(r)) for r in records], None)
    evaluated = [json.loads(line) for line in (run_dir / "per_image.jsonl").read_text().splitlines()[:6]]
    assert [(e["prompt_id"], e["sample"]) for e in evaluated] == [(r["prompt_id"], r["sample"]) for r in records]
    study = Images(None)  # the study's reader (csd.study)
    for record, check, seen in zip(records, checks, evaluated, strict=True):
        assert {k: bool(check[k]) for k in ("object", "colour", "count", "overall")} == {
            k: seen[f"scene_{k}"] for k in ("object", "colour", "count", "overall")}
        assert study.of(run_dir, record)[1] == check
