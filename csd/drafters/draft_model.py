"""The draft-model drafter: classic speculative sampling (docs/ALGORITHMS.md "Draft model").

A separate small autoregressive model of the target's image vocabulary and body layout (a model preset,
``drafter.model``) proposes ``gamma`` drafts one after the other, each from its own forward on its own cache (a
``csd.ragged.SlotBatch`` whose slots mirror the engine's); the recorded ``p`` of a draft is the law it was drawn
from, the draft model's logits processed by the target's pipeline (CFG, top-k, temperatures). The window is a chain
(anchor + drafts) that the target verifies in one forward with the chain's code (:func:`csd.drafters.chain.verify_chains`):
with SJD's rule that is exactly Leviathan et al.'s / Chen et al.'s speculative sampling. Afterwards the draft cache
keeps the committed prefix only; the last committed token is the next anchor. Forced body positions get their
forced token and no draft forward; the last ``layout.jacobi_tail`` positions are decoded without drafts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.drafters.base import FORWARDS, BodyIds, Drafter, Proposal, Verified
from csd.drafters.chain import ChainWindow, chain_proposal, verify_chains
from csd.params import Param
from csd.presets import choices
from csd.processors import TargetPipeline
from csd.ragged import SlotBatch
from csd.schema import Group, Int
from csd.verify import exponential_noise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot


def mismatch(draft: ModelAdapter, target: ModelAdapter) -> str | None:
    """Why ``draft`` cannot draft for ``target``, in a few words; None if it can: the same image codes (token ids), the
    same body layout (forced positions and grid) and the same sampling settings (the recorded ``p`` must be the
    target pipeline's processing of the draft's logits)."""
    if draft.vocab_size != target.vocab_size:
        return f"its image vocabulary ({draft.vocab_size} codes) is not the target's ({target.vocab_size} codes)"
    if not torch.equal(draft.image_token_ids.cpu(), target.image_token_ids.cpu()):
        return "its image codes are other token ids than the target's (another tokenizer)"
    if draft.layout.grid != target.layout.grid or not torch.equal(draft.layout.forced_ids, target.layout.forced_ids):
        return (f"its body layout (grid {list(draft.layout.grid)}, {draft.layout.length} positions) is not the "
                f"target's (grid {list(target.layout.grid)}, {target.layout.length} positions)")
    if draft.sampling != target.sampling:
        return f"it samples with {draft.sampling}, the target with {target.sampling}"
    return None


@dataclass
class DraftState:
    """An image's progress on the draft cache: ``fed`` = the body positions ``0 .. fed - 1`` whose entries the draft
    cache holds (-1: not even the prompt's last token yet; None: the slot's draft cache is not prefilled)."""

    fed: int | None = None


@dataclass
class DraftWindow(ChainWindow):
    """A chain window whose drafts the draft model proposed, with its forwards (one per free draft) and ``fed``, the
    draft cache's body positions after drafting."""

    forwards: int = 0
    fed: int = -1


@dataclass
class Plan:
    """One slot's drafting of this iteration: its window start ``n``, ``rows``, the positions of its free drafts
    (each needs one draft forward) and the drafts built so far (indices, recorded laws)."""

    n: int
    rows: int
    free: list[int]
    drafts: torch.Tensor
    probs: torch.Tensor


