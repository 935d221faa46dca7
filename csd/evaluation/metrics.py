"""The metrics of the evaluate stage (registered by name in ``csd.registry``).

Each takes the :class:`EvalContext` and returns a :class:`MetricOutput`; toy runs swap in the toy
CLIP, toy-CLIP-feature FID against rendered scenes, and the scene checker.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from csd.data.files import DOWNLOAD_HINT
from csd.errors import MissingDataError, MissingWeightsError
from csd.evaluation import content, fid_backends, speed, toy
from csd.evaluation.clip_features import ClipImageFeatures
from csd.evaluation.clip_score import (
    ClipModel,
    check_open_clip,
    clip_score_value,
    clip_scores,
    load_open_clip,
)
from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.dpg_score import check_vqa
from csd.evaluation.fid import (
    generated_fid,
    inception_fid,
    load_reference,
    load_reference_stats,
    module_digest,
    module_fid,
)
from csd.evaluation.fid_interval import FeatureRecorder, fid_interval, jackknife_interval
from csd.evaluation.geneval_score import check_geneval_files
from csd.evaluation.images import Preprocess, file_batches, list_images
from csd.evaluation.inception_metrics import check_inception_files
from csd.evaluation.preference import check_preference_files
from csd.registry import FID_BACKENDS

log = logging.getLogger(__name__)
#: the dataset loader whose runs have a ``dataset.caption_rule``
COCO_LOADER = "csd.data.coco.coco2017_prompts"


def speed_metric(ctx: EvalContext) -> MetricOutput:
    """Speed metrics; per image: batch-1 latency (a batched image's from run.json's latency probe, else null),
    NFE, step compression, acceptance and the draft counters the run's rates sum (csd.evaluation.intervals)."""
    recs = ctx.records
    probed = {(p["prompt_id"], p["sample"]): p["latency_s"] for p in ctx.info.get("latency_probe") or []}
    per_image = {
        "latency_s": [r["latency_s"] if r["latency_s"] is not None else probed.get((r["prompt_id"], r["sample"]))
                      for r in recs],
        "nfe": [r["nfe"] for r in recs],
        "step_compression": [r["step_compression"] for r in recs],
        "acceptance": [r["drafts_accepted"] / r["drafts_proposed"] if r["drafts_proposed"] else None for r in recs],
        "drafts_proposed": [r["drafts_proposed"] for r in recs],
        "drafts_accepted": [r["drafts_accepted"] for r in recs],
        "relaxed_accepts": [r["relaxed_accepts"] for r in recs],
    }
    return MetricOutput(speed.speed_metrics(recs, ctx.info), per_image)


def _clip_model(ctx: EvalContext) -> ClipModel:
    c = ctx.eval.clip
    if ctx.is_toy:
        return toy.load_toy_clip_model(ctx.device)
    return load_open_clip(c.model, c.pretrained, ctx.device, c.get("model_config"))


def _protocol(ctx: EvalContext) -> dict[str, Any]:
    """``eval.protocol`` and, for COCO runs, the run's ``dataset.caption_rule`` beside the protocol's own
    (``eval.caption_rule``; a difference is logged): recorded with FID and CLIP score."""
    out: dict[str, Any] = {"name": ctx.eval.protocol}
    if OmegaConf.select(ctx.run_config, "dataset._target_") == COCO_LOADER:
        rule = OmegaConf.select(ctx.run_config, "dataset.caption_rule", default="longest")  # runs before the key
        out |= {"caption_rule": rule, "protocol_caption_rule": ctx.eval.caption_rule}
        if ctx.eval.caption_rule not in (None, rule):
            log.warning("eval.protocol=%s was published on dataset.caption_rule=%s prompts; this run used %s",
                        ctx.eval.protocol, ctx.eval.caption_rule, rule)
    return out


def clip_score_metric(ctx: EvalContext) -> MetricOutput:
    """Mean CLIP score under ``eval.clip`` (image steps, caption prefix, scale, clamp; docs/EVALUATION.md)."""
    c = ctx.eval.clip
    clip = _clip_model(ctx)
    pre = Preprocess(c.transforms)
    captions = [r["prompt"] for r in ctx.records]
    scores = clip_scores(clip, ctx.images, captions, ctx.eval.batch_size, ctx.device, pre, c.prefix, c.scale, c.clamp)
    protocol = {**_protocol(ctx), "clip": {"model": clip.name, "transforms": pre.describe(), "prefix": c.prefix,
                                           "scale": c.scale, "clamp": c.clamp}}
    return MetricOutput({"clip_score": clip_score_value(scores, c.clamp)}, {"clip_score": scores.tolist()}, protocol)


