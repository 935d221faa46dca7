"""ZipAR's spatial schedule (He et al., ICML 2025; docs/ALGORITHMS.md "ZipAR"): several image rows decode at once.

Row 0 decodes alone, one token per forward; row 1 starts once row 0 is complete, and row ``r >= 2`` once row
``r - 1`` has ``window_size`` committed tokens. Every forward, each active row samples its next token from its target
``q`` (no draft, no verification): lossy, the law is not the raster one. The query of a row's next token is the entry
of its latest token; the first token of row ``r`` is predicted at the position of cell ``(r - 1, W - 1)``, by that
cell's own entry when row ``r - 1`` is complete, else by a proxy entry: the latest committed token of row ``r - 2``
fed with that position id (the released LlamaGen code), which no later query sees (the cache drops it).

Tokens enter the cache in generation order with their raster position ids (``Proposal.shift``); each entry sees the
entries written so far whose position is at most its own. The schedule depends on the grid and ``window_size`` only,
so the engine commits in generation order and :meth:`ZipARDrafter.finish` puts the image back in raster order.
With ``window_size >= W`` one row is active at a time: AR, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.drafters.base import STAT_KEYS, BodyIds, Drafter, Proposal, Verified
from csd.drafters.spatial import may_start, proxy_row, to_raster
from csd.params import Param
from csd.records import COMMIT_SAMPLED
from csd.schema import Int
from csd.verify import WindowNoise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot

#: an entry's source cell when it is the prompt's last token (the first forward's anchor)
PROMPT_TAIL = -1


@dataclass(frozen=True)
class Forward:
    """One forward of the schedule, in raster cells: ``entries`` ``(source, position)`` (the cell whose token is fed
    and the cell whose position id it gets; the proxy's differ), ``queries`` (the entry predicting each active row's
    next cell, rows in increasing order) and ``commits`` (those cells); the last ``proxies`` entries are proxies."""

    entries: tuple[tuple[int, int], ...]
    queries: tuple[int, ...]
    commits: tuple[int, ...]
    proxies: int


def zipar_schedule(rows: int, cols: int, window_size: int) -> list[Forward]:
    """The forwards that decode a ``rows x cols`` grid with ZipAR (module docstring), in order."""
    done = [0] * rows
    active, fresh, out, last = [0], [PROMPT_TAIL], [], 0
    start = min(window_size, cols)
    while active:
        entries = [(cell, cell) for cell in fresh]  # the tokens committed by the last forward
        index = {cell: j for j, cell in enumerate(fresh)}
        queries, proxies = [], []
        for r in active:
            if done[r] or r == 0:
                queries.append(index[r * cols + done[r] - 1 if done[r] else PROMPT_TAIL])
            elif done[r - 1] == cols:
                queries.append(index[r * cols - 1])
            else:  # the first token of row r: the latest token of row r - 2 at the position of cell (r - 1, W - 1)
                queries.append(len(fresh) + len(proxies))
                source = proxy_row(r)
                proxies.append((source * cols + done[source] - 1, r * cols - 1))
        fresh = [r * cols + done[r] for r in active]
        out.append(Forward(tuple(entries + proxies), tuple(queries), tuple(fresh), len(proxies)))
        for r in active:
            done[r] += 1
        active = [r for r in active if done[r] < cols]
        if last + 1 < rows and may_start(done[last], cols if last == 0 else start):
            last += 1
            active.append(last)
    return out


@dataclass(frozen=True)
class Step:
    """A schedule forward on the device: ``gather [fed]`` (the generation index of each entry's token), ``shift
    [1, fed]`` (``Proposal.shift``), ``queries [m]``, and on the host the number of commits, the kept entries and
    ``pad``, the shift that puts a padding entry past the image (position id prompt length + body + its index)."""

    gather: torch.Tensor
    shift: torch.Tensor
    queries: torch.Tensor
    commits: int
    keep: list[int]
    pad: int


class ZipARDrafter(Drafter):
    """ZipAR: every active row samples its next token each forward; ``window_size`` tokens of a row start the next."""

    name = "zipar"
    #: a forward's entries depend on the grid (one per row in flight, at most ``rows + 1``), not on a window setting
    window = None
    PARAMS = {
        "window_size": Param(Int(min=1), 8, "committed tokens of a row that start the next row (>= the width: AR)"),
    }

    def check_params(self) -> None:
        """No cross-parameter checks (the base class's are about drafts)."""

    def method_problem(self, method: str) -> str | None:
        if method != "sjd":
            return (f"drafter=zipar proposes no drafts (every token is sampled from q), so only the lossless rule "
                    f"applies: use method=sjd, got method={method}")
        return None

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        return "drafter=zipar runs eagerly (shifted position ids): set engine.compile=false" if compiled else None

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        from csd.adapters.emu3 import Emu3Adapter
        from csd.adapters.lumina import LuminaAdapter

        if issubclass(adapter_class, (Emu3Adapter, LuminaAdapter)):
            return (f"drafter=zipar needs a plain raster body, but {adapter_class.__name__} forces an end-of-line token "
                    "per row; use a Janus-Pro or toy model")
        return None

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        layout = adapter.layout
        if bool((layout.forced_ids >= 0).any()):
            raise ValueError(self.model_problem(type(adapter)) or "drafter=zipar needs a body without forced tokens")
        forwards = zipar_schedule(*layout.grid, self.window_size)
        order = [cell for f in forwards for cell in f.commits]
        generation = {cell: g for g, cell in enumerate(order)}
        self.steps, kept = [], 0
        for f in forwards:
            fed = len(f.entries)
            # entry j goes to cache index (prompt - 1) + kept + j; position id prompt + cell: shift = cell + 1 - kept - j
            shift = [pos + 1 - kept - j for j, (_, pos) in enumerate(f.entries)]
            gather = [generation.get(src, 0) for src, _ in f.entries]
            self.steps.append(Step(to_device(gather, self.device), to_device([shift], self.device),
                                   to_device(list(f.queries), self.device), len(f.commits), list(range(fed - f.proxies)),
                                   len(order) + 1 - kept))
            kept += fed - f.proxies
        #: raster cell of each generation index
        self.order = to_device(order, self.device)

    def start(self, slot: Slot) -> None:
        slot.draft = self.new_state(slot, None)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> Any:
        """No per-image state: forward ``slot.iteration`` of the schedule says everything."""
        return None

    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Every slot's forward of the schedule (its ``iteration``-th), padded to the longest with entries whose
        position ids lie past the image (``Step.pad``), where no query reaches; padding and proxies are never kept."""
        steps = [None if slot is None else self.steps[slot.iteration] for slot in slots]
        fed = max(step.gather.numel() for step in steps if step is not None)
        ids = self.body.image_ids[:1].repeat(len(slots), fed)
        pads = [0 if step is None else step.pad for step in steps]
        shift = to_device(pads, self.device).unsqueeze(1).repeat(1, fed)
        for b, (slot, step) in enumerate(zip(slots, steps, strict=True)):
            if step is not None:
                ids[b, : step.gather.numel()] = self.body.image_ids[slot.body[step.gather]]
                shift[b, : step.gather.numel()] = step.shift[0]
        from_prompt = [slot is not None and slot.iteration == 0 for slot in slots]
        return Proposal(ids, from_prompt, [step is not None for step in steps], fed, None, steps, shift=shift)

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """Each active row's next token, sampled from its query's ``q``. Random numbers: those of a chain window of
        ``m`` rows from the image's generator (:meth:`csd.verify.WindowNoise.draw`), whose row samples are used (AR's
        draw at ``m = 1``: the same tokens as AR when one row is active at a time); no host synchronisation (``m`` is
        the schedule's)."""
        most = max(step.commits for step in proposal.windows if step is not None)
        tokens = torch.zeros((len(slots), most), dtype=torch.long, device=self.device)
        entropies = target_entropy.new_zeros((len(slots), most))
        for b, (slot, step) in enumerate(zip(slots, proposal.windows, strict=True)):
            if step is not None:
                noise = WindowNoise.draw(1, step.commits, self.vocab, slot.generator, self.device)
                tokens[b, : step.commits] = sample_race(target[b, step.queries], noise.samples[0])
                entropies[b, : step.commits] = target_entropy[b, step.queries]
        counts = [0 if step is None else step.commits for step in proposal.windows]
        keep = [[] if step is None else step.keep for step in proposal.windows]
        kinds = torch.full((len(slots), most), COMMIT_SAMPLED, dtype=torch.long, device=self.device)
        stats = torch.zeros((len(slots), len(STAT_KEYS)), dtype=torch.long, device=self.device)
        return Verified(counts, tokens, kinds, entropies, stats, keep, None)

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """No drafts to carry."""

    def finish(self, slot: Slot) -> None:
        """Generation order -> raster order (:meth:`Drafter.finish`)."""
        to_raster(slot, self.order)
