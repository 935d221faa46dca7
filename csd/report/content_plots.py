"""Content-awareness plots: where drafts are accepted (token-grid heatmaps), vs entropy, vs toy regions."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from csd.report.pareto import run_styles

MAP_TITLES = {"accepted": "draft accepted", "relaxed": "relaxed accept", "commit_iter": "commit iteration\n(normalised)"}
#: what an all-zero map means, written in its panel instead (AR accepts no draft, lossless methods relax none)
EMPTY_TEXT = {"accepted": "no draft accepted", "relaxed": "no relaxed accept", "commit_iter": "no commit order"}
#: characters per line of a run's label left of its row
LABEL_WIDTH = 24


def carries_information(values: Any) -> bool:
    """False for a map that is all zero (or has no value): nothing to show but its colour at 0."""
    array = np.asarray(values, dtype=float)
    return bool(np.isfinite(array).any() and np.nanmax(np.abs(array)) > 0)


def heatmap_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Rows = runs ``(label, acceptance_maps)`` with the label at their left, columns = accepted / relaxed /
    commit-iteration means, one colour bar per column (relaxed: 0 to the largest share, often a few percent).

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
                ax.set_ylabel(textwrap.fill(label, LABEL_WIDTH), rotation=0, ha="right", va="center", fontsize=8)
            if carries_information(maps[key]):
                image = ax.imshow(np.asarray(maps[key], float), vmin=0, vmax=vmax, cmap="viridis")
            else:
                ax.text(0.5, 0.5, EMPTY_TEXT[key], ha="center", va="center", fontsize=7, color="0.4",
                        transform=ax.transAxes)
                ax.set_facecolor("0.95")
                ax.set_box_aspect(np.shape(maps[key])[0] / np.shape(maps[key])[1])  # as large as an image panel
        if image is not None:
            fig.colorbar(image, ax=axes[:, j], location="bottom", shrink=0.8, aspect=15, pad=0.02)
    return fig


def entropy_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Share of positions committed from an accepted draft (solid) / a relaxed one (dashed) per entropy bin, one
    colour and marker per run (:func:`csd.report.pareto.run_styles`), the legend beside the plot."""
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    for (label, curve), (colour, marker) in zip(runs, run_styles(len(runs)), strict=True):
        edges = np.asarray(curve["edges"])
        centres = (edges[:-1] + edges[1:]) / 2
        ax.plot(centres, np.asarray(curve["accepted"], float), "-", marker=marker, ms=3, c=colour, label=label)
        relaxed = np.asarray(curve["relaxed"], float)
        if np.nansum(relaxed) > 0:
            ax.plot(centres, relaxed, "--", c=colour)
    ax.set_xlabel("target entropy H(q) (nats)")
    ax.set_ylabel("share of positions accepted (-- relaxed)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=7)
    return fig


def regions_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Toy: relaxed-acceptance share of positions in object / smooth / textured regions, bars per run."""
    regions = ("object", "smooth", "textured")
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(runs) + 2), 4))
    width = 0.8 / len(regions)
    x = np.arange(len(runs))
    for k, reg in enumerate(regions):
        vals = [r[reg]["relaxed_rate"] for _, r in runs]
        ax.bar(x + (k - 1) * width, vals, width, label=reg)
    ax.set_xticks(x, [label for label, _ in runs], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("relaxed accepts / positions")
    ax.legend()
    fig.tight_layout()
    return fig


def save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