def reference_dir(eval_cfg: DictConfig, run_config: DictConfig, dataset: str | None) -> Path:
    """FID's reference images: ``eval.fid.reference_dir``, else the run's ``dataset.fid_reference`` (the reference
    set of ``dataset``)."""
    ref = eval_cfg.fid.reference_dir or OmegaConf.select(run_config, "dataset.fid_reference")
    if not ref:
        raise NotApplicable(f"no FID reference set for dataset '{dataset}': give reference images "
                            "(eval.fid.reference_dir) or statistics (eval.fid.reference_stats=<file.npz> with mu and "
                            "sigma, e.g. ADM's VIRTUAL_imagenet256_labeled.npz for ImageNet)")
    ref = Path(ref).expanduser()
    if not ref.is_dir():
        raise MissingDataError(f"FID reference images not found at '{ref}'; fetch them with `{DOWNLOAD_HINT}`")
    return ref


def require_stats(path: str) -> Path:
    """The FID reference statistics file ``eval.fid.reference_stats``, which must exist."""
    stats = Path(path).expanduser()
    if not stats.is_file():
        raise MissingDataError(f"FID reference statistics not found at '{stats}' (eval.fid.reference_stats: an .npz "
                               "with mu and sigma, e.g. ADM's VIRTUAL_imagenet256_labeled.npz for ImageNet 256)")
    return stats


def _paired_files(ctx: EvalContext, ref: Path) -> list[Path]:
    """The reference images of the run's prompts (``meta.file_name``), else the whole folder."""
    names = sorted({r["meta"]["file_name"] for r in ctx.records if "file_name" in r["meta"]})
    if ctx.eval.fid.paired and names:
        missing = [n for n in names if not (ref / n).exists()]
        if missing:
            raise MissingDataError(f"{len(missing)} paired reference images missing in {ref}, e.g. {missing[0]}")
        return [ref / n for n in names]
    return list_images(ref)


def fid_metric(ctx: EvalContext) -> MetricOutput:
    """FID by each evaluator of ``eval.fid.backends`` (docs/EVALUATION.md#fid-backends), each under its own key of
    metrics.json (``csd.registry.FID_BACKENDS``) with its jackknife interval; the images' steps are
    ``eval.fid.transforms``, for the package backends ``eval.fid.package_transforms`` where set (a protocol that
    imitates a package's resize in front of torchmetrics leaves it out for the package itself). A toy run's features
    are the toy CLIP's, which only the torchmetrics backend takes. An evaluator whose weights are missing is skipped
    alone (``skipped`` in metrics.json), unless ``eval.strict``; with none left the metric is skipped."""
    f = ctx.eval.fid
    if len(ctx.records) < 2:
        raise NotApplicable("FID needs at least 2 generated images")
    backends = list(f.get("backends", ["torchmetrics"]))
    packages = [b for b in backends if b != "torchmetrics"]
    if ctx.is_toy and packages:
        log.warning("FID backends %s need Inception; a toy run's FID uses the toy CLIP's features: skipping them",
                    packages)
        packages = []
    out, first_error = MetricOutput(protocol=_protocol(ctx)), None
    parts = (["torchmetrics"] if "torchmetrics" in backends else []) + packages
    for name in parts:
        try:
            part = _torchmetrics_fid(ctx) if name == "torchmetrics" else _package_fid(ctx, name)
        except MissingWeightsError as err:  # this evaluator alone is skipped, unless eval.strict or none is left
            if ctx.eval.get("strict"):
                raise
            first_error = first_error or err
            out.skipped[FID_BACKENDS[name]] = str(err)
            log.warning("FID backend %s skipped: %s", name, err)
            continue
        out.metrics.update(part.metrics)
        out.intervals.update(part.intervals)
        out.protocol.update(part.protocol)
    if not out.metrics and first_error is not None:
        raise first_error
    return out


