"""The speculative decoding engine (docs/ALGORITHMS.md, "The engine loop"): slots x drafter x acceptance rule.

The engine schedules images into ``batch_size`` slots (start, refill, advance, finish); a drafter
(``csd.drafters``) owns the windows and a rule (``csd.acceptance``, ``baselines``) judges them. One iteration,
for every image in flight at once (ragged: each has its own ``n``, window and acceptance):

1. propose: each slot's window (anchor, drafts, recorded draft laws, chain or tree structure), padded to one shape;
2. forward: one model forward for the whole batch;
3. target: the processors turn logits into ``q`` per row (CFG, temperature, top-k; compiled, in the step's graph);
4. verify: the rule accepts a prefix (a path, for trees) and the residual or bonus sample ends it; the only host
   synchronisation of the iteration reads how many tokens each slot commits (none when every window has one row:
   AR, the AR tail, whose samples the compiled step's graph draws from noise drawn at step 1);
5. refresh: this forward's targets become the next window's carried drafts;
6. roll back: each slot's cache keeps its committed entries and drops the rest;
7. commit: the tokens, how each was committed, its target entropy and the counters join the image's record.

AR is a chain of ``window = 1``; batch 1 is the same loop with one slot. An image's random numbers come from its
own generator (seeded with its seed) in a fixed order, so its tokens depend only on (prompt, seed), never on its
neighbours or the batch size. When an image finishes, the next request takes its slot (continuous refill).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from csd.acceptance import AcceptanceRule, entropy
from csd.adapters.base import ModelAdapter
from csd.device import Span, keep_temporaries_on_heap, synchronize
from csd.drafters.base import STAT_KEYS, BodyIds, Drafter
from csd.drafters.chain import ChainDrafter
from csd.fast import CompiledStep
from csd.processors import TargetPipeline
from csd.ragged import SlotBatch
from csd.records import COMMIT_FORCED
from csd.slot import Request, Slot


@dataclass
class Generation:
    """One decoded image body plus everything the records need.

    ``prefill_s`` / ``decode_s`` (device-synchronised seconds) are per-image latencies only at batch 1;
    in a batch images share every forward, so they are None there (``batched``). ``drafter_s``: the part of
    ``decode_s`` spent in the drafter's steps 1 and 5 (propose: its own model's forwards, sampling, building the
    windows; refresh: the next drafts, e.g. Hawk's head forwards), at batch 1 only.
    """

    tokens: torch.Tensor
    nfe: int
    stats: dict[str, int]
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    prefill_s: float | None
    decode_s: float | None
    batched: bool = False
    drafter_s: float | None = None

    @property
    def step_compression(self) -> float:
        return self.tokens.numel() / max(self.nfe, 1)


class JacobiEngine:
    """Speculative decoding of ``batch_size`` images at once with a drafter and an acceptance rule.

    ``drafter``: a :class:`csd.drafters.Drafter` (default: SJD's chain window of 16 rows; a chain of ``window=1`` is
    AR). ``compiled``: the adapter's compiled decode step (``csd.fast.CompiledStep``); every multi-token forward then
    has exactly ``drafter.window`` rows (two step shapes in all). Every run decodes on one ``csd.ragged.SlotBatch``.
    """

    def __init__(self, adapter: ModelAdapter, rule: AcceptanceRule, drafter: Drafter | None = None,
                 batch_size: int = 1, compiled: CompiledStep | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        drafter = ChainDrafter() if drafter is None else drafter
        problem = drafter.problem(batch_size, compiled is not None)
        if problem is not None:
            raise ValueError(problem)
        if compiled is not None and compiled.adapter is not adapter:
            raise ValueError("the compiled step belongs to another adapter")
        self.adapter, self.rule, self.drafter = adapter, rule, drafter
        self.compiled, self.batch_size = compiled, batch_size
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        self.device = adapter.device
        if self.device.type == "cpu":
            keep_temporaries_on_heap()
        self.body = BodyIds(adapter)
        self._batch: SlotBatch | None = None
        drafter.bind(adapter, self.body, compiled is not None)
        if compiled is not None:
            drafter.compile_post(compiled.compile)
        rule.setup(adapter)
        # compiled, the verification takes the rule's real-valued parameters as tensors: one graph for every value
        self.judge_rule = rule if compiled is None else rule.with_tensor_params(self.device)

    @torch.no_grad()
    def generate(self, prompt: str, seed: int) -> Generation:
        """One image (a batch of one request)."""
        ((_, gen),) = self.generate_many([Request(prompt, seed)])
        return gen

    @torch.no_grad()
    def generate_many(self, requests: Iterable[Request]) -> Iterator[tuple[Request, Generation]]:
        """Decode ``requests`` with up to ``batch_size`` in flight; yields ``(request, generation)`` as each
        image finishes (completion order), and the next request takes the freed slot. The eager cache is kept for
        the engine's next call (a prefill restarts a slot; its buffers and mask table stay), so one call decodes on
        an engine at a time; the compiled path picks its fixed cache per call (``csd.fast.CompiledStep``)."""
        pending = iter(requests)
        if self._batch is None or self.compiled is not None:
            self._batch = SlotBatch(self.adapter, self.batch_size, self.compiled)
        state = self._batch
        slots = [self._start(state, slot, next(pending, None)) for slot in range(self.batch_size)]
        while any(slot is not None for slot in slots):
            for b in self._iteration(state, slots):
                yield slots[b].request, self._finish(slots[b])
                slots[b] = self._start(state, b, next(pending, None))

    def _start(self, state: SlotBatch, b: int, request: Request | None) -> Slot | None:
        """Prefill slot ``b`` with ``request`` (None: the slot stays empty)."""
        if request is None:
            return None
        device, length = self.device, self.adapter.layout.length
        gen = torch.Generator(device=device).manual_seed(request.seed)
        times = []
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        state.prefill(b, request.prompt)
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        zeros = torch.zeros(length, dtype=torch.long, device=device)
        slot = Slot(
            request=request, generator=gen, body=zeros.clone(), commit_iter=zeros.clone(), commit_kind=zeros.clone(),
            entropy=torch.zeros(length, dtype=torch.float32, device=device),
            stats=torch.zeros(len(STAT_KEYS), dtype=torch.long, device=device), times=times,
        )
        self.drafter.start(slot)
        return slot

    def _iteration(self, state: SlotBatch, slots: list[Slot | None]) -> list[int]:
        """One forward for every image in flight (the numbered steps of the module docstring); returns the slots
        whose image is now complete."""
        # 1 propose (timed at batch 1 without a host synchronisation, as refresh: the drafter's share of the latency)
        span = Span(self.device) if self.batch_size == 1 else None
        proposal = self.drafter.propose(slots)
        if span is not None:
            slots[0].drafter_spans.append(span.stop())
        # 2 forward
        if self.drafter.reads_features:
            raw, proposal.features = state.forward(proposal.ids, proposal.from_prompt, proposal.active,
                                                   tree=proposal.tree, features=True, shift=proposal.shift,
                                                   groups=proposal.groups)
            folded = None
        elif self.compiled is None:
            raw = state.forward(proposal.ids, proposal.from_prompt, proposal.active, tree=proposal.tree,
                                shift=proposal.shift, groups=proposal.groups)
            folded = None
        else:  # compiled: the target of every column (and one-row windows' samples) come out of the step's graph
            raw, folded = state.forward(proposal.ids, proposal.from_prompt, proposal.active, tree=proposal.tree,
                                        shift=proposal.shift, groups=proposal.groups, target=self.pipeline,
                                        noise=proposal.noise)
        # 3 target
        if folded is None:
            target = self.pipeline(raw[:, :, : proposal.rows])
            target_entropy = entropy(target)
        else:
            target, target_entropy = folded[0][:, : proposal.rows], folded[1][:, : proposal.rows]
            proposal.samples = folded[2]
        # 4 verify (the iteration's one host synchronisation)
        verified = self.drafter.verify(self.judge_rule, slots, proposal, target, target_entropy)
        # 5 refresh
        span = Span(self.device) if self.batch_size == 1 else None
        self.drafter.refresh(slots, proposal, verified, target)
        if span is not None:
            slots[0].drafter_spans.append(span.stop())
        # 6 roll back
        if verified.keep is None:
            state.rollback([proposal.fed - m if active else 0 for m, active in zip(verified.counts, proposal.active, strict=True)])
        else:
            state.keep(proposal.fed, verified.keep)
        # 7 commit
        done = []
        for b, (slot, m) in enumerate(zip(slots, verified.counts, strict=True)):
            if slot is not None and self._advance(slot, verified.tokens[b, :m], verified.kinds[b, :m],
                                                  verified.entropy[b, :m], verified.stats[b]):
                done.append(b)
        return done

    def _advance(self, slot: Slot, tokens: torch.Tensor, kinds: torch.Tensor, entropies: torch.Tensor,
                 stats: torch.Tensor) -> bool:
        """Commit ``tokens`` (with their kinds and target entropies) and one iteration's counters; True when the
        image's body is complete."""
        span = slice(slot.n, slot.n + tokens.numel())
        slot.body[span] = tokens
        slot.commit_iter[span] = slot.iteration
        slot.commit_kind[span] = kinds
        slot.entropy[span] = entropies
        slot.stats += stats
        slot.n += tokens.numel()
        slot.iteration += 1
        return slot.n >= self.adapter.layout.length

    def _finish(self, slot: Slot) -> Generation:
        """The finished image's record (its decode time when it was decoded alone); the drafter first puts its
        per-position values in raster order (:meth:`csd.drafters.Drafter.finish`)."""
        self.drafter.finish(slot)
        synchronize(self.device)
        prefill_s = decode_s = drafter_s = None
        if self.batch_size == 1:
            t0, t1 = slot.times
            prefill_s, decode_s = t1 - t0, time.perf_counter() - t1
            drafter_s = sum(span.seconds() for span in slot.drafter_spans)
        return Generation(
            tokens=self.body(slot.body, 0).cpu(),
            nfe=slot.iteration,
            stats=dict(zip(STAT_KEYS, slot.stats.tolist(), strict=True)),
            commit_iter=slot.commit_iter.cpu(),
            commit_kind=torch.where(self.body.is_forced, COMMIT_FORCED, slot.commit_kind).cpu(),
            entropy=slot.entropy.cpu(),
            prefill_s=prefill_s,
            decode_s=decode_s,
            batched=self.batch_size > 1,
            drafter_s=drafter_s,
        )
