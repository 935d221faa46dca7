"""A paper's published numbers beside ours: the ``published`` block of an experiment preset (model -> dataset ->
method -> step compression, latency speed-up, FID; conf/experiment/paper_sjd_pac_table.yaml) as a table per model and
dataset, each measure's "ours" column (the mean over the runs of that method; speed-up against this sweep's AR run)
followed by its "published" column. Published methods without a run here keep their row (ours empty)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from csd.report.table import paper_order

#: measure -> header, in the order of the published tables
MEASURES = {"step_compression": "step compression", "speedup": "speed-up", "fid": "FID"}
NOTE = ("published: the numbers of the experiment preset's `published` block, measured by their authors on their own "
        "pipeline (hardware, prompts and FID protocol may differ): compare the ratios, not the digits.")


def published_frame(df: pd.DataFrame, published: Mapping[str, Any], model: str, dataset: str) -> pd.DataFrame | None:
    """One model's and dataset's rows: ``method``, then per measure ``<header>`` (ours) and ``<header> published``;
    None when nothing is published for them."""
    entries = (published.get(model) or {}).get(dataset) or {}
    if not entries:
        return None
    ours = paper_order(df[(df["model"] == model) & (df["dataset"] == dataset)]) if len(df) else df
    methods = list(dict.fromkeys([*ours.get("method", []), *entries]))
    rows = []
    for method in methods:
        mine, theirs = ours[ours["method"] == method] if len(ours) else ours, entries.get(method) or {}
        row: dict[str, Any] = {"method": method}
        for measure, header in MEASURES.items():
            row[header] = float(mine[measure].mean()) if measure in mine and mine[measure].notna().any() else None
            row[f"{header} published"] = theirs.get(measure)
        rows.append(row)
    table = pd.DataFrame(rows)
    keep = [c for c in table.columns if c == "method" or table[c].notna().any()]
    return table[keep]


def _cell(value: Any, header: str) -> str:
    if value is None or pd.isna(value):
        return ""
    return f"{value:.2f}" if header.startswith("FID") else f"{value:.2f}x"


def write_published(df: pd.DataFrame, published: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """``published_<model>_<dataset>.csv`` and ``.md`` for every model and dataset the block names; returns the
    Markdown paths."""
    written = []
    for model, datasets in published.items():
        for dataset in datasets or {}:
            table = published_frame(df, published, model, dataset)
            if table is None:
                continue
            stem = out_dir / f"published_{model}_{dataset}"
            table.to_csv(stem.with_suffix(".csv"), index=False)
            cells = table.astype(object).apply(lambda col: col.map(lambda v, h=col.name: v if h == "method" else _cell(v, h)))
            md = stem.with_suffix(".md")
            md.write_text(f"### {model} on {dataset}: ours and published\n\n"
                          + cells.to_markdown(index=False, disable_numparse=True) + f"\n\n{NOTE}\n", encoding="utf-8")
            written.append(md)
    return written