def reference_files_key(files: Sequence[Path]) -> list[tuple[str, str]]:
    """The reference images' part of a FID cache key: each file's resolved path and sha256, so a file replaced under
    the same path (even at the same size) recomputes the statistics instead of reusing stale ones."""
    out = []
    for p in files:
        with p.open("rb") as fh:
            out.append((str(p.resolve()), hashlib.file_digest(fh, "sha256").hexdigest()))
    return out


def _reference_files(ctx: EvalContext) -> list[Path]:
    return _paired_files(ctx, reference_dir(ctx.eval, ctx.run_config, ctx.info.get("dataset")))


def _package_fid(ctx: EvalContext, name: str) -> MetricOutput:
    """FID of the package backend ``name`` (csd.evaluation.fid_backends): the package's resize, network and Fréchet
    distance; the reference's mean and covariance from ``eval.fid.reference_stats`` or the reference images (cached)."""
    f = ctx.eval.fid
    steps = f.get("package_transforms")
    pre = Preprocess(f.transforms if steps is None else steps)
    stats = f.get("reference_stats")
    files = None if stats else _reference_files(ctx)  # a missing reference is reported before the network loads
    backend = fid_backends.build(name, f.get("weights_dir"), ctx.device)
    if stats:
        with np.load(require_stats(stats)) as ref:
            ref_mu, ref_sigma = ref["mu"], ref["sigma"]
        cached, reference = None, {"reference_stats": str(stats)}
    else:
        key = {"files": reference_files_key(files), "transforms": pre.describe(), "features": backend.features}
        ref_mu, ref_sigma, n_ref, cached = fid_backends.reference_stats(
            backend, key, lambda: backend.extract(files, pre, ctx.eval.batch_size, ctx.device), f.cache_dir)
        reference = {"n_reference": n_ref}
    features = backend.extract(ctx.images, pre, ctx.eval.batch_size, ctx.device)
    value = float(backend.frechet(*fid_backends.moments(features), ref_mu, ref_sigma))
    interval = None
    if ctx.eval.bootstrap:
        interval = jackknife_interval(torch.from_numpy(features), [r["prompt_id"] for r in ctx.records],
                                      torch.from_numpy(np.asarray(ref_mu, dtype=np.float64)),
                                      torch.from_numpy(np.asarray(ref_sigma, dtype=np.float64)))
    protocol = {backend.metric: {"backend": name, "features": backend.features, "transforms": pre.describe(),
                                 "paired": f.paired, **reference, "reference_cached": cached}}
    return MetricOutput({backend.metric: value}, protocol=protocol,
                        intervals={backend.metric: interval} if interval else {})


def _torchmetrics_fid(ctx: EvalContext) -> MetricOutput:
    """FID of torchmetrics' ``FrechetInceptionDistance`` (torch-fidelity's Inception), metric ``fid``."""
    f = ctx.eval.fid
    pre = Preprocess(f.transforms)
    stats = None if ctx.is_toy else f.get("reference_stats")
    if ctx.is_toy:
        network = ClipImageFeatures(toy.load_toy_clip_model(ctx.device))
        metric = module_fid(network)
        key, ref_batches = toy.rendered_reference(ctx.records, ctx.eval.toy.render, ctx.eval.batch_size)
        features = "toy-clip"
        key = {**key, "feature_weights": module_digest(network)}
    elif stats:
        metric, features = inception_fid(f.feature, f.inception_weights), f"inception-v3-torch-fidelity/{f.feature}"
    else:
        files = _reference_files(ctx)
        key = {"files": reference_files_key(files)}

        def ref_batches():
            return file_batches(files, pre, ctx.eval.batch_size)

        metric = inception_fid(f.feature, f.inception_weights)
        features = f"inception-v3-torch-fidelity/{f.feature}"
    metric = metric.to(ctx.device)
    if stats:  # the reference is a mean and a covariance: nothing to preprocess, cache or pair
        load_reference_stats(metric, require_stats(stats))
        cached, reference = None, {"reference_stats": str(stats)}
    else:
        key = {**key, "transforms": pre.describe(), "features": features}
        cached = load_reference(metric, key, ref_batches, f.cache_dir, ctx.device)
        reference = {"n_reference": int(metric.real_features_num_samples)}
    with FeatureRecorder(metric.inception) as generated:  # keeps the generated features for the interval
        value = generated_fid(metric, file_batches(ctx.images, pre, ctx.eval.batch_size), ctx.device)
    interval = fid_interval(metric, generated.features, [r["prompt_id"] for r in ctx.records], ctx.eval.bootstrap)
    protocol = {"fid": {"features": features, "transforms": pre.describe(), "paired": f.paired, **reference,
                        "reference_cached": cached}}  # with fid_metric's _protocol
    return MetricOutput({"fid": value}, protocol=protocol, intervals={"fid": interval} if interval else {})


