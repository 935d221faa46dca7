"""Metric ``precision_recall``: k-NN precision and recall (Kynkäänniemi et al. 2019, arXiv 1904.06991) of a run's
images against FID's reference images (the maths: ``csd.evaluation.inception_metrics``), on Inception-v3 pool
features (``eval.precision_recall.features: inception``, ADM's evaluator's network) or VGG-16 fc2 features
(``vgg16``: the improved precision / recall code LANTERN releases, every image resized to 224 x 224 PIL bilinear)."""

from __future__ import annotations

from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.images import Preprocess, file_batches, list_images
from csd.evaluation.inception_metrics import (
    extract,
    generated_features,
    inception_network,
    precision_recall,
    recall_interval,
    vgg16_network,
)
from csd.evaluation.metrics import reference_dir


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
    reference = extract(network, file_batches(ref, pre, ctx.eval.batch_size), ctx.device)
    in_reference, covered_by = precision_recall(generated, reference, p.k)
    interval = recall_interval(covered_by, [r["prompt_id"] for r in ctx.records], ctx.eval.bootstrap)
    protocol = {"precision_recall": {"features": features, "k": p.k,
                                     "n_reference": len(ref), "transforms": pre.describe()}}
    return MetricOutput({"precision": float(in_reference.mean()), "recall": float(covered_by.any(1).mean())},
                        {"in_reference_manifold": in_reference.astype(int).tolist()}, protocol,
                        intervals={"recall": interval} if interval else {})
