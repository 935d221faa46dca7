"""Grouped speculative decoding (So et al., ICCV 2025), as specified in docs/ALGORITHMS.md ("GSD").

Rank the image vocabulary by the target ``q`` (ties by token index); the group ``C(x)`` is ``x`` plus the ``G/2`` tokens on
each side of ``x`` in that ranking, keeping only tokens ``x'`` with ``|q(x') - q(x)| < prob_threshold``
and ``||e(x') - e(x)||^2 < embed_threshold`` (``e``: the model's input embeddings of image tokens).
Accept ``x`` with ``min(1, Q(C) / P(C))``; on rejection use the token-level residual.

``code_parity=True`` reproduces the released Lumina-mGPT code (``scheduler/jacobi_iteration_lumina_mgpt.py`` of
``junhyukso/GSD``): it sorts the processed logits ascending and slices ``[i - h, i + h)`` around the draft's
position ``i`` (``h = G/2``, 7 in the code), so the candidates are ``h - 1`` higher-ranked and ``h`` lower-ranked
neighbours; for the ``h`` lowest-ranked tokens the slice is empty and the code falls back to ``min(1, q/p)``.

``embed_threshold`` is an absolute squared distance, set for Lumina-mGPT's embeddings (paper parity). A
scale-free form for other codebooks: ``embed_threshold_quantile = a`` replaces it by the ``a``-quantile of the
squared distances between the model's image-token embeddings (all pairs of distinct codes, or
:data:`QUANTILE_PAIRS` random pairs of a larger vocabulary, seeded), computed once in :meth:`GSD.setup`.
"""

from __future__ import annotations

import numpy as np
import torch

from csd.acceptance import AcceptanceRule, ModelTables, Verdict, gather_token, likelihood_ratio
from csd.params import Param
from csd.schema import Bool, Float, Int

#: pairs of distinct codes sampled (seed 0) to estimate the distance quantile of a vocabulary with more pairs than this
QUANTILE_PAIRS = 1 << 22


def distance_quantile(embeddings: torch.Tensor, quantile: float, pairs: int = QUANTILE_PAIRS) -> float:
    """The ``quantile`` of ``||e(a) - e(b)||^2`` over pairs ``a != b`` of rows of ``embeddings [V, D]`` (all pairs
    when there are at most ``pairs``, else that many random ones, seeded); linear interpolation between order
    statistics (``numpy.quantile``'s default)."""
    emb = embeddings.float()
    vocab = emb.shape[0]
    if vocab < 2:
        raise ValueError(f"gsd: a distance quantile needs >= 2 image-token embeddings, got {vocab}")
    if vocab * (vocab - 1) // 2 <= pairs:
        a, b = torch.triu_indices(vocab, vocab, offset=1, device=emb.device)
    else:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randint(vocab, (pairs,), generator=gen)
        b = (a + torch.randint(1, vocab, (pairs,), generator=gen)) % vocab  # b != a
        a, b = a.to(emb.device), b.to(emb.device)
    dist2 = (emb[a] - emb[b]).pow(2).sum(-1)
    return float(np.quantile(dist2.cpu().double().numpy(), quantile))


class GSD(AcceptanceRule):
    name = "gsd"
    lossless = False

    PARAMS = {
        # G/2 neighbours on each side of x; G < 2 leaves x alone (SJD)
        "group_size": Param(Int(min=2), 14, "G: the group spans the tokens ranked within G/2 of x by q"),
        "prob_threshold": Param(Float(min=0, max=1), 0.15, "a group member's |q(v) - q(x)| must stay below this"),
        "embed_threshold": Param(Float(min=0), 0.5, "a group member's squared embedding distance to x must stay below this"),
        "code_parity": Param(Bool(), False, "true: the released code's group (its slice of ranks and its fallback)"),
        "embed_threshold_quantile": Param(Float(min=0, max=1, null="for the absolute embed_threshold"), None,
                                          "scale-free embed_threshold: this quantile of the model's pairwise distances"),
    }
    embeddings: torch.Tensor | None = None

    def setup(self, adapter: ModelTables) -> None:
        self.embeddings = adapter.token_embeddings().detach().float()
        if self.embed_threshold_quantile is not None:
            self.embed_threshold = distance_quantile(self.embeddings, self.embed_threshold_quantile)

    def offsets(self, device: torch.device) -> torch.Tensor:
        """Rank offsets of the candidates (negative = higher ``q``): ``-h .. h``, or ``-(h-1) .. h`` for the code."""
        half = self.group_size // 2
        return torch.arange(1 - half if self.code_parity else -half, half + 1, device=device)

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        if self.embeddings is None:
            raise RuntimeError("gsd: call setup(adapter) first (it needs the image-token embeddings)")
        vocab = target_probs.shape[-1]
        # stable: tied q (e.g. the zeros outside a top-k) rank by token index, so groups are reproducible
        order = torch.argsort(target_probs, dim=-1, descending=True, stable=True)
        rank_of = torch.argsort(order, dim=-1)
        rank_x = gather_token(rank_of, drafts)
        offsets = self.offsets(drafts.device)
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
        lossless = likelihood_ratio(target_probs, draft_probs, drafts).clamp(max=1.0)
        if self.code_parity:
            # the code's slice starts at ascending position i - h: empty for i < h (and for h = 0), and an
            # empty slice raises inside its try block, whose except branch is the plain min(1, q/p)
            half = self.group_size // 2
            no_group = (vocab - 1 - rank_x < half) | (half == 0)
            accept = torch.where(no_group, lossless, accept)
        return Verdict(accept, lossless)

    def params(self) -> dict[str, object]:
        params: dict[str, object] = {
            "group_size": self.group_size,
            "prob_threshold": self.prob_threshold,
            "embed_threshold": self.embed_threshold,
        }
        if self.code_parity:  # recorded only when set: records made before the option stay comparable
            params["code_parity"] = True
        if self.embed_threshold_quantile is not None:  # embed_threshold: the model's quantile after setup
            params["embed_threshold_quantile"] = self.embed_threshold_quantile
        return params
