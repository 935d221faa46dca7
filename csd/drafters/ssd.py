"""SSD, Spatially Speculative Decoding (arXiv 2606.20543; docs/ALGORITHMS.md "SSD"): blocks of cells drafted by
trained spatial heads (``csd.drafters.spatial_heads``), corrected position by position for ``r`` rounds, then
committed. **Lossy**: a committed block is never checked against the target as a chain (with ``r = 0`` its drafts are
committed unverified).

An image's iterations, one target forward each (the engine's loop; the image's cells in raster order):

* **AR step**: the first token, a forced position starting no block, the AR tail: one token sampled from ``q``.
* **block**: the next cells, drafted at once from the committed cells' features ``h`` (the target's, recorded when
  they were committed) and tokens: at a row start below a complete row (``k_v >= 1``) the next ``k_v`` rows, cell
  ``(y + d, x)`` from cell ``(y - 1, x)`` by the vertical head of offset ``(d + 1) W``; else the next
  ``min(k_h, cells left in the row)`` cells from the last committed cell ``s`` by the horizontal heads ``+1 .. +k_h``.
  Each draft ``x_i ~ p_i``, ``p_i`` the head's logits through the target's processors (CFG, temperature, top-k).
* **correction round** (``r`` of them per block; commits nothing, the cache drops the block): the target runs on
  ``[anchor, block]`` and gives ``q_i`` for every block position ``i``; each draft is accepted **independently** with
  the rule's ``b_i`` (SJD's ``min(1, q_i(x_i) / p_i(x_i))``), a rejected one replaced by a sample of the rule's
  residual ``norm(max(0, q_i - p_i))``. By the speculative-sampling identity the corrected ``x_i`` is distributed as
  ``q_i`` given the round's context, so ``q_i`` is the law recorded for the next round's test.
* **commit**: the target runs on ``[anchor, block]`` once more (the KV cache of the committed block and the features
  of its cells, which the next blocks' heads read) and the block is committed as it stands.

A block of ``K`` cells thus costs ``r + 1`` forwards. The lossy part: each position is corrected against a ``q_i``
computed from a context that holds the block's other (possibly rejected) drafts, and the final state is not
re-tested. Every random number of an image comes from its own generator in a fixed order (drafts at the block's
creation, then per round ``K`` uniforms and ``K`` residual races), so its tokens do not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.drafters.base import STAT_KEYS, BodyIds, Drafter, Proposal, Verified, features_problem
from csd.drafters.spatial import RowGrid
from csd.drafters.spatial_heads import TRAIN_HINT, SpatialHeads, load_spatial_heads
from csd.keys import SSD_HORIZONTAL_HEADS, SSD_ROUNDS, SSD_VERTICAL_HEADS
from csd.params import Param
from csd.processors import TargetPipeline
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.schema import Choice, Str
from csd.verify import exponential_noise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot

AR, ROUND, COMMIT = "ar", "round", "commit"
STAT = {key: i for i, key in enumerate(STAT_KEYS)}


@dataclass
class Block:
    """The block of body positions ``start .. start + K - 1``: drafts ``[K]`` (image-code indices; 0 at forced
    positions), their recorded laws ``[K, V]``, ``free [K]`` (not forced), the last round's acceptances ``[K]`` (None
    before the first round) and the rounds done."""

    start: int
    drafts: torch.Tensor
    probs: torch.Tensor
    free: torch.Tensor
    accepted: torch.Tensor | None = None
    rounds: int = 0

    @property
    def size(self) -> int:
        return self.drafts.numel()


@dataclass
class SSDState:
    """An image's committed features ``[cfg rows, body length, D]`` (entry ``p``: the target's feature whose logits
    gave the law of body position ``p``), its block in flight, this iteration's kind (AR, ROUND, COMMIT) and the
    corrected drafts of a round (for :meth:`SSDDrafter.refresh`). No Gumbel sharing."""

    feats: torch.Tensor
    block: Block | None = None
    mode: str = AR
    corrected: tuple[torch.Tensor, torch.Tensor] | None = None
    shared: None = None


class SSDDrafter(Drafter):
    """SSD's blocks (module docstring): ``k_h`` horizontal heads, ``k_v`` rows drafted below a complete row, ``rounds``
    correction rounds; any acceptance rule judges the corrections."""

    name = "ssd"
    reads_features = True
    #: a forward's entries depend on the block (a run of a row, or ``k_v`` rows), not on a window setting
    window = None
    PARAMS = {
        "k_h": Param(Choice(options=SSD_HORIZONTAL_HEADS), 5, "horizontal heads: cells +1 .. +k_h of the row drafted "
                                                              "from the last committed cell"),
        "k_v": Param(Choice(options=SSD_VERTICAL_HEADS), 1, "rows drafted at once below a complete row by the vertical "
                                                            "heads +W .. +k_v W (0: horizontal blocks only)"),
        "rounds": Param(Choice(options=SSD_ROUNDS), 2, "r: correction rounds (one forward each) before a block is "
                                                       "committed; 0 commits the drafts unverified"),
        "heads": Param(Str(null="the model's shipped heads (model=toy)"), None,
                       "the spatial heads' file (python -m experiments.train_drafter --kind spatial)"),
    }

    def check_params(self) -> None:
        if self.heads is not None and not Path(self.heads).is_file():
            raise ValueError(f"drafter.heads={self.heads}: no such file; {TRAIN_HINT}, or leave drafter.heads=null "
                             "for model=toy's shipped heads")

    def method_problem(self, method: str) -> str | None:
        if method == "ar":
            return "method=ar decodes one token per forward, but drafter=ssd always drafts: use drafter=chain (the default)"
        return None

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        return "drafter=ssd decodes on the eager cache: set engine.compile=false" if compiled else None

    def forward_entries(self, grid: tuple[int, int], body_len: int) -> int:
        """The anchor and the longest block: ``k_h`` cells, or ``k_v`` rows (with their forced tokens)."""
        return min(body_len, 1 + max(self.k_h, self.k_v * -(-body_len // grid[0])))

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        if problem := features_problem("ssd", adapter_class):
            return problem
        if self.heads is None and adapter_class.spatial_heads is None:
            return f"drafter.heads=null: {adapter_class.__name__} ships no spatial heads; {TRAIN_HINT} and pass drafter.heads=<file>"
        return None

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        self.refuse_model(adapter)
        self.net: SpatialHeads = load_spatial_heads(self.heads or adapter.spatial_heads, adapter)
        if self.net.k_h < self.k_h or self.net.k_v < self.k_v:
            raise ValueError(f"drafter.k_h={self.k_h}, drafter.k_v={self.k_v}: the heads file has k_h={self.net.k_h}, "
                             f"k_v={self.net.k_v}; lower them or {TRAIN_HINT}")
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        self.cfg_rows = 2 if adapter.uses_cfg else 1
        grid = RowGrid(adapter.layout)
        self.height, self.width, self.tail = grid.height, grid.width, adapter.layout.jacobi_tail
        #: body position of each cell (row-major), and the first cell at or after each body position (-1: none)
        self.cell_pos = [p for row in grid.cells for p in row]
        self.next_cell, c = [-1] * (grid.length + 1), len(self.cell_pos)
        for p in range(grid.length - 1, -1, -1):
            if grid.grid_row[p] >= 0:
                c -= 1
            self.next_cell[p] = c if c < len(self.cell_pos) else -1
        self.head_of = {o: k for k, o in enumerate(self.net.offsets)}

    def start(self, slot: Slot) -> None:
        """A new image's state (no Gumbel sharing: drafts come from the heads)."""
        slot.draft = self.new_state(slot, None)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> SSDState:
        decoder = self.adapter.decoder()
        feats = torch.zeros((self.cfg_rows, self.adapter.layout.length, self.net.hidden), dtype=decoder.dtype,
                            device=self.device)
        return SSDState(feats)

    # ---- 1 propose ----

    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Each slot's window: its anchor alone (an AR step) or its anchor and block (a round or the commit)."""
        ids = []
        for slot in slots:
            if slot is None:
                ids.append(self.body.image_ids[:1])
                continue
            state = slot.draft
            if state.block is None:
                state.block = self._new_block(slot)
            block = state.block
            if block is None:
                state.mode = AR
                ids.append(self.anchor(slot))
                continue
            state.mode = ROUND if block.rounds < self.rounds else COMMIT
            ids.append(torch.cat([self.anchor(slot), self.body(block.drafts, block.start)]))
        fed = max(i.numel() for i in ids)
        padded = torch.stack([torch.cat([i, self.body.image_ids[:1].expand(fed - i.numel())]) for i in ids])
        return Proposal(padded, [slot is not None and slot.n == 0 for slot in slots], [slot is not None for slot in slots],
                        fed, None, [None if slot is None else slot.draft for slot in slots])

    def _cells(self, n: int) -> tuple[list[int], list[int], list[int]] | None:
        """The next block's cells at body position ``n`` on, each with its source cell and head: ``k_v`` rows below a
        complete row, else a run of the current row; None for an AR step (no committed cell yet, the AR tail)."""
        c = self.next_cell[n]
        if n == 0 or c <= 0 or self.adapter.layout.length - n <= self.tail:
            return None
        y, x = divmod(c, self.width)
        if self.k_v and y >= 1 and x == 0:
            rows = min(self.k_v, self.height - y)
            cells = list(range(c, c + rows * self.width))
            sources = [c - self.width + (i % self.width) for i in range(len(cells))]
            heads = [self.head_of[(i // self.width + 1) * self.width] for i in range(len(cells))]
        else:
            cells = list(range(c, c + min(self.k_h, self.width - x)))
            sources = [c - 1] * len(cells)
            heads = [self.head_of[i + 1] for i in range(len(cells))]
        last = self.adapter.layout.length - self.tail  # no draft in the AR tail
        keep = [i for i, cell in enumerate(cells) if self.cell_pos[cell] < last]
        if not keep:
            return None
        return [cells[i] for i in keep], [sources[i] for i in keep], [heads[i] for i in keep]

    def _new_block(self, slot: Slot) -> Block | None:
        """Draft the block of :meth:`_cells` (one batched pass of the heads): ``x_i ~ p_i`` with the image's generator."""
        planned = self._cells(slot.n)
        if planned is None:
            return None
        cells, sources, heads = planned
        state, n = slot.draft, slot.n
        src = torch.tensor([self.cell_pos[s] for s in sources], device=self.device)
        head = torch.tensor(heads, device=self.device)
        tokens = self.body.image_ids[slot.body[src]]
        hidden = self.net.predict(state.feats[:, src], tokens.expand(self.cfg_rows, -1))   # [R, m, K, D]
        hidden = hidden[:, torch.arange(len(cells), device=self.device), head]             # [R, m, D]
        p = self.pipeline(self.net.readout(hidden).unsqueeze(0))[0].float()                # [m, V]
        x = sample_race(p, exponential_noise(tuple(p.shape), slot.generator, self.device))
        size = self.cell_pos[cells[-1]] + 1 - n
        at = torch.tensor([self.cell_pos[cell] - n for cell in cells], device=self.device)
        drafts = torch.zeros(size, dtype=torch.long, device=self.device)
        drafts[at] = x
        probs = F.one_hot(drafts, self.vocab).float()
        probs[at] = p
        free = torch.zeros(size, dtype=torch.bool, device=self.device)
        free[at] = True
        return Block(n, drafts, probs, free)

    # ---- 4 verify ----

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """AR steps sample ``q``; rounds correct their block (:func:`correct_block`) and commit nothing; commits commit
        the block. How many tokens each slot commits is known on the host: no synchronisation."""
        batch, width = len(slots), proposal.fed
        tokens = torch.zeros((batch, width), dtype=torch.long, device=self.device)
        kinds = torch.full((batch, width), COMMIT_FORCED, dtype=torch.long, device=self.device)
        entropy = torch.zeros((batch, width), dtype=torch.float32, device=self.device)
        stats = torch.zeros((batch, len(STAT_KEYS)), dtype=torch.long, device=self.device)
        counts = [0] * batch
        for b, slot in enumerate(slots):
            if slot is None:
                continue
            state, block = slot.draft, slot.draft.block
            if state.mode == AR:
                q = target[b, :1]
                tokens[b, :1] = sample_race(q, exponential_noise(tuple(q.shape), slot.generator, self.device))
                kinds[b, 0], entropy[b, :1], counts[b] = COMMIT_SAMPLED, target_entropy[b, :1], 1
                continue
            k = block.size
            if block.rounds == 0:  # the block's first forward
                stats[b, STAT["drafts_proposed"]] = block.free.sum()
                stats[b, STAT["drafter_forwards"]] = 1
            if state.mode == ROUND:
                out, accepted, relaxed, fallback = correct_block(rule, target[b, :k], block.probs, block.drafts,
                                                                 target_entropy[b, :k], block.free, slot.generator)
                state.corrected = (out, accepted)
                stats[b, STAT["drafts_verified"]] = block.free.sum()
                stats[b, STAT["drafts_accepted"]] = (accepted & block.free).sum()
                stats[b, STAT["relaxed_accepts"]] = (relaxed & block.free).sum()
                stats[b, STAT["residual_fallbacks"]] = (fallback & ~accepted & block.free).sum()
                continue
            tokens[b, :k] = block.drafts
            if block.accepted is None:  # r = 0: committed unverified
                kind = torch.full_like(block.drafts, COMMIT_RELAXED)
            else:
                kind = torch.where(block.accepted, COMMIT_ACCEPTED, COMMIT_SAMPLED)
            kinds[b, :k] = torch.where(block.free, kind, COMMIT_FORCED)
            entropy[b, :k] = target_entropy[b, :k]
            counts[b] = k
        return Verified(counts, tokens, kinds, entropy, stats, None, None)

    # ---- 5 refresh ----

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """A round's corrected drafts replace the block's, recorded with this round's ``q`` (their law); an AR step or
        a commit stores the target's features of the committed positions and ends the block."""
        for b, slot in enumerate(slots):
            if slot is None:
                continue
            state, n = slot.draft, slot.n
            if state.mode == ROUND:
                block = state.block
                block.drafts, block.accepted = state.corrected
                block.probs = torch.where(block.free[:, None], target[b, : block.size].float(), block.probs)
                block.rounds += 1
                state.corrected = None
                continue
            m = verified.counts[b]
            state.feats[:, n : n + m] = proposal.features[b, :, :m].to(state.feats.dtype)
            state.block = None


def correct_block(rule: AcceptanceRule, target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor,
                  target_entropy: torch.Tensor, free: torch.Tensor, generator: torch.Generator
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One SSD correction round over a block of ``K`` positions, each judged **independently** (no prefix):
    ``target_probs, draft_probs [K, V]``, ``drafts [K]``; position ``i`` keeps ``x_i`` with probability
    ``b_i = rule.accept_prob`` (SJD: ``min(1, q_i(x_i) / p_i(x_i))``), else takes ``y_i ~ rule.residual``
    (``norm(max(0, q_i - p_i))``). Positions not ``free`` (forced) are kept. Random numbers from ``generator``: ``K``
    uniforms, then one ``Exp(1)`` race ``[K, V]``. Returns the corrected drafts, which were accepted, which of those
    only by a relaxed rule (``u >= min(1, q/p)``) and where the residual had no mass (its fallback law was used)."""
    verdict = rule.accept_prob(target_probs[None], draft_probs[None], drafts[None], target_entropy[None])
    u = torch.rand(drafts.shape, generator=generator, device=drafts.device)
    accepted = (u < verdict.accept_prob[0]) | ~free
    relaxed = accepted & (u >= verdict.lossless_prob[0])
    residual = rule.residual(target_probs[None], draft_probs[None], drafts[None])
    noise = exponential_noise(tuple(target_probs.shape), generator, drafts.device)
    replacement = sample_race(residual.probs[0], noise)
    return torch.where(accepted, drafts, replacement), accepted, relaxed, residual.fallback[0]
