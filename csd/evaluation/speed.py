"""Speed and acceptance metrics from the per-image records (docs/EVALUATION.md definitions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def latency_stats(latencies: Sequence[float]) -> dict[str, float]:
    """Mean, median and 90th percentile of per-image latency (seconds)."""
    x = np.asarray(latencies, dtype=float)
    return {
        "latency_mean": float(x.mean()),
        "latency_median": float(np.median(x)),
        "latency_p90": float(np.percentile(x, 90)),
    }


def speedup(ar_latency_mean: float, latency_mean: float) -> float:
    """Speed-up = mean AR latency / mean method latency (same prompts, same GPU)."""
    return ar_latency_mean / latency_mean


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def speed_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Latency statistics, step compression and acceptance counters of one run.

    ``acceptance_rate`` = accepted / proposed drafts; ``relaxed_rate`` = share of the accepted drafts
    that only the relaxed rule accepted; ``filter_pass_rate`` = CSD's TV-filter passes / checks.
    Rates whose denominator is zero (e.g. AR proposes no drafts) are NaN.
    """
    total = {k: sum(r[k] for r in records) for k in (
        "drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes"
    )}
    return {
        **latency_stats([r["latency_s"] for r in records]),
        "decode_s_mean": float(np.mean([r["decode_s"] for r in records])),
        "prefill_s_mean": float(np.mean([r["prefill_s"] for r in records])),
        "vq_decode_s_mean": float(np.mean([r["vq_decode_s"] for r in records])),
        "nfe_mean": float(np.mean([r["nfe"] for r in records])),
        "step_compression": float(np.mean([r["step_compression"] for r in records])),
        "acceptance_rate": _ratio(total["drafts_accepted"], total["drafts_proposed"]),
        "relaxed_rate": _ratio(total["relaxed_accepts"], total["drafts_accepted"]),
        "filter_pass_rate": _ratio(total["filter_passes"], total["filter_checks"]),
        **{k: int(v) for k, v in total.items()},
    }
