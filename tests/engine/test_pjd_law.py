"""The law of PJD's images on a tiny grid, enumerated from its definition (docs/ALGORITHMS.md "PJD"), against the
engine's samples (chi-square); AR's law is the negative control (PJD is lossy: a lower row's drafts are judged
without the undecided tail of the row above).

The enumeration is a second, independent implementation of PJD's definition on a 2 x 3 image of 2 codes, window 2
(one draft a row), context 1: every path of fresh drafts, acceptances, residual, bonus and row samples, each forward's
targets from one no-cache forward over every entry fed so far with PJD's visibility
(:func:`tests.engine.test_pjd.reference_logits`).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace

import pytest
import torch

from csd.acceptance import SJD
from csd.adapters.base import BodyLayout
from csd.drafters.pjd import PJDDrafter
from csd.engine import JacobiEngine
from csd.processors import TargetPipeline
from tests.engine.test_pjd import Entry, reference_logits
from tests.helpers import chi_square_pvalue, exact_sequence_distribution, rejecting_janus

PROMPT = "a cat"
ROWS, COLS = 2, 3
#: samples of the chi-square test (about 5 tiny forwards each)
N_LAW = 600


@dataclass(frozen=True)
class RowState:
    """A row in flight: grid row, next body position, its first carried draft and that draft's law (or None)."""

    index: int
    start: int
    carried: int | None = None
    law: tuple[float, ...] | None = None


@dataclass(frozen=True)
class World:
    """A point of a PJD decode: committed codes by body position, rows in flight (top first), every entry fed so far,
    the completed rows' last positions still to feed, forwards run."""

    codes: tuple[int | None, ...]
    rows: tuple[RowState, ...]
    entries: tuple[Entry, ...]
    orphans: tuple[int, ...]
    forwards: int


