"""The metrics of the evaluate stage by name (``eval.metrics``), imported when used.

Each is a function of the ``csd.evaluation.context.EvalContext`` returning a ``MetricOutput``; naming them here costs
nothing (the CLIP, FID and GenEval modules load open_clip and torchmetrics, seconds), so the config checks list them
without importing any. A new metric is its function plus one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: metric name -> ``module:function``
METRICS: dict[str, str] = {
    "speed": "csd.evaluation.metrics:speed_metric",
    "clip_score": "csd.evaluation.metrics:clip_score_metric",
    "fid": "csd.evaluation.metrics:fid_metric",
    "content": "csd.evaluation.metrics:content_metric",
    "scene": "csd.evaluation.metrics:scene_metric",
    "regions": "csd.evaluation.metrics:regions_metric",
    "geneval": "csd.evaluation.geneval_score:geneval_metric",
}


def metric(name: str) -> Callable[[Any], Any]:
    """The metric function registered as ``name`` (``KeyError`` naming the available ones)."""
    if name not in METRICS:
        raise KeyError(f"unknown metric '{name}'; available: {sorted(METRICS)}")
    module, function = METRICS[name].split(":")
    return getattr(importlib.import_module(module), function)
