"""The Jacobi chain window of SJD and its variants (docs/ALGORITHMS.md, "The engine loop" and "Drafting variants").

A window is the anchor plus ``K - 1`` drafts, ``K = min(L, N - n)`` (``K = 1`` in the AR tail): the drafts carried
from the last forward, topped up with fresh ones (``init``). After verification (:func:`csd.verify.verify_window`),
the row samples ``y_m .. y_{K-1}`` of this forward become the next drafts with recorded laws ``q_m .. q_{K-1}``
(``coupling=none``), or each surviving old draft is maximally coupled with its new target (``maximal``, MC-SJD).
Windows of a batch may differ in length: shorter ones are padded and their padding is never committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.device import to_device
from csd.drafters.base import STAT_KEYS, Drafter, Proposal, Verified
from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.verify import WindowNoise, WindowResult, couple_drafts, exponential_noise, sample_race, verify_window

#: a window's kinds are computed as accepted + relaxed (``verify_chain_batch``)
assert (COMMIT_SAMPLED, COMMIT_ACCEPTED, COMMIT_RELAXED) == (0, 1, 2)

if TYPE_CHECKING:
    from csd.slot import Slot


@dataclass
class ChainState:
    """An image's carried drafts ``[c]``, their recorded laws ``[c, V]`` and its Gumbel-sharing noise (or None)."""

    carried: torch.Tensor
    carried_probs: torch.Tensor
    shared: torch.Tensor | None


@dataclass
class ChainWindow:
    """One image's window: ``rows`` target rows, its drafts ``[rows - 1]``, their recorded ``p`` and the input ids."""

    rows: int
    drafts: torch.Tensor
    draft_probs: torch.Tensor
    ids: torch.Tensor


