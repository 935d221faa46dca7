"""The matched-compression study across entropy regimes (docs/RESULTS.md "Does the answer depend on entropy?").

A regime is a finished study directory (``stage=study``; ``conf/experiment/entropy_regimes.yaml`` runs one per
sampling temperature of the toy): its AR and SJD runs, the rules' calibrated runs and ``study/study.json``. Per
regime this reads AR's mean target entropy (nats and over ``log V``), and per rule and target the quality loss
against AR at exactly the target's step compression: the study's mixture of the two runs that bracket the target
(``at_targets``; :func:`csd.report.matched.bracketing_mixture`, docs/EVALUATION.md#matched-compression-study) minus
AR, paired over prompts with one resample of the prompts for all three runs
(:func:`csd.evaluation.intervals.paired_difference`, docs/EVALUATION.md#confidence-intervals); and where each
calibrated run's relaxed acceptances land by region.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from csd.evaluation.attribution import REGIONS
from csd.evaluation.intervals import paired_difference, row_key
from csd.report.collect import load_run

#: quality compared with AR in each regime (per-image means, so a mixture of two runs mixes them exactly)
LOSS_METRICS = ("scene_acc_overall", "clip_score")
Row = Mapping[str, Any]


def _mix(x: Any, y: Any, w: float) -> float | None:
    return None if x is None or y is None else w * float(x) + (1 - w) * float(y)


def mixed_rows(a: Sequence[Row], b: Sequence[Row], w: float) -> list[dict[str, Any]]:
    """Per-image rows of the mixture ``w`` x run ``a`` + ``(1 - w)`` x run ``b`` on the (prompt_id, sample) keys both
    runs have: each numeric column mixed per image (bools as 0 / 1; missing in either run: missing). The mean of a
    mixed column is the mixture of the two runs' means over the images both have a value for, so a paired
    comparison with the mixed rows resamples the same prompts for both runs."""
    other = {row_key(r): r for r in b}
    out = []
    for row in a:
        match = other.get(row_key(row))
        if match is None:
            continue
        mixed: dict[str, Any] = {"prompt_id": row["prompt_id"], "sample": row["sample"]}
        for col, x in row.items():
            y = match.get(col)
            numeric = all(v is None or isinstance(v, (bool, int, float)) for v in (x, y))
            if col not in mixed and col in match and numeric:
                mixed[col] = _mix(x, y, w)
        out.append(mixed)
    return out


def per_image(run_dir: Path) -> list[dict[str, Any]]:
    """A run's per-image rows; a run that is missing, not evaluated or stale is refused in one line."""
    run = load_run(run_dir)
    if run is None or not run["per_image"]:
        raise ValueError(f"{run_dir}: no current per_image.jsonl (finish the study there: it resumes)")
    return run["per_image"]


def loss_vs_ar(root: Path, mixture: Mapping[str, float], ar: Sequence[Row], names: Sequence[str],
               n_boot: int) -> dict[str, dict[str, Any]]:
    """Each metric of the study's mixture at a target (``{run directory under root: weight}``) minus AR's, paired
    over prompts: ``{metric: {value, interval}}`` (interval None without a bootstrap, value NaN if not computable)."""
    (first, w), *rest = mixture.items()
    rows = per_image(root / first)
    if rest:
        rows = mixed_rows(rows, per_image(root / rest[0][0]), w)
    out = {}
    for name in names:
        cmp = paired_difference(rows, ar, name, n_boot)
        out[name] = {"value": cmp.value if cmp else math.nan, "interval": cmp.interval if cmp else None}
    return out


def ar_entropy(study: Mapping[str, Any], vocab: int) -> tuple[float, float]:
    """AR's mean target entropy over all positions (nats) from the study's per-region histograms, and over ``log V``."""
    hists = [h for h in study["ar_entropy_by_region"].values() if h["n"]]
    mean = sum(h["n"] * h["mean"] for h in hists) / sum(h["n"] for h in hists)
    return mean, mean / math.log(vocab)


