"""LANTERN (Jang et al., ICLR 2025): relaxed acceptance over latent neighbourhoods (docs/ALGORITHMS.md).

Neighbours ``n_1(x), n_2(x), ...`` of ``x`` are sorted by L2 distance between VQ codebook vectors
(precomputed once per model). With ``s_j`` the cumulative target mass of the first ``j`` neighbours
(``j <= k``) and ``J = max{j : s_j <= delta}``, the relaxed target is ``q~(x) = q(x) + s_J`` and
``b = min(1, q~(x) / p(x))``. On rejection the target mass of the ``J`` neighbours used is zeroed
before the residual ``norm([q' - p]_+)``.

``code_parity=True`` reproduces the released Lumina-mGPT code (``models/ea_model_lumina_mgpt.py`` of
``jadohu/LANTERN``, ``evaluate_posterior``): on rejection it zeroes the first ``k + 1`` neighbours whenever at
least one was used (``J >= 1``) and none when ``J = 0``; the acceptance is the same.

Empty residual: in the paper's mode ``[q' - p]_+`` has mass after every rejection (a rejection needs
``p(x) > q(x) + s_J``, and ``q'`` sums to ``1 - s_J``), so it falls back to ``q`` only where no rejection can
happen. The parity residual zeroes more than ``s_J`` and can be empty after a real rejection: like the released
code, it then draws uniformly over the vocabulary (here the image codes). Both fallbacks are flagged.
"""

from __future__ import annotations

import torch

from csd.acceptance import (
    AcceptanceRule,
    ModelTables,
    Residual,
    Verdict,
    gather_token,
    likelihood_ratio,
    positive_part,
)
from csd.params import Param
from csd.schema import Bool, Float, Int


def nearest_neighbours(codebook: torch.Tensor, k: int, chunk: int = 2048) -> torch.Tensor:
    """``[V, k]`` indices of each code's ``k`` nearest other codes (squared L2), nearest first."""
    codebook = codebook.float()
    k = min(k, codebook.shape[0] - 1)
    out = []
    for start in range(0, codebook.shape[0], chunk):
        block = codebook[start : start + chunk]
        dist = torch.cdist(block, codebook)
        rows = torch.arange(block.shape[0], device=codebook.device)
        dist[rows, rows + start] = float("inf")  # a code is not its own neighbour
        out.append(torch.topk(dist, k, dim=-1, largest=False).indices)
    return torch.cat(out)


class Lantern(AcceptanceRule):
    """LANTERN's relaxed acceptance: ``k`` = ``neighbours``, ``delta`` = ``budget`` (the names of the paper's symbols
    would clash with other rules' keys; ``method.k`` / ``method.delta`` still work for LANTERN, with a warning)."""

    name = "lantern"
    lossless = False
    PARAMS = {
        "neighbours": Param(Int(min=1), 1000, "k: the nearest VQ-codebook neighbours of x whose mass may be added"),
        "budget": Param(Float(min=0, max=1), 0.1, "delta: the most neighbour mass s_J added to q(x)"),
        "code_parity": Param(Bool(), False, "true: the released code's residual (zeroes k + 1 neighbours)"),
    }
    renamed = {"k": "neighbours", "delta": "budget"}
    neighbours_table: torch.Tensor | None = None

    def setup(self, adapter: ModelTables) -> None:
        # the code's residual zeroes one neighbour more than the acceptance may use
        table = self.neighbours + 1 if self.code_parity else self.neighbours
        self.neighbours_table = nearest_neighbours(adapter.codebook().detach().to(adapter.device), table)

    def _used_neighbours(self, target_probs: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbour ids ``[..., n]`` of each draft (``n`` = the table's width: ``k``, or ``k + 1`` with
        ``code_parity``) and a mask of the first ``J`` (those among the first ``k`` with ``s_j <= delta``)."""
        if self.neighbours_table is None:
            raise RuntimeError("lantern: call setup(adapter) first (it needs the VQ codebook)")
        nbrs = self.neighbours_table.to(drafts.device)[drafts]
        used = target_probs.gather(-1, nbrs).cumsum(-1) <= self.budget
        used[..., self.neighbours :] = False  # s_j grows with j, so `used` is a prefix: the first J of the first k
        return nbrs, used

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy) -> Verdict:
        nbrs, used = self._used_neighbours(target_probs, drafts)
        s_J = (target_probs.gather(-1, nbrs) * used).sum(-1)
        relaxed_q = gather_token(target_probs, drafts) + s_J
        accept = (relaxed_q / gather_token(draft_probs, drafts).clamp_min(1e-30)).clamp(max=1.0)
        return Verdict(accept, likelihood_ratio(target_probs, draft_probs, drafts).clamp(max=1.0))

    def residual(self, target_probs, draft_probs, drafts) -> Residual:
        """``norm([q' - p]_+)`` with ``q'`` = ``q`` without the zeroed neighbours; where it has no mass, ``q``
        (paper) or the uniform law over the image codes (``code_parity``, the released code's ``torch.ones``)."""
        nbrs, used = self._used_neighbours(target_probs, drafts)
        fallback = target_probs
        if self.code_parity:  # the whole table (k + 1 neighbours) where J >= 1, i.e. where the nearest one was used
            used = used[..., :1].expand_as(used)
            fallback = torch.ones_like(target_probs)
        zeroed = target_probs.scatter(-1, nbrs, target_probs.gather(-1, nbrs) * (~used))
        return positive_part(zeroed, draft_probs, fallback)

    def params(self) -> dict[str, object]:
        params: dict[str, object] = {"neighbours": self.neighbours, "budget": self.budget}
        if self.code_parity:  # recorded only when set: records made before the option stay comparable
            params["code_parity"] = True
        return params