class ChainDrafter(Drafter):
    """Jacobi chain windows of ``window`` rows (``window = 1`` is AR)."""

    name = "chain"

    def compile_post(self, compile: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Under ``engine.compile``: :func:`judge_windows` compiled, for windows of the step's ``L`` rows (shorter ones,
        near an image's end, are judged eagerly by the same function; one-row windows have nothing to judge)."""
        self.compiled_judge = compile(judge_windows)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> ChainState:
        empty = torch.zeros((0, self.vocab), dtype=torch.float32, device=self.device)
        return ChainState(torch.zeros(0, dtype=torch.long, device=self.device), empty, shared)

    def _window(self, slot: Slot) -> ChainWindow:
        length, tail, n = self.adapter.layout.length, self.adapter.layout.jacobi_tail, slot.n
        rows = 1 if length - n <= tail else min(self.window, length - n)
        drafts, probs, anchor = self.spine(slot, slot.draft.carried, slot.draft.carried_probs, rows - 1)
        return ChainWindow(rows, drafts, probs, anchor if rows == 1 else torch.cat([anchor, self.body(drafts, n)]))

    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Step 1; on the compiled path (``pad``) a proposal of one-row windows also draws their samples' noise
        (:func:`row_noise`), so that the step's graph samples them: the image's generator draws nothing between here
        and step 4, so the numbers are the ones step 4 would draw."""
        proposal = chain_proposal(self, slots, [None if slot is None else self._window(slot) for slot in slots])
        if self.pad and proposal.rows == 1:
            proposal.noise = row_noise(self, chain_heads(slots, proposal.windows), self._shared(slots, proposal.windows))
        return proposal

    def _shared(self, slots: list[Slot | None], windows: list[ChainWindow | None]) -> list[torch.Tensor | None]:
        """Each window's Gumbel-sharing noise of its rows ``[1, rows, V]`` (None: no window, or no sharing)."""
        return [None if w is None or slot.draft.shared is None else slot.draft.shared[slot.n : slot.n + w.rows].unsqueeze(0)
                for slot, w in zip(slots, windows, strict=True)]

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        heads = chain_heads(slots, proposal.windows)
        if proposal.noise is not None:  # one-row windows, their noise drawn at step 1 (and sampled by the step)
            return sample_rows(self, heads, target, target_entropy, proposal.noise, proposal.samples)
        return verify_chain_batch(self, rule, heads, proposal.windows, target, target_entropy,
                                  self._shared(slots, proposal.windows))

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """SJD step 6: ``y_m .. y_{K-1}`` become the next drafts, recorded with ``q_m .. q_{K-1}``; with maximal
        coupling each surviving old draft is kept with probability ``min(1, q/p)`` (:func:`csd.verify.couple_drafts`)."""
        samples = verified.detail
        for b, (slot, w, m) in enumerate(zip(slots, proposal.windows, verified.counts, strict=True)):
            if w is None:
                continue
            refreshed = samples[b, m : w.rows]
            if self.coupling == "maximal" and w.rows > 1:
                coupled = couple_drafts(target[b, : w.rows - 1], w.drafts, w.draft_probs, slot.generator)
                refreshed = torch.cat([coupled, samples[b, w.rows - 1 : w.rows]])[m:]
            slot.draft.carried, slot.draft.carried_probs = refreshed, target[b, m : w.rows]


def chain_proposal(drafter: Drafter, slots: list[Slot | None], windows: list[ChainWindow | None]) -> Proposal:
    """Step 1 for chain windows (one per slot, None: an empty slot), padded to one shape: to the longest window, or to
    ``drafter.window`` rows when the drafter pads (the compiled path)."""
    rows = max(w.rows for w in windows if w is not None)
    fed = drafter.window if (drafter.pad and rows > 1) else rows
    # padding repeats a window's last token (an empty slot: any token); its outputs are dropped and rolled back
    if len(windows) == 1 and windows[0] is not None and windows[0].rows == fed:  # batch 1, unpadded: a view
        ids = windows[0].ids.unsqueeze(0)
    else:
        ids = torch.stack([
            drafter.body.image_ids[:1].expand(fed) if w is None else
            w.ids if w.rows == fed else torch.cat([w.ids, w.ids[-1:].expand(fed - w.rows)])
            for w in windows
        ])
    from_prompt = [w is not None and slot.n == 0 for slot, w in zip(slots, windows, strict=True)]
    return Proposal(ids, from_prompt, [w is not None for w in windows], rows, None, windows)


def verify_chains(drafter: Drafter, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal,
                  target: torch.Tensor, target_entropy: torch.Tensor, shared: list[torch.Tensor | None]) -> Verified:
    """Step 4 for one chain window per slot (:func:`verify_chain_batch`, each window starting at its slot's ``n``)."""
    return verify_chain_batch(drafter, rule, chain_heads(slots, proposal.windows), proposal.windows, target,
                              target_entropy, shared)


def chain_heads(slots: list[Slot | None], windows: list[ChainWindow | None]) -> list[ChainHead | None]:
    """Where each slot's chain window starts (its ``n``) and its image's generator; None: no window."""
    return [None if w is None else ChainHead(slot.n, slot.generator) for slot, w in zip(slots, windows, strict=True)]


@dataclass(frozen=True)
class ChainHead:
    """Where a chain window starts: ``n``, the body position of its first draft (its anchor's row predicts it), and the
    generator of its image."""

    n: int
    generator: torch.Generator


def verify_chain_batch(drafter: Drafter, rule: AcceptanceRule, heads: list[ChainHead | None], windows: list[ChainWindow | None],
                       target: torch.Tensor, target_entropy: torch.Tensor, shared: list[torch.Tensor | None]) -> Verified:
    """Step 4 for a batch of chain windows (:func:`csd.verify.verify_window`; None: no window): ``target [C, rows, V]``
    and ``target_entropy [C, rows]`` are window ``i``'s rows, ``shared[i]`` its Gumbel-sharing noise of its rows
    ``[1, rows, V]`` or None. Each window draws its random numbers from its own image's generator, in window order.
    The ``drafter_forwards`` counter is 0 (a drafter with forwards of its own adds them)."""
    rows, vocab, device = target.shape[1], drafter.vocab, drafter.device
    if rows == 1:  # one-row windows (AR, a tail): no draft to judge
        return sample_rows(drafter, heads, target, target_entropy, row_noise(drafter, heads, shared))
    own = [None if w is None else WindowNoise.draw(1, w.rows, vocab, head.generator, device, noise)
           for head, w, noise in zip(heads, windows, shared, strict=True)]
    if len(windows) == 1 and windows[0] is not None:  # batch 1: the window's own tensors, no copy
        ((head, w, noise),) = zip(heads, windows, own, strict=True)
        drafts, draft_probs = w.drafts.unsqueeze(0), w.draft_probs.unsqueeze(0)
        forced = drafter.body.is_forced[head.n : head.n + rows - 1].unsqueeze(0)
        n_drafts = None
    elif all(w is not None and w.rows == rows for w in windows):  # every window full: no padding
        noise = WindowNoise(*(torch.cat([getattr(o, f) for o in own]) for f in ("samples", "uniforms", "residual")))
        drafts = torch.stack([w.drafts for w in windows])
        draft_probs = torch.stack([w.draft_probs for w in windows])
        forced = torch.stack([drafter.body.is_forced[head.n : head.n + rows - 1] for head in heads])
        n_drafts = None
    else:  # windows shorter than the batch's are padded (padding is never accepted nor committed)
        count = len(windows)
        noise = WindowNoise(target.new_ones((count, rows, vocab)), target.new_zeros((count, rows - 1)),
                            target.new_ones((count, vocab)))
        drafts = torch.zeros((count, rows - 1), dtype=torch.long, device=device)
        draft_probs = F.one_hot(drafts, vocab).float()
        forced = torch.zeros((count, rows - 1), dtype=torch.bool, device=device)
        for b, (head, w, o) in enumerate(zip(heads, windows, own, strict=True)):
            if w is None:
                continue
            noise.samples[b, : w.rows], noise.uniforms[b, : w.rows - 1], noise.residual[b] = o.samples[0], o.uniforms[0], o.residual[0]
            drafts[b, : w.rows - 1], draft_probs[b, : w.rows - 1] = w.drafts, w.draft_probs
            forced[b, : w.rows - 1] = drafter.body.is_forced[head.n : head.n + w.rows - 1]
        n_drafts = to_device([0 if w is None else w.rows - 1 for w in windows], device)
    if not drafter.body.any_forced:  # no forced position: nothing to exempt
        forced = None
    compiled = drafter.compiled_judge
    judge = compiled if compiled is not None and rows == drafter.window else judge_windows
    committed, kinds, stats, counts, samples = judge(rule, target, target_entropy, drafts, draft_probs, forced, noise,
                                                     n_drafts)
    counts = counts.tolist()  # the one host synchronisation of the iteration
    counts = [m if w is not None else 0 for m, w in zip(counts, windows, strict=True)]
    return Verified(counts, committed, kinds, target_entropy, stats, None, samples)


def judge_windows(rule: AcceptanceRule, target: torch.Tensor, target_entropy: torch.Tensor, drafts: torch.Tensor,
                  draft_probs: torch.Tensor, forced: torch.Tensor | None, noise: WindowNoise,
                  n_drafts: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The tensor work of step 4 for ``B`` chain windows, arguments as :func:`csd.verify.verify_window`'s: the committed
    tokens ``[B, rows]``, their kinds (COMMIT_*), the counters ``[B, len(STAT_KEYS)]``, the committed counts ``[B]``
    (``n_accepted + 1``, still on the device) and every row's sample ``[B, rows]``. One function, so that
    ``engine.compile`` runs it as one graph."""
    result, samples = verify_window(rule, target, target_entropy, drafts, draft_probs, forced, noise, n_drafts)
    # accepted (1) + relaxed (2: a relaxed draft is accepted), sampled (0) elsewhere and in the last row
    kinds = F.pad(result.accepted.long() + result.relaxed, (0, 1), value=COMMIT_SAMPLED)
    return result.committed, kinds, _stats(result, forced, n_drafts), result.n_accepted + 1, samples


def row_noise(drafter: Drafter, heads: list[ChainHead | None], shared: list[torch.Tensor | None]) -> torch.Tensor:
    """The random numbers of one-row windows (AR, a window in the AR tail), ``Exp(1)`` noise ``[B, 1, V]`` of their
    samples (ones for no window), drawn exactly as :meth:`csd.verify.WindowNoise.draw` draws them for one row (its
    sample's noise unless shared, no uniform, the residual's noise, which one row never uses: drawn, not
    transformed), so the images' streams are the same as through :func:`csd.verify.verify_window`."""
    vocab, device = drafter.vocab, drafter.device
    noise = []
    for head, own in zip(heads, shared, strict=True):
        if head is None:
            noise.append(torch.ones((1, 1, vocab), device=device))
            continue
        noise.append(exponential_noise((1, 1, vocab), head.generator, device) if own is None else own)
        torch.rand((1, 0), generator=head.generator, device=device)
        torch.rand((1, vocab), generator=head.generator, device=device)
    return noise[0] if len(noise) == 1 else torch.cat(noise)


def sample_rows(drafter: Drafter, heads: list[ChainHead | None], target: torch.Tensor, target_entropy: torch.Tensor,
                noise: torch.Tensor, samples: torch.Tensor | None = None) -> Verified:
    """Step 4 for one-row windows: each commits its row sample ``argmax_v q(v) / E_v`` of ``target [B, 1, V]`` with
    the noise ``E`` of :func:`row_noise` (``samples``: already drawn from them, by the compiled step's graph); every
    slot commits one token, known without a host synchronisation."""
    if samples is None:
        samples = sample_race(target, noise)
    count, device = len(heads), drafter.device
    kinds = torch.full((count, 1), COMMIT_SAMPLED, dtype=torch.long, device=device)
    stats = torch.zeros((count, len(STAT_KEYS)), dtype=torch.long, device=device)
    counts = [0 if head is None else 1 for head in heads]
    return Verified(counts, samples, kinds, target_entropy, stats, None, samples)


def _stats(result: WindowResult, forced: torch.Tensor | None, n_drafts: torch.Tensor | None) -> torch.Tensor:
    """Device-side counters ``[B, len(STAT_KEYS)]`` in STAT_KEYS order (forced positions excluded, None: none;
    ``n_drafts`` None: every window full): the per-draft flags of the window summed in one reduction."""
    shape = result.accepted.shape
    if n_drafts is not None:
        free = torch.arange(shape[1], device=result.accepted.device) < n_drafts.unsqueeze(-1)
        if forced is not None:
            free &= ~forced
    else:
        free = torch.ones(shape, dtype=torch.bool, device=result.accepted.device) if forced is None else ~forced
    flags = [free, result.verified, result.accepted, result.relaxed]
    if result.filter_pass is not None:
        flags += [result.verified, result.filter_pass]
    sums = torch.stack(flags, dim=1).sum(-1)
    zero = sums[:, :1] * 0
    filters = [] if result.filter_pass is not None else [zero, zero]
    return torch.cat([sums, *filters, result.fallback.long().unsqueeze(-1), zero, zero], dim=-1)
