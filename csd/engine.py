"""The speculative Jacobi engine (docs/ALGORITHMS.md, "The engine loop"), batched over images.

State of an image between iterations: ``n`` committed body tokens (the cache holds the prompt and all
of them except the last, which is the next window's anchor) and the carried drafts with their
recorded distributions. One iteration, for every image in flight at once (ragged: each has its own
``n``, window and acceptance):

1. window = anchor + carried drafts + fresh drafts (``init``: ``random`` | ``repeat_left``; one-hot p),
   ``K = min(L, N - n)`` rows so no draft lies past the image (``K = 1`` in the AR tail); shorter
   windows are padded to the batch's longest and their padding is never committed;
2. one forward for the whole batch; 3. processors -> ``q`` per row, a sample ``y_j ~ q_j`` per row;
4-5. :func:`csd.verify.verify_window` commits ``m`` tokens per image;
6. refresh: ``y_m .. y_{K-1}`` become the next drafts, recorded distributions ``q_m .. q_{K-1}``;
7. roll each image's cache back by its rejected tail.

AR is the same loop with ``L = 1``; batch 1 is the same loop with one slot. An image's random numbers
come from its own generator (seeded with its seed) in a fixed order, so its tokens depend only on
(prompt, seed), never on its neighbours or the batch size. When an image finishes, the next request
takes its slot (continuous refill). The only host synchronisation per iteration is reading the ``m``s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule, entropy
from csd.adapters.base import ModelAdapter, to_device
from csd.processors import TargetPipeline
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.verify import WindowNoise, couple_drafts, exponential_noise, verify_window

INIT_SCHEMES = ("random", "repeat_left")
COUPLINGS = ("none", "maximal", "gumbel")
#: the recorded ``p`` of a fresh random draft: one-hot on itself, or the uniform law it was drawn from
DRAFT_RECORDS = ("onehot", "uniform")
STAT_KEYS = ("drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes")


@dataclass(frozen=True)
class Request:
    """One image to decode; ``key`` is the caller's handle, returned with the result."""

    prompt: str
    seed: int
    key: Any = None


@dataclass
class Generation:
    """One decoded image body plus everything the records need.

    ``prefill_s`` / ``decode_s`` (device-synchronised seconds) are per-image latencies only at batch 1;
    in a batch images share every forward, so they are None there (``batched``).
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

    @property
    def step_compression(self) -> float:
        return self.tokens.numel() / max(self.nfe, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Image:
    """Decoding state of one image in a batch slot (host ints, device tensors)."""

    request: Request
    generator: torch.Generator
    body: torch.Tensor
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    stats: torch.Tensor
    carried: torch.Tensor
    carried_probs: torch.Tensor
    #: Gumbel sharing: one Exp(1) noise vector per body position, reused until that position is committed
    shared: torch.Tensor | None
    times: list[float] = field(default_factory=list)
    n: int = 0
    iteration: int = 0


@dataclass
class _Window:
    """One image's window of an iteration: ``rows`` target rows, its drafts and their recorded ``p``."""

    rows: int
    drafts: torch.Tensor
    draft_probs: torch.Tensor
    ids: torch.Tensor


