"""Tree windows of SJD-PAC (CVPR 2026; docs/ALGORITHMS.md "SJD-PAC: tree windows").

A tree window spends the forward's ``L`` nodes (``method.window``) on a root (the anchor: the last
committed token), a **spine** (the chain of an SJD window) and extra **siblings**: the first ``D - 1``
depths under the root form the Cartesian-product tree of the released code (``D`` = ``tree_depth``,
``K`` = ``tree_width``): every node above depth ``D - 1`` has the ``K`` candidates of the next depth as
children, the same ``K`` tokens under every parent, and below depth ``D - 1`` only the spine continues.
Node order: the spine (node ``d`` at depth ``d``), then the other nodes by depth, each depth in
lexicographic order of its branch tuple. A node at depth ``d`` is a draft for body position
``root + d``; it attends to the cache prefix, its ancestors and itself.

Verification is recursive rejection sampling (RRS) in sibling order, generic over the acceptance
rule: child ``k`` of a node is judged with the rule against the running target ``r_q`` (the node's
``q`` for ``k = 0``, else the rule's residual after child ``k - 1``) and its recorded law with the
tokens of the earlier children removed; the first child that passes is taken. With SJD's rule this is
RRS without replacement (Jeon et al.), exactly lossless when the candidates of a depth are drawn one
after the other, each from its recorded law with the earlier ones removed (docs/ALGORITHMS.md "SJD-PAC: tree windows").
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.verify import sample_race


def tree_nodes(width: int, depth: int) -> int:
    """Nodes of the full tree of the first ``depth - 1`` levels plus its root: ``(K^D - 1) / (K - 1)``."""
    return sum(width**d for d in range(depth))


def deepest_tree(window: int, width: int) -> int:
    """The most levels (root included) of a full ``width``-ary tree that ``window`` nodes hold (1: the root alone)."""
    depth, nodes = 1, 1
    while nodes + width**depth <= window:
        nodes += width**depth
        depth += 1
    return depth


def tree_problem(window: int, width: int, depth: int, coupling: str, parity: bool) -> str | None:
    """Why tree settings (``drafter=pac_tree``) cannot run (one line), or None. A tree deeper than the window holds
    names the deepest that fits, not its node count (exponential in the depth: 600 digits at depth 1000)."""
    if width < 2 or depth < 2:
        return (f"drafter.width={width} and drafter.depth={depth} must be >= 2 (a tree branches at depths 1 .. depth-1; "
                "for chain windows use drafter=chain)")
    fits = deepest_tree(window, width)
    if depth > fits:
        nodes = f"{tree_nodes(width, depth)} nodes" if depth <= fits + 2 else f"more than {window} nodes"
        fix = (f"at most drafter.depth={fits} fits ({tree_nodes(width, fits)} nodes)" if fits >= 2
               else f"the window needs >= {1 + width} nodes for any tree")
        return (f"drafter.window={window} cannot hold the tree of drafter.width={width}, drafter.depth={depth} "
                f"({nodes}, (K^D - 1)/(K - 1)): {fix}; raise the window or shrink the tree")
    if parity and coupling != "maximal":
        return f"drafter.code_parity=true reproduces the released code's refresh, which is maximal coupling: got drafter.coupling={coupling!r}"
    return None


@dataclass(frozen=True)
class TreeMask:
    """What a tree forward needs from the adapter: ``depth [N]`` of each node (position id = root position + depth)
    and ``ancestors [N, N]`` (``ancestors[j, i]``: node ``i`` is node ``j`` or one of its ancestors)."""

    depth: torch.Tensor
    ancestors: torch.Tensor

    def visible(self, lengths: torch.Tensor, bound: int) -> torch.Tensor:
        """``[A, N, bound]``: query node ``j`` of cache row ``r`` (whose window starts at index ``lengths[r]``) sees
        every key before the window and, inside it, the keys of its ancestors and itself."""
        nodes = self.depth.numel()
        rel = torch.arange(bound, device=lengths.device) - lengths[:, None]
        inside = (rel >= 0) & (rel < nodes)
        ancestor = self.ancestors[:, rel.clamp(0, nodes - 1)].transpose(0, 1)
        return (rel < 0)[:, None, :] | (inside[:, None, :] & ancestor)


@dataclass(frozen=True)
class Tree:
    """A window tree on the host: per node its branch tuple (one candidate index per depth), parent and children
    (in branch order); ``spine`` nodes ``0 .. spine-1`` are the chain (node ``d`` at depth ``d``)."""

    branches: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    spine: int

    @property
    def size(self) -> int:
        return len(self.branches)

    def depth(self, node: int) -> int:
        return len(self.branches[node])

    @staticmethod
    @functools.cache
    def build(spine: int, widths: tuple[int, ...]) -> Tree:
        """``spine`` chain nodes plus the Cartesian product of ``widths[d-1]`` candidates at depths ``d = 1 ..
        len(widths)`` (``len(widths) <= spine - 1``; a width of 1 is a depth without siblings)."""
        branches = [(0,) * d for d in range(spine)]
        for d in range(1, len(widths) + 1):
            branches += [b for b in itertools.product(*(range(w) for w in widths[:d])) if any(b)]
        return Tree.from_branches(tuple(branches), spine)

    @staticmethod
    def from_branches(branches: tuple[tuple[int, ...], ...], spine: int) -> Tree:
        """The tree of ``branches`` (every prefix of a branch listed before it, the first ``spine`` the chain of
        zeros: node ``d`` at depth ``d``); children in branch order."""
        index = {b: i for i, b in enumerate(branches)}
        parent = (-1, *(index[b[:-1]] for b in branches[1:]))
        children: list[list[int]] = [[] for _ in branches]
        for node in sorted(range(1, len(branches)), key=lambda i: branches[i][-1]):
            children[parent[node]].append(node)
        return Tree(tuple(branches), parent, tuple(map(tuple, children)), spine)

    def mask(self, device: torch.device) -> TreeMask:
        """The adapter's view of this tree (depths and the ancestor-or-self mask)."""
        ancestors = torch.zeros((self.size, self.size), dtype=torch.bool)
        for node in range(self.size):
            i = node
            while i >= 0:
                ancestors[node, i] = True
                i = self.parent[i]
        depth = torch.tensor([len(b) for b in self.branches])
        return TreeMask(depth.to(device), ancestors.to(device))

    def grid(self) -> tuple[list[list[int]], list[list[list[int]]]]:
        """Internal nodes (those with children) as a ``[X, depths]`` grid (-1 padded), the depth on the last axis
        as the rules expect of window positions (COOL-SD's schedule), and each one's children ``[K, X, depths]``."""
        internal = [node for node in range(self.size) if self.children[node]]
        if not internal:  # a root alone (the AR tail): nothing to verify
            return [], []
        depths = max(self.depth(node) for node in internal) + 1
        columns: list[list[int]] = [[] for _ in range(depths)]
        for node in internal:
            columns[self.depth(node)].append(node)
        rows = max(len(c) for c in columns)
        nodes = [[columns[d][x] if x < len(columns[d]) else -1 for d in range(depths)] for x in range(rows)]
        width = max(len(self.children[node]) for node in internal)
        kids = [[[self.children[v][k] if v >= 0 and k < len(self.children[v]) else -1 for v in row] for row in nodes]
                for k in range(width)]
        return nodes, kids

    def path(self, accepted: Sequence[bool], deepest: bool = False) -> list[int]:
        """The accepted path from the root. RRS order: at each node the first accepted child. ``deepest`` (the
        released code's row choice, docs/ALGORITHMS.md "SJD-PAC: tree windows"): the deepest node whose path is all accepted, the
        lexicographically first branch tuple on ties, whatever the sibling order."""
        if not deepest:
            path = [0]
            while True:
                step = next((c for c in self.children[path[-1]] if accepted[c]), None)
                if step is None:
                    return path
                path.append(step)
        reach = [True] * self.size
        for node in range(1, self.size):  # a parent always precedes its children
            reach[node] = reach[self.parent[node]] and bool(accepted[node])
        node = min((v for v in range(self.size) if reach[v]), key=lambda v: (-self.depth(v), self.branches[v]))
        path = [node]
        while path[-1] > 0:
            path.append(self.parent[path[-1]])
        return path[::-1]

    def continuation(self, last: int) -> list[int]:
        """Nodes at depths ``depth(last), depth(last) + 1, ...`` that continue the committed path for the refresh:
        first children (branch 0) while there are any, then the spine (the released code's rows)."""
        seq = [last]
        while True:
            node, below = seq[-1], self.depth(seq[-1]) + 1
            if self.children[node]:
                seq.append(self.children[node][0])
            elif below < self.spine:
                seq.append(below)
            else:
                return seq


