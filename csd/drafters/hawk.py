"""Hawk: spatial draft heads on a tree window (NeurIPS 2025, arXiv 2510.25739; docs/ALGORITHMS.md "Hawk").

Heads (``SpatialHeadsLike``: ``csd.drafters.spatial_heads.SpatialHeads`` or the stand-in :class:`TargetLawHeads`)
read a committed image cell's pair ``(f_s, x_s)``, ``f_s`` the target's last hidden state whose logits gave the law of
cell ``s``, and give a law for each cell ``s + o``, ``o`` in ``offsets`` (image cells, raster order without
end-of-line columns): **horizontal** offsets ``1 .. k_h`` (the rest of the row) and **vertical** ones ``W, 2W`` (the
cells below, ``W`` the grid's width). Eq. (Hawk, our notation)::

    p^h_k(. | s) = Q(H_k(f_s, x_s)),  k = 1 .. k_h          p^v_d(. | s) = Q(V_d(f_s, x_s)),  d = 1, 2

``Q``: the target's own processors (CFG rows combined, top-k, temperature), so a draft law lives where ``q`` does.

After every forward the committed cells' pairs go through the heads once (batched): the vertical laws are **cached**
(a ring of ``max offset + 1`` cells per vertical offset) until decoding reaches their cells; the horizontal laws of
the newest pair replace the previous ones. The **spatial pool** of a cell ``c`` at depth ``d`` of the next window
(``c`` = the cell of body position ``n - 1 + d``) holds, in this order, the horizontal law ``p^h_{c - s}(. | s)`` of
the newest pair ``s`` (if ``1 <= c - s <= k_h``) and the cached vertical laws ``p^v_1(. | c - W)``,
``p^v_2(. | c - 2W)`` (if those cells were decoded) [assumed: the paper's pool order is not stated; the horizontal
head is the one trained on the nearest context].

The window is a fixed tree (``csd.tree.Tree.build``: the Cartesian product of ``width`` = ``K`` candidates at depths
``1 .. D - 1``, then a spine to ``window`` nodes). Candidate ``k`` of a depth is drawn from pool law
``min(k, |pool| - 1)`` with the earlier candidates removed (``draw=sample``: an exponential race with the image's
generator; ``draw=top``: the argmax, recorded one-hot [assumed: the paper's candidates are its heads' top tokens]), and
recorded with exactly that law. Verification is recursive rejection sampling in sibling order
(``csd.tree.verify_tree``): child ``k`` is judged with ``min(1, r_k(x) / p'_k(x))`` against the running target
``r_k`` (``r_0 = q``, ``r_{k+1} = norm([r_k - p'_k]_+)``), ``p'_k`` its law with the earlier children removed. Since a
rejected child ``x_k`` has ``r_k(x_k) <= p'_k(x_k)``, ``r_{k+1}(x_k) = 0``: removing it from the next law changes no
acceptance, and ``r_{k+1}`` does not depend on which token was rejected, so the committed token is distributed as
``q`` whatever law each candidate came from (multi-draft speculative sampling, lossless; the paper's appendix proves
the same for its pool). A depth without any pool law, a depth past the body and an image's first window (no pair
yet) have no valid candidate: their nodes are never accepted.

Without trained heads (``drafter.heads=null``) the drafter runs the **stand-in** :class:`TargetLawHeads`: every head
returns the target's own law of cell ``s`` (``head(f_s)``), i.e. the horizontal candidates of the next cells are drawn
from the last committed cell's law and the vertical ones from the law the cell above (two above) was decoded with —
an untrained spatial prior, the counterpart of the stale target laws SJD-PAC drafts from. Any batch size; eager only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.adapters.base import BodyLayout, ModelAdapter
from csd.device import to_device
from csd.drafters.base import FORWARDS, BodyIds, Drafter, Proposal, Verified, features_problem
from csd.drafters.tree_window import TreeOutcome, TreeWindow, tree_grid, verify_tree_windows
from csd.keys import HAWK_DRAWS
from csd.params import Param
from csd.processors import TargetPipeline
from csd.schema import Choice, Int, Str
from csd.tree import Tree, branch_nodes, tree_problem
from csd.verify import exponential_noise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot

HEADS_HINT = "train them with `python -m experiments.train_drafter --kind spatial` (docs/ALGORITHMS.md \"Hawk\")"


class SpatialHeadsLike(Protocol):
    """What the drafter needs of spatial heads (``csd.drafters.spatial_heads.SpatialHeads`` has this shape)."""

    #: the cell offset each head predicts: horizontal ``1 .. k_h``, vertical multiples of the grid's width
    offsets: tuple[int, ...]

    def __call__(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``feature [..., D]`` (the hidden state whose logits gave the law of cell ``s``), ``token [...]`` (the input
        id of ``x_s``) -> raw logits ``[..., len(offsets), V_raw]`` of cells ``s + offsets[k]``."""
        ...


