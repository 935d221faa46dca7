"""The paper-style results table, one per model: CSV and Markdown."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

METHOD_ORDER = ("ar", "sjd", "sjd_l32", "mcsjd", "gsd", "gsd_g25", "addition", "amplify", "amplify_k4", "lantern", "csd")
#: frame column -> table header (columns a sweep did not measure are dropped)
COLUMNS = {
    "label": "method", "lam": "lambda", "delta": "delta", "latency_mean": "latency (s)", "speedup": "speed-up",
    "step_compression": "step compression", "acceptance_rate": "acceptance", "clip_score": "CLIP",
    "fid": "FID", "scene_acc_overall": "scene acc.",
}


def paper_order(df: pd.DataFrame) -> pd.DataFrame:
    """The runs in the papers' method order (unknown methods last), then by lambda, delta and label."""
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    rows = df.assign(_order=df["method"].map(lambda m: order.get(m, len(order))))
    return rows.sort_values(["_order", "method", "lam", "delta", "label"], na_position="first").drop(columns="_order")


def paper_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in :func:`paper_order`, paper column names, rounded."""
    rows = paper_order(df)
    cols = [c for c in COLUMNS if c in rows and rows[c].notna().any()]
    return rows[cols].rename(columns=COLUMNS).round(3).reset_index(drop=True)


def _markdown(table: pd.DataFrame) -> str:
    """Markdown with empty cells where a method has no such value (tabulate blanks None, not NaN)."""
    cells = table.astype(object).where(table.notna(), None)
    return cells.to_markdown(index=False, floatfmt=".3g", missingval="")


def write_tables(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``table_<model>.csv`` and ``.md`` for each model of the sweep; returns the Markdown paths."""
    written = []
    for model, group in df.groupby("model"):
        table = paper_table(group)
        table.to_csv(out_dir / f"table_{model}.csv", index=False)
        md = out_dir / f"table_{model}.md"
        md.write_text(f"### {model} ({', '.join(sorted(group['dataset'].unique()))})\n\n"
                      + _markdown(table) + "\n", encoding="utf-8")
        written.append(md)
    return written
