"""VVS verification skipping (Dong et al., CVPR 2026, arXiv 2511.13587; code ``HyattDD/VVS``) for the EAGLE drafter
(``drafter.skip``; docs/ALGORITHMS.md "VVS: verification skipping").

A drafting round is *skipped* when, instead of sending its drafts to the target, the drafter commits one candidate
path of them truncated to ``s = min(L_path, floor(tau))`` tokens, ``tau`` the image's running mean accepted length
(tokens a verified forward commits: accepted drafts + 1, the EAGLE papers' ``tau``), and drafts again from the end of
that path. The skipped tokens' pairs enter the head with the latest cached target features (VVS's "reuse_prev":
the last ``s`` target features the image has, the last one repeated when it has fewer), and the next target forward
processes the skipped chain and the new drafts in one window, so a skip costs no target forward of its own. Lossy:
the skipped tokens are never judged by the acceptance rule (``skip_verify=false``, the released code's behaviour);
``skip_verify=true`` judges them in that forward as the first drafts of the window instead (the chain's test, so the
image keeps its rule's law where the path is a chain of draws from the recorded ``p``).

Schedules (none before ``warmup`` committed tokens, as the code's ``new_token <= 5``; never two skipped rounds in a
row: a skipped round and the verified round drafted after it share one target forward, and the next decision is
the next forward's first round):

- ``uniform``: round ``k`` (1-based count of the image's drafting rounds, skipped ones included) is skipped when
  ``k % interval == 0``;
- ``similarity`` (the code's "dynamic" policy): skipped when the candidate paths of the tree agree, i.e. the
  depth-weighted mean pairwise cosine similarity of their code embeddings
  ``S = mean_{i<j} sum_l w_l cos(e(x_{i,l}), e(x_{j,l}))``, ``w_l = decay^l / sum_l' decay^l'`` (``l = 0`` the first
  draft), is at least ``threshold`` (0.70 in the code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

#: the released ``run_vvs.sh``'s uniform interval and the code's similarity threshold, depth decay and warm-up
VVS_INTERVAL, VVS_THRESHOLD, VVS_DECAY, VVS_WARMUP = 5, 0.70, 0.9, 6


@dataclass
class SkipState:
    """One image's skipping record: drafting rounds so far, the verified rounds with
    drafts and the tokens they committed (for ``tau``), and per round ``(n, possible, skipped)`` (``log``: its committed
    tokens, whether a skip could commit a path there, whether it did)."""

    rounds: int = 0
    verified: int = 0
    committed: int = 0
    log: list[tuple[int, bool, bool]] = field(default_factory=list)

    def mean_accepted(self) -> int:
        """``floor(tau)``: tokens per verified forward with drafts (accepted + 1), 1 before any."""
        return self.committed // self.verified if self.verified else 1

    def record_verified(self, tokens: int) -> None:
        """A verified forward with drafts committed ``tokens`` (the skipped chain's tokens not included)."""
        self.verified += 1
        self.committed += tokens


def depth_weights(length: int, decay: float, device: torch.device | None = None) -> torch.Tensor:
    """``w_l = decay^l / sum_{l' < length} decay^l'`` for ``l < length``."""
    w = decay ** torch.arange(length, dtype=torch.float32, device=device)
    return w / w.sum()


def path_similarity(paths: torch.Tensor, embeddings: torch.Tensor, decay: float) -> float:
    """Mean pairwise depth-weighted cosine similarity ``S`` (module docstring) of ``P`` candidate paths of equal
    length ``paths [P, l]`` with code embeddings ``embeddings [P, l, D]``; 0 with fewer than two paths (the code's
    fallback). One host synchronisation."""
    count, length = paths.shape
    if count < 2 or length == 0:
        return 0.0
    unit = F.normalize(embeddings.float(), dim=-1)
    cos = torch.einsum("ild,jld->lij", unit, unit)  # [l, P, P]
    sim = torch.einsum("l,lij->ij", depth_weights(length, decay, unit.device), cos)
    i, j = torch.triu_indices(count, count, offset=1, device=unit.device)
    return float(sim[i, j].mean())


@dataclass(frozen=True)
class SkipSchedule:
    """When a round is skipped (module docstring): ``policy`` none / uniform / similarity and its settings."""

    policy: str
    interval: int
    threshold: float
    decay: float
    warmup: int

    def skip(self, state: SkipState, n: int, s: int, possible: bool, similarity: float | None = None) -> bool:
        """Whether the image's next drafting round (its ``state.rounds + 1``-th, at ``n`` committed tokens) is
        skipped; ``s``: the tokens a skip would commit; ``possible``: the round has them and room after them;
        ``similarity``: the round's ``S`` (similarity policy). Counts the round, and when it is skipped the verified
        round drafted after it (at ``n + s``, in the same target forward)."""
        state.rounds += 1
        wanted = False
        if possible and self.policy != "none" and n >= self.warmup:
            if self.policy == "uniform":
                wanted = state.rounds % self.interval == 0
            else:
                wanted = similarity is not None and similarity >= self.threshold
        state.log.append((n, possible, wanted))
        if wanted:
            state.rounds += 1
            state.log.append((n + s, False, False))
        return wanted


def reused_features(recent: torch.Tensor, count: int) -> torch.Tensor:
    """VVS's "reuse_prev" features for ``count`` skipped tokens from the latest cached target features
    ``recent [rows, k, D]``: the last ``count`` of them, the last one repeated when there are fewer."""
    k = recent.shape[1]
    if count <= k:
        return recent[:, k - count :]
    return torch.cat([recent, recent[:, -1:].expand(-1, count - k, -1)], dim=1)
