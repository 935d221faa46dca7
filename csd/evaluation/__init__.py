"""The evaluate stage: metrics computed from a run directory only (records, images, run.json).

``evaluate_run`` is imported on first use, so readers of ``metrics.json`` (the report stage, the
notebook) do not pay for torch, open_clip and torchmetrics.
"""

from __future__ import annotations

from typing import Any

METRICS_FILE = "metrics.json"
#: one JSON line per record: its (prompt_id, sample) and per-image metric values, for paired comparisons
PER_IMAGE_FILE = "per_image.jsonl"

__all__ = ["METRICS_FILE", "PER_IMAGE_FILE", "evaluate_run"]


def __getattr__(name: str) -> Any:
    if name == "evaluate_run":
        from csd.evaluation.run import evaluate_run

        return evaluate_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
