"""Metric ``precision_recall``: k-NN precision and recall (Kynkäänniemi et al. 2019, arXiv 1904.06991) of a run's
images against FID's reference images (the maths: ``csd.evaluation.inception_metrics``)."""

from __future__ import annotations

from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.images import Preprocess, file_batches, list_images
from csd.evaluation.inception_metrics import (
    extract,
    generated_features,
    inception_network,
    precision_recall,
    recall_interval,
)
from csd.evaluation.metrics import reference_dir


def precision_recall_metric(ctx: EvalContext) -> MetricOutput:
    """``precision`` (per image ``in_reference_manifold``, 0/1) and ``recall`` against FID's reference images
    (``eval.fid.reference_dir`` or the dataset's), k = ``eval.precision_recall.k``, 2048 Inception features."""
    p = ctx.eval.precision_recall
    if len(ctx.records) <= p.k:
        raise NotApplicable(f"precision / recall need more than eval.precision_recall.k={p.k} generated images")
    ref = list_images(reference_dir(ctx.eval, ctx.run_config, ctx.info.get("dataset")))
    network = inception_network("2048", p.inception_weights, "eval.precision_recall.inception_weights")
    generated = generated_features(ctx, network)
    pre = Preprocess(ctx.eval.fid.transforms)
    reference = extract(network, file_batches(ref, pre, ctx.eval.batch_size), ctx.device)
    in_reference, covered_by = precision_recall(generated, reference, p.k)
    interval = recall_interval(covered_by, [r["prompt_id"] for r in ctx.records], ctx.eval.bootstrap)
    protocol = {"precision_recall": {"features": "inception-v3-torch-fidelity/2048", "k": p.k,
                                     "n_reference": len(ref), "transforms": pre.describe()}}
    return MetricOutput({"precision": float(in_reference.mean()), "recall": float(covered_by.any(1).mean())},
                        {"in_reference_manifold": in_reference.astype(int).tolist()}, protocol,
                        intervals={"recall": interval} if interval else {})
