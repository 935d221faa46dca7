"""The comparison notebook runs top to bottom on the committed toy results (``CSD_RESULTS_DIR``)."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_eval_fixtures import REPO


@pytest.mark.slow
def test_compare_runs_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSD_RESULTS_DIR", str(REPO / "results" / "toy_paper"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(REPO / "notebooks/compare_runs.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "6 evaluated runs" in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
