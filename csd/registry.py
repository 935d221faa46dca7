"""The plug-ins chosen by name that the config checks must list without importing them: the evaluate stage's metrics
(``eval.metrics``) and the image steps of its preprocessing (``eval.fid.transforms``, ``eval.clip.transforms``).

Naming them here costs nothing: the CLIP, FID and GenEval modules load open_clip and torchmetrics (seconds), and the
image steps torch and PIL. A new metric is its function plus one line in :data:`METRICS`; a new image step its
function in ``csd.evaluation.images.STEPS`` plus one line in :data:`IMAGE_STEPS` (a test keeps the two equal). Rules,
drafters, models and datasets are named by the ``_target_`` of their config file (``conf/<group>/<name>.yaml``) and
built by the composition root, ``csd.compose``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: metric name -> ``module:function``: a function of the ``csd.evaluation.context.EvalContext`` returning a
#: ``MetricOutput``
METRICS: dict[str, str] = {
    "speed": "csd.evaluation.metrics:speed_metric",
    "clip_score": "csd.evaluation.metrics:clip_score_metric",
    "fid": "csd.evaluation.metrics:fid_metric",
    "content": "csd.evaluation.metrics:content_metric",
    "scene": "csd.evaluation.metrics:scene_metric",
    "regions": "csd.evaluation.metrics:regions_metric",
    "geneval": "csd.evaluation.geneval_score:geneval_metric",
    "hpsv2": "csd.evaluation.preference:hpsv2_metric",
    "image_reward": "csd.evaluation.preference:image_reward_metric",
    "inception_score": "csd.evaluation.inception_metrics:inception_score_metric",
    "precision_recall": "csd.evaluation.precision_recall:precision_recall_metric",
    "dpg": "csd.evaluation.dpg_score:dpg_metric",
}

#: image step name -> whether it takes a size (``name:<px>``); the steps themselves: ``csd.evaluation.images.STEPS``
IMAGE_STEPS: dict[str, bool] = {
    "crop_long_edge": False,
    "center_crop": True,
    "resize_shorter": True,
    "lanczos": True,
    "bilinear": True,
    "pil_bilinear": True,
    "clean_bicubic": True,
}


#: ``eval.fid.backends``: FID evaluator -> its key in metrics.json; torchmetrics is ``csd.evaluation.fid``, the
#: packages' ``csd.evaluation.fid_backends.BUILDERS`` (a test keeps the two equal; docs/EVALUATION.md#fid-backends)
FID_BACKENDS: dict[str, str] = {
    "torchmetrics": "fid",
    "clean-fid:clean": "fid_clean",
    "clean-fid:legacy_tensorflow": "fid_clean_legacy_tf",
    "clean-fid:legacy_pytorch": "fid_clean_legacy_pt",
    "pytorch-fid": "fid_pytorch",
}


def fid_backend_names() -> list[str]:
    """The registered FID backends, in :data:`FID_BACKENDS`' order."""
    return list(FID_BACKENDS)


def metric(name: str) -> Callable[[Any], Any]:
    """The metric function registered as ``name`` (``KeyError`` naming the available ones)."""
    if name not in METRICS:
        raise KeyError(f"unknown metric '{name}'; available: {sorted(METRICS)}")
    module, function = METRICS[name].split(":")
    return getattr(importlib.import_module(module), function)


def metric_names() -> list[str]:
    """The registered metric names."""
    return sorted(METRICS)


def step_error(step: str) -> str | None:
    """What is wrong with an image step string (``name`` or ``name:<px>``), or None."""
    name, _, size = step.partition(":")
    if name not in IMAGE_STEPS:
        return f"unknown image step {step!r}; choose from {sorted(IMAGE_STEPS)}"
    if IMAGE_STEPS[name] and not (size.isdigit() and int(size) >= 1):
        return f"image step {step!r} needs a size: {name}:<px>, px >= 1"
    if not IMAGE_STEPS[name] and size:
        return f"image step {step!r} takes no size: write {name}"
    return None
