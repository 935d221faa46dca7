"""Gather evaluated runs (run.json + metrics.json) into one table, with speed-up vs the matching AR run."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from csd.evaluation import METRICS_FILE
from csd.evaluation.speed import speedup

log = logging.getLogger(__name__)
AR_METHOD = "ar"
#: engine-wide keys every method records; labelled only when they tell runs of one method apart
ENGINE_KEYS = ("window", "init", "coupling", "draft_record")


def find_run_dirs(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """A sweep directory's run directories (any depth, those with a run.json), or the given list."""
    if isinstance(source, (str, Path)):
        root = Path(source)
        if (root / "run.json").exists():
            return [root]
        return sorted(p.parent for p in root.rglob("run.json"))
    return [Path(p) for p in source]


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def method_label(method: str, params: dict[str, Any], keys: Sequence[str]) -> str:
    """``method k=v ...`` for the hyper-parameters ``keys`` (in the run's order), e.g. ``csd lam=0.1 delta=0.5``."""
    return " ".join([method, *(f"{k}={_fmt(params[k])}" for k in params if k in keys)])


def label_keys(params_of_runs: Sequence[dict[str, Any]]) -> list[str]:
    """The hyper-parameters that name the runs of one method in a report.

    Several runs: the keys whose values differ between them (constant ones would repeat on every
    point). One run: its method's own keys (not the engine-wide ``window``/``init``/``coupling``/``draft_record``).
    """
    scalar = [{k: v for k, v in p.items() if k not in ("name", "_target_") and not isinstance(v, (dict, list))}
              for p in params_of_runs]
    keys = list(dict.fromkeys(k for p in scalar for k in p))
    if len(scalar) == 1:
        return [k for k in keys if k not in ENGINE_KEYS]
    return [k for k in keys if len({repr(p.get(k)) for p in scalar}) > 1]


def load_run(run_dir: Path) -> dict[str, Any] | None:
    """The full ``metrics.json`` of a run plus its directory, or None (with a warning) if not evaluated."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        log.warning("%s has no %s (run stage=evaluate); left out of the report", run_dir, METRICS_FILE)
        return None
    return {**json.loads(path.read_text(encoding="utf-8")), "run_dir": str(run_dir)}


def results_frame(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: identity, label (:func:`label_keys`), ``lam``, ``delta``, metrics, speed-up."""
    params_of = {m: [r["run"].get("method_params") or {} for r in results if r["run"]["method"] == m]
                 for m in {r["run"]["method"] for r in results}}
    keys = {m: label_keys(p) for m, p in params_of.items()}
    rows = []
    for res in results:
        run, params = res["run"], res["run"].get("method_params") or {}
        rows.append({
            "run_dir": res["run_dir"], "model": run["model"], "dataset": run["dataset"], "method": run["method"],
            "label": method_label(run["method"], params, keys[run["method"]]), "lam": params.get("lam"),
            "delta": params.get("delta"), "n_images": run.get("n_records"), **res["metrics"],
        })
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["speedup"] = np.nan
    for (model, dataset), group in df.groupby(["model", "dataset"]):
        ar = group[group["method"] == AR_METHOD]
        if ar.empty or "latency_mean" not in df:
            log.warning("no AR run for %s/%s: speed-up left empty (add one with eval.report.extra_runs=[<ar run dir>])",
                        model, dataset)
            continue
        if len(ar) > 1:
            log.warning("%d AR runs for %s/%s: speed-up uses %s", len(ar), model, dataset, ar["run_dir"].iloc[0])
        ar_row = ar.iloc[0]
        if (group["n_images"] != ar_row["n_images"]).any():
            log.warning("runs of %s/%s differ in image count from the AR run: speed-ups compare different prompts", model, dataset)
        df.loc[group.index, "speedup"] = [speedup(ar_row["latency_mean"], v) for v in group["latency_mean"]]
    return df
