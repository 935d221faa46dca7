"""Gather evaluated runs (run.json + metrics.json) into one table, with speed-up vs the matching AR run and
paired differences from it (docs/EVALUATION.md#confidence-intervals)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from csd.decode import RUN_INFO_FILE
from csd.deprecations import MOVED_TO_DRAFTER, current_method_params
from csd.evaluation import METRICS_FILE, PER_IMAGE_FILE
from csd.evaluation.freshness import STALE, UNVERIFIED, metrics_state, refresh_hint
from csd.evaluation.intervals import Comparison, paired_difference, paired_speedup
from csd.evaluation.speed import speedup
from csd.report.labels import CHAIN, default_drafter, drafter_of, label_params, method_defaults

log = logging.getLogger(__name__)
AR_METHOD = "ar"
#: the drafters' keys (current names) a run records; labelled only when they tell runs of one method apart
ENGINE_KEYS = tuple(MOVED_TO_DRAFTER.values())
#: quality metrics compared with the AR run image by image: columns ``d_<metric>`` (method - AR), ``_lo``, ``_hi``
PAIRED = ("clip_score", "scene_acc_overall", "geneval_overall", "hpsv2", "image_reward", "precision", "dpg_score")
#: prompt resamples of the paired intervals when the caller gives none (``eval.bootstrap``'s default)
DEFAULT_RESAMPLES = 1000


def natural_key(path: Path) -> list[Any]:
    """Sort key that orders numbered names by number: ``1_sjd`` before ``10_csd_mc`` (Hydra's job numbers)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", path.as_posix())]


def find_run_dirs(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """A sweep directory's run directories (any depth, those with a run.json, in :func:`natural_key` order), or the
    given list."""
    if isinstance(source, (str, Path)):
        root = Path(source)
        if (root / "run.json").exists():
            return [root]
        return sorted((p.parent for p in root.rglob("run.json")), key=natural_key)
    return [Path(p) for p in source]


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def method_label(name: str, params: dict[str, Any], keys: Sequence[str]) -> str:
    """``name k=v ...`` for the hyper-parameters ``keys`` (in the run's order), e.g. ``csd lam=0.1 delta=0.5``."""
    return " ".join([name, *(f"{k}={_fmt(params[k])}" for k in params if k in keys)])


def label_keys(params_of_runs: Sequence[dict[str, Any]], defaults: dict[str, Any] | None = None) -> list[str]:
    """The hyper-parameters that name the runs of one method on one drafter in a report.

    The keys whose values differ between its runs, and those where a run differs from the ``defaults`` of the
    method on that drafter (:func:`csd.report.labels.method_defaults`); values equal to the defaults in every run
    would repeat on every point. Without ``defaults`` (a method with no config file), one run is named by its
    method's own keys (not the drafter's :data:`ENGINE_KEYS`).
    """
    scalar = [{k: v for k, v in p.items() if k not in ("name", "_target_") and not isinstance(v, (dict, list))}
              for p in params_of_runs]
    keys = list(dict.fromkeys(k for p in scalar for k in p))
    varying = [k for k in keys if len({repr(p.get(k)) for p in scalar}) > 1]
    if defaults is not None:
        return [k for k in keys if k in varying or any(k in p and (k not in defaults or p[k] != defaults[k])
                                                      for p in scalar)]
    if len(scalar) == 1:
        return [k for k in keys if k not in ENGINE_KEYS]
    return varying


def run_labels(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The report's name of each run (``run.json`` contents): ``method [drafter] k=v ...``, short and under the
    current key names (:func:`csd.report.labels.label_params`).

    The drafter is named where a method's runs use several, or one that is not the method's own
    (:func:`csd.report.labels.default_drafter`; the chain for a method without a config file): ``sjd chain`` /
    ``sjd pac_tree`` in a drafter sweep, ``sjd_pac`` alone. The keys are :func:`label_keys` of the runs of that method on that drafter, against their defaults.
    """
    methods = [run["method"] for run in runs]
    params = [run_params(run) for run in runs]
    drafters = [drafter_of(p) for p in params]
    shown = [label_params(p) for p in params]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(methods, drafters, strict=True)):
        groups.setdefault(key, []).append(i)
    labels = [""] * len(runs)
    for (method, drafter), members in groups.items():
        named = drafter != (default_drafter(method) or CHAIN) or sum(m == method for m, _ in groups) > 1
        keys = label_keys([shown[i] for i in members], method_defaults(method, drafter))
        for i in members:
            labels[i] = method_label(f"{method} {drafter}" if named else method, shown[i], keys)
    return labels


def run_params(run: dict[str, Any]) -> dict[str, Any]:
    """A run's ``method_params`` under the rule's current parameter names (runs made before a rename)."""
    return current_method_params(run["method"], run.get("method_params") or {})


def load_run(run_dir: Path) -> dict[str, Any] | None:
    """The full ``metrics.json`` of a run plus its directory and ``per_image`` rows (``per_image.jsonl``; empty
    for runs evaluated before it existed), or None with a warning naming the run and the fix: not evaluated,
    a file that is not valid JSON, or metrics that no longer describe the run's records (resumed or repaired
    since: :func:`csd.evaluation.freshness.metrics_state`)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        log.warning("%s has no %s (run stage=evaluate); left out of the report", run_dir, METRICS_FILE)
        return None
    rows_path = run_dir / PER_IMAGE_FILE
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        return not_json(path, err)
    try:
        lines = rows_path.read_text(encoding="utf-8").splitlines() if rows_path.exists() else []
        rows = [json.loads(line) for line in lines]
    except ValueError as err:
        return not_json(rows_path, err)
    state, message = metrics_state(run_dir, metrics)
    if state == STALE:
        log.warning("%s: %s; left out of the report", run_dir, message)
        return None
    if state == UNVERIFIED:
        log.info("%s: %s", run_dir, message)
    return {**metrics, "run_dir": str(run_dir), "per_image": rows, "timing": timing_context(run_dir)}


#: the run.json fields that say where and with what a run was timed
TIMING_FIELDS = ("host", "versions", "threads")


def timing_context(run_dir: Path) -> dict[str, Any]:
    """Where and with what a run's latencies were measured: run.json's :data:`TIMING_FIELDS` it has (``host`` is
    recorded by runs made since 2026-12-08)."""
    try:
        info = json.loads((run_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {key: info[key] for key in TIMING_FIELDS if key in info}


def timing_differences(run: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """``field: reference -> run`` for each timing field both record with different values."""
    return [f"{key} {reference[key]} vs {run[key]}" for key in TIMING_FIELDS
            if key in run and key in reference and run[key] != reference[key]]


def not_json(path: Path, err: ValueError) -> None:
    """Warn that the evaluate stage's file ``path`` is broken (e.g. cut short by a full disk), and the fix."""
    run_dir = path.parent
    log.warning("%s is not valid JSON (%s); %s left out of the report: %s", path, err, run_dir,
                refresh_hint(run_dir))


def interval_columns(intervals: dict[str, Sequence[float]]) -> dict[str, float]:
    """``{<metric>_lo: lo, <metric>_hi: hi}`` of a run's ``metrics.json`` intervals."""
    return {f"{name}{end}": v for name, (lo, hi) in intervals.items() for end, v in (("_lo", lo), ("_hi", hi))}


def comparison_columns(name: str, comparison: Comparison | None) -> dict[str, float]:
    """``{name: value, name_lo: lo, name_hi: hi}`` (NaN where absent)."""
    if comparison is None:
        return {}
    lo, hi = comparison.interval or (np.nan, np.nan)
    return {name: comparison.value, f"{name}_lo": lo, f"{name}_hi": hi}


def vs_reference(run: dict[str, Any], reference: dict[str, Any], n_boot: int) -> dict[str, float]:
    """Paired speed-up and quality differences of ``run`` against the AR ``reference`` over their common
    (prompt_id, sample) images, each with its paired bootstrap interval (:mod:`csd.evaluation.intervals`)."""
    a, b = run.get("per_image") or [], reference.get("per_image") or []
    if not a or not b:
        return {}
    out = {"n_prompts_paired": len({r["prompt_id"] for r in a} & {r["prompt_id"] for r in b})}
    out |= comparison_columns("speedup", paired_speedup(a, b, n_boot))
    for name in PAIRED:
        out |= comparison_columns(f"d_{name}", paired_difference(a, b, name, n_boot))
    return out


def results_frame(results: Sequence[dict[str, Any]], n_boot: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """One row per run: identity, label (:func:`run_labels`), ``lam``, ``delta``, image and prompt counts (``n_prompts``:
    the clusters of its intervals, ``n_prompts_paired``: those shared with the AR run), metrics with ``_lo`` / ``_hi``
    interval columns, speed-up vs the AR run of the same model and dataset and, where both runs have
    ``per_image.jsonl``, paired differences ``d_<metric>`` (:data:`PAIRED`), all with ``n_boot`` prompt resamples.

    Speed-up = mean AR latency / mean run latency over the images timed in both runs (paired); without per-image
    rows, over each run's own timed images.
    """
    labels = run_labels([res["run"] for res in results])
    rows = []
    for res, label in zip(results, labels, strict=True):
        run, params = res["run"], run_params(res["run"])
        rows.append({
            "run_dir": res["run_dir"], "model": run["model"], "dataset": run["dataset"], "method": run["method"],
            "label": label, "lam": params.get("lam"),
            "delta": params.get("delta"), "n_images": run.get("n_records"),
            "n_prompts": len({r["prompt_id"] for r in res.get("per_image") or []}) or None,  # the intervals' clusters
            "protocol": (res.get("protocol") or {}).get("name"), **res["metrics"],  # None without FID / CLIP
            **interval_columns(res.get("intervals") or {}),
        })
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["speedup"] = np.nan
    for (model, dataset), group in df.groupby(["model", "dataset"]):
        ar = group[group["method"] == AR_METHOD]
        if ar.empty:
            log.warning("no AR run for %s/%s: speed-up left empty (add one with eval.report.extra_runs=[<ar run dir>])",
                        model, dataset)
            continue
        if len(ar) > 1:
            log.warning("%d AR runs for %s/%s: speed-ups and differences use %s", len(ar), model, dataset, ar["run_dir"].iloc[0])
        ar_row = ar.iloc[0]
        log.info("speed-ups of %s/%s divide by the AR run %s", model, dataset, ar_row["run_dir"])
        reference = results[ar.index[0]].get("timing") or {}
        others = group.index.drop(ar.index[0])
        elsewhere = [(results[i]["run_dir"], diff) for i in others
                     if (diff := timing_differences(results[i].get("timing") or {}, reference))]
        if elsewhere:
            log.warning("the AR run of %s/%s (%s) was timed on another machine or software than %d of %d runs (%s: %s): "
                        "their speed-ups compare two machines or loads; time AR in the same sweep", model, dataset,
                        ar_row["run_dir"], len(elsewhere), len(others), elsewhere[0][0], "; ".join(elsewhere[0][1]))
        if (group["n_images"] != ar_row["n_images"]).any():
            log.warning("runs of %s/%s differ in image count from the AR run: paired comparisons use the images both "
                        "have, unpaired speed-ups (no per_image.jsonl) compare different prompts", model, dataset)
        if "latency_mean" in df:
            df.loc[group.index, "speedup"] = [speedup(ar_row["latency_mean"], v) for v in group["latency_mean"]]
        for i in group.index.drop(ar.index[0]):
            for column, value in vs_reference(results[i], results[ar.index[0]], n_boot).items():
                df.loc[i, column] = value
    return df
