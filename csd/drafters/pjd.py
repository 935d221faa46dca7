"""PJD, Parallel Jacobi Decoding (Liao et al., CVPR 2026, arXiv 2606.05703; docs/ALGORITHMS.md "PJD"): Jacobi chains
on several image rows at once, one forward for all of them.

Rows start in turn (the spatial schedule of ``csd.drafters.spatial``): row ``r + 1`` once row ``r`` has ``context``
committed cells. Every row in flight holds a Jacobi chain: its anchor (its last committed token, or for a row not
started yet the token before its first cell: a forced end-of-line, else a proxy) and ``K - 1`` drafts; the top row's
``K = min(L, its remaining positions)`` (one at a time in the AR tail), a lower row's ``K = min(L, c_above - c_row)`` (it
stays one cell behind the row above). One forward over every chain, **row-causal**: an entry sees the committed tokens
before its raster position (the cache, this forward's anchors, held entries and completed rows' last tokens), each
once, and its own chain's earlier entries, never another chain's drafts (``Proposal.groups``). A lower row with
``K < 2`` feeds no chain, but its latest committed cell, which no cache entry holds (it anchors the row's next chain),
is fed as a **held** entry, shared and dropped after the forward, whenever a row below it feeds a chain (the released
code feeds that anchor in every forward).
Each chain is verified with the rule
(:func:`csd.drafters.chain.verify_chain_batch`); the top row commits its accepted prefix and the residual or bonus
sample, a lower row its accepted prefix only (its rejected tail waits). Carried drafts are refreshed per chain as the
chain drafter's (``coupling``), or as the released code does (``code_parity``). Lossy: a lower row's drafts are judged
without the undecided tail of the row above.

The cache holds the committed entries in generation order with their raster position ids; the engine commits in
generation order and :meth:`PJDDrafter.finish` puts the image back in raster order. With ``context >= W`` one row is in
flight at a time and PJD is the chain drafter, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from csd.acceptance import AcceptanceRule, likelihood_ratio
from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.drafters.base import STAT_KEYS, BodyIds, Drafter, Proposal, Verified
from csd.drafters.chain import ChainHead, ChainWindow, verify_chain_batch
from csd.drafters.spatial import RowGrid, may_start, to_raster
from csd.params import Param
from csd.records import COMMIT_FORCED
from csd.schema import Bool, Int
from csd.verify import couple_drafts

if TYPE_CHECKING:
    from csd.slot import Slot

#: a window entry visible to every chain of its forward (a committed token: an anchor, a completed row's last token)
SHARED = 0
#: the released code keeps a draft after the first rejection when ``min(1, q/p)`` exceeds this
CODE_KEEP_RATIO = 0.5
FALLBACK = STAT_KEYS.index("residual_fallbacks")


@dataclass
class Row:
    """An image row in flight: ``index`` (its grid row; the top row's may move on while no row below is in flight),
    ``start`` (the body position of its next commit), its carried drafts ``[c]`` for positions ``start ..`` and their
    laws ``[c, V]``, and ``prefix``: the forced positions it commits with its first cell (the row above's end-of-line)."""

    index: int
    start: int
    carried: torch.Tensor
    carried_probs: torch.Tensor
    prefix: list[int] = field(default_factory=list)


@dataclass
class PJDState:
    """An image's rows in flight (top first), committed cells per grid row, which body positions are committed and
    their codes (``raster``, on the device), the commit order, the body entries its cache holds, the committed
    positions no entry holds yet that no chain anchors (``orphans``: fed once, as context for the rows below) and its
    Gumbel-sharing noise (or None)."""

    rows: list[Row]
    done: list[int]
    committed: list[bool]
    raster: torch.Tensor
    order: list[int]
    cached: int = 0
    orphans: list[int] = field(default_factory=list)
    shared: torch.Tensor | None = None


@dataclass
class Chain:
    """One row's chain in this forward: its slot and image generator, row, window (``offset``: its anchor's window
    index), whether it is the top row and whether its anchor is a proxy (dropped after the forward)."""

    slot: int
    generator: torch.Generator
    row: Row
    offset: int
    top: bool
    proxy: bool
    window: ChainWindow


@dataclass
class SlotPlan:
    """A slot's window: its chains, then held entries (left-out rows' latest committed cells: context for the rows
    below, dropped after the forward), then ``orphans`` completion entries (kept); ``entries`` in all (padding
    follows)."""

    chains: list[Chain]
    orphans: int
    entries: int


@dataclass
class Commits:
    """What verification decided: ``chains`` in window order, how many body tokens each commits (``cells``; a lower
    row's accepted prefix, the top row's plus its residual or bonus), the batched chain result and their targets."""

    chains: list[Chain]
    cells: list[int]
    result: Verified
    target: torch.Tensor


class PJDDrafter(Drafter):
    """Row-parallel Jacobi chains of ``window`` entries each; ``context`` committed cells of a row start the next."""

    name = "pjd"
    PARAMS = {
        **Drafter.PARAMS,
        "window": Param(Int(min=1), 8, "L: entries of each row's chain, its anchor + L - 1 drafts (the released code's 8)"),
        "context": Param(Int(min=1), 8, "c: committed cells of a row that start the next row (>= the image width: one "
                                        "row at a time, the chain drafter; the released code's activation count 9 "
                                        "counts the row's anchor: c = 8)"),
        "code_parity": Param(Bool(), False, "true: the released code's refresh (a later draft kept while min(1, q/p) > "
                                            "0.5, with its old law) and rows that never draft past their end"),
    }

    def check_params(self) -> None:
        super().check_params()
        if self.code_parity and self.coupling != "none":
            raise ValueError(f"drafter.code_parity=true reproduces the released code's refresh, which replaces the "
                             f"coupling: set drafter.coupling=none, got {self.coupling!r}")

    def method_problem(self, method: str) -> str | None:
        if method == "ar":
            return "method=ar decodes one token per forward, but drafter=pjd always drafts: use drafter=chain (the default)"
        return super().method_problem(method)

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        if compiled:
            return "drafter=pjd runs eagerly (shifted position ids, row-causal windows): set engine.compile=false"
        return None

    def forward_entries(self, grid: tuple[int, int], body_len: int) -> int:
        """At most ``W - c + 1`` rows are in flight (each lower row one cell behind the one above), each with ``L``
        entries, and one completed row's last token."""
        rows = 1 if self.context >= grid[1] else min(grid[0], grid[1] - self.context + 1)
        return min(body_len, rows * self.window + 1)

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        self.grid = RowGrid(adapter.layout)
        self.tail = adapter.layout.jacobi_tail

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> PJDState:
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        top = Row(0, 0, empty, torch.zeros((0, self.vocab), device=self.device))
        grid = self.grid
        return PJDState([top], [0] * grid.height, [False] * grid.length,
                        torch.zeros(grid.length, dtype=torch.long, device=self.device), [], shared=shared)

    # ---- the schedule (host) ----

    def _limit(self, state: PJDState, row: Row) -> int:
        """One past the last position the top row may draft: its row's end when a row below is in flight (or always,
        ``code_parity``), else the body's end."""
        return self.grid.span_end(row.index) if (len(state.rows) > 1 or self.code_parity) else self.grid.length

    def _entries(self, state: PJDState, i: int) -> int:
        """``K``: the entries of row ``i``'s chain (top row: ``min(L, limit - start)``, 1 in the AR tail; a lower row:
        ``min(L, c_above - c_row)``, drafting nothing in the AR tail)."""
        row, length = state.rows[i], self.grid.length
        if i == 0:
            return 1 if length - row.start <= self.tail else min(self.window, self._limit(state, row) - row.start)
        above = state.rows[i - 1].index
        return min(self.window, state.done[above] - state.done[row.index], length - self.tail - row.start + 1)

    # ---- 1 propose ----

    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Every slot's chains (the top row first: its anchor is column 0, the prompt's last token at first), then the
        latest committed cell of each row left out (``K < 2``) above a row that feeds a chain (no cache entry holds it:
        it anchors its row's next chain, so the rows below would not see it), then its orphans, padded to the longest
        slot with entries whose position ids lie past the image."""
        plans, ids, positions, groups = [], [], [], []
        for b, slot in enumerate(slots):
            if slot is None:
                plans.append(None)
                ids.append(self.body.image_ids[:0])
                positions.append([])
                groups.append([])
                continue
            state, chains, parts, pos, grp, left_out = slot.draft, [], [], [], [], []
            for i, row in enumerate(state.rows):
                k = self._entries(state, i)
                if i > 0 and k < 2:
                    if state.committed[row.start - 1]:
                        left_out.append(row)
                    continue
                anchor, proxy = self._anchor(state, row)
                drafts, probs = self._drafts(state, row, k - 1, slot.generator)
                window = ChainWindow(k, drafts, probs, torch.cat([anchor, self.body(drafts, row.start)]))
                chains.append(Chain(b, slot.generator, row, len(pos), i == 0, proxy, window))
                parts.append(window.ids)
                pos += range(row.start - 1, row.start + k - 1)
                grp += [len(chains) if proxy else SHARED] + [len(chains)] * (k - 1)
            lowest = chains[-1].row.index  # chains run top to bottom
            held = [row.start - 1 for row in left_out if row.index < lowest]
            for p in held + state.orphans:
                parts.append(self.body(state.raster[p : p + 1], p))
                pos.append(p)
                grp.append(SHARED)
            plans.append(SlotPlan(chains, len(state.orphans), len(pos)))
            ids.append(torch.cat(parts))
            positions.append(pos)
            groups.append(grp)
        fed = max(len(p) for p in positions)
        shift, group = [], []
        for slot, pos, grp in zip(slots, positions, groups, strict=True):
            cached = 0 if slot is None else slot.draft.cached
            # entry j goes to cache index (prompt - 1) + cached + j, its position id is prompt + its body position
            pos = pos + list(range(self.grid.length + len(pos), self.grid.length + fed))
            shift.append([p + 1 - cached - j for j, p in enumerate(pos)])
            group.append(grp + [-1] * (fed - len(grp)))
        padded = torch.stack([torch.cat([i, self.body.image_ids[:1].expand(fed - i.numel())]) for i in ids])
        from_prompt = [slot is not None and slot.draft.rows[0].start == 0 for slot in slots]
        return Proposal(padded, from_prompt, [slot is not None for slot in slots], fed, None, plans,
                        shift=to_device(shift, self.device), groups=to_device(group, self.device))

    def _anchor(self, state: PJDState, row: Row) -> tuple[torch.Tensor, bool]:
        """The id ``[1]`` fed at position ``start - 1`` and whether it is a proxy: the committed or forced token there
        (the prompt's last token before the body), else the proxy of :meth:`csd.drafters.spatial.RowGrid.proxy_cell`."""
        p = row.start - 1
        if p < 0:
            return self.body.image_ids[:1], False
        if state.committed[p] or self.grid.forced[p]:
            return self.body(state.raster[p : p + 1], p), False
        cell = self.grid.proxy_cell(row.index, state.done)
        return self.body(state.raster[cell : cell + 1], cell), True

    def _drafts(self, state: PJDState, row: Row, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain's drafts and recorded laws: its carried ones topped up with fresh ones (:meth:`Drafter.spine`'s
        draws, so one row in flight is the chain drafter's window)."""
        keep = min(row.carried.numel(), count)
        if keep == count:
            return row.carried[:keep], row.carried_probs[:keep]
        p = row.start - 1
        left = row.carried[keep - 1] if keep else (state.raster[p] if p >= 0 and state.committed[p] else None)
        fresh = self.fresh_drafts(row.start + keep, count - keep, left, gen)
        return torch.cat([row.carried[:keep], fresh]), torch.cat([row.carried_probs[:keep], self.fresh_probs(fresh)])

    # ---- 4 verify ----

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """Every chain of every slot verified at once (one host synchronisation); a slot commits, in order, each chain's
        tokens (a lower row's prefix forced positions first, at its first commit)."""
        chains = [c for plan in proposal.windows if plan is not None for c in plan.chains]
        most, fed, vocab = max(c.window.rows for c in chains), proposal.fed, self.vocab
        # each chain's target rows, the last repeated as padding (never committed)
        index = to_device([[c.slot * fed + c.offset + min(j, c.window.rows - 1) for j in range(most)] for c in chains],
                          self.device)
        chain_target = target.reshape(-1, vocab)[index]
        heads = [ChainHead(c.row.start, c.generator) for c in chains]
        shared = [None if slots[c.slot].draft.shared is None
                  else slots[c.slot].draft.shared[c.row.start : c.row.start + c.window.rows].unsqueeze(0) for c in chains]
        result = verify_chain_batch(self, rule, heads, [c.window for c in chains], chain_target,
                                    target_entropy.reshape(-1)[index], shared)
        cells = [m if c.top else m - 1 for c, m in zip(chains, result.counts, strict=True)]
        sentinel = len(chains) * most
        sources: list[list[int]] = [[] for _ in slots]
        keep: list[list[int]] = [[] for _ in slots]
        for i, (c, m) in enumerate(zip(chains, cells, strict=True)):
            if m == 0:
                continue
            sources[c.slot] += [sentinel] * len(c.row.prefix) + list(range(i * most, i * most + m))
            keep[c.slot] += range(c.offset + 1, c.offset + m) if c.proxy else range(c.offset, c.offset + m)
        for b, plan in enumerate(proposal.windows):
            if plan is not None:  # completion entries stay: context for the rows below
                keep[b] += range(plan.entries - plan.orphans, plan.entries)
        counts = [len(s) for s in sources]
        width = max(max(counts), 1)
        gather = to_device([s + [sentinel] * (width - len(s)) for s in sources], self.device)

        def per_slot(values: torch.Tensor, fill: float | int) -> torch.Tensor:
            flat = torch.cat([values.reshape(-1), values.new_full((1,), fill)])
            return flat[gather]

        lower = to_device([not c.top for c in chains], self.device, torch.bool)
        chain_stats = result.stats.clone()
        chain_stats[:, FALLBACK] *= ~lower  # a lower row commits no residual
        stats = torch.zeros((len(slots), len(STAT_KEYS)), dtype=torch.long, device=self.device)
        stats.index_add_(0, to_device([c.slot for c in chains], self.device), chain_stats)
        return Verified(counts, per_slot(result.tokens, 0), per_slot(result.kinds, COMMIT_FORCED),
                        per_slot(result.entropy, 0.0), stats, [sorted(k) for k in keep],
                        Commits(chains, cells, result, chain_target))

    # ---- 5 refresh, and the schedule's bookkeeping ----

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """Each chain's next drafts (from the draft after its commits on), then each image's schedule: commits, rows
        that end, the orphans they leave, the row that starts."""
        detail: Commits = verified.detail
        for c, (tokens, laws) in zip(detail.chains, self._carried(detail), strict=True):
            c.row.carried, c.row.carried_probs = tokens, laws
        for b, slot in enumerate(slots):
            if slot is None:
                continue
            state = slot.draft
            state.orphans = []
            positions = []
            for c, m in zip(detail.chains, detail.cells, strict=True):
                if c.slot != b or m == 0:
                    continue
                positions += c.row.prefix + list(range(c.row.start, c.row.start + m))
                c.row.prefix = []
                c.row.start += m
            for p in positions:
                state.committed[p] = True
                if self.grid.grid_row[p] >= 0:
                    state.done[self.grid.grid_row[p]] += 1
            state.order += positions
            if positions:
                state.raster[to_device(positions, self.device)] = verified.tokens[b, : len(positions)]
            state.cached += len(verified.keep[b])
            self._advance_rows(state)

    def _carried(self, detail: Commits) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per chain: the drafts for the positions after its commits and their laws: the row samples ``y_m ..`` with
        ``q_m ..`` (``coupling=none``), each old draft maximally coupled with its new ``q`` (``maximal``), or the released
        code's: after the first rejection an old draft stays, with its old law, while ``min(1, q/p) > 0.5``."""
        samples, target = detail.result.detail, detail.target
        out = []
        for i, (c, m) in enumerate(zip(detail.chains, detail.cells, strict=True)):
            w, k = c.window, c.window.rows
            tokens, laws = samples[i, :k], target[i, :k]
            if k > 1 and self.coupling == "maximal":
                coupled = couple_drafts(target[i, : k - 1], w.drafts, w.draft_probs, c.generator)
                tokens = torch.cat([coupled, samples[i, k - 1 : k]])
            elif k > 1 and self.code_parity:
                accepted = detail.result.counts[i] - 1
                later = torch.arange(k - 1, device=self.device) > accepted
                ratio = likelihood_ratio(target[i, : k - 1], w.draft_probs, w.drafts).clamp(max=1)
                old = later & (ratio > CODE_KEEP_RATIO)
                tokens = torch.cat([torch.where(old, w.drafts, samples[i, : k - 1]), samples[i, k - 1 : k]])
                laws = torch.cat([torch.where(old[:, None], w.draft_probs, target[i, : k - 1]), target[i, k - 1 : k]])
            out.append((tokens[m:], laws[m:]))
        return out

    def _advance_rows(self, state: PJDState) -> None:
        """After the commits: the top row ends at its limit (leaving its last token as an orphan unless it anchors the
        next row) or, alone, moves on to the row its start is in; then the row below the last one starts once the last
        has ``context`` cells (taking the drafts the top row carried into it)."""
        grid = self.grid
        while state.rows[0].start >= grid.span_end(state.rows[0].index):
            if state.rows[0].start >= grid.length:  # the image is complete
                return
            if len(state.rows) == 1:  # alone, the top row drafts on into the rows below
                state.rows[0].index = grid.owner(state.rows[0].start)
                break
            last = state.rows.pop(0).start - 1
            if state.rows[0].start - 1 != last:
                state.orphans.append(last)
        top, last = state.rows[0], state.rows[-1]
        below = last.index + 1
        if below < grid.height and state.done[below] == 0 and may_start(state.done[last.index], self.context):
            start = grid.cells[below][0]
            row = Row(below, start, top.carried[:0], top.carried_probs[:0], list(range(grid.end[last.index], start)))
            if last is top:  # drafts the top row carried past its row's end belong to the new row
                offset = start - top.start
                if top.carried.numel() > offset:
                    row.carried, row.carried_probs = top.carried[offset:], top.carried_probs[offset:]
                cut = max(grid.end[last.index] - top.start, 0)
                top.carried, top.carried_probs = top.carried[:cut], top.carried_probs[:cut]
            state.rows.append(row)

    def finish(self, slot: Slot) -> None:
        """Generation order -> raster order (:meth:`Drafter.finish`)."""
        to_raster(slot, to_device(slot.draft.order, self.device))
