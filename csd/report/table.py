"""The paper-style results table, one per model: CSV (intervals as lo / hi columns) and Markdown (``value [lo, hi]``)."""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from csd.presets import CONF_DIR
from csd.registry import FID_BACKENDS
from csd.report.collect import method_label
from csd.report.labels import CHAIN, default_drafter, method_defaults

log = logging.getLogger(__name__)
#: characters per line of the console table's notes
NOTE_WIDTH = 110
METHOD_ORDER = (
    "ar", "sjd", "sjd_l32", "mcsjd", "sjd_pac", "gsd", "gsd_g25", "addition", "amplify", "amplify_k4", "lantern",
    "lantern_pp", "eagle_sd",
    "entropy_sjd", "cool_sd", "csd", "csd_mc", "csd_pac",
)
#: frame column -> table header (columns a sweep did not measure are dropped); ``d_*`` = paired difference vs AR
COLUMNS = {
    "label": "method", "lam": "lambda", "delta": "delta", "latency_mean": "latency (s)", "speedup": "speed-up",
    "step_compression": "step compression", "skipped_per_image": "skipped rounds / image",
    "acceptance_rate": "acceptance", "clip_score": "CLIP", "d_clip_score": "Δ CLIP", "fid": "FID",
    "fid_clean": "FID clean-fid", "fid_clean_legacy_tf": "FID clean-fid legacy TF",
    "fid_clean_legacy_pt": "FID clean-fid legacy PT", "fid_pytorch": "FID pytorch-fid",
    "scene_acc_overall": "scene acc.", "d_scene_acc_overall": "Δ scene acc.",
    "geneval_overall": "GenEval", "d_geneval_overall": "Δ GenEval",
    "hpsv2": "HPSv2.1", "d_hpsv2": "Δ HPSv2.1", "image_reward": "ImageReward", "d_image_reward": "Δ ImageReward",
    "inception_score": "IS", "precision": "precision", "d_precision": "Δ precision", "recall": "recall",
    "dpg_score": "DPG", "d_dpg_score": "Δ DPG",
}
#: comparisons with AR and their no-difference value: an interval containing it is flagged
NO_DIFFERENCE = {"speedup": 1.0, "d_clip_score": 0.0, "d_scene_acc_overall": 0.0, "d_geneval_overall": 0.0,
                 "d_hpsv2": 0.0, "d_image_reward": 0.0, "d_precision": 0.0, "d_dpg_score": 0.0}
FLAG = "†"
NOTE_INTERVALS = (
    "`value [lo, hi]`: 95 % percentile-bootstrap interval over prompts, all samples of a prompt resampled together (FID: below). "
    "Speed-up and Δ (method − AR) are paired: the images both runs have, the same resampled prompts for both."
)
NOTE_FLAG = f"{FLAG} the interval contains 0 (speed-up: 1): not distinguishable from AR with this many prompts."
#: fewer prompts than this behind an interval and it is marked :data:`SMALL_N` (docs/EVALUATION.md#confidence-intervals)
MIN_PROMPTS = 20
SMALL_N = "‡"
NOTE_SMALL_N = (
    f"{SMALL_N} fewer than {MIN_PROMPTS} prompts behind the interval: a rough guide only (a percentile bootstrap over "
    "so few prompts is too narrow, docs/EVALUATION.md#confidence-intervals)."
)
#: the FID columns, one per evaluator of ``eval.fid.backends`` (``csd.registry.FID_BACKENDS``)
FID_COLUMNS = tuple(FID_BACKENDS.values())
#: the quality column of the compact console table: the first one measured (the toy's and GenEval's own first)
MAIN_QUALITY = ("scene_acc_overall", "geneval_overall", "clip_score", *FID_COLUMNS)
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