def relaxed_rates(entry: Mapping[str, Any]) -> dict[str, float]:
    """Relaxed acceptances / positions per region of a study run (``relaxed_by_region``; NaN where absent)."""
    regions = entry.get("relaxed_by_region") or {}
    return {r: regions.get(r, {}).get("relaxed_rate", math.nan) for r in REGIONS}


def regime_summary(root: Path, n_boot: int, names: Sequence[str] = LOSS_METRICS) -> dict[str, Any]:
    """One regime (a finished study directory): sampling settings and AR's entropy (from AR's run.json and the
    study), AR's quality, SJD's and every rule's loss vs AR at each target, relaxed rate per region of each run."""
    path = root / "study" / "study.json"
    if not path.exists():
        raise ValueError(f"{root}: no study/study.json (run the study there: it resumes)")
    study = json.loads(path.read_text())
    info = json.loads((root / "ar" / "run.json").read_text())["model_info"]
    mean, share = ar_entropy(study, int(info["vocab_size"]))
    ar = per_image(root / "ar")
    loss = {rule: [{"gain": c["gain"], "loss": loss_vs_ar(root, c["mixture"], ar, names, n_boot)} if "mixture" in c
                   else {"gain": c["gain"], "outside": c["outside"]} for c in cells]
            for rule, cells in study["at_targets"].items()}
    regions = {rule: [{"gain": e["gain"], "rates": relaxed_rates(e)} for e in entries if "run" in e]
               for rule, entries in study["rules"].items()}
    return {"root": str(root), "temperature": info["temperature"], "guidance_scale": info["guidance_scale"],
            "entropy_mean": mean, "entropy_over_log_v": share, "targets": study["targets"],
            "ar": {n: study["references"]["ar"][n] for n in names},
            "sjd_loss": loss_vs_ar(root, {"sjd": 1.0}, ar, names, n_boot), "loss": loss, "regions": regions}


def fmt(cell: Mapping[str, Any], digits: int = 3, sign: str = "+") -> str:
    """``value [lo, hi]`` (signed by default: a difference)."""
    v, iv = cell["value"], cell["interval"]
    if v is None or math.isnan(v):
        return "n/a"
    spec = f"{sign}.{digits}f"
    return f"{v:{spec}} [{iv[0]:{spec}}, {iv[1]:{spec}}]" if iv else f"{v:{spec}}"


def regime_label(r: Mapping[str, Any]) -> str:
    return f"T={r['temperature']:g}, g={r['guidance_scale']:g}"