class TargetLawHeads:
    """The stand-in for trained heads: every offset's law is the target's own law of cell ``s``, ``head(f_s)``
    (module docstring). ``offsets``: horizontal ``1 .. k_h``, vertical ``W, 2W``."""

    def __init__(self, adapter: ModelAdapter, offsets: tuple[int, ...]) -> None:
        self.adapter, self.offsets = adapter, offsets

    def __call__(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        logits = self.adapter.head(feature)
        return logits.unsqueeze(-2).expand(*logits.shape[:-1], len(self.offsets), logits.shape[-1])


def cell_positions(layout: BodyLayout) -> tuple[list[int], list[int]]:
    """The body position of each image cell (raster order, end-of-line columns skipped) and the cell of each body
    position (-1 at a forced position): offsets in cells become sequence positions through these two tables."""
    width = layout.grid[1]
    cell_of = [int(r) * width + int(c) if r >= 0 else -1 for r, c in zip(layout.rows.tolist(), layout.cols.tolist(), strict=True)]
    position = [0] * (layout.grid[0] * width)
    for p, c in enumerate(cell_of):
        if c >= 0:
            position[c] = p
    return position, cell_of


def split_offsets(offsets: tuple[int, ...], width: int) -> tuple[list[int], list[int]]:
    """The heads' indices of horizontal offsets ``1 .. k_h`` (in that order) and of vertical ones (multiples of the
    grid's ``width``); one line if the offsets are neither."""
    horizontal = [k for k, o in enumerate(offsets) if 0 < o < width]
    vertical = [k for k, o in enumerate(offsets) if o >= width and o % width == 0]
    if sorted(offsets[k] for k in horizontal) != list(range(1, len(horizontal) + 1)) or \
            len(horizontal) + len(vertical) != len(offsets):
        raise ValueError(f"spatial heads' offsets {offsets} are not horizontal 1 .. k_h plus multiples of the grid's "
                         f"width {width}")
    return sorted(horizontal, key=lambda k: offsets[k]), vertical


@dataclass
class HawkState:
    """An image's drafting state: the newest pair's cell ``source`` (-1: none yet) and its horizontal laws
    ``horizontal [k_h, V]``; the vertical cache ``ring [R, n_v, V]`` and, on the host, the cell each ring entry holds
    (``ring_cell[i][k]``, -1: empty); ``windows``: this iteration's tree window."""

    source: int
    horizontal: torch.Tensor
    ring: torch.Tensor
    ring_cell: list[list[int]]
    window: TreeWindow | None = None


class HawkDrafter(Drafter):
    """Hawk's tree windows of ``window`` nodes, ``width`` candidates per branching depth from the spatial pools
    (module docstring); lossless with SJD's rule, any rule runs on it."""

    name = "hawk"
    reads_features = True
    PARAMS = {
        "window": Param(Int(min=3), 16, "L: the nodes of one forward (root, spine and siblings)"),
        "width": Param(Int(min=2), 2, "K: candidates per cell at the branching depths (the spatial pool's laws in "
                                      "order: horizontal, vertical +W, +2W; the last one again past the pool)"),
        "depth": Param(Int(min=2), 3, "D: tree levels counting the root; branching at depths 1 .. D-1"),
        "heads": Param(Str(null="the stand-in: the target's own law of the decoded cell for every offset"), None,
                       "the trained spatial heads' file (python -m experiments.train_drafter --kind spatial)"),
        "draw": Param(Choice(options=HAWK_DRAWS), "sample",
                      "candidates drawn from their pool law (sample) or its most likely codes (top, recorded one-hot)"),
    }

    def check_params(self) -> None:
        problem = tree_problem(self.window, self.width, self.depth, "maximal", False)
        if problem is not None:
            raise ValueError(problem)
        if self.heads is not None and not Path(self.heads).exists():
            raise ValueError(f"drafter.heads={self.heads}: no such file; {HEADS_HINT}, or leave drafter.heads=null for "
                             "the stand-in (the target's own law)")

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        return "drafter=hawk (tree windows) runs eagerly: set engine.compile=false" if compiled else None

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        return features_problem("hawk", adapter_class)

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        self.refuse_model(adapter)
        layout = adapter.layout
        self.grid_width = layout.grid[1]
        self.cell_position, self.cell_of = cell_positions(layout)
        widths = (self.width,) * (self.depth - 1)
        self.tree = Tree.build(self.window - branch_nodes(widths), widths)
        self.mask = self.tree.mask(self.device)
        self.grid, self.grid_of = tree_grid(self.tree, self.device)
        self.reach = self.tree.spine - 1  # the deepest depth
        self.node_depth = self.mask.depth
        self.node_branch = to_device([b[-1] if b else 0 for b in self.tree.branches], self.device)
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        if self.heads is None:
            horizontal = tuple(range(1, min(self.reach, self.grid_width - 1) + 1))
            self.use_heads(TargetLawHeads(adapter, horizontal + (self.grid_width, 2 * self.grid_width)))
        else:
            from csd.drafters.spatial_heads import load_spatial_heads

            self.use_heads(load_spatial_heads(self.heads, adapter))

    def use_heads(self, net: SpatialHeadsLike) -> None:
        """Draft with ``net`` (after :meth:`bind`; images started before keep their old state's shapes, so call it
        between runs): its offsets split into horizontal and vertical ones, the vertical cache sized for the largest."""
        self.net = net
        self.h_index, self.v_index = split_offsets(tuple(net.offsets), self.grid_width)
        self.v_offsets = [net.offsets[k] for k in self.v_index]
        self.ring_size = max(self.v_offsets, default=0) + 1

    def params(self) -> dict[str, object]:
        return {"drafter": self.name, **self.param_values()}

    def start(self, slot: Slot) -> None:
        slot.draft = self.new_state(slot, None)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> HawkState:
        v, nv = self.vocab, len(self.v_index)
        return HawkState(-1, torch.zeros((len(self.h_index), v), device=self.device),
                         torch.zeros((self.ring_size, nv, v), device=self.device),
                         [[-1] * nv for _ in range(self.ring_size)])

    def pool(self, state: HawkState, cell: int) -> list[torch.Tensor]:
        """The spatial pool of ``cell``: its horizontal law from the newest pair, then its cached vertical laws."""
        laws = []
        step = cell - state.source
        if state.source >= 0 and 1 <= step <= len(self.h_index):
            laws.append(state.horizontal[step - 1])
        ring = cell % self.ring_size
        laws += [state.ring[ring, k] for k in range(len(self.v_index)) if state.ring_cell[ring][k] == cell]
        return laws

    def _window(self, slot: Slot) -> TreeWindow:
        """The slot's tree window: every depth's ``K`` candidates from its pool (the same under every parent, as in
        the Cartesian tree), the depths the image cannot use invalid."""
        layout, n, state, width, vocab = self.adapter.layout, slot.n, slot.draft, self.width, self.vocab
        span = layout.length - n
        usable = 0 if (n == 0 or span <= layout.jacobi_tail) else min(self.reach, span - 1)
        uniform = torch.full((vocab,), 1.0 / vocab, device=self.device)
        laws, valid, forced = [uniform.expand(width, vocab)], [[False] * width], [False]  # the root's placeholder
        for d in range(1, self.reach + 1):
            p = n - 1 + d
            is_forced = d <= usable and self.body.forced_host[p]
            pool = self.pool(state, self.cell_of[p]) if d <= usable and not is_forced else []
            count = width if d < self.depth else 1
            laws.append(torch.stack([pool[min(k, len(pool) - 1)] for k in range(count)] + [uniform] * (width - count))
                        if pool else uniform.expand(width, vocab))
            valid.append([bool(pool) and k < count for k in range(width)] if not is_forced else [True] + [False] * (width - 1))
            forced.append(is_forced)
        law = torch.stack(laws)  # [depths + 1, K, V]
        cand, law, exists = self.draw_candidates(law, slot.generator)
        at = self.node_depth * width + self.node_branch
        exists = exists.flatten()[at] & to_device(sum(valid, []), self.device, torch.bool)[at]
        tokens, probs = cand.flatten()[at], law.flatten(0, 1)[at]
        positions = (n - 1 + self.node_depth).clamp(0, layout.length - 1)
        is_forced = to_device(forced, self.device, torch.bool)[self.node_depth]
        ids = torch.where(is_forced, self.body.forced[positions], self.body.image_ids[tokens])
        ids = torch.cat([self.anchor(slot), ids[1:]])
        return TreeWindow(self.tree, self.mask, self.grid, self.grid_of, tokens, probs, exists, is_forced, ids)

    def draw_candidates(self, law: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidates ``[..., K]`` of laws ``law [..., K, V]``, one after the other, candidate ``k`` from law ``k``
        without the earlier candidates; returns them, the law each was drawn from as recorded (``top``: one-hot) and
        whether each exists (a law without mass left has none)."""
        noise = exponential_noise(tuple(law.shape), gen, self.device)
        removed = torch.zeros(law.shape[:-2] + law.shape[-1:], dtype=torch.bool, device=self.device)
        tokens, records, exists = [], [], []
        for k in range(law.shape[-2]):
            left = law[..., k, :].masked_fill(removed, 0.0)
            has = left.sum(-1) > 0
            drawable = torch.where(has.unsqueeze(-1), left, torch.ones_like(left))
            token = drawable.argmax(-1) if self.draw == "top" else sample_race(drawable, noise[..., k, :])
            token = torch.where(has, token, 0)
            tokens.append(token)
            records.append(F.one_hot(token, self.vocab).float() if self.draw == "top" else law[..., k, :])
            exists.append(has)
            removed = removed | (has.unsqueeze(-1) & F.one_hot(token, self.vocab).bool())
        return torch.stack(tokens, -1), torch.stack(records, -2), torch.stack(exists, -1)

    def propose(self, slots: list[Slot | None]) -> Proposal:
        windows: list[TreeWindow | None] = []
        for slot in slots:
            if slot is not None:
                slot.draft.window = self._window(slot)
            windows.append(None if slot is None else slot.draft.window)
        filler = next(w.ids for w in windows if w is not None)
        ids = torch.stack([filler if w is None else w.ids for w in windows])
        return Proposal(ids, [slot is not None and slot.n == 0 for slot in slots], [slot is not None for slot in slots],
                        self.tree.size, self.mask, windows)

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """RRS over every slot's tree at once, one host synchronisation (``verify_tree_windows``)."""
        return verify_tree_windows(self, rule, slots, proposal.windows, target, target_entropy)

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """The committed cells' pairs ``(f_s, x_s)`` through the heads in one batched call: node ``path[j]``'s feature
        gave the law of body position ``n + j``, committed as ``tokens[j]``; forced positions make no pair. Trained
        heads count one ``drafter_forwards`` per image the call carries (the stand-in none: it is the target's law). Vertical
        laws enter the ring at cell ``s + o``; the newest pair's horizontal laws replace the slot's."""
        pairs: list[tuple[int, list[int], list[int]]] = []  # (slot, path entries, cells)
        for b, slot in enumerate(slots):
            out: TreeOutcome | None = verified.detail[b]
            if slot is None or out is None:
                continue
            path = verified.keep[b]
            free = [(j, self.cell_of[slot.n + j]) for j in range(len(path)) if self.cell_of[slot.n + j] >= 0]
            if free:
                pairs.append((b, [path[j] for j, _ in free], [c for _, c in free]))
        if not pairs:
            return
        if not isinstance(self.net, TargetLawHeads):  # one forward of the drafter's own heads per image it carries
            verified.stats[to_device([b for b, _, _ in pairs], self.device), FORWARDS] += 1
        most, r = max(len(c) for _, _, c in pairs), proposal.features.shape[1]
        features = proposal.features.new_zeros((len(pairs), r, most, proposal.features.shape[-1]))
        tokens = torch.zeros((len(pairs), most), dtype=torch.long, device=self.device)
        for i, (b, entries, cells) in enumerate(pairs):
            features[i, :, : len(cells)] = proposal.features[b][:, to_device(entries, self.device)]
            codes = verified.tokens[b, to_device([self.cell_position[c] - slots[b].n for c in cells], self.device)]
            tokens[i, : len(cells)] = self.body.image_ids[codes]
        raw = self.net(features, tokens.unsqueeze(1).expand(-1, r, -1))  # [P, r, M, O, V_raw]
        laws = self.pipeline(raw.flatten(2, 3)).view(len(pairs), most, len(self.net.offsets), -1)
        h_index, v_index = to_device(self.h_index, self.device), to_device(self.v_index, self.device)
        for i, (b, _, cells) in enumerate(pairs):
            state, total = slots[b].draft, len(self.cell_position)
            state.source, state.horizontal = cells[-1], laws[i, len(cells) - 1, h_index]
            rings, planes, rows = [], [], []
            for j, c in enumerate(cells):
                for k, o in enumerate(self.v_offsets):
                    if c + o < total:
                        rings.append((c + o) % self.ring_size)
                        planes.append(k)
                        rows.append(j)
                        state.ring_cell[(c + o) % self.ring_size][k] = c + o
            if rows:
                at = to_device(rows, self.device)
                state.ring[to_device(rings, self.device), to_device(planes, self.device)] = laws[i, at][
                    torch.arange(len(rows), device=self.device), v_index[to_device(planes, self.device)]]
