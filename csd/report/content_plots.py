"""Content-awareness plots: where drafts are accepted (token-grid heatmaps), vs entropy, vs toy regions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

MAP_TITLES = {"accepted": "draft accepted", "relaxed": "relaxed accept", "commit_iter": "commit iteration (norm.)"}


def heatmap_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Rows = runs ``(label, acceptance_maps)``, columns = accepted / relaxed / commit-iteration means."""
    fig, axes = plt.subplots(len(runs), len(MAP_TITLES), figsize=(3.2 * len(MAP_TITLES), 3 * len(runs)), squeeze=False)
    for i, (label, maps) in enumerate(runs):
        for j, (key, title) in enumerate(MAP_TITLES.items()):
            im = axes[i][j].imshow(np.asarray(maps[key]), vmin=0, vmax=1, cmap="viridis")
            axes[i][j].set_title(f"{label}\n{title}", fontsize=8)
            axes[i][j].set_xticks([])
            axes[i][j].set_yticks([])
            fig.colorbar(im, ax=axes[i][j], fraction=0.046)
    fig.tight_layout()
    return fig


def entropy_figure(runs: Sequence[tuple[str, dict[str, Any]]]) -> plt.Figure:
    """Share of positions committed from an accepted draft (solid) / a relaxed one (dashed) per entropy bin."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in runs:
        edges = np.asarray(curve["edges"])
        centres = (edges[:-1] + edges[1:]) / 2
        (line,) = ax.plot(centres, np.asarray(curve["accepted"], float), "o-", ms=3, label=label)
        relaxed = np.asarray(curve["relaxed"], float)
        if np.nansum(relaxed) > 0:
            ax.plot(centres, relaxed, "--", c=line.get_color())
    ax.set_xlabel("target entropy H(q) (nats)")
    ax.set_ylabel("share of positions accepted (-- relaxed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
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
