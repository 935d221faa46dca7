"""The paper-style results table, one per model: CSV (intervals as lo / hi columns) and Markdown (``value [lo, hi]``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from csd.config import CONF_DIR
from csd.report.collect import method_label
from csd.report.labels import method_defaults

METHOD_ORDER = (
    "ar", "sjd", "sjd_l32", "mcsjd", "sjd_pac", "gsd", "gsd_g25", "addition", "amplify", "amplify_k4", "lantern",
    "entropy_sjd", "cool_sd", "csd", "csd_mc", "csd_pac",
)
#: frame column -> table header (columns a sweep did not measure are dropped); ``d_*`` = paired difference vs AR
COLUMNS = {
    "label": "method", "lam": "lambda", "delta": "delta", "latency_mean": "latency (s)", "speedup": "speed-up",
    "step_compression": "step compression", "acceptance_rate": "acceptance", "clip_score": "CLIP",
    "d_clip_score": "Δ CLIP", "fid": "FID", "scene_acc_overall": "scene acc.", "d_scene_acc_overall": "Δ scene acc.",
    "geneval_overall": "GenEval", "d_geneval_overall": "Δ GenEval",
}
#: comparisons with AR and their no-difference value: an interval containing it is flagged
NO_DIFFERENCE = {"speedup": 1.0, "d_clip_score": 0.0, "d_scene_acc_overall": 0.0, "d_geneval_overall": 0.0}
FLAG = "†"
NOTE_INTERVALS = (
    "`value [lo, hi]`: 95 % percentile-bootstrap interval over prompts, all samples of a prompt resampled together (FID: below). "
    "Speed-up and Δ (method − AR) are paired: the images both runs have, the same resampled prompts for both."
)
NOTE_FLAG = f"{FLAG} the interval contains 0 (speed-up: 1): not distinguishable from AR with this many prompts."
NOTE_FID = (
    "FID interval: delete-a-group jackknife over prompts, reference statistics fixed; it is an interval for FID "
    "at this image count. FID is biased upwards on small image sets: compare FIDs only at equal image counts."
)


def paper_order(df: pd.DataFrame) -> pd.DataFrame:
    """The runs in the papers' method order (unknown methods last), then by lambda, delta and label."""
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    rows = df.assign(_order=df["method"].map(lambda m: order.get(m, len(order))))
    return rows.sort_values(["_order", "method", "lam", "delta", "label"], na_position="first").drop(columns="_order")


def _measured(rows: pd.DataFrame, column: str) -> bool:
    return column in rows and rows[column].notna().any()


def paper_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in :func:`paper_order`, paper column names, each interval as ``<name> lo`` and ``<name> hi`` columns
    right after its value, rounded to 3 decimals."""
    rows = paper_order(df)
    out = {}
    for column, header in COLUMNS.items():
        if _measured(rows, column):
            out[header] = rows[column]
            if _measured(rows, f"{column}_lo"):
                out[f"{header} lo"], out[f"{header} hi"] = rows[f"{column}_lo"], rows[f"{column}_hi"]
    return pd.DataFrame(out).round(3).reset_index(drop=True)


def _decimals(lo: float, hi: float) -> int:
    """Decimals that show the interval's width to two significant digits (0 to 6)."""
    return min(6, max(0, 1 - math.floor(math.log10(hi - lo))))


def interval_cell(value: float, lo: float, hi: float, no_difference: float | None = None) -> str | None:
    """``value [lo, hi]`` (``value`` alone without an interval, None without a value), with :data:`FLAG` when the
    interval contains ``no_difference``."""
    if pd.isna(value):
        return None
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.3g}"
    if hi - lo > 1e-9 * max(abs(lo), abs(hi), 1.0):  # not zero width up to rounding
        d = _decimals(lo, hi)
        text = f"{value:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"
    else:
        text = f"{value:.3g} [{lo:.3g}, {hi:.3g}]"
    return text + (f" {FLAG}" if no_difference is not None and lo <= no_difference <= hi else "")


def defaults_note(methods: Sequence[str]) -> str | None:
    """The labels' rule and each method's defaults beyond the engine-wide ones of ``conf/method_keys.yaml``
    (``csd lam=0.1 delta=0.5 ...``); None when no method has a config file."""
    engine = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method_keys.yaml"))
    parts = []
    for method in dict.fromkeys(methods):
        defaults = method_defaults(method)
        if defaults is not None:
            own = [k for k, v in defaults.items() if k not in engine or engine[k] != v]
            parts.append(method_label(method, defaults, own))
    if not parts:
        return None
    return ("Labels name only the hyper-parameters that differ from the method's defaults or between its runs; "
            "the defaults (`conf/method/<method>.yaml`, beyond `conf/method_keys.yaml`): " + "; ".join(parts) + ".")


def markdown_table(df: pd.DataFrame) -> tuple[str, list[str]]:
    """The table in :func:`paper_order` with ``value [lo, hi]`` cells and :data:`FLAG` on comparisons with AR whose
    interval contains no difference; returns the Markdown and the footnotes it needs."""
    rows = paper_order(df)
    cells: dict[str, list] = {}
    for column, header in COLUMNS.items():
        if not _measured(rows, column):
            continue
        if _measured(rows, f"{column}_lo"):
            cells[header] = [interval_cell(v, lo, hi, NO_DIFFERENCE.get(column))
                             for v, lo, hi in zip(rows[column], rows[f"{column}_lo"], rows[f"{column}_hi"], strict=True)]
        else:
            cells[header] = list(rows[column])
    table = pd.DataFrame(cells).astype(object)
    table = table.where(table.notna(), None)  # tabulate blanks None, not NaN
    notes = [NOTE_INTERVALS] if any(_measured(rows, f"{c}_lo") for c in COLUMNS) else []
    if any(isinstance(c, str) and c.endswith(FLAG) for column in cells.values() for c in column):
        notes.append(NOTE_FLAG)
    if _measured(rows, "fid"):
        notes.append(NOTE_FID)
    if (note := defaults_note(rows["method"])) is not None:
        notes.append(note)
    return table.to_markdown(index=False, floatfmt=".3g", missingval=""), notes


def table_context(group: pd.DataFrame) -> str:
    """A table heading's context: the datasets and the evaluation protocols (``eval.protocol``) of its runs; several
    protocols are named as such, since their quality columns must not be compared (docs/EVALUATION.md)."""
    context = ", ".join(sorted(group["dataset"].unique()))
    protocols = sorted(p for p in group.get("protocol", pd.Series(dtype=object)).dropna().unique())
    if len(protocols) == 1:
        context += f"; eval protocol: {protocols[0]}"
    elif protocols:
        context += f"; MIXED eval protocols {', '.join(protocols)}: quality columns do not compare across them"
    return context


def write_tables(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``table_<model>.csv`` and ``.md`` (with its footnotes) for each model of the sweep; returns the Markdown paths."""
    written = []
    for model, group in df.groupby("model"):
        paper_table(group).to_csv(out_dir / f"table_{model}.csv", index=False)
        markdown, notes = markdown_table(group)
        md = out_dir / f"table_{model}.md"
        md.write_text(f"### {model} ({table_context(group)})\n\n" + markdown + "\n"
                      + "".join(f"\n{note}\n" for note in notes), encoding="utf-8")
        written.append(md)
    return written
