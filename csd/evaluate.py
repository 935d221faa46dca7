"""The evaluate stage: run directory in, ``metrics.json`` (and optionally a W&B run) out."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from csd.errors import ConfigError, MissingDataError, MissingWeightsError
from csd.evaluation import METRICS_FILE, PER_IMAGE_FILE
from csd.evaluation.context import EvalContext, NotApplicable
from csd.evaluation.fid_interval import GROUPS
from csd.evaluation.intervals import LEVEL, SEED, run_intervals
from csd.keys import eval_metrics
from csd.progress import shown
from csd.records import records_digest
from csd.registry import metric
from csd.rundir import expected_images, live_writers

log = logging.getLogger(__name__)

#: run.json fields copied into metrics.json so a sweep table needs no other file
RUN_FIELDS = ("method", "method_params", "model", "dataset", "seed", "n_images")


def evaluate_run(run_dir: Path, cfg: DictConfig) -> dict[str, Any]:
    """Compute the configured metrics of one run, write ``<run_dir>/metrics.json`` and ``per_image.jsonl``
    and return the former's content.

    Metrics come from ``cfg.eval.metrics`` (:func:`csd.keys.eval_metrics`: null = the model's own). A metric that
    cannot run (missing weights or data, not applicable) is recorded under ``skipped`` with the
    reason, or raises when ``cfg.eval.strict`` is set. Metrics are over the union of a sharded run's shards;
    a run with missing images (:func:`missing_images`), or one a live process still generates into
    (:func:`csd.rundir.live_writers`), is refused unless ``eval.allow_partial``. ``run.records_sha256``
    names the records evaluated (:func:`records_digest`), so that the report and ``stage=status`` can tell
    when they changed. ``intervals`` holds each metric's 95 % interval: a bootstrap
    over ``cfg.eval.bootstrap`` prompt resamples, for FID a jackknife over prompts (``eval.bootstrap=0``: none;
    docs/EVALUATION.md#confidence-intervals). The metrics' progress bars follow ``engine.progress``
    (:mod:`csd.progress`).
    """
    with shown(OmegaConf.select(cfg, "engine.progress", default=True)):
        return _evaluate(run_dir, cfg)


def _evaluate(run_dir: Path, cfg: DictConfig) -> dict[str, Any]:
    """:func:`evaluate_run`'s work, its bars already switched."""
    writers = live_writers(Path(run_dir))
    if writers and not OmegaConf.select(cfg, "eval.allow_partial", default=False):
        lock, holder = writers[0]
        raise ConfigError(
            f"{run_dir}: {holder} is generating into it (lock {lock}); evaluate it when that has finished, "
            "or set eval.allow_partial=true to evaluate the images recorded so far"
        )
    ctx = EvalContext.load(run_dir, cfg.eval, OmegaConf.select(cfg, "device", default="auto"))
    missing = missing_images(ctx)
    names = eval_metrics(ctx.eval, ctx.info["model"])
    result: dict[str, Any] = {
        "run": {k: ctx.info.get(k) for k in RUN_FIELDS}
        | {"n_records": len(ctx.records), "records_sha256": records_digest(ctx.records)}
        | ({"allow_partial": True, "missing": missing} if missing or writers else {})
        | ({"generating": [holder for _, holder in writers]} if writers else {}),
        "metrics": {}, "intervals": {}, "skipped": {}, "protocol": {}, "content": {},
    }
    per_image = compute_metrics(ctx, names, result)
    n_boot = ctx.eval.bootstrap
    prompt_ids = [r["prompt_id"] for r in ctx.records]
    finite = [k for k, v in result["metrics"].items() if isinstance(v, (int, float)) and math.isfinite(v)]
    result["intervals"] = run_intervals(prompt_ids, per_image, finite, n_boot) | result["intervals"]
    if n_boot:
        result["protocol"]["bootstrap"] = {
            "resamples": n_boot, "level": LEVEL, "seed": SEED, "method": "percentile",
            "unit": "prompt (all samples of a drawn prompt together)",
            "fid": f"delete-a-group jackknife over prompts ({GROUPS} groups), reference statistics fixed",
        }
    write_per_image(ctx, per_image)
    (ctx.run_dir / METRICS_FILE).write_text(json.dumps(result, indent=1), encoding="utf-8")
    log.info(summary_line(result))
    logger_cfg = OmegaConf.select(cfg, "logger")
    if logger_cfg is not None and logger_cfg.mode != "disabled":
        from csd.tracking import log_evaluated_run  # wandb is imported only when logging is on

        log_evaluated_run(ctx, result, per_image, cfg)
    return result


def compute_metrics(ctx: EvalContext, names: list[str], result: dict[str, Any]) -> dict[str, list]:
    """Run the metrics ``names`` into ``result`` (metrics, protocol, content, intervals; a metric that cannot run
    under ``skipped``, or raised with ``eval.strict``); returns the per-image values."""
    per_image: dict[str, list] = {}
    for name in names:
        compute = metric(name)
        try:
            out = compute(ctx)
        except (MissingWeightsError, MissingDataError, NotApplicable) as err:
            if ctx.eval.strict and not isinstance(err, NotApplicable):
                raise
            log.warning("metric %s skipped: %s", name, err)
            result["skipped"][name] = str(err)
            continue
        result["metrics"].update(out.metrics)
        result["protocol"].update(out.protocol)
        result["content"].update(out.content)
        result["intervals"].update(out.intervals)
        result["skipped"].update(out.skipped)
        per_image.update(out.per_image)
    return per_image


def write_per_image(ctx: EvalContext, per_image: dict[str, list]) -> Path:
    """``per_image.jsonl``: per record (records order), its ``prompt_id``, ``sample`` and every per-image column
    of the metrics that ran (NaN written as null), for the report's paired comparisons."""
    path = ctx.run_dir / PER_IMAGE_FILE
    lines = []
    for i, rec in enumerate(ctx.records):
        row = {"prompt_id": rec["prompt_id"], "sample": rec["sample"]}
        for name, values in per_image.items():
            v = values[i]
            row[name] = None if isinstance(v, float) and math.isnan(v) else v
        lines.append(json.dumps(row))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return path


def missing_images(ctx: EvalContext) -> dict[str, int]:
    """Records file -> images it still lacks (``shards.json``, else run.json's ``n_images``): a run or shard
    killed mid-way raises :class:`ConfigError` unless ``eval.allow_partial``."""
    counts = Counter(Path(at.rsplit(":", 1)[0]).name for at in ctx.where)
    expected = expected_images(ctx.run_dir, ctx.info.get("n_images", 0))
    missing = {name: total - counts[name] for name, total in expected.items() if counts[name] < total}
    if OmegaConf.select(ctx.eval, "allow_partial", default=False):
        return missing
    if len(expected) == 1 and missing:
        name, n = next(iter(missing.items()))
        total = expected[name]
        raise ConfigError(
            f"{ctx.run_dir} is incomplete ({name} has {total - n} of {total} images); finish it (rerun the "
            f"command that generated it, with run_dir={ctx.run_dir}) or set eval.allow_partial=true"
        )
    if missing:
        shards = ", ".join(f"{name} lacks {n} of {expected[name]}" for name, n in missing.items())
        raise ConfigError(
            f"{ctx.run_dir} is incomplete ({shards}); finish those shards (stage=generate with the same "
            "dataset.num_shards and dataset.shard) or set eval.allow_partial=true"
        )
    return missing


def summary_line(result: dict[str, Any]) -> str:
    """One line per run: method (hyper-parameters), images, latency, compression, acceptance, quality."""
    run, m = result["run"], result["metrics"]
    params = ", ".join(f"{k}={v}" for k, v in (run.get("method_params") or {}).items())
    parts = [f"{run['method']}({params}) {run['model']}/{run['dataset']}: {run['n_records']} images"]
    fmt = {
        "latency_mean": "latency {:.3f}s", "latency_p90": "p90 {:.3f}s", "step_compression": "compression {:.2f}x",
        "skipped_per_image": "skipped {:.1f} rounds/image", "acceptance_rate": "accept {:.1%}", "relaxed_rate": "relaxed {:.1%}", "clip_score": "CLIP {:.2f}",
        "fid": "FID {:.2f}", "scene_acc_overall": "scene {:.1%}", "geneval_overall": "GenEval {:.1%}",
    }
    parts += [f.format(m[k]) for k, f in fmt.items() if k in m and not math.isnan(m[k])]
    if result["skipped"]:
        parts.append(f"skipped: {', '.join(result['skipped'])}")
    return " | ".join(parts)
