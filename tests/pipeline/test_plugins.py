"""A rule and a drafter of one's own: one Python module plus one YAML file each, outside the package, run through the
command line (``hydra.searchpath`` adds their config directory) and the report, their parameters checked from their
declarations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # run.py in subprocesses

MODULE = '''
"""A rule and a drafter of one's own."""
import torch

from csd.acceptance import AcceptanceRule, Verdict, likelihood_ratio
from csd.drafters.chain import ChainDrafter
from csd.params import Param
from csd.schema import Float


class Floor(AcceptanceRule):
    """b = max(min(1, q/p), floor): at least ``floor`` for every draft."""

    name = "floor"
    lossless = False
    PARAMS = {"floor": Param(Float(min=0, max=1), 0.2, "the least acceptance probability")}

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy):
        lossless = likelihood_ratio(target_probs, draft_probs, drafts).clamp(max=1.0)
        return Verdict(lossless.clamp(min=self.floor), lossless)


class Echo(ChainDrafter):
    """Fresh drafts repeat the last committed code (one-hot recorded, so SJD stays lossless on it)."""

    name = "echo"

    def fresh_drafts(self, start, count, left, gen):
        return torch.full((count,), 0 if left is None else int(left), dtype=torch.long, device=self.device)
'''

METHOD = """defaults: [/method_keys@_here_, _self_]
name: floor
_target_: myplugins.Floor
floor: 0.2
"""

DRAFTER = """name: echo
_target_: myplugins.Echo
window: 6
init: random
coupling: none
draft_record: onehot
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run([sys.executable, str(REPO / "run.py"), f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_rule_and_a_drafter_of_ones_own_run_through_the_cli_and_the_report(tmp_path: Path) -> None:
    (tmp_path / "myplugins").mkdir()
    (tmp_path / "myplugins" / "__init__.py").write_text(MODULE)
    for group, text in (("method", METHOD), ("drafter", DRAFTER)):
        (tmp_path / "conf" / group).mkdir(parents=True)
        (tmp_path / "conf" / group / f"{'floor' if group == 'method' else 'echo'}.yaml").write_text(text)
    common = ("model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=2", "logger=disabled", "engine.warmup=0")
    # the declaration checks the new key, in one line naming it, before any model loads
    bad = run(tmp_path, "method=floor", "drafter=echo", "method.floor=2", *common)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: method.floor=2 must be in [0, 1]", bad.stderr
    typo = run(tmp_path, "method=floor", "method.flor=0.5", *common)
    assert typo.returncode == 2 and "did you mean method.floor?" in typo.stderr
    out = run(tmp_path, "method=floor", "drafter=echo", "method.floor=0.5", "drafter.window=4", *common,
              f"run_dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    table = pd.read_csv(tmp_path / "run" / "report" / "table_janus_pro_tiny.csv")
    assert table["method"].tolist() == ["floor echo floor=0.5"]  # its drafter (not the chain) and its rule's own keys
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["method_params"] == {"drafter": "echo", "window": 4, "init": "random", "coupling": "none",
                                     "draft_record": "onehot", "floor": 0.5}
    assert float(table["step compression"].iloc[0]) > 1  # the echo drafts were proposed and accepted
