"""Bootstrap confidence intervals over prompts and paired method-vs-reference comparisons (numpy only: the report
reads them without torch; FID's interval is :mod:`csd.evaluation.fid_interval`).

docs/EVALUATION.md#confidence-intervals. The intervals are 95 % percentile-bootstrap intervals
(Efron & Tibshirani 1993, ch. 13: the 2.5th and 97.5th percentiles of the resampled statistic).
The resampling unit is the **prompt** (a cluster bootstrap): a resample draws as many prompts as the
run has, with replacement, and takes every image (all samples) of each drawn prompt, so correlated
samples of one prompt are never treated as independent evidence. Paired comparisons draw the same
prompts for both runs. The resamples are seeded (:data:`SEED`), so intervals are reproducible.

A metric is a function of per-cluster totals of per-image columns (:class:`Totals`): a mean over the
images that have a value (``clip_score``), a ratio of summed counters (``acceptance_rate``), or the
mean of per-task accuracies (``geneval_overall``). The same function gives the point estimate (every
prompt drawn once) and each resample's value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: coverage of every interval
LEVEL = 0.95
#: seed of the resampled prompt draws (runs, metrics and paired comparisons all use it)
SEED = 0
#: per-image rows are keyed by the record's (prompt_id, sample)
Key = tuple[str, int]


@dataclass(frozen=True)
class Resamples:
    """A cluster bootstrap: ``counts[b, c]`` = how often cluster ``c`` is drawn in resample ``b``;
    ``index[i]`` = the cluster of item ``i``. ``n_boot = 0`` gives one row of ones: the point estimate."""

    index: np.ndarray
    counts: np.ndarray

    @classmethod
    def draw(cls, clusters: Sequence[str], n_boot: int, seed: int = SEED) -> Resamples:
        """Resample the distinct values of ``clusters`` (prompt ids) ``n_boot`` times, with replacement."""
        names, index = np.unique(np.asarray(clusters, dtype=object).astype(str), return_inverse=True)
        n = len(names)
        if n_boot == 0:
            return cls(index, np.ones((1, n)))
        draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n)) + n * np.arange(n_boot)[:, None]
        return cls(index, np.bincount(draws.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float))

    def point(self) -> Resamples:
        """Every cluster once: the statistic of the data as observed."""
        return Resamples(self.index, np.ones((1, self.counts.shape[1])))


class Totals:
    """Per-resample sums of per-image columns (null = NaN = absent), from per-cluster totals."""

    def __init__(self, columns: Mapping[str, np.ndarray], resamples: Resamples) -> None:
        self.columns, self.resamples = columns, resamples
        self.n_clusters = resamples.counts.shape[1]

    def _cluster_sums(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.resamples.index, weights=values, minlength=self.n_clusters)

    def sum(self, name: str) -> np.ndarray:
        """``[n_boot]``: the column summed over each resample's images that have a value."""
        return self.resamples.counts @ self._cluster_sums(np.nan_to_num(self.columns[name], nan=0.0))

    def count(self, name: str) -> np.ndarray:
        """``[n_boot]``: the number of each resample's images that have a value."""
        return self.resamples.counts @ self._cluster_sums((~np.isnan(self.columns[name])).astype(float))

    def mean(self, name: str) -> np.ndarray:
        """Mean over the images with a value (NaN for a resample without any)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum(name) / self.count(name)

    def ratio(self, num: str, den: str) -> np.ndarray:
        """Summed ``num`` / summed ``den`` (a rate over the whole resample; NaN where ``den`` sums to 0)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum(num) / self.sum(den)


#: a metric as a function of resampled totals, ``[n_boot]`` values
Estimand = Callable[[Totals], np.ndarray]


def mean_of(name: str) -> Estimand:
    return lambda t: t.mean(name)


def ratio_of(num: str, den: str) -> Estimand:
    return lambda t: t.ratio(num, den)


def mean_of_means(names: Sequence[str]) -> Estimand:
    """Unweighted mean of several column means, over the ones a resample has (GenEval's overall score)."""
    def estimand(t: Totals) -> np.ndarray:
        means = np.stack([t.mean(n) for n in names])
        present = ~np.isnan(means)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(present, means, 0.0).sum(0) / present.sum(0)
    return estimand


#: metrics.json name -> estimand over the per-image columns of csd.evaluation.metrics
FIXED_ESTIMANDS: dict[str, tuple[tuple[str, ...], Estimand]] = {
    "clip_score": (("clip_score",), mean_of("clip_score")),
    "hpsv2": (("hpsv2",), mean_of("hpsv2")),
    "image_reward": (("image_reward",), mean_of("image_reward")),
    "precision": (("in_reference_manifold",), mean_of("in_reference_manifold")),
    "dpg_score": (("dpg_score",), mean_of("dpg_score")),
    "step_compression": (("step_compression",), mean_of("step_compression")),
    "nfe_mean": (("nfe",), mean_of("nfe")),
    "latency_mean": (("latency_s",), mean_of("latency_s")),
    "acceptance_rate": (("drafts_accepted", "drafts_proposed"), ratio_of("drafts_accepted", "drafts_proposed")),
    "relaxed_rate": (("relaxed_accepts", "drafts_accepted"), ratio_of("relaxed_accepts", "drafts_accepted")),
}
SCENE_PREFIX, GENEVAL_PREFIX = "scene_", "geneval_correct:"


