"""Speed vs quality Pareto plots: one point per run, the non-dominated runs joined and highlighted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from csd.report.layout import legend_below, wrap
from csd.report.table import paper_order

#: metrics where lower is better; every other axis is maximised
LOWER_IS_BETTER = ("fid", "latency_mean")
AXIS_NAMES = {"speedup": "speed-up vs AR", "step_compression": "step compression", "fid": "FID",
              "clip_score": "CLIP score", "scene_acc_overall": "scene accuracy", "geneval_overall": "GenEval"}
#: quality axes of the Pareto panels when ``eval.report.pareto_y`` is not set (rows of those a sweep measured)
PARETO_Y = ("scene_acc_overall", "geneval_overall", "fid", "clip_score")
#: a run is clipped to a panel's edge when a gap this many times the other runs' span separates it (:func:`outliers`)
OUTLIER_GAP = 3.0
MARKERS = "os^DvP*Xph"
#: (colour, marker) of one run's points
Style = tuple[tuple[float, ...], str]
#: under the title of a Pareto figure with no AR run to measure speed-ups against (its speed-up panels left out)
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


def outliers(values: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> np.ndarray:
    """Mask of the values cut off from the others: repeatedly the lowest or highest value whose distance to the
    others' extent (their values and intervals ``lo`` / ``hi``, NaN = none) is more than :data:`OUTLIER_GAP` times
    that extent, at most a quarter of the values (none of fewer than four), e.g. a collapsed method's FID thirty
    times the other runs'. A value merely some intervals away from a tight cluster is no outlier."""
    v = np.asarray(values, float)
    lo = np.where(np.isnan(np.asarray(lo, float)), v, lo)
    hi = np.where(np.isnan(np.asarray(hi, float)), v, hi)
    out = np.zeros(len(v), dtype=bool)
    left = [i for i in np.argsort(v) if np.isfinite(v[i])]

    def ratio(k: int, rest: list[int]) -> float:
        low, high = np.nanmin(lo[rest]), np.nanmax(hi[rest])
        gap = max(low - v[k], v[k] - high, 0.0)
        return gap / (high - low) if high > low else (np.inf if gap > 0 else 0.0)

    while out.sum() < len(v) // 4 and len(left) >= 3:
        low, high = ratio(left[0], left[1:]), ratio(left[-1], left[:-1])
        if max(low, high) <= OUTLIER_GAP:
            break
        out[left.pop(0 if low > high else -1)] = True
    return out


def bulk_limits(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, clipped: np.ndarray) -> tuple[float, float]:
    """Axis limits around the points not ``clipped`` and their intervals (``lo`` / ``hi``, NaN = none), padded."""
    keep = ~clipped & np.isfinite(values)
    low = np.nanmin(np.concatenate([values[keep], lo[keep]]))
    high = np.nanmax(np.concatenate([values[keep], hi[keep]]))
    pad = 0.08 * (high - low) if high > low else 0.05 * max(abs(high), 1e-3)
    return float(low - pad), float(high + pad)


def _interval(df: pd.DataFrame, column: str, end: str) -> np.ndarray:
    name = f"{column}{end}"
    return df[name].to_numpy(float) if name in df else np.full(len(df), np.nan)


