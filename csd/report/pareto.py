"""Speed vs quality Pareto plots: one point per run, the non-dominated runs joined and highlighted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from csd.report.table import paper_order

#: metrics where lower is better; every other axis is maximised
LOWER_IS_BETTER = ("fid", "latency_mean")
AXIS_NAMES = {"speedup": "speed-up vs AR", "step_compression": "step compression", "fid": "FID",
              "clip_score": "CLIP score", "scene_acc_overall": "scene accuracy"}
MARKERS = "os^DvP*Xph"
#: (colour, marker) of one run's points
Style = tuple[tuple[float, ...], str]
#: shown on a speed-up panel when the report has no AR run to measure speed-ups against
NO_AR_HINT = "no AR run, so no speed-up:\nadd one with eval.report.extra_runs=[<ar run dir>]"


def pareto_front(x: Sequence[float], y: Sequence[float], maximize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """Mask of the points no other point dominates (at least as good on both axes, better on one)."""
    sx = np.asarray(x, float) * (1 if maximize_x else -1)
    sy = np.asarray(y, float) * (1 if maximize_y else -1)
    front = np.zeros(len(sx), dtype=bool)
    for i in range(len(sx)):
        dominated = (sx >= sx[i]) & (sy >= sy[i]) & ((sx > sx[i]) | (sy > sy[i]))
        front[i] = not dominated.any()
    return front


def run_styles(n: int) -> list[Style]:
    """``(colour, marker)`` of ``n`` runs: ten colours, then the next marker, so no two runs look alike."""
    cmap = plt.get_cmap("tab10")
    return [(cmap(i % 10), MARKERS[i // 10 % len(MARKERS)]) for i in range(n)]


def error_bar(row: pd.Series, column: str) -> list[list[float]] | None:
    """``[[below], [above]]`` of ``row[column]`` from its ``<column>_lo`` / ``_hi`` interval (None without one;
    clipped at 0 where a percentile interval does not contain the point)."""
    lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return None
    return [[max(0.0, row[column] - lo)], [max(0.0, hi - row[column])]]


def pareto_axes(ax: plt.Axes, df: pd.DataFrame, x: str, y: str, styles: Sequence[Style]) -> None:
    """Scatter ``y`` against ``x`` on ``ax``, one style per run (``styles``, in ``df``'s row order), front as a line,
    95 % intervals (``<column>_lo`` / ``_hi``) as error bars in the run's colour.

    Points carry no text (labels of nearby runs would overprint); the figure legend names them. The front is
    drawn through the point estimates.
    """
    ax.set_xlabel(AXIS_NAMES.get(x, x))
    ax.set_ylabel(AXIS_NAMES.get(y, y))
    mask = (df[x].notna() & df[y].notna()).to_numpy()
    if not mask.any():
        no_ar = "speedup" in (x, y) and df["speedup"].isna().all()
        ax.text(0.5, 0.5, NO_AR_HINT if no_ar else "not measured", ha="center", va="center", fontsize=8,
                transform=ax.transAxes, wrap=True)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    pts = df[mask]
    front = pareto_front(pts[x], pts[y], x not in LOWER_IS_BETTER, y not in LOWER_IS_BETTER)
    line = pts[front].sort_values(x)
    ax.plot(line[x], line[y], "-", c="0.3", lw=1, zorder=1)
    shown = [style for style, m in zip(styles, mask, strict=True) if m]
    for (_, row), on_front, (colour, marker) in zip(pts.iterrows(), front, shown, strict=True):
        xerr, yerr = error_bar(row, x), error_bar(row, y)
        if xerr is not None or yerr is not None:
            ax.errorbar(row[x], row[y], xerr=xerr, yerr=yerr, fmt="none", ecolor=colour, elinewidth=0.8, alpha=0.6,
                        zorder=1.5)
        ax.scatter(row[x], row[y], color=colour, marker=marker, s=45 if on_front else 25, zorder=2,
                   edgecolors="k" if on_front else "none")
    ax.grid(alpha=0.3)


def pareto_figure(df: pd.DataFrame, xs: Sequence[str], ys: Sequence[str], title: str) -> plt.Figure:
    """A ``len(ys) x len(xs)`` grid of Pareto panels for one model, with one legend entry per run (paper order)."""
    df = paper_order(df)
    fig, axes = plt.subplots(len(ys), len(xs), figsize=(4.5 * len(xs) + 3, 4 * len(ys)), squeeze=False,
                             layout="constrained")
    styles = run_styles(len(df))
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            if x in df and y in df:
                pareto_axes(axes[i][j], df, x, y, styles)
            else:
                axes[i][j].set_axis_off()
    handles = [Line2D([], [], ls="", color=c, marker=m, label=label) for (c, m), label in zip(styles, df["label"], strict=True)]
    handles.append(Line2D([], [], c="0.3", lw=1, marker="o", mfc="w", mec="k", label="Pareto front (black edge)"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=7, ncols=1 + len(handles) // 40)
    fig.suptitle(title)
    return fig


def plot_pareto(df: pd.DataFrame, xs: Sequence[str], ys: Sequence[str], title: str, path: Path) -> Path:
    """:func:`pareto_figure` saved as PNG."""
    fig = pareto_figure(df, xs, ys, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