def numeric_columns(per_image: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """Per-image columns as floats (null -> NaN, bool -> 0/1); text columns are left out, except that
    ``geneval_correct`` is split by ``geneval_tag`` into ``geneval_correct:<task>`` (NaN off the task)."""
    out = {}
    for name, values in per_image.items():
        if all(v is None or isinstance(v, (bool, int, float)) for v in values):
            out[name] = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    if "geneval_correct" in out and "geneval_tag" in per_image:
        tags = np.asarray(per_image["geneval_tag"], dtype=object)
        for task in dict.fromkeys(per_image["geneval_tag"]):
            out[f"{GENEVAL_PREFIX}{task}"] = np.where(tags == task, out["geneval_correct"], np.nan)
    return out


def estimands(columns: Mapping[str, np.ndarray]) -> dict[str, Estimand]:
    """The metrics computable from ``columns``: the fixed ones, ``scene_acc_<category>`` from ``scene_<category>``,
    ``geneval_<task>`` and ``geneval_overall`` from ``geneval_correct:<task>``."""
    out = {name: fn for name, (needs, fn) in FIXED_ESTIMANDS.items() if all(c in columns for c in needs)}
    out |= {f"scene_acc_{c[len(SCENE_PREFIX):]}": mean_of(c) for c in columns if c.startswith(SCENE_PREFIX)}
    tasks = [c for c in columns if c.startswith(GENEVAL_PREFIX)]
    out |= {f"geneval_{c[len(GENEVAL_PREFIX):]}": mean_of(c) for c in tasks}
    if tasks:
        out["geneval_overall"] = mean_of_means(tasks)
    return out


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> list[float] | None:
    """``[lo, hi]``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the finite draws (None if none)."""
    finite = np.asarray(draws, dtype=float)
    finite = finite[np.isfinite(finite)]
    if not finite.size:
        return None
    lo, hi = np.percentile(finite, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


def run_intervals(
    prompt_ids: Sequence[str], per_image: Mapping[str, Sequence[Any]], names: Sequence[str], n_boot: int,
    seed: int = SEED,
) -> dict[str, list[float]]:
    """``{metric: [lo, hi]}`` for the metrics ``names`` that the per-image columns determine (records order)."""
    if n_boot == 0:
        return {}
    columns = numeric_columns(per_image)
    totals = Totals(columns, Resamples.draw(prompt_ids, n_boot, seed))
    found = estimands(columns)
    out = {}
    for name in names:
        if name in found and (interval := percentile_interval(found[name](totals))) is not None:
            out[name] = interval
    return out


def point_estimates(prompt_ids: Sequence[str], per_image: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Every estimand's value on the data as observed (equals the corresponding ``metrics.json`` value)."""
    columns = numeric_columns(per_image)
    totals = Totals(columns, Resamples.draw(prompt_ids, 0))
    return {name: float(fn(totals)[0]) for name, fn in estimands(columns).items()}


# ------------------------------------------------------------------------------------ paired comparisons


@dataclass(frozen=True)
class Comparison:
    """A paired statistic of a run against a reference run over ``n_images`` common images; ``interval`` is
    None when the bootstrap is off (``n_boot = 0``) or no resample had a value."""

    value: float
    interval: list[float] | None
    n_images: int


def row_key(row: Mapping[str, Any]) -> Key:
    return str(row["prompt_id"]), int(row["sample"])


def _aligned(rows: Sequence[Mapping[str, Any]], keys: Sequence[Key]) -> dict[str, np.ndarray]:
    """The numeric columns of ``rows`` (per-image rows) in the order of ``keys``."""
    by_key = {row_key(r): r for r in rows}
    names = [n for n in rows[0] if n not in ("prompt_id", "sample")]
    return numeric_columns({n: [by_key[k].get(n) for k in keys] for n in names})


def paired(
    run: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], name: str, n_boot: int,
    combine: Callable[[np.ndarray, np.ndarray], np.ndarray], seed: int = SEED,
) -> Comparison | None:
    """``combine(metric of run, metric of reference)`` over the (prompt_id, sample) keys both runs have, each
    column restricted to the images where both have a value; one resample of prompts serves both runs.

    ``run`` / ``reference``: per-image rows (``per_image.jsonl``). None when they share no image or a run
    lacks the metric's columns.
    """
    keys = sorted({row_key(r) for r in run} & {row_key(r) for r in reference})
    if not keys:
        return None
    cols_a, cols_b = _aligned(run, keys), _aligned(reference, keys)
    a, b = {}, {}
    for col in cols_a.keys() & cols_b.keys():
        missing = np.isnan(cols_a[col]) | np.isnan(cols_b[col])
        a[col], b[col] = np.where(missing, np.nan, cols_a[col]), np.where(missing, np.nan, cols_b[col])
    fn = estimands(a).get(name)
    if fn is None:
        return None
    resamples = Resamples.draw([k[0] for k in keys], n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = float(combine(fn(Totals(a, resamples.point())), fn(Totals(b, resamples.point())))[0])
        interval = percentile_interval(combine(fn(Totals(a, resamples)), fn(Totals(b, resamples)))) if n_boot else None
    return Comparison(value, interval, len(keys))


def paired_difference(run: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], name: str,
                      n_boot: int, seed: int = SEED) -> Comparison | None:
    """Metric of ``run`` minus metric of ``reference`` (paired over prompts); identical runs give exactly 0 [0, 0]."""
    return paired(run, reference, name, n_boot, np.subtract, seed)


def paired_speedup(run: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], n_boot: int,
                   seed: int = SEED) -> Comparison | None:
    """Mean reference latency / mean run latency over the images timed in both (speed-up vs AR, paired)."""
    return paired(run, reference, "latency_mean", n_boot, lambda a, b: b / a, seed)