def pareto_axes(ax: plt.Axes, df: pd.DataFrame, x: str, y: str, styles: Sequence[Style]) -> bool:
    """Scatter ``y`` against ``x`` on ``ax``, one style per run (``styles``, in ``df``'s row order), front as a line,
    95 % intervals (``<column>_lo`` / ``_hi``) as error bars in the run's colour. Returns whether a run was clipped.

    Points carry no text (labels of nearby runs would overprint); the figure legend names them. A run far off
    the others on an axis (:func:`outliers`) would squeeze them into a line: the axis spans the others, and the
    run is drawn at its edge with an arrow and its value. The front is computed on the values, drawn through the
    points as shown.
    """
    ax.set_xlabel(AXIS_NAMES.get(x, x))
    ax.set_ylabel(AXIS_NAMES.get(y, y))
    mask = (df[x].notna() & df[y].notna()).to_numpy()
    if not mask.any():  # another run has this speed measure, another this quality: none has both
        ax.text(0.5, 0.5, "no run has both", ha="center", va="center", fontsize=8, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return False
    pts = df[mask]
    shown = {"x": pts[x].to_numpy(float), "y": pts[y].to_numpy(float)}
    clipped, limits = {}, {}
    for axis, column in (("x", x), ("y", y)):
        lo, hi = _interval(pts, column, "_lo"), _interval(pts, column, "_hi")
        clipped[axis] = outliers(shown[axis], lo, hi)
        if clipped[axis].any():
            limits[axis] = bulk_limits(shown[axis], lo, hi, clipped[axis])
            shown[axis] = np.clip(shown[axis], *limits[axis])
    front = pareto_front(pts[x], pts[y], x not in LOWER_IS_BETTER, y not in LOWER_IS_BETTER)
    order = np.argsort(shown["x"][front], kind="stable")
    ax.plot(shown["x"][front][order], shown["y"][front][order], "-", c="0.3", lw=1, zorder=1)
    styled = [style for style, m in zip(styles, mask, strict=True) if m]
    off = []
    for k, ((_, row), (colour, marker)) in enumerate(zip(pts.iterrows(), styled, strict=True)):
        edge = "k" if front[k] else "none"
        if clipped["x"][k] or clipped["y"][k]:
            ax.scatter(shown["x"][k], shown["y"][k], color=colour, marker=marker, s=45 if front[k] else 25,
                       zorder=3, edgecolors=edge, clip_on=False)
            off.append((k, row, colour))
            continue
        xerr, yerr = error_bar(row, x), error_bar(row, y)
        if xerr is not None or yerr is not None:
            ax.errorbar(row[x], row[y], xerr=xerr, yerr=yerr, fmt="none", ecolor=colour, elinewidth=0.8, alpha=0.6,
                        zorder=1.5)
        ax.scatter(row[x], row[y], color=colour, marker=marker, s=45 if front[k] else 25, zorder=2, edgecolors=edge)
    if "x" in limits:
        ax.set_xlim(*limits["x"])
    if "y" in limits:
        ax.set_ylim(*limits["y"])
    for k, row, colour in off:
        _write_clipped(ax, (row[x], row[y]), (shown["x"][k], shown["y"][k]), (clipped["x"][k], clipped["y"][k]), colour)
    ax.grid(alpha=0.3)
    return bool(limits)


def _write_clipped(ax: plt.Axes, value: tuple[float, float], at: tuple[float, float], off: tuple[bool, bool],
                   colour: tuple[float, ...]) -> None:
    """``↑ 1.2`` (an arrow towards the run's ``value``, the value) next to a run drawn ``at`` the panel's edge,
    on the side of the marker towards the panel's centre (``off``: clipped in x, in y)."""
    parts = []
    if off[0]:
        parts.append(f"{'→' if value[0] > at[0] else '←'} {value[0]:.3g}")
    if off[1]:
        parts.append(f"{'↑' if value[1] > at[1] else '↓'} {value[1]:.3g}")
    left = at[0] > sum(ax.get_xlim()) / 2
    below = at[1] > sum(ax.get_ylim()) / 2
    ax.annotate("  ".join(parts), at, xytext=(-6 if left else 6, -4 if below else 4), textcoords="offset points",
                ha="right" if left else "left", va="top" if below else "bottom", fontsize=7, color=colour,
                annotation_clip=False)


def has_points(df: pd.DataFrame, x: str, y: str) -> bool:
    """Whether a run of ``df`` has both ``x`` and ``y``: a panel of them would show a point."""
    return x in df and y in df and bool((df[x].notna() & df[y].notna()).any())


def pareto_figure(df: pd.DataFrame, xs: Sequence[str], ys: Sequence[str], title: str) -> plt.Figure:
    """A grid of Pareto panels for one model, quality metrics ``ys`` (rows) against speed measures ``xs`` (columns),
    the legend below them: one entry per run (paper order).

    Only rows and columns with points are drawn: without an AR run there is no speed-up, and the title says how
    to add one instead of a column of empty panels; a quality no run measured has no row.
    """
    df = paper_order(df)
    drawn_x = [x for x in xs if any(has_points(df, x, y) for y in ys)]
    drawn_y = [y for y in ys if any(has_points(df, x, y) for x in drawn_x)]
    notes = [NO_AR_HINT] if "speedup" in xs and "speedup" not in drawn_x else []
    if not drawn_y:
        notes.append(f"no run has both a speed measure ({', '.join(xs)}) and a quality ({', '.join(ys)})")
    styles = run_styles(len(df))
    handles = [Line2D([], [], ls="", color=c, marker=m, label=wrap(label))
               for (c, m), label in zip(styles, df["label"], strict=True)]
    handles.append(Line2D([], [], c="0.3", lw=1, marker="o", mfc="w", mec="k", label="Pareto front (black edge)"))
    rows, cols = max(len(drawn_y), 1), max(len(drawn_x), 1)
    heading = "\n".join([title, *notes])
    fig, axes = plt.subplots(rows, cols, figsize=(max(4.6 * cols, 5.5), 3.4 * rows + 0.2 + 0.2 * heading.count("\n")),
                             squeeze=False, layout="constrained")
    clipped = False
    for i, y in enumerate(drawn_y):
        for j, x in enumerate(drawn_x):
            clipped |= pareto_axes(axes[i][j], df, x, y, styles)
    if not drawn_y:
        axes[0][0].set_axis_off()
    if clipped:
        handles.append(Line2D([], [], ls="", marker="$↑$", color="0.3",
                              label=wrap("off the axis range: drawn at the edge, value written")))
    fig.suptitle(heading, fontsize=10)
    legend_below(fig, handles, max_cols=3 if cols > 1 else 2)
    return fig


def plot_pareto(df: pd.DataFrame, xs: Sequence[str], ys: Sequence[str], title: str, path: Path) -> Path:
    """:func:`pareto_figure` saved as PNG."""
    fig = pareto_figure(df, xs, ys, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
