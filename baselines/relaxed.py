"""Content-agnostic relaxations of the SJD acceptance (docs/ALGORITHMS.md table): Addition and Amplify.

Both keep the lossless residual ``norm([q - p]_+)``.
"""

from __future__ import annotations

from csd.acceptance import AcceptanceRule, Verdict, likelihood_ratio


class Addition(AcceptanceRule):
    """``b = min(1, q(x)/p(x) + c)``."""

    name = "addition"
    lossless = False

    def __init__(self, c: float = 0.1) -> None:
        if c < 0:
            raise ValueError(f"addition: c must be >= 0, got {c}")
        self.c = float(c)

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        return Verdict((ratio + self.c).clamp(max=1.0), ratio.clamp(max=1.0))

    def params(self) -> dict[str, object]:
        return {"c": self.c}


class Amplify(AcceptanceRule):
    """``b = min(1, k q(x)/p(x))`` (papers use k = 3, 4)."""

    name = "amplify"
    lossless = False

    def __init__(self, k: float = 3.0) -> None:
        if k < 1:
            raise ValueError(f"amplify: k must be >= 1, got {k}")
        self.k = float(k)

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        return Verdict((self.k * ratio).clamp(max=1.0), ratio.clamp(max=1.0))

    def params(self) -> dict[str, object]:
        return {"k": self.k}