class JacobiEngine:
    """Speculative Jacobi decoding with a pluggable acceptance rule; ``window=1`` is AR.

    ``batch_size`` images are decoded at once (one forward per iteration for all of them); batch 1 is
    the same loop with one slot.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        rule: AcceptanceRule,
        window: int = 16,
        init: str = "random",
        pad_window: bool = False,
        coupling: str = "none",
        batch_size: int = 1,
        draft_record: str = "onehot",
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES}, got {init!r}")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS}, got {coupling!r}")
        if draft_record not in DRAFT_RECORDS:
            raise ValueError(f"draft_record must be one of {DRAFT_RECORDS}, got {draft_record!r}")
        if draft_record == "uniform" and init != "random":
            raise ValueError("draft_record='uniform' records the law of init='random' drafts; repeat_left drafts are not drawn from it")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.adapter, self.rule, self.window, self.init = adapter, rule, window, init
        # maximal (MC-SJD): refreshed drafts are old drafts maximally coupled with their new targets
        # (recorded p = new q); gumbel: every sample for body position n uses the same Exp(1) noise E_n
        self.coupling = coupling
        # compiled path: every multi-token forward has exactly `window` rows (two step shapes in all)
        self.pad_window = pad_window
        self.batch_size = batch_size
        # a fresh random draft is drawn uniformly: recording that law (SJD-PAC's code) is as lossless as a
        # one-hot and accepts with min(1, V q(x)) instead of q(x) (docs/ALGORITHMS.md "Drafting variants")
        self.draft_record = draft_record
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        layout = adapter.layout
        self.device = adapter.device
        self.forced = layout.forced_ids.to(self.device)
        self.is_forced = self.forced >= 0
        self.cols = layout.cols.tolist()
        self.image_ids = adapter.image_token_ids.to(self.device)
        rule.setup(adapter)

    def body_ids(self, idx: torch.Tensor, start: int) -> torch.Tensor:
        """Image-code indices at body positions ``start ..`` -> adapter token ids (forced ids where forced)."""
        end = start + idx.numel()
        return torch.where(self.is_forced[start:end], self.forced[start:end], self.image_ids[idx])

    def fresh_drafts(self, start: int, count: int, left: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
        """``count`` fresh draft indices for positions ``start ..``; ``left`` is the index at ``start - 1``."""
        rand = torch.randint(self.adapter.vocab_size, (count,), generator=gen, device=self.device)
        if self.init == "random" or count == 0:
            return rand
        # repeat_left: copy the left neighbour in the same image row (random at a row start)
        out = []
        for j in range(count):
            left = rand[j] if (self.cols[start + j] <= 0 or left is None) else left
            out.append(left)
        return torch.stack(out)

    def fresh_probs(self, fresh: torch.Tensor) -> torch.Tensor:
        """The recorded ``p`` of fresh drafts ``[count]``: one-hot rows, or the uniform law over the image codes."""
        vocab = self.adapter.vocab_size
        if self.draft_record == "uniform":
            return torch.full((fresh.numel(), vocab), 1.0 / vocab, device=self.device)
        return F.one_hot(fresh, vocab).float()

    @torch.no_grad()
    def generate(self, prompt: str, seed: int) -> Generation:
        """One image (a batch of one request)."""
        ((_, gen),) = self.generate_many([Request(prompt, seed)])
        return gen

    @torch.no_grad()
    def generate_many(self, requests: Iterable[Request]) -> Iterator[tuple[Request, Generation]]:
        """Decode ``requests`` with up to ``batch_size`` in flight; yields ``(request, generation)`` as each
        image finishes (completion order), and the next request takes the freed slot."""
        pending = iter(requests)
        state = self.adapter.start_batch(self.batch_size)
        slots = [self._start(state, slot, next(pending, None)) for slot in range(self.batch_size)]
        while any(image is not None for image in slots):
            for slot in self._iteration(state, slots):
                image = slots[slot]
                yield image.request, self._finish(image)
                slots[slot] = self._start(state, slot, next(pending, None))

    def _start(self, state: Any, slot: int, request: Request | None) -> _Image | None:
        """Prefill ``slot`` with ``request`` (None: the slot stays empty)."""
        if request is None:
            return None
        device, vocab, length = self.device, self.adapter.vocab_size, self.adapter.layout.length
        gen = torch.Generator(device=device).manual_seed(request.seed)
        times = []
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        self.adapter.prefill_slot(state, slot, request.prompt)
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        zeros = torch.zeros(length, dtype=torch.long, device=device)
        # Gumbel sharing (docs/ALGORITHMS.md "Drafting variants"): y_n = argmax q_n / E_n with E_n fixed per
        # body position until n is committed; lossless because E_n is independent of everything that
        # decides whether its draft is accepted (the uniforms and residual noise are drawn separately)
        shared = exponential_noise((length, vocab), gen, device) if self.coupling == "gumbel" else None
        return _Image(
            request=request, generator=gen, body=zeros.clone(), commit_iter=zeros.clone(), commit_kind=zeros.clone(),
            entropy=torch.zeros(length, dtype=torch.float32, device=device),
            stats=torch.zeros(len(STAT_KEYS), dtype=torch.long, device=device),
            carried=zeros[:0], carried_probs=torch.zeros((0, vocab), dtype=torch.float32, device=device),
            shared=shared, times=times,
        )

    def _window(self, image: _Image) -> _Window:
        """The image's next window (SJD step 1): carried drafts topped up with fresh ones."""
        length, tail, n = self.adapter.layout.length, self.adapter.layout.jacobi_tail, image.n
        rows = 1 if length - n <= tail else min(self.window, length - n)
        n_drafts = rows - 1
        keep = min(image.carried.numel(), n_drafts)
        left = image.carried[keep - 1] if keep else (image.body[n - 1] if n else None)
        fresh = self.fresh_drafts(n + keep, n_drafts - keep, left, image.generator)
        drafts = torch.cat([image.carried[:keep], fresh])
        draft_probs = torch.cat([image.carried_probs[:keep], self.fresh_probs(fresh)])
        # column 0 is the anchor: the last committed token (the adapter puts the prompt tail there when n = 0)
        anchor = self.body_ids(image.body[n - 1 : n], n - 1) if n else self.image_ids[:1]
        return _Window(rows, drafts, draft_probs, torch.cat([anchor, self.body_ids(drafts, n)]))

    def _iteration(self, state: Any, slots: list[_Image | None]) -> list[int]:
        """One forward for every image in flight; returns the slots whose image is now complete."""
        device, vocab, length = self.device, self.adapter.vocab_size, self.adapter.layout.length
        windows = [None if image is None else self._window(image) for image in slots]
        rows = max(w.rows for w in windows if w is not None)
        fed = self.window if (self.pad_window and rows > 1) else rows
        # padding repeats a window's last token (an empty slot: any token); its outputs are dropped and rolled back
        ids = torch.stack([
            self.image_ids[:1].expand(fed) if w is None else torch.cat([w.ids, w.ids[-1:].expand(fed - w.rows)])
            for w in windows
        ])
        active = [w is not None for w in windows]
        raw = self.adapter.forward_batch(state, ids, [w is not None and image.n == 0 for image, w in zip(slots, windows, strict=True)], active)
        target = self.pipeline(raw[:, :, :rows])
        target_ent = entropy(target)

        # each image draws its window's random numbers from its own generator, exactly as at batch 1;
        # windows shorter than the batch's are padded (padding is never accepted nor committed)
        noise = WindowNoise(target.new_ones((len(slots), rows, vocab)), target.new_zeros((len(slots), rows - 1)),
                            target.new_ones((len(slots), vocab)))
        drafts = torch.zeros((len(slots), rows - 1), dtype=torch.long, device=device)
        draft_probs = F.one_hot(drafts, vocab).float()
        forced = torch.zeros((len(slots), rows - 1), dtype=torch.bool, device=device)
        for b, (image, w) in enumerate(zip(slots, windows, strict=True)):
            if w is None:
                continue
            shared = None if image.shared is None else image.shared[image.n : image.n + w.rows].unsqueeze(0)
            own = WindowNoise.draw(1, w.rows, vocab, image.generator, device, shared)
            noise.samples[b, : w.rows], noise.uniforms[b, : w.rows - 1], noise.residual[b] = own.samples[0], own.uniforms[0], own.residual[0]
            drafts[b, : w.rows - 1], draft_probs[b, : w.rows - 1] = w.drafts, w.draft_probs
            forced[b, : w.rows - 1] = self.is_forced[image.n : image.n + w.rows - 1]
        n_drafts = to_device([0 if w is None else w.rows - 1 for w in windows], device)
        result, samples = verify_window(self.rule, target, target_ent, drafts, draft_probs, forced, noise, n_drafts)
        kind = torch.full((len(slots), rows), COMMIT_SAMPLED, dtype=torch.long, device=device)
        kind[:, : rows - 1] = torch.where(
            result.accepted, torch.where(result.relaxed, COMMIT_RELAXED, COMMIT_ACCEPTED), COMMIT_SAMPLED
        )
        iteration_stats = self._iteration_stats(result, n_drafts, forced)
        refreshed = samples
        if self.coupling == "maximal":
            refreshed = torch.stack([
                samples[b] if w is None or w.rows == 1 else torch.cat(
                    [couple_drafts(target[b, : w.rows - 1], w.drafts, w.draft_probs, slots[b].generator), samples[b, w.rows - 1 :]]
                )
                for b, w in enumerate(windows)
            ])

        committed = (result.n_accepted + 1).tolist()  # the one host synchronisation of the iteration
        self.adapter.rollback_batch(state, [fed - (m if w is not None else 0) for m, w in zip(committed, windows, strict=True)])
        done = []
        for b, (image, w, m) in enumerate(zip(slots, windows, committed, strict=True)):
            if image is None:
                continue
            span = slice(image.n, image.n + m)
            image.body[span] = result.committed[b, :m]
            image.commit_iter[span] = image.iteration
            image.commit_kind[span] = kind[b, :m]
            image.entropy[span] = target_ent[b, :m]
            image.stats += iteration_stats[b]
            image.carried, image.carried_probs = refreshed[b, m : w.rows], target[b, m : w.rows]
            image.n += m
            image.iteration += 1
            if image.n >= length:
                done.append(b)
        return done

    def _finish(self, image: _Image) -> Generation:
        """The finished image's record (its decode time when it was decoded alone)."""
        synchronize(self.device)
        prefill_s = decode_s = None
        if self.batch_size == 1:
            t0, t1 = image.times
            prefill_s, decode_s = t1 - t0, time.perf_counter() - t1
        return Generation(
            tokens=self.body_ids(image.body, 0).cpu(),
            nfe=image.iteration,
            stats=dict(zip(STAT_KEYS, image.stats.tolist(), strict=True)),
            commit_iter=image.commit_iter.cpu(),
            commit_kind=torch.where(self.is_forced, COMMIT_FORCED, image.commit_kind).cpu(),
            entropy=image.entropy.cpu(),
            prefill_s=prefill_s,
            decode_s=decode_s,
            batched=self.batch_size > 1,
        )

    def _iteration_stats(self, result, n_drafts: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """Device-side counters ``[B, len(STAT_KEYS)]`` in STAT_KEYS order (forced positions excluded)."""
        positions = torch.arange(forced.shape[1], device=forced.device)
        proposed = ((positions < n_drafts.unsqueeze(-1)) & ~forced).sum(-1)
        verified = result.verified.sum(-1)
        zero = proposed * 0
        checks = verified if result.filter_pass is not None else zero
        passes = result.filter_pass.sum(-1) if result.filter_pass is not None else zero
        return torch.stack([proposed, verified, result.accepted.sum(-1), result.relaxed.sum(-1), checks, passes], dim=-1)
