"""The metrics of the evaluate stage (``csd.evaluate``), computed from a run directory only (records, images,
run.json), and the files it writes: readers of ``metrics.json`` (the report stage, the notebook) import this package
without paying for torch, open_clip and torchmetrics.
"""

from __future__ import annotations

METRICS_FILE = "metrics.json"
#: one JSON line per record: its (prompt_id, sample) and per-image metric values, for paired comparisons
PER_IMAGE_FILE = "per_image.jsonl"
