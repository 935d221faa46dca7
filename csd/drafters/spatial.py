"""What the spatial drafters share (docs/ALGORITHMS.md "ZipAR" and "PJD"): the image grid seen as rows of body
positions, when the next row may start, which token stands in for a new row's missing left neighbour, and the
reassembly of an image committed out of raster order.

Both ZipAR (``csd.drafters.zipar``) and PJD (``csd.drafters.pjd``) decode several image rows at once: row ``r + 1``
starts once row ``r`` has ``c`` committed cells, a row's tokens enter the cache in generation order with their raster
position ids (``Proposal.shift``), and the first token of a row is predicted at the position of the cell before it in
raster order, ``(r - 1, W - 1)``: by that cell's own entry once it is decoded, by a forced token there (Lumina-mGPT's
and Emu3's end-of-line), else by a **proxy**, the latest committed token of row ``r - 2`` (the released ZipAR code's
choice: the cell just above ``(r - 1, W - 1)`` once row ``r - 2`` is complete), of row 0 for row 1.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

from csd.adapters.base import BodyLayout

if TYPE_CHECKING:
    from csd.slot import Slot


def proxy_row(row: int) -> int:
    """The grid row whose latest committed cell stands in for the cell before row ``row``'s first one (``row >= 1``)."""
    return max(row - 2, 0)


def may_start(done_above: int, context: int) -> bool:
    """Whether a row may start: the row above has at least ``context`` committed cells."""
    return done_above >= context


class RowGrid:
    """The image grid of a body layout as rows of body positions.

    ``cells[r]``: the body positions of row ``r``'s cells, left to right; ``end[r]``: one past its last cell. Row ``r``
    **owns** the positions ``end[r - 1] .. end[r] - 1`` (row 0 from 0; the last row to the end of the body): its cells
    and the forced tokens before them (a header, the row above's end-of-line token). ``grid_row[p]``: the grid row of
    the cell at position ``p`` (-1 at forced positions)."""

    def __init__(self, layout: BodyLayout) -> None:
        self.height, self.width = layout.grid
        self.length = layout.length
        self.grid_row = layout.rows.tolist()
        self.forced = (layout.forced_ids >= 0).tolist()
        self.cells: list[list[int]] = [[] for _ in range(self.height)]
        for p, r in enumerate(self.grid_row):
            if r >= 0:
                self.cells[r].append(p)
        self.end = [cells[-1] + 1 for cells in self.cells]

    def owner(self, position: int) -> int:
        """The row that owns body position ``position``."""
        return min(bisect.bisect_right(self.end, position), self.height - 1)

    def span_end(self, row: int) -> int:
        """One past the last position row ``row`` owns."""
        return self.length if row == self.height - 1 else self.end[row]

    def proxy_cell(self, row: int, done: list[int]) -> int:
        """The body position of the proxy for row ``row``'s first token: the latest committed cell of
        :func:`proxy_row` (``done``: committed cells per row, left to right)."""
        source = proxy_row(row)
        return self.cells[source][done[source] - 1]


def to_raster(slot: Slot, order: torch.Tensor) -> None:
    """Put the records of the image in ``slot`` (``body``, ``commit_iter``, ``commit_kind``, ``entropy``) from generation
    order into raster order: ``order[g]`` is the body position committed ``g``-th."""
    for name in ("body", "commit_iter", "commit_kind", "entropy"):
        values = getattr(slot, name)
        raster = torch.empty_like(values)
        raster[order] = values
        setattr(slot, name, raster)