def loss_table(regimes: Sequence[Mapping[str, Any]], metric: str) -> list[str]:
    """Markdown lines: per regime AR's ``metric`` and SJD's loss, per rule the loss vs AR at each target."""
    targets = regimes[0]["targets"]
    head = ["regime", "mean H / log V", f"AR {metric}", "SJD - AR", "rule",
            *(f"x{g:.2f} SJD: rule - AR" for g in targets)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in regimes:
        ar = r["ar"][metric]
        lead = [regime_label(r), f"{r['entropy_over_log_v']:.3f}", fmt(ar, sign=""), fmt(r["sjd_loss"][metric])]
        for rule, cells in r["loss"].items():
            by_gain = {c["gain"]: c for c in cells}
            row = [fmt(by_gain[g]["loss"][metric]) if "loss" in by_gain.get(g, {}) else "unreached" for g in targets]
            lines.append("| " + " | ".join([*lead, rule, *row]) + " |")
            lead = ["", "", "", ""]
    return lines


def markdown(regimes: Sequence[Mapping[str, Any]]) -> str:
    """regimes.md: the loss tables (one per metric) and the relaxed rate per region of every calibrated run."""
    lines = ["# Matched-compression study across entropy regimes", "",
             "Quality loss against AR at exactly each target step compression (the mixture of the two runs that "
             "bracket it), paired over prompts, 95 % intervals; `unreached`: the rule's runs do not reach the target.",
             ""]
    for metric in LOSS_METRICS:
        lines += [f"## {metric}", "", *loss_table(regimes, metric), ""]
    lines += ["## Relaxed acceptances per region (share of the region's positions, each calibrated run)", "",
              "| regime | rule | target | " + " | ".join(REGIONS) + " |", "|" + "---|" * (3 + len(REGIONS))]
    for r in regimes:
        for rule, runs in r["regions"].items():
            for run in runs:
                rates = " | ".join(f"{run['rates'][reg]:.4f}" for reg in REGIONS)
                lines.append(f"| {regime_label(r)} | {rule} | x{run['gain']:.2f} | {rates} |")
    return "\n".join(lines) + "\n"


def figure(regimes: Sequence[Mapping[str, Any]], out: Path, metric: str = LOSS_METRICS[0]) -> None:
    """regimes.png: per regime (columns) the loss vs AR against the target gain per rule (top; SJD at gain 1) and
    the relaxed rate per region of every calibrated run (bottom); one colour per rule in every column, the rules'
    legend above the panels and the regions' below them (:func:`csd.report.layout.legend_below`), not on the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from csd.report.layout import legend_below

    rules = list(dict.fromkeys(rule for r in regimes for rule in r["loss"]))
    colours = {rule: plt.get_cmap("tab10")(i % 10) for i, rule in enumerate(rules)}
    fig, axes = plt.subplots(2, len(regimes), figsize=(5 * len(regimes), 8), squeeze=False, layout="constrained")
    handles = {}
    for col, r in enumerate(regimes):
        top, bottom = axes[0][col], axes[1][col]
        sjd = r["sjd_loss"][metric]
        for rule, cells in r["loss"].items():
            got = [(1.0, sjd)] + [(c["gain"], c["loss"][metric]) for c in cells if "loss" in c]
            ys = [c["value"] for _, c in got]
            err = np.array([[max(c["value"] - c["interval"][0], 0), max(c["interval"][1] - c["value"], 0)]
                            if c["interval"] else [0.0, 0.0] for _, c in got]).T
            handles[rule] = top.errorbar([g for g, _ in got], ys, yerr=err, fmt="-o", capsize=3, label=rule,
                                         color=colours[rule])
        top.axhline(0, color="black", lw=0.5)
        top.set_title(f"{regime_label(r)} (mean H / log V {r['entropy_over_log_v']:.3f})", fontsize=9)
        top.set_xlabel("step compression / SJD's")
        top.set_ylabel(f"{metric}: rule - AR")
        runs = [(f"{rule} x{run['gain']:.2f}", run["rates"]) for rule, rs in r["regions"].items() for run in rs]
        width = 0.8 / len(REGIONS)
        x = np.arange(len(runs))
        for j, reg in enumerate(REGIONS):
            bottom.bar(x + j * width, [rates[reg] for _, rates in runs], width, label=reg)
        bottom.set_xticks(x + width, [label for label, _ in runs], rotation=60, ha="right", fontsize=6)
        bottom.set_ylabel("relaxed acceptances / positions")
    rule_legend = fig.legend(handles=[handles[rule] for rule in rules if rule in handles], loc="outside upper center",
                             ncols=min(len(handles), 8) or 1, fontsize=7)
    fig.set_figheight(fig.get_figheight() + rule_legend.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi)
    legend_below(fig, axes[1][0].get_legend_handles_labels()[0], max_cols=len(REGIONS))
    fig.savefig(out / "regimes.png", dpi=120)
    plt.close(fig)


def build_regimes(roots: Sequence[Path], out: Path, n_boot: int) -> list[dict[str, Any]]:
    """``<out>/regimes.json``, ``regimes.md`` and ``regimes.png`` over the study directories ``roots``, ordered by
    AR's mean target entropy."""
    regimes = sorted((regime_summary(root, n_boot) for root in roots), key=lambda r: r["entropy_mean"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "regimes.json").write_text(json.dumps(regimes, indent=1, default=float))
    (out / "regimes.md").write_text(markdown(regimes))
    figure(regimes, out)
    return regimes
