"""drafter=draft_model through the config and the command line: its checks before any model loads, a run end to end
with another rule (LANTERN), its records and metrics (``drafter_forwards``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from csd.compose import method_params
from csd.errors import ConfigError
from csd.validate import validate
from tests.pipeline.test_config import make_cfg

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("overrides", "message"), [
    (["drafter.model=nope"], r"^drafter.model='nope': choose one of the \d+ options in conf/model/ \(.*\)$"),
    pytest.param(["drafter.model=janus_pro_tiny"], r"drafter.model=janus_pro_tiny is not a ToyAdapter like model=toy: "
                 r".* choose one of \['toy', 'toy_draft'\]", marks=pytest.mark.slow),  # imports every adapter module
    (["drafter.gamma=0"], "drafter.gamma=0 must be an integer >= 1"),
    (["engine.compile=true"], "drafter=draft_model runs eagerly: set engine.compile=false"),
    (["method=ar"], "method=ar decodes one token per forward, but drafter=draft_model always drafts"),
])
def test_draft_model_settings_are_checked_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(make_cfg("drafter=draft_model", *overrides))
    assert "\n" not in str(err.value)


def test_draft_model_records_its_settings_and_ignores_a_presets_window(caplog):
    cfg = make_cfg("drafter=draft_model", "model=janus_pro_tiny", "drafter.model=janus_pro_tiny", "engine.batch_size=4")
    validate(cfg)
    assert method_params(cfg) == {"drafter": "draft_model", "model": "janus_pro_tiny", "gamma": 4, "lam": 0.1,
                                  "delta": 0.5, "entropy_norm": "none"}
    with caplog.at_level(logging.WARNING):
        validate(make_cfg("method=sjd_l32", "drafter=draft_model"))  # sjd_l32 sets drafter.window=32
    assert "drafter.window (not a key of drafter=draft_model)" in caplog.text


@pytest.mark.slow
def test_lantern_on_toy_draft_drafts_runs_through_the_cli(tmp_path: Path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(REPO / "run.py"), "method=lantern", "drafter=draft_model",
                          "drafter.model=toy_draft", "drafter.gamma=2", "model=toy", "dataset.n_prompts=1",
                          "eval.metrics=[speed]", "logger=disabled", "engine.warmup=0", f"run_dir={tmp_path}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (record,) = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert record["method_params"] == {"drafter": "draft_model", "model": "toy_draft", "gamma": 2, "neighbours": 1000,
                                       "budget": 0.1}
    assert record["drafter_forwards"] == record["drafts_proposed"] > record["nfe"] > 0
    assert record["relaxed_accepts"] > 0  # LANTERN's relaxation acted on the draft model's drafts
    assert 0 < record["drafter_s"] < record["decode_s"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["drafter_forwards"] == record["drafter_forwards"] and metrics["drafter_s_mean"] == record["drafter_s"]
