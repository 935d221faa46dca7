"""Content-awareness plots: where drafts are accepted (token-grid heatmaps), vs entropy, vs toy regions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from csd.report.layout import legend_below, wrap
from csd.report.pareto import run_styles

MAP_TITLES = {"accepted": "draft accepted", "relaxed": "relaxed accept", "commit_iter": "commit iteration\n(normalised)"}
#: what a map's colour measures, under its colour bar (csd.evaluation.content.acceptance_maps)
MAP_UNITS = {"accepted": "share of images", "relaxed": "share of images", "commit_iter": "0 = first, 1 = last"}
#: what an all-zero map means, written in its panel instead (AR accepts no draft, lossless methods relax none)
EMPTY_TEXT = {"accepted": "no draft accepted", "relaxed": "no relaxed accept", "commit_iter": "no commit order"}
#: characters per line of a run's label left of its row
LABEL_WIDTH = 24
REGIONS = ("object", "smooth", "textured")


def carries_information(values: Any) -> bool:
    """False for a map that is all zero (or has no value): nothing to show but its colour at 0."""
    array = np.asarray(values, dtype=float)
    return bool(np.isfinite(array).any() and np.nanmax(np.abs(array)) > 0)


def heatmap_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Rows = runs ``(label, acceptance_maps)`` with the label at their left, columns = accepted / relaxed /
    commit-iteration means over the token grid (axes: token column and row), one colour bar per column with its
    unit (relaxed: 0 to the largest share, often a few percent).

    A map that is all zero says so in its panel (e.g. ``no relaxed accept`` of a lossless method); a column no
    run fills is left out.
    """
    keys = [k for k in MAP_TITLES if any(carries_information(maps[k]) for _, maps in runs)] or list(MAP_TITLES)
    size = 1.7 if len(runs) <= 12 else 1.2
    fig, axes = plt.subplots(len(runs), len(keys), figsize=(size * len(keys) + 1.8, size * len(runs) + 1.2),
                             squeeze=False, layout="constrained")
    for j, key in enumerate(keys):
        top = max((np.nanmax(np.asarray(m[key], float)) for _, m in runs if carries_information(m[key])), default=1.0)
        vmax = 1.0 if key != "relaxed" else float(top)
        image = None
        for i, (label, maps) in enumerate(runs):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(MAP_TITLES[key], fontsize=9)
            if j == 0:
                ax.set_ylabel(wrap(label, LABEL_WIDTH), rotation=0, ha="right", va="center", fontsize=8)
            if carries_information(maps[key]):
                image = ax.imshow(np.asarray(maps[key], float), vmin=0, vmax=vmax, cmap="viridis")
            else:
                ax.text(0.5, 0.5, EMPTY_TEXT[key], ha="center", va="center", fontsize=7, color="0.4",
                        transform=ax.transAxes)
                ax.set_facecolor("0.95")
                ax.set_box_aspect(np.shape(maps[key])[0] / np.shape(maps[key])[1])  # as large as an image panel
        if image is not None:
            bar = fig.colorbar(image, ax=axes[:, j], location="bottom", shrink=0.8, aspect=15, pad=0.02)
            bar.set_label(MAP_UNITS[key], fontsize=8)
    fig.supxlabel("token column (left to right)", fontsize=9)
    fig.supylabel("token row (top to bottom)", fontsize=9)
    return fig


def entropy_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Share of positions committed from an accepted draft (solid) / a relaxed one (dashed) per entropy bin, one
    colour and marker per run (:func:`csd.report.pareto.run_styles`), the legend under the plot."""
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    handles = []
    dashed = False
    for (label, curve), (colour, marker) in zip(runs, run_styles(len(runs)), strict=True):
        edges = np.asarray(curve["edges"])
        centres = (edges[:-1] + edges[1:]) / 2
        handles += ax.plot(centres, np.asarray(curve["accepted"], float), "-", marker=marker, ms=3, c=colour,
                           label=wrap(label))
        relaxed = np.asarray(curve["relaxed"], float)
        if np.nansum(relaxed) > 0:
            ax.plot(centres, relaxed, "--", c=colour)
            dashed = True
    if dashed:
        handles.append(Line2D([], [], ls="--", c="0.3", label="dashed: relaxed accepts"))
    ax.set_xlabel("target entropy H(q) (nats)")
    ax.set_ylabel("share of positions accepted")
    ax.grid(alpha=0.3)
    legend_below(fig, handles)
    return fig


def regions_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Toy: relaxed-acceptance share of positions in object / smooth / textured regions, one group of horizontal
    bars per run (its label beside it, read level), regions in the legend under the plot; a run with none says so."""
    fig, ax = plt.subplots(figsize=(7, max(3.0, 0.8 + 0.75 * len(runs))), layout="constrained")
    height = 0.8 / len(REGIONS)
    y = np.arange(len(runs))
    rates = np.array([[r[reg]["relaxed_rate"] for reg in REGIONS] for _, r in runs], dtype=float)
    for k, reg in enumerate(REGIONS):
        ax.barh(y + (k - 1) * height, rates[:, k], height, label=reg)
    top = np.nanmax(rates) if np.isfinite(rates).any() and np.nanmax(rates) > 0 else 1.0
    ax.set_xlim(0, 1.15 * top)
    for i in np.flatnonzero(~(np.nan_to_num(rates) > 0).any(axis=1)):
        ax.text(0.01 * top, y[i], "no relaxed accept", va="center", fontsize=7, color="0.4")
    ax.set_yticks(y, [wrap(label, LABEL_WIDTH) for label, _ in runs], fontsize=8)
    ax.invert_yaxis()  # the first run on top, as in the tables
    ax.set_xlabel("relaxed accepts / positions in the region")
    ax.set_ylabel("run")
    ax.grid(axis="x", alpha=0.3)
    legend_below(fig, ax.get_legend_handles_labels()[0])
    return fig


def save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