class DraftModelDrafter(Drafter):
    """Speculative sampling with a draft model: ``gamma`` drafts per window, drawn autoregressively from ``model``.

    ``draft``: an adapter already loaded for ``model`` (tests, the Python API); None: ``load(model, target)`` loads the
    preset when the engine binds the drafter (the composition root gives ``csd.compose.load_draft_adapter``: the preset
    with the target's sampling settings).
    """

    name = "draft_model"
    PARAMS = {
        "model": Param(Group(group="model", options=choices), "toy_draft",
                       "the draft model: a model preset of the target's image vocabulary and body layout"),
        "gamma": Param(Int(min=1), 4, "drafts per window, each drawn from one draft-model forward"),
    }

    def __init__(self, draft: ModelAdapter | None = None,
                 load: Callable[[str, ModelAdapter], ModelAdapter] | None = None, **values: Any) -> None:
        super().__init__(**values)
        self.draft, self.load = draft, load

    def check_params(self) -> None:
        """Nothing across keys: ``model`` and ``gamma`` are checked by their specs, the model itself when bound."""

    @property
    def window(self) -> int:
        """Rows of a full window: the anchor and ``gamma`` drafts."""
        return self.gamma + 1

    def window_problem(self, body_len: int, model: str) -> str | None:
        """``gamma`` sets the window (the anchor and ``gamma`` drafts): the message names it."""
        if self.window <= body_len:
            return None
        return (f"drafter.gamma={self.gamma} drafts windows of {self.window} entries (the anchor and gamma drafts), "
                f"longer than model={model}'s image ({body_len} tokens)")

    def window_fix(self, body_len: int) -> str:
        return f"set drafter.gamma <= {body_len - 1}"

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        if compiled:
            return "drafter=draft_model runs eagerly: set engine.compile=false"
        return None

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        """Load the draft model (unless given) and check that it can draft for ``adapter`` (one ``ValueError`` line)."""
        super().bind(adapter, body, pad)
        if self.draft is None:
            if self.load is None:
                raise ValueError(f"drafter.model={self.model}: no draft adapter and no loader; build the drafter with "
                                 "csd.compose.build_drafter, or pass draft=<adapter>")
            self.draft = self.load(self.model, adapter)
        problem = mismatch(self.draft, adapter)
        if problem is not None:
            raise ValueError(f"drafter.model={self.model} cannot draft for this target: {problem}")
        self.pipeline = TargetPipeline.build(self.draft.sampling, self.draft.raw_image_columns)
        self.batch: SlotBatch | None = None

    def start(self, slot: Slot) -> None:
        slot.draft = self.new_state(slot, None)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> DraftState:
        return DraftState()

    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Step 1: every slot's drafts, drawn step by step with one draft forward for all slots per step; step ``s``
        feeds each slot what its draft cache lacks up to its ``s``-th free draft's position and draws that draft from
        the processed law of the last entry (``exponential_noise`` from the slot's generator, in position order)."""
        if self.batch is None or self.batch.slots != len(slots):
            self.batch = SlotBatch(self.draft, len(slots))
        plans = [None if slot is None else self._plan(b, slot) for b, slot in enumerate(slots)]
        forwards = [0] * len(slots)
        for step in range(max((len(p.free) for p in plans if p is not None), default=0)):
            active = [p is not None and len(p.free) > step for p in plans]
            self._draft_step(slots, plans, active, step)
            forwards = [f + a for f, a in zip(forwards, active, strict=True)]
        windows = [None if p is None else self._window(slot, p, f) for slot, p, f in zip(slots, plans, forwards, strict=True)]
        return chain_proposal(self, slots, windows)

    def _plan(self, b: int, slot: Slot) -> Plan:
        """Slot ``b``'s drafting plan (a new image's draft cache is prefilled first): ``gamma`` drafts at most, none
        past the body nor in its ``jacobi_tail``; forced positions are drafts with their forced token."""
        if slot.draft.fed is None:
            self.batch.prefill(b, slot.request.prompt)
            slot.draft.fed = -1
        layout, n = self.adapter.layout, slot.n
        rows = 1 if layout.length - n <= layout.jacobi_tail else min(self.window, layout.length - n)
        free = [j for j in range(n, n + rows - 1) if not self.body.forced_host[j]]
        drafts = torch.zeros(rows - 1, dtype=torch.long, device=self.device)
        return Plan(n, rows, free, drafts, F.one_hot(drafts, self.vocab).float())

    def _draft_step(self, slots: list[Slot | None], plans: list[Plan | None], active: list[bool], step: int) -> None:
        """One draft forward: each active slot feeds its body positions ``fed .. j - 1`` (after the prompt's last token
        when ``fed = -1``; committed tokens, then this window's drafts) and draws the draft at ``j``, its
        ``step``-th free position; shorter inputs are padded and their padding rolled back."""
        chunks, from_prompt = [], []
        for slot, plan, on in zip(slots, plans, active, strict=True):
            if not on:
                chunks.append(self.body.image_ids[:1])
                from_prompt.append(False)
                continue
            fed, j = slot.draft.fed, plan.free[step]
            start = max(fed, 0)
            known = torch.cat([slot.body[start : plan.n], plan.drafts[max(start - plan.n, 0) : j - plan.n]])
            ids = self.body(known, start)
            chunks.append(torch.cat([self.body.image_ids[:1], ids]) if fed < 0 else ids)
            from_prompt.append(fed < 0)
            slot.draft.fed = j
        width = max(c.numel() for c in chunks)
        ids = torch.stack([torch.cat([c, c[-1:].expand(width - c.numel())]) for c in chunks])
        logits = self.batch.forward(ids, from_prompt, active)
        last = to_device([c.numel() - 1 for c in chunks], self.device)
        law = self.pipeline(logits[torch.arange(len(chunks), device=self.device), :, last].unsqueeze(2))[:, 0]
        noise = torch.ones_like(law)
        for b, (slot, on) in enumerate(zip(slots, active, strict=True)):
            if on:
                noise[b] = exponential_noise((self.vocab,), slot.generator, self.device)
        drafts = sample_race(law, noise)
        for b, (plan, on) in enumerate(zip(plans, active, strict=True)):
            if on:
                i = plan.free[step] - plan.n
                plan.drafts[i], plan.probs[i] = drafts[b], law[b]
        self.batch.rollback([width - c.numel() if on else 0 for c, on in zip(chunks, active, strict=True)])

    def _window(self, slot: Slot, plan: Plan, forwards: int) -> DraftWindow:
        n = plan.n
        anchor = self.body(slot.body[n - 1 : n], n - 1) if n else self.body.image_ids[:1]
        ids = torch.cat([anchor, self.body(plan.drafts, n)])
        return DraftWindow(plan.rows, plan.drafts, plan.probs, ids, forwards, slot.draft.fed)

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """Step 4: the chain's verification (speculative sampling with SJD's rule), plus the draft forwards."""
        verified = verify_chains(self, rule, slots, proposal, target, target_entropy, [None] * len(slots))
        forwards = [0 if w is None else w.forwards for w in proposal.windows]
        verified.stats[:, FORWARDS] += to_device(forwards, self.device)
        return verified

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """Step 5: the draft cache keeps the committed prefix: of the ``m`` tokens committed at ``n .. n + m - 1``, the
        accepted drafts it holds (up to ``n + m - 2``); the last one, a replacement or the bonus, is the next anchor."""
        drop = [0] * len(slots)
        for b, (slot, w, m) in enumerate(zip(slots, proposal.windows, verified.counts, strict=True)):
            if w is not None:
                keep = min(w.fed, slot.n + m - 1)
                drop[b], slot.draft.fed = w.fed - keep, keep
        if any(drop):
            self.batch.cache.rollback([k for k in drop for _ in range(self.batch.rows)])
