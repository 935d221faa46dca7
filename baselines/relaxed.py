"""Content-agnostic relaxations of the SJD acceptance (docs/ALGORITHMS.md table): Addition and Amplify.

Both keep the lossless residual ``norm([q - p]_+)``.
"""

from __future__ import annotations

from csd.acceptance import AcceptanceRule, Verdict, likelihood_ratio
from csd.params import Param
from csd.schema import Float


class Addition(AcceptanceRule):
    """``b = min(1, q(x)/p(x) + c)``."""

    name = "addition"
    lossless = False
    PARAMS = {"c": Param(Float(min=0), 0.1, "c: the constant added to q(x)/p(x)")}

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        return Verdict((ratio + self.c).clamp(max=1.0), ratio.clamp(max=1.0))



class Amplify(AcceptanceRule):
    """``b = min(1, k q(x)/p(x))`` with ``k`` = ``factor`` (papers use k = 3, 4)."""

    name = "amplify"
    lossless = False
    PARAMS = {"factor": Param(Float(min=1), 3.0, "k: the factor that multiplies q(x)/p(x)")}
    renamed = {"k": "factor"}

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        return Verdict((self.factor * ratio).clamp(max=1.0), ratio.clamp(max=1.0))
