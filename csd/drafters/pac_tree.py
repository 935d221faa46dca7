"""SJD-PAC's tree windows (docs/ALGORITHMS.md "SJD-PAC: tree windows"; the tree itself: ``csd.tree``).

The spine is the chain window's drafts (carried, topped up with fresh ones); depths ``1 .. D-1`` get ``K - 1``
siblings, carried ones (Proactive Drafting: drawn without replacement from the stale target) or fresh distinct
random tokens; forced depths get none. Verification is recursive rejection sampling in sibling order for any rule
(:func:`csd.tree.verify_tree`); the accepted path's cache entries are kept (the adapter compacts them). The refresh
continues the committed path (Adaptive Continuation: maximal coupling of the old draft). ``code_parity``: the
released code's sibling drafts and row choice instead of the lossless ones. Batch 1, eager adapters with tree
attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule, lossless_residual
from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.drafters.base import BodyIds, Drafter, Proposal, Verified
from csd.drafters.tree_window import TreeWindow, tree_grid, verify_tree_window
from csd.keys import COUPLINGS, DRAFT_RECORDS
from csd.params import Param
from csd.schema import Bool, Choice, Int
from csd.tree import Tree, TreeMask, TreeVerdict, branch_nodes, tree_problem, without_replacement
from csd.verify import couple_drafts, exponential_noise

if TYPE_CHECKING:
    from csd.slot import Slot


@dataclass
class TreeState:
    """An image's carried spine drafts and laws, its carried siblings ``[S, K-1]`` for the next window's depths
    ``1 .. S`` with their laws ``[S, K-1, V]`` and whether each exists, and its Gumbel-sharing noise (or None)."""

    carried: torch.Tensor
    carried_probs: torch.Tensor
    shared: torch.Tensor | None
    siblings: torch.Tensor | None = None
    sibling_probs: torch.Tensor | None = None
    sibling_valid: torch.Tensor | None = None


class PacTreeDrafter(Drafter):
    """Tree windows of ``window`` nodes: ``width`` = ``K`` candidates at each of the ``depth - 1`` branching depths."""

    name = "pac_tree"
    PARAMS = {
        **Drafter.PARAMS,
        "window": Param(Int(min=1), 64, "L: the nodes of one forward (root, spine and siblings)"),
        "width": Param(Int(min=2), 4, "K: the candidates at each branching depth"),
        "depth": Param(Int(min=2), 3, "D: tree levels counting the root; branching at depths 1 .. D-1"),
        "coupling": Param(Choice(options=COUPLINGS), "maximal", Drafter.PARAMS["coupling"].help),
        "draft_record": Param(Choice(options=DRAFT_RECORDS), "uniform", Drafter.PARAMS["draft_record"].help),
        "code_parity": Param(Bool(), False, "true: the released code's sibling drafts and longest-run row (biased)"),
    }

    def check_params(self) -> None:
        super().check_params()
        problem = tree_problem(self.window, self.width, self.depth, self.coupling, self.code_parity)
        if problem is not None:
            raise ValueError(problem)

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        #: per tree shape: the adapter's mask, the verification grid and each internal node's grid cell
        self._trees: dict[tuple[int, tuple[int, ...]], tuple[TreeMask, tuple[torch.Tensor, torch.Tensor], dict]] = {}

    def params(self) -> dict[str, object]:
        """The chain's settings plus the tree's, under the names runs have recorded since tree windows exist (no name:
        the tree keys imply it)."""
        chain = {key: getattr(self, key) for key in Drafter.PARAMS}
        return {**chain, "tree_width": self.width, "tree_depth": self.depth, "pac_code_parity": self.code_parity}

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        if batch_size > 1:
            return f"drafter=pac_tree (tree windows) decodes one image at a time: set engine.batch_size=1, got {batch_size}"
        if compiled:
            return "drafter=pac_tree (tree windows) runs eagerly: set engine.compile=false"
        return None

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> TreeState:
        empty = torch.zeros((0, self.vocab), dtype=torch.float32, device=self.device)
        return TreeState(torch.zeros(0, dtype=torch.long, device=self.device), empty, shared)

    def _shape(self, spine: int, widths: tuple[int, ...]) -> tuple[Tree, TreeMask, tuple[torch.Tensor, torch.Tensor], dict]:
        """The tree of ``spine`` chain nodes and ``widths`` candidates per branching depth, its adapter mask and
        verification grid (built once per shape)."""
        tree = Tree.build(spine, widths)
        key = (spine, widths)
        if key not in self._trees:
            self._trees[key] = (tree.mask(self.device), *tree_grid(tree, self.device))
        return (tree, *self._trees[key])

    def _window(self, slot: Slot) -> TreeWindow:
        """``window`` nodes at most, no draft past the body; fresh siblings are distinct random tokens besides the
        spine's, recorded like fresh drafts (uniform: RRS removes the earlier candidates from it, which is the law
        they were drawn from; one-hot: lossless as is)."""
        layout, n, state = self.adapter.layout, slot.n, slot.draft
        width, vocab, span = self.width, self.vocab, layout.length - n
        widths: tuple[int, ...] = ()
        spine = 1
        if span > layout.jacobi_tail:
            depths = min(self.depth - 1, span - 1)
            widths = tuple(1 if self.body.forced_host[n - 1 + d] else width for d in range(1, depths + 1))
            spine = min(span, self.window - branch_nodes(widths))
        tree, mask, grid, grid_of = self._shape(spine, widths)
        n_drafts = spine - 1
        spine_tokens, spine_probs, anchor = self.spine(slot, state.carried, state.carried_probs, n_drafts)
        depths = len(widths)
        have = 0 if state.siblings is None else min(state.siblings.shape[0], depths)
        noise = exponential_noise((depths - have, width - 1, vocab), slot.generator, self.device)
        exclude = F.one_hot(spine_tokens[have:depths], vocab).bool()
        new, new_valid = without_replacement(torch.ones(exclude.shape, device=self.device), noise, exclude)
        sib_tokens, sib_probs, sib_valid = new, self.fresh_probs(new.flatten()).view(*new.shape, vocab), new_valid
        if have:
            sib_tokens = torch.cat([state.siblings[:have], new])
            sib_probs = torch.cat([state.sibling_probs[:have], sib_probs])
            sib_valid = torch.cat([state.sibling_valid[:have], new_valid])
        # candidate table: a placeholder for the root, the spine drafts, then depth by depth the siblings
        dummy = torch.zeros(1, dtype=torch.long, device=self.device)
        cand_tokens = torch.cat([dummy, spine_tokens, sib_tokens.flatten()])
        cand_probs = torch.cat([spine_probs.new_zeros(1, vocab), spine_probs, sib_probs.flatten(0, 1)])
        cand_valid = torch.cat([dummy.bool(), torch.ones(n_drafts, dtype=torch.bool, device=self.device), sib_valid.flatten()])
        index = [0] + [len(b) if b[-1] == 0 else spine + (len(b) - 1) * (width - 1) + b[-1] - 1 for b in tree.branches[1:]]
        index = to_device(index, self.device)
        positions = (n - 1 + mask.depth).clamp_min(0)
        forced = self.body.is_forced[positions] & (mask.depth > 0)
        tokens = cand_tokens[index]
        ids = torch.where(forced, self.body.forced[positions], self.body.image_ids[tokens])
        ids = torch.cat([anchor, ids[1:]])
        return TreeWindow(tree, mask, grid, grid_of, tokens, cand_probs[index], cand_valid[index], forced, ids)

    def propose(self, slots: list[Slot | None]) -> Proposal:
        (slot,) = slots
        w = self._window(slot)
        return Proposal(w.ids.unsqueeze(0), [slot.n == 0], [True], w.tree.size, w.mask, [w])

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """RRS over the tree, then the accepted path plus the residual (or bonus) sample (:func:`verify_tree_window`)."""
        (slot,), (w,) = slots, proposal.windows
        shared = None if slot.draft.shared is None else slot.draft.shared[slot.n + w.mask.depth].unsqueeze(0)
        return verify_tree_window(self, rule, slot, w, target[0], target_entropy[0], shared, deepest=self.code_parity)

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """The next window's candidates for the depths after the commit, each recorded with its target ``q_j`` of this
        forward (stale context), along the path's continuation (``Tree.continuation``).

        Candidate 0 (Adaptive Continuation): the old draft maximally coupled with ``q_j`` (``coupling=maximal``; the
        node's row sample where there is no old draft, and for ``coupling=none`` / ``gumbel``). Proactive Drafting:
        for the first ``D - 1`` depths, ``K - 1`` siblings drawn one after the other from ``q_j`` without the earlier
        candidates. ``code_parity``: the released code's candidates instead (:meth:`_code_candidates`).
        """
        (slot,), out = slots, verified.detail
        w, target, state = out.window, target[0], slot.draft
        tree, gen, vocab, width = w.tree, slot.generator, self.vocab, self.width
        heads = tree.continuation(out.last)[1:]  # heads[j - 1]: the node whose q is the target of new depth j
        olds = [tree.children[t][0] if tree.children[t] else -1 for t in heads]
        law = target[to_device(heads, self.device)]
        depths = min(self.depth - 1, len(heads))
        if self.code_parity:
            first, siblings, valid = self._code_candidates(w, law, out.verdict, out.accepted, heads, olds, gen)
        else:
            first = out.samples[to_device(heads, self.device)]
            coupled = [j for j, o in enumerate(olds) if o >= 0]
            if self.coupling == "maximal" and coupled:
                rows, old = to_device(coupled, self.device), to_device([olds[j] for j in coupled], self.device)
                first = first.index_put((rows,), couple_drafts(law[rows], w.tokens[old], w.probs[old], gen))
            noise = exponential_noise((depths, width - 1, vocab), gen, self.device)
            siblings, valid = without_replacement(law[:depths], noise, F.one_hot(first[:depths], vocab).bool())
        state.carried, state.carried_probs = first, law
        state.siblings, state.sibling_valid = siblings[:depths], valid[:depths]
        state.sibling_probs = law[:depths].unsqueeze(1).expand(-1, width - 1, -1)

    def _code_candidates(self, w: TreeWindow, law: torch.Tensor, verdict: TreeVerdict, accepted: list[bool],
                         heads: list[int], olds: list[int], gen: torch.Generator,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The released code's candidates (docs/ALGORITHMS.md "SJD-PAC"): ``K`` distinct draws from a residual
        ``Res_j``; an old draft that passed its test (same uniform) stays candidate 0 and the first ``K - 1`` draws are
        its siblings, else the ``K`` draws are the candidates. ``Res_j``: ``norm([q_j - p_j]_+)`` where it passed, the
        all-children-rejected residual of its parent where it failed, ``q_j`` where there is no old draft."""
        count, width = len(heads), self.width
        has = to_device([o >= 0 for o in olds], self.device, torch.bool)
        passed = to_device([o >= 0 and bool(accepted[o]) for o in olds], self.device, torch.bool)
        old = to_device([max(o, 0) for o in olds], self.device)
        cell = [w.grid_of.get(t, (0, 0)) for t in heads]
        final = verdict.final[to_device([c[0] for c in cell], self.device), to_device([c[1] for c in cell], self.device)]
        residual = torch.where(passed.unsqueeze(-1), lossless_residual(law, w.probs[old]),
                               torch.where(has.unsqueeze(-1), final, law))
        noise = exponential_noise((count, width, self.vocab), gen, self.device)
        draws, exists = without_replacement(residual, noise, torch.zeros(residual.shape, dtype=torch.bool, device=self.device))
        keep = passed.unsqueeze(-1)
        cands = torch.where(keep, torch.cat([w.tokens[old].unsqueeze(-1), draws[:, :-1]], -1), draws)
        valid = torch.where(keep, torch.cat([keep, exists[:, :-1]], -1), exists)
        return cands[:, 0], cands[:, 1:], valid[:, 1:]
