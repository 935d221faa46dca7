"""Acceptance rules: the pluggable part of speculative Jacobi decoding (docs/ALGORITHMS.md, "Acceptance rules").

A rule maps, for every verified window position, the processed target distribution ``q``
(``target_probs``), the distribution the draft was actually sampled from ``p`` (``draft_probs``) and
the draft token ``x`` to an acceptance probability ``b``; on the first rejection the engine samples a
replacement from ``rule.residual`` (default: the lossless ``norm([q - p]_+)``), a :class:`Residual` that always
has mass (where the rule's formula has none, its documented fallback law, flagged). The committed token
then has distribution ``P(y) = p(y) b(y) + sum_x p(x) (1 - b(x)) r_x(y)``, which equals ``q`` exactly
for SJD's ``b = min(1, q(x)/p(x))``.

All functions are batched over leading dimensions (``[..., V]`` distributions, ``[...]`` tokens) and
never synchronise with the host. SJD and CSD live here; the other baselines live in ``baselines/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from csd.params import Param, Parametrized
from csd.schema import Choice, Float


class ModelTables(Protocol):
    """What a rule may read of the model when it is set up (:meth:`AcceptanceRule.setup`): the model adapters
    (``csd.adapters.base.ModelAdapter``) give it; a rule knows nothing else of them."""

    device: torch.device

    def token_embeddings(self) -> torch.Tensor:
        """``[V, d]``: the input embeddings of the image tokens (GSD's latent distance)."""
        ...

    def codebook(self) -> torch.Tensor:
        """``[V, d]``: the image tokenizer's code vectors (LANTERN's latent neighbours)."""
        ...


@dataclass
class Verdict:
    """Per-position outcome of a rule: ``accept_prob`` b, the lossless ``min(1, q/p)`` for the same
    position (to count relaxed acceptances), and the CSD filter result where the rule has one."""

    accept_prob: torch.Tensor
    lossless_prob: torch.Tensor
    filter_pass: torch.Tensor | None = None


def gather_token(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[..., tokens]`` elementwise: ``q(x)`` for ``probs [..., V]`` and ``tokens [...]``."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def likelihood_ratio(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``q(x) / p(x)``. ``p(x) > 0`` because ``x`` was sampled from ``p``; the clamp only guards rounding."""
    return gather_token(target_probs, drafts) / gather_token(draft_probs, drafts).clamp_min(1e-30)


@dataclass
class Residual:
    """The law a replacement is drawn from after a rejection: ``probs [..., V]`` (normalised, never without
    mass) and ``fallback [...]``, True where the rule's formula had no mass and ``probs`` is its fallback law."""

    probs: torch.Tensor
    fallback: torch.Tensor


def positive_part(target_probs: torch.Tensor, draft_probs: torch.Tensor, fallback: torch.Tensor) -> Residual:
    """``norm([t - p]_+)`` for a (possibly reduced) target ``t``; ``norm(fallback)`` where ``t <= p`` everywhere.

    ``fallback [..., V]`` must have mass (a law, or a uniform row): the sampler refuses a law without any.
    """
    diff = (target_probs - draft_probs).clamp_min(0.0)
    mass = diff.sum(-1, keepdim=True)
    has_mass = mass > 1e-12
    fallback = fallback / fallback.sum(-1, keepdim=True)
    return Residual(torch.where(has_mass, diff / mass.clamp_min(1e-30), fallback), ~has_mass.squeeze(-1))


def lossless_residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """``norm([q - p]_+)``; falls back to ``q`` where ``q <= p`` everywhere (for laws ``q != p`` unreachable
    except by rounding: ``q <= p`` everywhere and equal sums mean ``q = p``, which accepts every draft)."""
    return positive_part(target_probs, draft_probs, target_probs).probs


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """``H(q) = -sum q log q`` in nats (``0 log 0 = 0``)."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``TV(a, b) = 0.5 sum |a - b|``."""
    return 0.5 * (a - b).abs().sum(-1)


class AcceptanceRule(Parametrized):
    """Base rule: lossless acceptance ``min(1, q(x)/p(x))`` with residual ``norm([q - p]_+)``. A rule declares its
    hyper-parameters in ``PARAMS`` (``csd.params``); its ``method.<key>`` config keys are checked against them."""

    name = "sjd"
    #: True when the committed tokens are distributed exactly as the target (tests assert it)
    lossless = True

    def setup(self, adapter: ModelTables) -> None:
        """Precompute model-dependent tables (neighbour lists, embeddings). Default: nothing."""

    def accept_prob(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        drafts: torch.Tensor,
        target_entropy: torch.Tensor,
    ) -> Verdict:
        lossless = likelihood_ratio(target_probs, draft_probs, drafts).clamp(max=1.0)
        return Verdict(lossless, lossless)

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor) -> Residual:
        """The replacement law after rejecting ``drafts``: ``norm([q - p]_+)``, falling back to ``q``."""
        return positive_part(target_probs, draft_probs, target_probs)

    def params(self) -> dict[str, object]:
        """Hyper-parameters recorded with every image (default: every declared one)."""
        return self.param_values()


class SJD(AcceptanceRule):
    """Speculative Jacobi decoding (Teng et al., 2024): the lossless rule. With ``window = 1`` it is AR."""


ENTROPY_NORMS = ("none", "log_vocab", "log_support")


class CSD(AcceptanceRule):
    """Content-aware speculative decoding.

    ``b = min(1, q(x)/p(x) + lam * H(q))`` where ``TV(p, q) < delta`` (the distribution-alignment
    filter), else the lossless ``min(1, q(x)/p(x))``; the residual stays ``norm([q - p]_+)``, which the
    paper proves TV-optimal under the relaxed acceptance. ``entropy_norm`` (unknown in the paper):
    raw nats (``none``), ``H / log V`` (``log_vocab``) or ``H / log |supp q|`` (``log_support``).
    """

    name = "csd"
    lossless = False
    PARAMS = {
        "lam": Param(Float(min=0), 0.1, "lambda: weight of the target entropy in b = min(1, q/p + lam H~(q))"),
        "delta": Param(Float(min=0, max=1), 0.5, "delta: relax only where TV(p, q) < delta (the alignment filter)"),
        "entropy_norm": Param(Choice(options=ENTROPY_NORMS), "none",
                              "H~: raw nats (none), H / log V (log_vocab) or H / log |supp q| (log_support)"),
    }

    def normalised_entropy(self, target_probs: torch.Tensor, target_entropy: torch.Tensor) -> torch.Tensor:
        if self.entropy_norm == "log_vocab":
            return target_entropy / torch.log(torch.tensor(float(target_probs.shape[-1])))
        if self.entropy_norm == "log_support":
            log_support = torch.log((target_probs > 0).sum(-1).float())
            return torch.where(log_support > 0, target_entropy / log_support.clamp_min(1e-30), 0.0)
        return target_entropy

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        ratio = likelihood_ratio(target_probs, draft_probs, drafts)
        lossless = ratio.clamp(max=1.0)
        aligned = total_variation(draft_probs, target_probs) < self.delta
        relaxed = (ratio + self.lam * self.normalised_entropy(target_probs, target_entropy)).clamp(max=1.0)
        return Verdict(torch.where(aligned, relaxed, lossless), lossless, aligned)

