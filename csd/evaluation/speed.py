"""Speed and acceptance metrics from the per-image records (docs/EVALUATION.md definitions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NAN = float("nan")


def latency_stats(latencies: Sequence[float]) -> dict[str, float]:
    """Mean, median and 90th percentile of per-image latency (seconds); NaN without any latency."""
    x = np.asarray(latencies, dtype=float)
    if not x.size:
        return {"latency_mean": NAN, "latency_median": NAN, "latency_p90": NAN}
    return {
        "latency_mean": float(x.mean()),
        "latency_median": float(np.median(x)),
        "latency_p90": float(np.percentile(x, 90)),
    }


def speedup(ar_latency_mean: float, latency_mean: float) -> float:
    """Speed-up = mean AR latency / mean method latency (same prompts, same GPU)."""
    return ar_latency_mean / latency_mean


def _ratio(num: float, den: float) -> float:
    return num / den if den else NAN


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else NAN


def batch1_timings(records: Sequence[dict[str, Any]], info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-image (batch-1) timings of a run: records with a latency (a batched image has null) plus
    run.json's ``latency_probe`` (images of a batched run decoded again at batch 1)."""
    return [r for r in records if r.get("latency_s") is not None] + list(info.get("latency_probe") or [])


def speed_metrics(records: Sequence[dict[str, Any]], info: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Latency statistics, throughput, step compression and acceptance counters of one run.

    Latency is a batch-1 quantity over :func:`batch1_timings` (``latency_images`` of them; NaN if
    none), and so is ``drafter_s_mean``, the drafter's share of ``decode_s`` (over the timings that have it); ``throughput_images_per_s`` is run.json's images / decoding wall time of the last generate
    pass (NaN for runs that predate it). ``acceptance_rate`` = accepted / proposed drafts;
    ``relaxed_rate`` = share of the accepted drafts that only the relaxed rule accepted;
    ``filter_pass_rate`` = CSD's TV-filter passes / checks. Rates whose denominator is zero (e.g. AR
    proposes no drafts) are NaN.
    """
    info = info or {}
    timed = batch1_timings(records, info)
    total = {k: sum(r[k] for r in records) for k in (
        "drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes"
    )}
    # counters added later: records made before them have none (replacements drawn from a rule's fallback law, the
    # forwards of a drafter's own model, the drafting rounds VVS committed without a target forward)
    for key in ("residual_fallbacks", "drafter_forwards", "skipped"):
        total[key] = sum(r.get(key, 0) for r in records)
    return {
        **latency_stats([t["latency_s"] for t in timed]),
        "latency_images": len(timed),
        "decode_s_mean": _mean([t["decode_s"] for t in timed]),
        "prefill_s_mean": _mean([t["prefill_s"] for t in timed]),
        # the drafter's share of decode_s (timings made before it have none)
        "drafter_s_mean": _mean([t["drafter_s"] for t in timed if t.get("drafter_s") is not None]),
        "throughput_images_per_s": float(info.get("throughput_images_per_s", NAN)),
        "vq_decode_s_mean": _mean([r["vq_decode_s"] for r in records]),
        "nfe_mean": _mean([r["nfe"] for r in records]),
        "step_compression": _mean([r["step_compression"] for r in records]),
        "acceptance_rate": _ratio(total["drafts_accepted"], total["drafts_proposed"]),
        "relaxed_rate": _ratio(total["relaxed_accepts"], total["drafts_accepted"]),
        "filter_pass_rate": _ratio(total["filter_passes"], total["filter_checks"]),
        # VVS's skipped drafting rounds per image (NaN without any: the column stays out of the tables)
        "skipped_per_image": total["skipped"] / len(records) if total["skipped"] and records else NAN,
        **{k: int(v) for k, v in total.items()},
    }
