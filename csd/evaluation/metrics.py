"""The metrics of the evaluate stage, by name (``eval.metrics`` / ``eval.toy.metrics``).

Each takes the :class:`EvalContext` and returns a :class:`MetricOutput`; toy runs swap in the toy
CLIP, toy-CLIP-feature FID against rendered scenes, and the scene checker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from csd.data.files import DOWNLOAD_HINT, MissingDataError
from csd.evaluation import content, speed, toy
from csd.evaluation.clip_features import ClipImageFeatures
from csd.evaluation.clip_score import ClipModel, clip_scores, load_open_clip
from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.fid import generated_fid, inception_fid, load_reference, module_fid
from csd.evaluation.geneval_score import geneval_metric
from csd.evaluation.images import Preprocess, file_batches, list_images


def speed_metric(ctx: EvalContext) -> MetricOutput:
    recs = ctx.records
    per_image = {
        "latency_s": [r["latency_s"] for r in recs],
        "nfe": [r["nfe"] for r in recs],
        "step_compression": [r["step_compression"] for r in recs],
        "acceptance": [r["drafts_accepted"] / r["drafts_proposed"] if r["drafts_proposed"] else math.nan for r in recs],
        "relaxed_accepts": [r["relaxed_accepts"] for r in recs],
    }
    return MetricOutput(speed.speed_metrics(recs, ctx.info), per_image)


def _clip_model(ctx: EvalContext) -> ClipModel:
    c = ctx.eval.clip
    if ctx.is_toy:
        return toy.load_toy_clip_model(ctx.device)
    return load_open_clip(c.model, c.pretrained, ctx.device, c.get("model_config"))


def clip_score_metric(ctx: EvalContext) -> MetricOutput:
    clip = _clip_model(ctx)
    scores = clip_scores(clip, ctx.image_paths, [r["prompt"] for r in ctx.records], ctx.eval.batch_size, ctx.device)
    return MetricOutput({"clip_score": float(scores.mean())}, {"clip_score": scores.tolist()}, {"clip": clip.name})


def _reference_dir(ctx: EvalContext) -> Path:
    ref = ctx.eval.fid.reference_dir or OmegaConf.select(ctx.run_config, "dataset.fid_reference")
    if not ref:
        raise NotApplicable(f"no FID reference set for dataset '{ctx.info.get('dataset')}' (eval.fid.reference_dir)")
    ref = Path(ref).expanduser()
    if not ref.is_dir():
        raise MissingDataError(f"FID reference images not found at '{ref}'; fetch them with `{DOWNLOAD_HINT}`")
    return ref


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
    f = ctx.eval.fid
    if len(ctx.records) < 2:
        raise NotApplicable("FID needs at least 2 generated images")
    pre = Preprocess(f.resize, f.center_crop)
    if ctx.is_toy:
        metric = module_fid(ClipImageFeatures(toy.load_toy_clip_model(ctx.device)))
        key, ref_batches = toy.rendered_reference(ctx.records, ctx.eval.toy.render, ctx.eval.batch_size)
        features = "toy-clip"
    else:
        files = _paired_files(ctx, _reference_dir(ctx))
        key = {"files": [(str(p.resolve()), p.stat().st_size) for p in files]}

        def ref_batches():
            return file_batches(files, pre, ctx.eval.batch_size)

        metric = inception_fid(f.feature, f.inception_weights)
        features = f"inception-v3-torch-fidelity/{f.feature}"
    metric = metric.to(ctx.device)
    key = {**key, "preprocess": pre.describe(), "features": features}
    cached = load_reference(metric, key, ref_batches, f.cache_dir, ctx.device)
    value = generated_fid(metric, file_batches(ctx.image_paths, pre, ctx.eval.batch_size), ctx.device)
    n_ref = int(metric.real_features_num_samples)
    protocol = {"fid": {"features": features, "preprocess": pre.describe(), "n_reference": n_ref, "reference_cached": cached}}
    return MetricOutput({"fid": value}, protocol=protocol)


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
    checks = toy.scene_checks(ctx.records, ctx.run_dir, ctx.eval.toy.scene_key)
    t = ctx.eval.toy
    accuracy = toy.scene_accuracy(checks, list(t.categories), dict(t.only_if))
    return MetricOutput(accuracy, {"scene_overall": [bool(c.get("overall")) for c in checks]})


def regions_metric(ctx: EvalContext) -> MetricOutput:
    if not ctx.is_toy:
        raise NotApplicable("region analysis needs the toy segmenter")
    regions = toy.region_acceptance(ctx.records, ctx.run_dir, ctx.eval.toy.scene_key)
    flat = {f"relaxed_rate_{reg}": c["relaxed_rate"] for reg, c in regions.items()}
    return MetricOutput(flat, content={"regions": regions})


METRICS: dict[str, Callable[[EvalContext], MetricOutput]] = {
    "speed": speed_metric,
    "clip_score": clip_score_metric,
    "fid": fid_metric,
    "content": content_metric,
    "scene": scene_metric,
    "regions": regions_metric,
    "geneval": geneval_metric,
}