def interval_cell(value: float, lo: float, hi: float, no_difference: float | None = None, few: bool = False) -> str | None:
    """``value [lo, hi]`` (``value`` alone without an interval, None without a value), with :data:`FLAG` when the
    interval contains ``no_difference`` and :data:`SMALL_N` when it rests on ``few`` prompts."""
    if pd.isna(value):
        return None
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.3g}"
    if hi - lo > 1e-9 * max(abs(lo), abs(hi), 1.0):  # not zero width up to rounding
        d = _decimals(lo, hi)
        text = f"{value:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"
    else:
        text = f"{value:.3g} [{lo:.3g}, {hi:.3g}]"
    text += f" {FLAG}" if no_difference is not None and lo <= no_difference <= hi else ""
    return text + (f" {SMALL_N}" if few else "")


def interval_cells(rows: pd.DataFrame, column: str) -> list[str | None]:
    """:func:`interval_cell` of ``column`` in every row; comparisons with AR count the prompts both runs have."""
    counts = rows.get("n_prompts_paired" if column in NO_DIFFERENCE else "n_prompts", [None] * len(rows))
    return [interval_cell(v, lo, hi, NO_DIFFERENCE.get(column), few=bool(pd.notna(n) and n < MIN_PROMPTS))
            for v, lo, hi, n in zip(rows[column], rows[f"{column}_lo"], rows[f"{column}_hi"], counts, strict=True)]


def _flag_notes(cells: dict[str, list]) -> list[str]:
    """The notes of the flags that ``cells`` carry."""
    texts = [c for column in cells.values() for c in column if isinstance(c, str)]
    return [note for flag, note in ((FLAG, NOTE_FLAG), (SMALL_N, NOTE_SMALL_N)) if any(flag in c for c in texts)]


def defaults_note(methods: Sequence[str]) -> str | None:
    """The labels' rule and each method's defaults beyond its drafter's (``conf/drafter/<drafter>.yaml``, the drafter
    named unless it is the chain): ``csd lam=0.1 delta=0.5 ...``, ``sjd_pac pac_tree``; None when no method has a
    config file."""
    parts = []
    for method in dict.fromkeys(methods):
        defaults, drafter = method_defaults(method), default_drafter(method)
        if defaults is not None:
            engine = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "drafter" / f"{drafter}.yaml"))
            own = [k for k, v in defaults.items() if k not in engine or engine[k] != v]
            parts.append(method_label(method if drafter == CHAIN else f"{method} {drafter}", defaults, own))
    if not parts:
        return None
    return ("Labels name a method's drafter where its runs use several or not its own, and only the hyper-parameters "
            "that differ from the defaults or between its runs; the defaults (`conf/method/<method>.yaml`, beyond its "
            "drafter's `conf/drafter/<drafter>.yaml`, the chain unless named): " + "; ".join(parts) + ".")


def markdown_table(df: pd.DataFrame) -> tuple[str, list[str]]:
    """The table in :func:`paper_order` with ``value [lo, hi]`` cells, :data:`FLAG` on comparisons with AR whose
    interval contains no difference and :data:`SMALL_N` on intervals over fewer than :data:`MIN_PROMPTS` prompts;
    returns the Markdown and the footnotes it needs."""
    table, notes = full_cells(df)
    return table.to_markdown(index=False, floatfmt=".3g", missingval=""), notes


