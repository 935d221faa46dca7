"""The comparison notebook runs top to bottom on the committed toy results, from the repo root or notebooks/."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.evaluation.test_eval_fixtures import REPO

ABLATION = REPO / "results" / "ablation_lambda_delta"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("results_dir", "cwd", "expected"),
    [
        (None, REPO, f"12 evaluated runs under {REPO / 'results' / 'toy_paper'}"),  # a fresh clone's default
        (None, REPO / "notebooks", f"12 evaluated runs under {REPO / 'results' / 'toy_paper'}"),  # Jupyter's cwd
        ("results/ablation_lambda_delta", REPO / "notebooks", f"30 evaluated runs under {ABLATION}"),  # from the repo
        (str(ABLATION), REPO, f"30 evaluated runs under {ABLATION}"),
    ],
)
def test_compare_runs_notebook(results_dir: str | None, cwd: Path, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if results_dir is None:
        monkeypatch.delenv("CSD_RESULTS_DIR", raising=False)
    else:
        monkeypatch.setenv("CSD_RESULTS_DIR", results_dir)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(REPO / "notebooks/compare_runs.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert expected in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
