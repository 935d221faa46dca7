"""Entropy-informed SJD acceptance (arXiv 2510.09012, released Lumina-mGPT code of ``krennic999/ARsample``).

The released code scales SJD's uniform by ``s = clamp(H(q)/e + o, 0, 1)`` and accepts iff
``u s <= min(1, q(x)/p(x))``, i.e. with probability ``b = min(1, q(x) / (s p(x)))``: most lenient where the
target is confident (``1/s = 20`` at ``H = 0``). ``b >= min(1, q/p)``, so the TV-optimal residual
``norm([q - p b]_+)`` is the lossless ``norm([q - p]_+)`` (COOL-SD, Prop. 1). Its dynamic temperature is a model
option, part of the target ``q`` of every method (``model.entropy_temperature``, ``csd.processors``); the paper's
"+random" rule is not implemented (docs/ALGORITHMS.md, "Entropy-aware SJD").
"""

from __future__ import annotations

import torch

from csd.acceptance import AcceptanceRule, Verdict, likelihood_ratio
from csd.params import Param
from csd.schema import Float


class EntropySJD(AcceptanceRule):
    """``b = min(1, q(x) / (s p(x)))``, ``s = clamp(H(q) / entropy_scale + entropy_offset, 0, 1)`` (``H`` in nats)."""

    name = "entropy_sjd"
    lossless = False

    PARAMS = {
        "entropy_scale": Param(Float(gt=0), 9.0, "e in s = clamp(H(q)/e + o, 0, 1)"),
        "entropy_offset": Param(Float(min=0, max=1), 0.05, "o in s = clamp(H(q)/e + o, 0, 1)"),
    }

    def uniform_scale(self, target_entropy: torch.Tensor) -> torch.Tensor:
        """``s = clamp(H / e + o, 0, 1)``."""
        return (target_entropy / self.entropy_scale + self.entropy_offset).clamp(0.0, 1.0)

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        # s = 0 (H = 0, o = 0): accept every x with q(x) > 0, never one with q(x) = 0
        scaled = ratio / self.uniform_scale(target_entropy).clamp_min(1e-30)
        return Verdict(scaled.clamp(max=1.0), ratio.clamp(max=1.0))

