"""Grouped speculative decoding (So et al., ICCV 2025), as specified in docs/ALGORITHMS.md.

Rank the image vocabulary by the target ``q`` (ties by token index); the group ``C(x)`` is ``x`` plus the ``G/2`` tokens on
each side of ``x`` in that ranking, keeping only tokens ``x'`` with ``|q(x') - q(x)| < prob_threshold``
and ``||e(x') - e(x)||^2 < embed_threshold`` (``e``: the model's input embeddings of image tokens).
Accept ``x`` with ``min(1, Q(C) / P(C))``; on rejection use the token-level residual.
"""

from __future__ import annotations

import torch

from csd.acceptance import AcceptanceRule, Verdict, gather_token, likelihood_ratio
from csd.adapters.base import ModelAdapter


class GSD(AcceptanceRule):
    name = "gsd"
    lossless = False

    def __init__(self, group_size: int = 14, prob_threshold: float = 0.15, embed_threshold: float = 0.5) -> None:
        if group_size < 0:
            raise ValueError(f"gsd: group_size must be >= 0, got {group_size}")
        self.group_size = int(group_size)
        self.prob_threshold = float(prob_threshold)
        self.embed_threshold = float(embed_threshold)
        self.embeddings: torch.Tensor | None = None

    def setup(self, adapter: ModelAdapter) -> None:
        self.embeddings = adapter.token_embeddings().detach().float()

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        if self.embeddings is None:
            raise RuntimeError("gsd: call setup(adapter) first (it needs the image-token embeddings)")
        vocab = target_probs.shape[-1]
        # stable: tied q (e.g. the zeros outside a top-k) rank by token index, so groups are reproducible
        order = torch.argsort(target_probs, dim=-1, descending=True, stable=True)
        rank_of = torch.argsort(order, dim=-1)
        rank_x = gather_token(rank_of, drafts)
        half = self.group_size // 2
        offsets = torch.arange(-half, half + 1, device=drafts.device)
        ranks = rank_x.unsqueeze(-1) + offsets
        in_range = (ranks >= 0) & (ranks < vocab)
        group = order.gather(-1, ranks.clamp(0, vocab - 1))
        q_group = target_probs.gather(-1, group)
        p_group = draft_probs.gather(-1, group)
        q_x = gather_token(target_probs, drafts).unsqueeze(-1)
        emb = self.embeddings.to(drafts.device)
        dist2 = (emb[group] - emb[drafts].unsqueeze(-2)).pow(2).sum(-1)
        keep = in_range & ((q_group - q_x).abs() < self.prob_threshold) & (dist2 < self.embed_threshold)
        keep = keep | (offsets == 0)  # x itself is always in its group
        q_mass = (q_group * keep).sum(-1)
        p_mass = (p_group * keep).sum(-1)
        accept = (q_mass / p_mass.clamp_min(1e-30)).clamp(max=1.0)
        return Verdict(accept, likelihood_ratio(target_probs, draft_probs, drafts).clamp(max=1.0))

    def params(self) -> dict[str, object]:
        return {
            "group_size": self.group_size,
            "prob_threshold": self.prob_threshold,
            "embed_threshold": self.embed_threshold,
        }