def content_metric(ctx: EvalContext) -> MetricOutput:
    maps = content.acceptance_maps(ctx.records)
    vocab = ctx.info.get("model_info", {}).get("vocab_size")
    bins = ctx.eval.content.entropy_bins
    edges = np.linspace(0.0, math.log(vocab), bins + 1) if vocab else bins
    return MetricOutput(content={
        "acceptance_maps": {k: v.tolist() for k, v in maps.items()},
        "acceptance_by_entropy": content.acceptance_by_entropy(ctx.records, edges),
    })


def scene_metric(ctx: EvalContext) -> MetricOutput:
    if not ctx.is_toy:
        raise NotApplicable("the scene checker applies to the toy model only")
    checks = toy.scene_checks(ctx.records, ctx.images, ctx.eval.toy.scene_key)
    t = ctx.eval.toy
    accuracy = toy.scene_accuracy(checks, list(t.categories), dict(t.only_if))
    return MetricOutput(accuracy, toy.scene_correct(checks, list(t.categories), dict(t.only_if)))


def regions_metric(ctx: EvalContext) -> MetricOutput:
    if not ctx.is_toy:
        raise NotApplicable("region analysis needs the toy segmenter")
    regions = toy.region_acceptance(ctx.records, ctx.images, ctx.eval.toy.scene_key)
    flat = {f"relaxed_rate_{reg}": c["relaxed_rate"] for reg, c in regions.items()}
    return MetricOutput(flat, content={"regions": regions})


#: the dataset loader of GenEval runs (the only runs the geneval metric applies to)
GENEVAL_LOADER = "csd.data.geneval.geneval_prompts"
#: the dataset loader of DPG-Bench runs (the only runs the dpg metric applies to)
DPG_LOADER = "csd.data.dpg.dpg_prompts"


def _check_fid_weights(eval_cfg: DictConfig, backends: list[str]) -> None:
    """The weights of every FID backend: torchmetrics' loaded as the metric loads them, the packages' files looked up."""
    if "torchmetrics" in backends:
        inception_fid(eval_cfg.fid.feature, eval_cfg.fid.inception_weights)
    fid_backends.check_weights(backends, eval_cfg.fid.get("weights_dir"))


def check_files(names: Sequence[str], eval_cfg: DictConfig, run_config: DictConfig) -> None:
    """``eval.strict`` before a run is generated (or evaluated): raise the :class:`MissingWeightsError` or
    :class:`MissingDataError` that a metric of ``names`` would raise for a real (non-toy) model's run of
    ``run_config``: CLIP weights, FID's reference folder and Inception weights (loaded, as the metric loads them),
    GenEval's detector and colour CLIP, the preference scores' weights and named Inception weights files. Files only the records name (FID's paired reference images) are checked
    when the metric runs; a metric that does not apply (no FID reference set) is skipped then, as always."""
    if "clip_score" in names:
        c = eval_cfg.clip
        check_open_clip(c.model, c.pretrained, c.get("model_config"))
    backends = list(eval_cfg.fid.get("backends", ["torchmetrics"]))
    if "fid" in names and eval_cfg.fid.get("reference_stats"):
        require_stats(eval_cfg.fid.reference_stats)
        _check_fid_weights(eval_cfg, backends)
    elif "fid" in names:
        try:
            reference_dir(eval_cfg, run_config, OmegaConf.select(run_config, "dataset.name"))
        except NotApplicable:
            pass
        else:
            _check_fid_weights(eval_cfg, backends)
    if "geneval" in names and OmegaConf.select(run_config, "dataset._target_") == GENEVAL_LOADER:
        g = eval_cfg.geneval
        check_geneval_files(g.detector, g.clip_model, g.clip_pretrained)
    if "dpg" in names and OmegaConf.select(run_config, "dataset._target_") == DPG_LOADER:
        check_vqa(eval_cfg.dpg.model)
    check_preference_files(names, eval_cfg)
    check_inception_files(names, eval_cfg)
