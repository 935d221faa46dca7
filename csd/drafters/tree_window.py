"""What every tree-window drafter shares (docs/ALGORITHMS.md "SJD-PAC: tree windows"): one image's tree window, its
verification by recursive rejection sampling (:func:`csd.tree.verify_tree`) and the iteration's counters.

A drafter builds a :class:`TreeWindow` (per node its candidate and the law it was drawn from, the recorded ``p``) and
hands it to :func:`verify_tree_window`, which judges it with any rule, reads the one host synchronisation and returns
the accepted path plus the residual (or bonus) sample. ``drafter=pac_tree`` (candidates from stale targets and fresh
random tokens) and ``drafter=eagle`` with a static tree (candidates from the head) both verify this way, one image at
a time; :func:`verify_tree_windows` verifies a batch of windows of one shape at once (``drafter=hawk``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from csd.acceptance import AcceptanceRule
from csd.device import to_device
from csd.drafters.base import STAT_KEYS, Drafter, Verified
from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.tree import Tree, TreeMask, TreeVerdict, verify_tree
from csd.verify import WindowNoise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot

#: a tree's verification grid on the device (:meth:`csd.tree.Tree.grid`) and each internal node's grid cell
Grid = tuple[tuple[torch.Tensor, torch.Tensor], dict[int, tuple[int, int]]]


@dataclass
class TreeWindow:
    """One image's tree window: per node its candidate, recorded ``p``, whether the candidate exists, whether its
    position is forced, and its model input id (node 0: the anchor); the verification grid of its shape."""

    tree: Tree
    mask: TreeMask
    grid: tuple[torch.Tensor, torch.Tensor]
    grid_of: dict[int, tuple[int, int]]
    tokens: torch.Tensor
    probs: torch.Tensor
    valid: torch.Tensor
    forced: torch.Tensor
    ids: torch.Tensor


@dataclass
class TreeOutcome:
    """What a refresh needs of a verified tree window."""

    window: TreeWindow
    samples: torch.Tensor
    verdict: TreeVerdict
    accepted: list[bool]
    last: int


def tree_grid(tree: Tree, device: torch.device) -> Grid:
    """``tree``'s verification grid as device tensors, and each internal node's ``(row, depth)`` cell in it."""
    nodes, kids = tree.grid()
    grid_of = {v: (x, d) for x, row in enumerate(nodes) for d, v in enumerate(row) if v >= 0}
    depths = len(nodes[0]) if nodes else 0
    grid = (torch.tensor(nodes, dtype=torch.long).view(len(nodes), depths).to(device),
            torch.tensor(kids, dtype=torch.long).view(len(kids), len(nodes), depths).to(device))
    return grid, grid_of


def verify_tree_window(drafter: Drafter, rule: AcceptanceRule, slot: Slot, w: TreeWindow, target: torch.Tensor,
                       target_entropy: torch.Tensor, shared: torch.Tensor | None = None, deepest: bool = False) -> Verified:
    """RRS over the tree window ``w`` (targets ``[N, V]``, entropies ``[N]``), then the accepted path plus the residual
    (or bonus) sample (docs/ALGORITHMS.md "SJD-PAC: tree windows", Verification). ``shared``: Gumbel-sharing noise of
    the nodes' row samples ``[1, N, V]`` or None; ``deepest``: the released SJD-PAC code's row choice. The
    ``drafter_forwards`` counter is 0 (a drafter with forwards of its own adds them)."""
    tree, size, device = w.tree, w.tree.size, drafter.device
    # the chain's draw order (row samples, uniforms, residual); node j's row sample is for position n + depth(j)
    noise = WindowNoise.draw(1, size, drafter.vocab, slot.generator, device, shared)
    samples = sample_race(target, noise.samples[0])
    uniforms = torch.cat([noise.uniforms.new_ones(1), noise.uniforms[0]])
    verdict = verify_tree(rule, w.grid, target, target_entropy, w.tokens, w.probs, w.valid, w.forced, uniforms)
    filtered = torch.zeros_like(verdict.accepted) if verdict.filter_pass is None else verdict.filter_pass
    flags = torch.stack([verdict.accepted, verdict.relaxed, filtered, w.valid]).tolist()  # the one host sync
    path = tree.path(flags[0], deepest=deepest)
    last = path[-1]
    # all children of the last node rejected: a sample of the final residual; a leaf: the bonus sample of its q
    rejected_all = bool(tree.children[last])
    final = sample_race(verdict.final[w.grid_of[last]], noise.residual[0]) if rejected_all else samples[last]
    accepted = to_device(path[1:], device)
    tokens = torch.cat([w.tokens[accepted], final.view(1)])
    kinds = to_device([COMMIT_RELAXED if flags[1][v] else COMMIT_ACCEPTED for v in path[1:]] + [COMMIT_SAMPLED], device)
    counters = tree_stats(drafter.body.forced_host, slot.n, tree, path, flags, verdict.filter_pass is not None)
    stats = to_device(counters + [0, 0, 0], device)
    if rejected_all:  # the final residual's fallback flag stays on the device (no extra host sync)
        stats[STAT_KEYS.index("residual_fallbacks")] = verdict.final_fallback[w.grid_of[last]]
    entropies = target_entropy[to_device(path, device)]
    outcome = TreeOutcome(w, samples, verdict, flags[0], last)
    return Verified([len(path)], tokens[None], kinds[None], entropies[None], stats[None], [path], outcome)


def tree_stats(forced_host: Sequence[bool], n: int, tree: Tree, path: list[int], flags: list[list[bool]],
               filtered: bool) -> list[int]:
    """The iteration's counters (STAT_KEYS but the fallback count, the drafter's forwards and the skips) for a tree
    window, free (unforced, existing) nodes only: proposed = every node of the window; verified = the children RRS
    judged along the committed path (up to the accepted one, at the last node all of them); accepted / relaxed =
    nodes of the path; filter counts over verified."""
    _, relaxed, passes, valid = flags

    def free(v: int) -> bool:
        return bool(valid[v]) and not forced_host[n - 1 + tree.depth(v)]

    verified = []
    for i, node in enumerate(path):
        kids = tree.children[node]
        verified += kids[: kids.index(path[i + 1]) + 1] if i + 1 < len(path) else kids
    verified = [v for v in verified if free(v)]
    on_path = [v for v in path[1:] if free(v)]
    return [
        sum(free(v) for v in range(1, tree.size)), len(verified), len(on_path), sum(relaxed[v] for v in on_path),
        len(verified) if filtered else 0, sum(passes[v] for v in verified) if filtered else 0,
    ]


def verify_tree_windows(drafter: Drafter, rule: AcceptanceRule, slots: Sequence[Slot | None],
                        windows: Sequence[TreeWindow | None], target: torch.Tensor,
                        target_entropy: torch.Tensor) -> Verified:
    """:func:`verify_tree_window` for a batch of tree windows of **one shape** (``windows[b]`` None: an empty slot),
    with the iteration's one host synchronisation for all of them: the windows are verified as one forest (node ``j``
    of the ``a``-th active window is forest node ``a N + j``; :func:`csd.tree.verify_tree` treats every internal node
    alike, so its grid is the windows' grids side by side). Each image draws its random numbers from its own generator
    in :func:`verify_tree_window`'s order, so its tokens do not depend on the batch. ``target [B, N, V]``,
    ``target_entropy [B, N]``. Returns the slots' :class:`Verified` (``counts`` 0 and ``keep`` empty for an empty slot;
    ``detail``: each slot's :class:`TreeOutcome` or None)."""
    active = [b for b, w in enumerate(windows) if w is not None]
    batch, device, vocab = len(windows), drafter.device, drafter.vocab
    first = windows[active[0]]
    tree, size = first.tree, first.tree.size
    rows = to_device(active, device)
    noises = [WindowNoise.draw(1, size, vocab, slots[b].generator, device) for b in active]
    samples = torch.stack([sample_race(target[b], noise.samples[0]) for b, noise in zip(active, noises, strict=True)])
    uniforms = torch.cat([torch.cat([noise.uniforms.new_ones(1), noise.uniforms[0]]) for noise in noises])
    nodes, kids = first.grid
    shift = (torch.arange(len(active), device=device) * size).view(-1, 1, 1)
    forest_nodes = torch.where(nodes >= 0, nodes + shift, -1).flatten(0, 1)
    forest_kids = torch.where(kids.unsqueeze(1) >= 0, kids.unsqueeze(1) + shift, -1).flatten(1, 2)

    def cat(name: str) -> torch.Tensor:
        return torch.cat([getattr(windows[b], name) for b in active])

    valid = cat("valid")
    verdict = verify_tree(rule, (forest_nodes, forest_kids), target[rows].flatten(0, 1),
                          target_entropy[rows].flatten(), cat("tokens"), cat("probs"), valid, cat("forced"), uniforms)
    filtered = torch.zeros_like(verdict.accepted) if verdict.filter_pass is None else verdict.filter_pass
    flags = torch.stack([verdict.accepted, verdict.relaxed, filtered, valid]).tolist()  # the one host sync
    cells = nodes.shape[0]
    counts, paths = [0] * batch, [[] for _ in range(batch)]
    outcomes: list[TreeOutcome | None] = [None] * batch
    tokens, kinds, entropies, stats = [], [], [], []
    for a, b in enumerate(active):
        w, own = windows[b], [f[a * size : (a + 1) * size] for f in flags]
        path = tree.path(own[0])
        last = path[-1]
        rejected_all = bool(tree.children[last])
        x, depth = w.grid_of[last] if rejected_all else (0, 0)
        final = (sample_race(verdict.final[a * cells + x, depth], noises[a].residual[0]) if rejected_all
                 else samples[a, last])
        at = to_device(path[1:], device)
        tokens.append(torch.cat([w.tokens[at], final.view(1)]))
        kinds.append(to_device([COMMIT_RELAXED if own[1][v] else COMMIT_ACCEPTED for v in path[1:]] + [COMMIT_SAMPLED], device))
        counters = to_device(tree_stats(drafter.body.forced_host, slots[b].n, tree, path, own,
                                        verdict.filter_pass is not None) + [0, 0, 0], device)
        if rejected_all:  # the final residual's fallback flag stays on the device (no extra host sync)
            counters[STAT_KEYS.index("residual_fallbacks")] = verdict.final_fallback[a * cells + x, depth]
        stats.append(counters)
        entropies.append(target_entropy[b, to_device(path, device)])
        counts[b], paths[b] = len(path), path
        outcomes[b] = TreeOutcome(w, samples[a], verdict, own[0], last)
    width = max(counts)
    out_tokens = torch.zeros((batch, width), dtype=torch.long, device=device)
    out_kinds = torch.zeros((batch, width), dtype=torch.long, device=device)
    out_entropy = torch.zeros((batch, width), dtype=target_entropy.dtype, device=device)
    out_stats = torch.zeros((batch, len(STAT_KEYS)), dtype=torch.long, device=device)
    for a, b in enumerate(active):
        m = counts[b]
        out_tokens[b, :m], out_kinds[b, :m], out_entropy[b, :m], out_stats[b] = tokens[a], kinds[a], entropies[a], stats[a]
    return Verified(counts, out_tokens, out_kinds, out_entropy, out_stats, paths, outcomes)
