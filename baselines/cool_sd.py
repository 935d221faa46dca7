"""COOL-SD: annealed relaxation of speculative decoding (AAAI 2026, arXiv 2601.09212; docs/ALGORITHMS.md).

``b_d = min(1, w_d q(x)/p(x))`` with a weight that decreases along the window: relax the earliest drafts
most. Window depth ``d = 0..K-2`` is the index along dim ``-2`` of ``accept_prob``'s ``[..., K-1, V]``
rows (the engine passes window positions ``1..K-1`` in order); the schedule restarts every iteration.

The paper's code is not released; its note gives ``w_i = delta exp(-nu i - mu)`` with ``nu = 0.7``,
``delta`` tuned (1.1, 2) and ``mu`` unknown. ``mu`` and the start of ``i`` only rescale ``delta``, so
``anneal_scale`` is the weight of the first draft. The floor at 1 is our guess,
``w_d = max(1, anneal_scale exp(-anneal_decay d))``: without it ``delta = 1.1`` would be stricter than SJD
from the second draft on. With ``w >= 1`` the optimal residual ``norm([q - p b]_+)`` (Theorem 2) is the
lossless ``norm([q - p]_+)`` (Proposition 1), so the residual, which the engine computes without the
depth, is exact.
"""

from __future__ import annotations

import torch

from csd.acceptance import AcceptanceRule, Verdict, likelihood_ratio
from csd.params import Param
from csd.schema import Float


class CoolSD(AcceptanceRule):
    """``b_d = min(1, w_d q(x)/p(x))``, ``w_d = max(1, anneal_scale exp(-anneal_decay d))``, ``d`` = window depth."""

    name = "cool_sd"
    lossless = False

    PARAMS = {
        "anneal_scale": Param(Float(min=1), 1.1, "the weight w of the first draft (the paper's 1.1 or 2)"),
        "anneal_decay": Param(Float(min=0), 0.7, "nu: the weight's decay along the window"),
    }

    def weights(self, depth: int) -> torch.Tensor:
        """``w_d`` for ``d = 0..depth-1``: ``max(1, anneal_scale exp(-anneal_decay d))``."""
        d = torch.arange(depth, dtype=torch.float32)
        return (self.anneal_scale * torch.exp(-self.anneal_decay * d)).clamp_min(1.0)

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        relaxed = self.weights(ratio.shape[-1]).to(ratio) * ratio
        return Verdict(relaxed.clamp(max=1.0), ratio.clamp(max=1.0))

