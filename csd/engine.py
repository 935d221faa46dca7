"""The speculative Jacobi engine (docs/ALGORITHMS.md, "The engine loop").

State between iterations: ``n`` committed body tokens (the cache holds the prompt and all of them
except the last, which is the next window's anchor) and the carried drafts with their recorded
distributions. One iteration:

1. window = anchor + carried drafts + fresh drafts (``init``: ``random`` | ``repeat_left``; one-hot p),
   ``K = min(L, N - n)`` rows so no draft lies past the image (``K = 1`` in the AR tail);
2. one forward; 3. processors -> ``q`` per row, a sample ``y_j ~ q_j`` per row;
4-5. :func:`csd.verify.verify_window` commits ``m`` tokens;
6. refresh: ``y_m .. y_{K-1}`` become the next drafts, recorded distributions ``q_m .. q_{K-1}``;
7. roll the cache back by ``K - m`` (the rejected tail of the window).

AR is the same loop with ``L = 1``. The only host synchronisation per iteration is reading ``m``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule, entropy
from csd.adapters.base import ModelAdapter
from csd.processors import TargetPipeline
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.verify import couple_drafts, exponential_noise, verify_window

INIT_SCHEMES = ("random", "repeat_left")
COUPLINGS = ("none", "maximal", "gumbel")
STAT_KEYS = ("drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes")


@dataclass
class Generation:
    """One decoded image body plus everything the records need."""

    tokens: torch.Tensor
    nfe: int
    stats: dict[str, int]
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    prefill_s: float
    decode_s: float

    @property
    def step_compression(self) -> float:
        return self.tokens.numel() / max(self.nfe, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class JacobiEngine:
    """Speculative Jacobi decoding with a pluggable acceptance rule; ``window=1`` is AR."""

    def __init__(
        self,
        adapter: ModelAdapter,
        rule: AcceptanceRule,
        window: int = 16,
        init: str = "random",
        pad_window: bool = False,
        coupling: str = "none",
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES}, got {init!r}")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS}, got {coupling!r}")
        self.adapter, self.rule, self.window, self.init = adapter, rule, window, init
        # maximal (MC-SJD): refreshed drafts are old drafts maximally coupled with their new targets
        # (recorded p = new q); gumbel: every sample for body position n uses the same Exp(1) noise E_n
        self.coupling = coupling
        # compiled path: every multi-token forward has exactly `window` rows (two step shapes in all)
        self.pad_window = pad_window
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

    @torch.no_grad()
    def generate(self, prompt: str, seed: int) -> Generation:
        adapter, device, vocab = self.adapter, self.device, self.adapter.vocab_size
        length, tail = adapter.layout.length, adapter.layout.jacobi_tail
        gen = torch.Generator(device=device).manual_seed(seed)

        synchronize(device)
        t0 = time.perf_counter()
        ctx = adapter.prefill(prompt)
        synchronize(device)
        t1 = time.perf_counter()

        body = torch.zeros(length, dtype=torch.long, device=device)
        commit_iter = torch.zeros(length, dtype=torch.long, device=device)
        commit_kind = torch.zeros(length, dtype=torch.long, device=device)
        ent_map = torch.zeros(length, dtype=torch.float32, device=device)
        stats = torch.zeros(len(STAT_KEYS), dtype=torch.long, device=device)
        carried = torch.zeros(0, dtype=torch.long, device=device)
        carried_probs = torch.zeros((0, vocab), dtype=torch.float32, device=device)
        # Gumbel sharing (docs/ALGORITHMS.md "Drafting variants"): y_n = argmax q_n / E_n with E_n fixed per
        # body position until n is committed; lossless because E_n is independent of everything that
        # decides whether its draft is accepted (the uniforms and residual noise are drawn separately)
        shared = exponential_noise((length, vocab), gen, device) if self.coupling == "gumbel" else None
        n = iteration = 0
        while n < length:
            rows = 1 if length - n <= tail else min(self.window, length - n)
            n_drafts = rows - 1
            keep = min(carried.numel(), n_drafts)
            left = carried[keep - 1] if keep else (body[n - 1] if n else None)
            fresh = self.fresh_drafts(n + keep, n_drafts - keep, left, gen)
            drafts = torch.cat([carried[:keep], fresh])
            draft_probs = torch.cat([carried_probs[:keep], F.one_hot(fresh, vocab).float()])
            draft_ids = self.body_ids(drafts, n)
            fed = self.window if (self.pad_window and rows > 1) else rows
            if fed > rows:  # padding rows repeat the last draft; their outputs are dropped and rolled back
                draft_ids = torch.cat([draft_ids, draft_ids[-1:].expand(fed - rows)])
            if n == 0:
                raw = adapter.forward(ctx, draft_ids, with_prompt_tail=True)
            else:
                raw = adapter.forward(ctx, torch.cat([self.body_ids(body[n - 1 : n], n - 1), draft_ids]))
            target = self.pipeline(raw[:, :rows])
            target_ent = entropy(target)
            result, samples = verify_window(
                self.rule,
                target.unsqueeze(0),
                target_ent.unsqueeze(0),
                drafts.unsqueeze(0),
                draft_probs.unsqueeze(0),
                self.is_forced[n : n + n_drafts].unsqueeze(0),
                gen,
                None if shared is None else shared[n : n + rows].unsqueeze(0),
            )
            m_dev = result.n_accepted[0] + 1
            within = torch.arange(rows, device=device) < m_dev
            span = slice(n, n + rows)
            body[span] = torch.where(within, result.committed[0], body[span])
            commit_iter[span] = torch.where(within, iteration, commit_iter[span])
            kind = torch.full((rows,), COMMIT_SAMPLED, dtype=torch.long, device=device)
            kind[:n_drafts] = torch.where(
                result.accepted[0], torch.where(result.relaxed[0], COMMIT_RELAXED, COMMIT_ACCEPTED), COMMIT_SAMPLED
            )
            commit_kind[span] = torch.where(within, kind, commit_kind[span])
            ent_map[span] = torch.where(within, target_ent, ent_map[span])
            stats += self._iteration_stats(result, n, n_drafts)
            refreshed = samples[0]
            if self.coupling == "maximal" and n_drafts:
                coupled = couple_drafts(target[:-1], drafts, draft_probs, gen)
                refreshed = torch.cat([coupled, samples[0, -1:]])

            m = int(m_dev)  # the one host synchronisation of the iteration
            adapter.rollback(ctx, fed - m)
            carried, carried_probs = refreshed[m:], target[m:]
            n += m
            iteration += 1
        synchronize(device)
        t2 = time.perf_counter()

        commit_kind = torch.where(self.is_forced, COMMIT_FORCED, commit_kind)
        return Generation(
            tokens=self.body_ids(body, 0).cpu(),
            nfe=iteration,
            stats=dict(zip(STAT_KEYS, stats.tolist(), strict=True)),
            commit_iter=commit_iter.cpu(),
            commit_kind=commit_kind.cpu(),
            entropy=ent_map.cpu(),
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
        )

    def _iteration_stats(self, result, n: int, n_drafts: int) -> torch.Tensor:
        """Device-side counters in STAT_KEYS order (forced positions excluded)."""
        proposed = (~self.is_forced[n : n + n_drafts]).sum()
        checks = result.verified.sum() if result.filter_pass is not None else proposed * 0
        passes = result.filter_pass.sum() if result.filter_pass is not None else proposed * 0
        return torch.stack(
            [proposed, result.verified.sum(), result.accepted.sum(), result.relaxed.sum(), checks, passes]
        )
