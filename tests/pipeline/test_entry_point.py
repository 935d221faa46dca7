"""``run.py stage=evaluate|report`` on an existing run: evaluate's Hydra files land in the run, the report's in
``runs/report/<time>`` (the report directory holds only the report), a quiet run.log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evaluation.test_eval_fixtures import REPO, make_run

pytestmark = pytest.mark.slow  # every test runs run.py in a subprocess


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy run evaluated (speed + toy-CLIP score, which loads open_clip) then reported, from its parent dir."""
    root = tmp_path_factory.mktemp("cwd")
    make_run(root / "r", "csd", method_params={"lam": 0.1, "delta": 0.5})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    for args in (["stage=evaluate", "run_dir=r", "eval.toy.metrics=[speed,clip_score]"], ["stage=report", "sweep_dir=."]):
        out = subprocess.run([sys.executable, str(REPO / "run.py"), *args, "logger=disabled"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    (root / "report_stdout.txt").write_text(out.stdout)
    return root


def test_evaluate_and_report_write_into_the_given_dirs(evaluated: Path) -> None:
    assert (evaluated / "r" / "metrics.json").exists() and (evaluated / "report" / "table_toy.md").exists()
    assert (evaluated / "r" / "run.log").exists() and (evaluated / "r" / ".hydra" / "evaluate" / "overrides.yaml").exists()
    # the report directory holds only the report: reporting committed results leaves no Hydra files there
    assert not {".hydra", "run.log"} & {p.name for p in (evaluated / "report").iterdir()}
    (log_dir,) = (evaluated / "runs" / "report").iterdir()
    assert (log_dir / "run.log").exists() and (log_dir / ".hydra" / "report" / "overrides.yaml").exists()
    assert sorted(p.name for p in (evaluated / "runs").iterdir()) == ["report"]  # no other stray directory


def test_run_log_has_no_open_clip_info_lines(evaluated: Path) -> None:
    log = "".join(p.read_text() for p in evaluated.rglob("run.log"))
    assert "toy/toy: 4 images" in log  # the evaluate stage's summary line
    assert "toy-clip" not in log  # open_clip's "Parsing model identifier ... toy-clip" INFO lines


def test_a_run_shows_our_progress_bar_but_not_transformers_loading_bar(tmp_path: Path) -> None:
    """The toy loads through ``from_pretrained`` (transformers' "Loading weights" bar); the engine's bar stays."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(REPO / "run.py"), "stage=generate", "dataset.n_prompts=1", "logger=disabled",
                          f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "csd: 100%" in out.stderr and "Loading weights" not in out.stderr


def test_report_prints_the_compact_table(evaluated: Path) -> None:
    printed = (evaluated / "report_stdout.txt").read_text()
    assert "| method " in printed and "latency" not in printed  # the full table (latency, ...) stays in the file
    assert "full table: report/table_toy.md" in printed
