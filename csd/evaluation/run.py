"""The evaluate stage: run directory in, ``metrics.json`` (and optionally a W&B run) out."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from csd.adapters.base import MissingWeightsError
from csd.data.files import MissingDataError
from csd.evaluation import METRICS_FILE
from csd.evaluation.context import EvalContext, NotApplicable
from csd.evaluation.metrics import METRICS

log = logging.getLogger(__name__)

#: run.json fields copied into metrics.json so a sweep table needs no other file
RUN_FIELDS = ("method", "method_params", "model", "dataset", "seed", "n_images")


def evaluate_run(run_dir: Path, cfg: DictConfig) -> dict[str, Any]:
    """Compute the configured metrics of one run, write ``<run_dir>/metrics.json`` and return its content.

    Metrics come from ``cfg.eval.metrics`` (``cfg.eval.toy.metrics`` for toy models). A metric that
    cannot run (missing weights or data, not applicable) is recorded under ``skipped`` with the
    reason, or raises when ``cfg.eval.strict`` is set.
    """
    ctx = EvalContext.load(run_dir, cfg.eval, OmegaConf.select(cfg, "device", default="auto"))
    names = list(ctx.eval.toy.metrics if ctx.is_toy else ctx.eval.metrics)
    result: dict[str, Any] = {
        "run": {k: ctx.info.get(k) for k in RUN_FIELDS} | {"n_records": len(ctx.records)},
        "metrics": {}, "skipped": {}, "protocol": {}, "content": {},
    }
    per_image: dict[str, list] = {}
    for name in names:
        if name not in METRICS:
            raise KeyError(f"unknown metric '{name}'; available: {sorted(METRICS)}")
        try:
            out = METRICS[name](ctx)
        except (MissingWeightsError, MissingDataError, NotApplicable) as err:
            if ctx.eval.strict and not isinstance(err, NotApplicable):
                raise
            log.warning("metric %s skipped: %s", name, err)
            result["skipped"][name] = str(err)
            continue
        result["metrics"].update(out.metrics)
        result["protocol"].update(out.protocol)
        result["content"].update(out.content)
        per_image.update(out.per_image)
    (ctx.run_dir / METRICS_FILE).write_text(json.dumps(result, indent=1), encoding="utf-8")
    log.info(summary_line(result))
    logger_cfg = OmegaConf.select(cfg, "logger")
    if logger_cfg is not None and logger_cfg.mode != "disabled":
        from csd.tracking import log_evaluated_run  # wandb is imported only when logging is on

        log_evaluated_run(ctx, result, per_image, cfg)
    return result


def summary_line(result: dict[str, Any]) -> str:
    """One line per run: method (hyper-parameters), images, latency, compression, acceptance, quality."""
    run, m = result["run"], result["metrics"]
    params = ", ".join(f"{k}={v}" for k, v in (run.get("method_params") or {}).items())
    parts = [f"{run['method']}({params}) {run['model']}/{run['dataset']}: {run['n_records']} images"]
    fmt = {
        "latency_mean": "latency {:.3f}s", "latency_p90": "p90 {:.3f}s", "step_compression": "compression {:.2f}x",
        "acceptance_rate": "accept {:.1%}", "relaxed_rate": "relaxed {:.1%}", "clip_score": "CLIP {:.2f}",
        "fid": "FID {:.2f}", "scene_acc_overall": "scene {:.1%}", "geneval_overall": "GenEval {:.1%}",
    }
    parts += [f.format(m[k]) for k, f in fmt.items() if k in m and not math.isnan(m[k])]
    if result["skipped"]:
        parts.append(f"skipped: {', '.join(result['skipped'])}")
    return " | ".join(parts)