def full_cells(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The cells of :func:`markdown_table` (rows in :func:`paper_order`, None where empty) and its footnotes."""
    rows = paper_order(df)
    cells: dict[str, list] = {}
    for column, header in COLUMNS.items():
        if not _measured(rows, column):
            continue
        if _measured(rows, f"{column}_lo"):
            cells[header] = interval_cells(rows, column)
        else:
            cells[header] = list(rows[column])
    table = pd.DataFrame(cells).astype(object)
    table = table.where(table.notna(), None)  # tabulate blanks None, not NaN
    notes = [NOTE_INTERVALS] if any(_measured(rows, f"{c}_lo") for c in COLUMNS) else []
    notes += _flag_notes(cells)
    if any(_measured(rows, m) for m in FID_COLUMNS):
        notes.append(NOTE_FID)
    if (note := defaults_note(rows["method"])) is not None:
        notes.append(note)
    return table, notes


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
    """``table_<model>.csv`` and ``.md`` (with its footnotes) for each model of the sweep, warning once per table
    whose intervals rest on fewer than :data:`MIN_PROMPTS` prompts; returns the Markdown paths."""
    written = []
    for model, group in df.groupby("model"):
        paper_table(group).to_csv(out_dir / f"table_{model}.csv", index=False)
        markdown, notes = markdown_table(group)
        if NOTE_SMALL_N in notes:
            log.warning("%s: intervals over fewer than %d prompts (as few as %d) are marked %s in the table: a rough "
                        "guide only", model, MIN_PROMPTS, group["n_prompts"].min(), SMALL_N)
        md = out_dir / f"table_{model}.md"
        md.write_text(f"### {model} ({table_context(group)})\n\n" + markdown + "\n"
                      + "".join(f"\n{note}\n" for note in notes), encoding="utf-8")
        written.append(md)
    return written


def compact_table(group: pd.DataFrame) -> tuple[str, list[str]]:
    """One model's runs for the console: method, knobs (the label's hyper-parameters), speed-up, step compression
    and the main quality (:data:`MAIN_QUALITY`; a FID: each evaluator's) with its interval; returns the Markdown and its flags' notes."""
    table, notes = compact_cells(group)
    return table.to_markdown(index=False, missingval="", disable_numparse=True), notes


def main_quality(rows: pd.DataFrame) -> str | None:
    """The first metric of :data:`MAIN_QUALITY` the runs measured."""
    return next((m for m in MAIN_QUALITY if _measured(rows, m)), None)


def compact_cells(group: pd.DataFrame, delta: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """The cells of :func:`compact_table` (rows in :func:`paper_order`, None where empty) and its flags' notes;
    ``delta``: also the main quality's paired difference from AR (``Δ ...``) with its interval, where measured."""
    rows = paper_order(group)
    cells: dict[str, list] = {"method": list(rows["method"])}
    knobs = [label.removeprefix(method).strip() for label, method in zip(rows["label"], rows["method"], strict=True)]
    if any(knobs):
        cells["knobs"] = knobs
    if _measured(rows, "speedup"):
        cells[COLUMNS["speedup"]] = (interval_cells(rows, "speedup") if _measured(rows, "speedup_lo")
                                     else [interval_cell(v, math.nan, math.nan) for v in rows["speedup"]])
    if _measured(rows, "step_compression"):
        cells[COLUMNS["step_compression"]] = [None if pd.isna(v) else f"{v:.2f}" for v in rows["step_compression"]]
    main = main_quality(rows)
    # a FID is shown by every evaluator measured (eval.fid.backends), side by side
    for quality in [m for m in FID_COLUMNS if _measured(rows, m)] if main in FID_COLUMNS else [main] if main else []:
        cells[COLUMNS[quality]] = (interval_cells(rows, quality) if _measured(rows, f"{quality}_lo")
                                   else [interval_cell(v, math.nan, math.nan) for v in rows[quality]])
    if main is not None:
        diff = f"d_{main}"
        if delta and diff in COLUMNS and _measured(rows, diff):
            cells[COLUMNS[diff]] = (interval_cells(rows, diff) if _measured(rows, f"{diff}_lo")
                                    else [interval_cell(v, math.nan, math.nan) for v in rows[diff]])
    table = pd.DataFrame(cells).astype(object)
    table = table.where(table.notna(), None)
    return table, _flag_notes(cells)


def console_tables(df: pd.DataFrame, out_dir: Path) -> str:
    """What ``stage=report`` prints: per model its :func:`compact_table`, the notes it needs and where the full
    table is (``<out_dir>/table_<model>.md``)."""
    parts = []
    for model, group in df.groupby("model"):
        table, notes = compact_table(group)
        notes = ["`value [lo, hi]`: 95 % interval over prompts.", *notes]
        parts.append(f"### {model} ({table_context(group)})\n\n{table}\n\n"
                     + "\n".join(textwrap.fill(note, NOTE_WIDTH) for note in notes)
                     + f"\nfull table: {out_dir / f'table_{model}.md'}\n")
    return "\n".join(parts)
