"""W&B tracking writes an offline run with the per-image table, images, heatmaps and summary metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import wandb
from omegaconf import OmegaConf

from csd.evaluate import evaluate_run
from tests.evaluation.test_eval_fixtures import REPO, eval_cfg, make_run

pytestmark = pytest.mark.slow  # each test evaluates a run into an offline W&B run


def test_offline_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}\n")
    run = make_run(sweep / "0_csd", "csd", method_params={"lam": 0.5, "delta": 0.3}, relaxed_every=4)
    cfg = eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed", "content"]})
    cfg.logger = OmegaConf.load(REPO / "conf/logger/wandb.yaml")
    evaluate_run(run, cfg)
    wandb.teardown()  # the W&B service writes the run file asynchronously: flush it before reading
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    data = next(offline[0].glob("run-*.wandb")).read_bytes()
    for key in (b"latency_mean", b"acceptance_rate", b"step_compression", b"per_image", b"samples",
                b"acceptance_heatmaps", b"sweep"):  # summary keys, logged media, the group (sweep dir name)
        assert key in data, key


def test_reevaluation_resumes_the_same_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run = make_run(tmp_path / "r", "ar")
    cfg = eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed"]})
    cfg.logger = OmegaConf.load(REPO / "conf/logger/wandb.yaml")
    evaluate_run(run, cfg)
    evaluate_run(run, cfg)
    wandb.teardown()
    logs = [p.name for p in (run / "wandb").glob("offline-run-*/run-*.wandb")]
    # one local W&B directory per evaluation, both of the same W&B run: `wandb sync` appends them
    assert len(logs) == 2 and len(set(logs)) == 1, logs
    assert logs[0] == f"run-{(run / 'wandb_id.txt').read_text().strip()}.wandb"


def test_disabled_logger_writes_nothing(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", "ar")
    evaluate_run(run, eval_cfg(tmp_path, **{"eval.toy.metrics": ["speed"]}))
    assert not (run / "wandb").exists()