def branch_nodes(widths: Sequence[int]) -> int:
    """Nodes besides the spine in :meth:`Tree.build`'s tree."""
    return sum(math.prod(widths[:d]) - 1 for d in range(1, len(widths) + 1))


@dataclass
class TreeVerdict:
    """RRS outcome of one tree window, on the device. ``accepted [N]``: the node passed its test against its running
    target (computed for every node, as if every earlier sibling had been rejected; the root: False);
    ``relaxed [N]``: accepted where ``min(1, q/p)`` would have rejected; ``filter_pass [N]`` (CSD);
    ``final [X, depths, V]``: per internal node of the grid, the residual left after all its children;
    ``final_fallback [X, depths]``: that residual descends from a rule's fallback law (a residual without mass)."""

    accepted: torch.Tensor
    relaxed: torch.Tensor
    filter_pass: torch.Tensor | None
    final: torch.Tensor
    final_fallback: torch.Tensor


def verify_tree(
    rule: AcceptanceRule,
    grid: tuple[torch.Tensor, torch.Tensor],
    target_probs: torch.Tensor,
    target_entropy: torch.Tensor,
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    valid: torch.Tensor,
    forced: torch.Tensor,
    uniforms: torch.Tensor,
) -> TreeVerdict:
    """Recursive rejection sampling over every internal node at once (docs/ALGORITHMS.md "SJD-PAC: tree windows").

    ``grid``: :meth:`Tree.grid` as device tensors. Per node ``[N]`` / ``[N, V]``: ``target_probs`` (the node's
    ``q``, which predicts its children), ``tokens`` and ``draft_probs`` (the candidate and its recorded law),
    ``valid`` (a candidate exists: a depth whose law has fewer than ``K`` tokens has invalid siblings, never
    accepted), ``forced`` (structural tokens: always accepted) and ``uniforms`` (one per node).

    Child ``k`` of a node: ``r_pk = norm(p_k`` with children ``0 .. k-1`` zeroed``)``; accepted if
    ``u < b(r_qk, r_pk, x_k)``; ``r_q(k+1) = rule.residual(r_qk, r_pk, x_k)`` (SJD: ``norm([r_qk - r_pk]_+)``).
    """
    nodes, kids = grid
    count, vocab = draft_probs.shape
    at = nodes.clamp_min(0)
    running = target_probs[at]
    entropy = target_entropy[at]
    removed = torch.zeros(running.shape, dtype=torch.bool, device=running.device)
    fell_back = torch.zeros(running.shape[:-1], dtype=torch.bool, device=running.device)
    flags = torch.zeros((3, count + 1), dtype=torch.bool, device=running.device)
    has_filter = False
    for k in range(kids.shape[0]):
        child = kids[k].clamp_min(0)
        present = (kids[k] >= 0) & valid[child]
        token = tokens[child]
        law = draft_probs[child]
        if k > 0:
            law = law.masked_fill(removed, 0.0)
            law = law / law.sum(-1, keepdim=True).clamp_min(1e-30)
        verdict = rule.accept_prob(running, law, token, entropy)
        free = ~forced[child]
        passed = present & (uniforms[child] < torch.where(forced[child], 1.0, verdict.accept_prob))
        slot = torch.where(present, child, count).flatten()  # absent children write to a spare slot
        flags[0].index_put_((slot,), passed.flatten())
        flags[1].index_put_((slot,), (passed & free & (uniforms[child] >= verdict.lossless_prob)).flatten())
        if verdict.filter_pass is not None:
            has_filter = True
            flags[2].index_put_((slot,), (verdict.filter_pass & free).flatten())
        residual = rule.residual(running, law, token)
        running = torch.where(present.unsqueeze(-1), residual.probs, running)
        fell_back = fell_back | (present & residual.fallback)
        removed = removed | (present.unsqueeze(-1) & F.one_hot(token, vocab).bool())
    flags = flags[:, :count]
    return TreeVerdict(flags[0], flags[1], flags[2] if has_filter else None, running, fell_back)


def without_replacement(probs: torch.Tensor, noise: torch.Tensor, exclude: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` draws one after the other from ``probs [..., V]``, each from the law with ``exclude [..., V]`` and the
    earlier draws removed (exponential races with ``noise [..., k, V]``). Returns the tokens ``[..., k]`` and
    whether each exists (False once the remaining law has no mass: the token is then 0, never used)."""
    tokens, valid = [], []
    for i in range(noise.shape[-2]):
        left = probs.masked_fill(exclude, 0.0)
        exists = left.sum(-1) > 0
        # an exhausted law has no sample: race over the uniform law instead and discard the draw
        drawable = torch.where(exists.unsqueeze(-1), left, torch.ones_like(left))
        token = torch.where(exists, sample_race(drawable, noise[..., i, :]), 0)
        tokens.append(token)
        valid.append(exists)
        exclude = exclude | (exists.unsqueeze(-1) & F.one_hot(token, probs.shape[-1]).bool())
    return torch.stack(tokens, -1), torch.stack(valid, -1)