class PJDLaw:
    """Enumerates P(image) under PJD with window 2 and ``context`` on ``adapter`` read as a ``ROWS x COLS`` raster."""

    def __init__(self, adapter, context: int) -> None:
        self.adapter, self.context = adapter, context
        self.vocab = adapter.vocab_size
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        self.ids = adapter.image_token_ids.tolist()
        self.law: dict[tuple[int, ...], float] = {}

    @functools.cache  # noqa: B019 (one instance per test)
    def targets(self, entries: tuple[Entry, ...]) -> torch.Tensor:
        """``q`` of every entry ``[E, V]`` (CFG applied)."""
        return self.pipeline(reference_logits(self.adapter, PROMPT, list(entries)).unsqueeze(0))[0]

    def run(self) -> dict[tuple[int, ...], float]:
        start = World((None,) * (ROWS * COLS), (RowState(0, 0),), (), (), 0)
        self.step(start, 1.0)
        return self.law

    def entries_of(self, world: World, row: RowState, top: bool) -> int:
        """K: the top row's ``min(2, limit - start)``, a lower row's ``min(2, c_above - c_row)``."""
        done = [sum(c is not None for c in world.codes[r * COLS : (r + 1) * COLS]) for r in range(ROWS)]
        if top:
            limit = (row.index + 1) * COLS if len(world.rows) > 1 else ROWS * COLS
            return min(2, limit - row.start)
        return min(2, done[row.index - 1] - done[row.index])

    def step(self, world: World, prob: float) -> None:
        if prob == 0.0:
            return
        if all(c is not None for c in world.codes):
            key = tuple(world.codes)
            self.law[key] = self.law.get(key, 0.0) + prob
            return
        # the window: each chain (anchor + at most one draft), then the orphans
        chains = []
        for i, row in enumerate(world.rows):
            k = self.entries_of(world, row, i == 0)
            if i > 0 and k < 2:
                continue
            chains.append((i, row, k))
        fresh = [c for c in chains if c[2] == 2 and c[1].carried is None]
        for draws in torch.cartesian_prod(*[torch.arange(self.vocab)] * len(fresh)).view(-1, len(fresh)).tolist() if fresh else [[]]:
            draw = dict(zip([c[0] for c in fresh], draws, strict=True))
            self.forward(world, chains, draw, prob / self.vocab ** len(fresh))

    def forward(self, world: World, chains, draw: dict[int, int], prob: float) -> None:
        t, new, windows = world.forwards, [], []
        for group, (i, row, k) in enumerate(chains, start=1):
            p = row.start - 1
            if p < 0:
                anchor, proxy = self.ids[0], False  # the prompt's last token (the reference reads it from the prompt)
            elif world.codes[p] is not None:
                anchor, proxy = self.ids[world.codes[p]], False
            else:  # the latest committed cell of row r - 2 (row 0 for row 1)
                source = max(row.index - 2, 0)
                latest = max(c for c in range(source * COLS, (source + 1) * COLS) if world.codes[c] is not None)
                anchor, proxy = self.ids[world.codes[latest]], True
            offset = len(new)
            new.append(Entry(anchor, p, t, group if proxy else 0, False))
            draft = law = None
            if k == 2:
                draft = row.carried if row.carried is not None else draw[i]
                law = row.law if row.carried is not None else tuple(float(v == draft) for v in range(self.vocab))
                new.append(Entry(self.ids[draft], row.start, t, group, False))
            windows.append((i, row, k, offset, proxy, draft, law))
        for p in world.orphans:
            new.append(Entry(self.ids[world.codes[p]], p, t, 0, True))
        q = self.targets(world.entries + tuple(new))[len(world.entries):]
        self.outcomes(world, windows, new, q, 0, [], prob)

    def outcomes(self, world: World, windows, new, q, w: int, chosen: list, prob: float) -> None:
        """Every joint outcome of the windows ``w ..`` (each: committed codes, the next first carried draft, the entries
        it keeps), then the schedule."""
        if prob == 0.0:
            return
        if w == len(windows):
            self.advance(world, windows, new, chosen, prob)
            return
        i, row, k, offset, proxy, draft, law = windows[w]
        top = i == 0
        q0 = q[offset]
        if k == 1:  # no draft: the top row's bonus sample
            for y in range(self.vocab):
                self.outcomes(world, windows, new, q, w + 1, [*chosen, ([y], None, 1)], prob * float(q0[y]))
            return
        q1, p = q[offset + 1], torch.tensor(law)
        accept = min(1.0, float(q0[draft]) / law[draft])
        for y in range(self.vocab):  # accepted: the top row adds the bonus y ~ q_1, a lower row carries it
            outcome = ([draft, y], None, 2) if top else ([draft], (y, tuple(q1.tolist())), 1)
            self.outcomes(world, windows, new, q, w + 1, [*chosen, outcome], prob * accept * float(q1[y]))
        if accept == 1.0:
            return
        if top:  # rejected: the residual is committed, y_1 ~ q_1 carried
            residual = (q0 - p).clamp(min=0)
            if float(residual.sum()) <= 0:  # q_0 <= p everywhere: the draft was accepted (up to rounding)
                return
            residual = residual / residual.sum()
            for r in range(self.vocab):
                for y in range(self.vocab):
                    outcome = ([r], (y, tuple(q1.tolist())), 1)
                    self.outcomes(world, windows, new, q, w + 1, [*chosen, outcome],
                                  prob * (1 - accept) * float(residual[r]) * float(q1[y]))
        else:  # rejected: nothing committed, y_0 ~ q_0 carried
            for y in range(self.vocab):
                self.outcomes(world, windows, new, q, w + 1, [*chosen, ([], (y, tuple(q0.tolist())), 0)],
                              prob * (1 - accept) * float(q0[y]))

    def advance(self, world: World, windows, new, chosen, prob: float) -> None:
        codes, rows, kept = list(world.codes), [], [e.kept for e in new]
        for (i, row, _, offset, proxy, _, _), (commit, carried, keep) in zip(windows, chosen, strict=True):
            for j, code in enumerate(commit):
                codes[row.start + j] = code
            for j in range(offset + int(proxy), offset + keep):
                kept[j] = True
            nxt = replace(row, start=row.start + len(commit), carried=None if carried is None else carried[0],
                          law=None if carried is None else carried[1])
            rows.append((i, nxt))
        by_index = dict(rows)
        rows = [by_index.get(i, row) for i, row in enumerate(world.rows)]
        entries = world.entries + tuple(replace(e, kept=f) for e, f in zip(new, kept, strict=True))
        orphans = []
        # the top row ends at its row's end when a row below is in flight, else drafts on into the next row
        while rows[0].start >= (rows[0].index + 1) * COLS and rows[0].start < ROWS * COLS:
            if len(rows) == 1:
                rows[0] = replace(rows[0], index=rows[0].start // COLS)
                break
            last = rows.pop(0).start - 1
            if rows[0].start - 1 != last:
                orphans.append(last)
        last = rows[-1]
        below = last.index + 1
        done = sum(c is not None for c in codes[last.index * COLS : (last.index + 1) * COLS])
        # (the top row's first carried draft lies in its own row: nothing to hand down with one draft a row)
        if below < ROWS and all(c is None for c in codes[below * COLS : (below + 1) * COLS]) and done >= self.context:
            rows.append(RowState(below, below * COLS))
        self.step(World(tuple(codes), tuple(rows), entries, tuple(orphans), world.forwards + 1), prob)


@pytest.mark.slow
@pytest.mark.statistical
def test_the_image_law_is_the_enumerated_one():
    """2 x 3 images of 2 codes (64 images), window 2, context 1: a lower row drafts while the top row's last cell is
    undecided; negative control: the same samples against AR's law."""
    adapter = rejecting_janus(grid=3, codebook=2)
    adapter.layout = BodyLayout.raster(ROWS, COLS)
    law = PJDLaw(adapter, context=1).run()
    assert abs(sum(law.values()) - 1.0) < 1e-5
    engine = JacobiEngine(adapter, SJD(), PJDDrafter(window=2, context=1))
    codes = {int(t): c for c, t in enumerate(adapter.image_token_ids)}
    counts = Counter(tuple(codes[t] for t in engine.generate(PROMPT, seed).tokens.tolist()) for seed in range(N_LAW))
    assert chi_square_pvalue(counts, law) > 1e-3
    ar = {tuple(codes[t] for t in image): p for image, p in exact_sequence_distribution(adapter, PROMPT).items()}
    assert chi_square_pvalue(counts, ar) < 1e-6
