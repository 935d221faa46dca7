"""Speed vs quality Pareto plots: one point per run, the non-dominated runs joined and highlighted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

#: metrics where lower is better; every other axis is maximised
LOWER_IS_BETTER = ("fid", "latency_mean")
AXIS_NAMES = {"speedup": "speed-up vs AR", "step_compression": "step compression", "fid": "FID",
              "clip_score": "CLIP score", "scene_acc_overall": "scene accuracy"}


def pareto_front(x: Sequence[float], y: Sequence[float], maximize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """Mask of the points no other point dominates (at least as good on both axes, better on one)."""
    sx = np.asarray(x, float) * (1 if maximize_x else -1)
    sy = np.asarray(y, float) * (1 if maximize_y else -1)
    front = np.zeros(len(sx), dtype=bool)
    for i in range(len(sx)):
        dominated = (sx >= sx[i]) & (sy >= sy[i]) & ((sx > sx[i]) | (sy > sy[i]))
        front[i] = not dominated.any()
    return front


def pareto_axes(ax: plt.Axes, df: pd.DataFrame, x: str, y: str) -> None:
    """Scatter ``y`` against ``x`` on ``ax``, runs labelled, Pareto front drawn as a line."""
    pts = df[[x, y, "label"] + [c for c in ("lam", "delta") if c in df]].dropna(subset=[x, y])
    ax.set_xlabel(AXIS_NAMES.get(x, x))
    ax.set_ylabel(AXIS_NAMES.get(y, y))
    if pts.empty:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        return
    front = pareto_front(pts[x], pts[y], x not in LOWER_IS_BETTER, y not in LOWER_IS_BETTER)
    ax.scatter(pts[x][~front], pts[y][~front], c="0.6", s=25, label="dominated")
    line = pts[front].sort_values(x)
    ax.plot(line[x], line[y], "o-", c="tab:red", ms=6, label="Pareto front")
    for _, row in pts.iterrows():
        ax.annotate(row["label"], (row[x], row[y]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.grid(alpha=0.3)


def plot_pareto(df: pd.DataFrame, xs: Sequence[str], ys: Sequence[str], title: str, path: Path) -> Path:
    """A ``len(ys) x len(xs)`` grid of Pareto panels for one model, saved as PNG."""
    fig, axes = plt.subplots(len(ys), len(xs), figsize=(5 * len(xs), 4 * len(ys)), squeeze=False)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            if x in df and y in df:
                pareto_axes(axes[i][j], df, x, y)
            else:
                axes[i][j].set_axis_off()
    with_points = [ax for row in axes for ax in row if ax.get_legend_handles_labels()[0]]
    if with_points:
        with_points[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
