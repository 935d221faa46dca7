"""Figure layout shared by the report's plots: legends under the axes that fit the figure's width, labels wrapped
so that no run's name widens a figure or runs off its edge."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.legend import Legend

#: characters per line of a run's label in a legend or beside an axis (labels are short: csd.report.labels)
LABEL_WIDTH = 30
#: room left and right of a legend, as a share of the figure's width
MARGIN = 0.02


def wrap(label: str, width: int = LABEL_WIDTH) -> str:
    """``label`` on lines of at most ``width`` characters, broken between its ``k=v`` words."""
    return textwrap.fill(label, width, break_long_words=False, break_on_hyphens=False)


def legend_below(fig: plt.Figure, handles: Sequence[Artist], max_cols: int = 3, fontsize: float = 7) -> Legend:
    """A figure legend under the axes (``fig`` has the constrained layout, which keeps room for it) in the most
    columns, up to ``max_cols``, that fit the figure's width; the figure grows by the legend's height, so the axes
    keep the size they were given, and one column wider than the figure widens it. Outside the axes the legend
    hides no data and takes no width from them."""
    renderer = fig.canvas.get_renderer()
    room = (1 - 2 * MARGIN) * fig.bbox.width
    for ncols in range(max(1, min(max_cols, len(handles))), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", fontsize=fontsize, ncols=ncols)
        box = legend.get_window_extent(renderer)
        if box.width <= room:
            break
        if ncols > 1:
            legend.remove()
    else:
        fig.set_figwidth(box.width / fig.dpi / (1 - 2 * MARGIN))
    fig.set_figheight(fig.get_figheight() + box.height / fig.dpi)
    return legend
