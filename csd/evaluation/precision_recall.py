"""Metric ``precision_recall``: k-NN precision and recall (Kynkäänniemi et al. 2019, arXiv 1904.06991) of a run's
images against FID's reference images (the maths: ``csd.evaluation.inception_metrics``), on Inception-v3 pool
features (``eval.precision_recall.features: inception``, ADM's evaluator's network) or VGG-16 fc2 features
(``vgg16``: the improved precision / recall code LANTERN releases, every image resized to 224 x 224 PIL bilinear)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.fid import cache_key, module_digest
from csd.evaluation.images import Preprocess, file_batches, list_images
from csd.evaluation.inception_metrics import (
    extract,
    generated_features,
    inception_network,
    precision_recall,
    vgg16_network,
)
from csd.evaluation.metrics import reference_dir, reference_files_key


def reference_features(key: dict[str, Any], extract_features: Callable[[], np.ndarray],
                       cache_dir: str | Path | None) -> tuple[np.ndarray, bool]:
    """The reference images' features ``[N_ref, D]`` and whether they came from the cache: ``cache_dir`` (FID's,
    ``eval.fid.cache_dir``; None: no cache) keeps them under a hash of ``key`` (each reference file's path and sha256,
    the transforms, the network's name and a digest of its weights), so a sweep extracts them once; a replaced file,
    other transforms or another network miss the cache."""
    path = None if cache_dir is None else Path(cache_dir) / f"pr_ref_{cache_key(key)}.npy"
    if path is not None and path.exists():
        return np.load(path), True
    features = extract_features()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, features)
        tmp.replace(path)
    return features, False


def precision_recall_metric(ctx: EvalContext) -> MetricOutput:
    """``precision`` (per image ``in_reference_manifold``, 0/1) and ``recall`` against FID's reference images
    (``eval.fid.reference_dir`` or the dataset's), k = ``eval.precision_recall.k``, on ``eval.precision_recall.features``:
    2048 Inception features after ``eval.fid.transforms``, or 4096 VGG-16 fc2 features after ``pil_bilinear:224``."""
    p = ctx.eval.precision_recall
    if len(ctx.records) <= p.k:
        raise NotApplicable(f"precision / recall need more than eval.precision_recall.k={p.k} generated images")
    ref = list_images(reference_dir(ctx.eval, ctx.run_config, ctx.info.get("dataset")))
    if p.features == "vgg16":
        network = vgg16_network(p.vgg16_weights, "eval.precision_recall.vgg16_weights")
        pre, features = Preprocess(("pil_bilinear:224",)), "vgg16-fc2-torchvision-imagenet1k-v1/4096"
    else:
        network = inception_network("2048", p.inception_weights, "eval.precision_recall.inception_weights")
        pre, features = Preprocess(ctx.eval.fid.transforms), "inception-v3-torch-fidelity/2048"
    generated = generated_features(ctx, network, pre)
    key = {"files": reference_files_key(ref), "transforms": pre.describe(), "features": features,
           "feature_weights": module_digest(network)}
    reference, cached = reference_features(
        key, lambda: extract(network, file_batches(ref, pre, ctx.eval.batch_size), ctx.device), ctx.eval.fid.cache_dir)
    in_reference, recalled, interval = precision_recall(generated, reference, p.k, [r["prompt_id"] for r in ctx.records],
                                                        ctx.eval.bootstrap)
    protocol = {"precision_recall": {"features": features, "k": p.k, "n_reference": len(ref),
                                     "transforms": pre.describe(), "reference_cached": cached}}
    return MetricOutput({"precision": float(in_reference.mean()), "recall": float(recalled.mean())},
                        {"in_reference_manifold": in_reference.astype(int).tolist()}, protocol,
                        intervals={"recall": interval} if interval else {})
