"""The speculative Jacobi engine (docs/ALGORITHMS.md, "The engine loop"), batched over images.

State of an image between iterations: ``n`` committed body tokens (the cache holds the prompt and all
of them except the last, which is the next window's anchor) and the carried drafts with their
recorded distributions. One iteration, for every image in flight at once (ragged: each has its own
``n``, window and acceptance):

1. window = anchor + carried drafts + fresh drafts (``init``: ``random`` | ``repeat_left``; one-hot p),
   ``K = min(L, N - n)`` rows so no draft lies past the image (``K = 1`` in the AR tail); shorter
   windows are padded to the batch's longest and their padding is never committed;
2. one forward for the whole batch; 3. processors -> ``q`` per row, a sample ``y_j ~ q_j`` per row;
4-5. :func:`csd.verify.verify_window` commits ``m`` tokens per image;
6. refresh: ``y_m .. y_{K-1}`` become the next drafts, recorded distributions ``q_m .. q_{K-1}``;
7. roll each image's cache back by its rejected tail.

AR is the same loop with ``L = 1``; batch 1 is the same loop with one slot. An image's random numbers
come from its own generator (seeded with its seed) in a fixed order, so its tokens depend only on
(prompt, seed), never on its neighbours or the batch size. When an image finishes, the next request
takes its slot (continuous refill). The only host synchronisation per iteration is reading the ``m``s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule, entropy, lossless_residual
from csd.adapters.base import ModelAdapter, to_device
from csd.processors import TargetPipeline
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.tree import Tree, TreeMask, branch_nodes, tree_problem, verify_tree, without_replacement
from csd.verify import WindowNoise, couple_drafts, exponential_noise, sample_race, verify_window

INIT_SCHEMES = ("random", "repeat_left")
COUPLINGS = ("none", "maximal", "gumbel")
#: the recorded ``p`` of a fresh random draft: one-hot on itself, or the uniform law it was drawn from
DRAFT_RECORDS = ("onehot", "uniform")
STAT_KEYS = ("drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes",
             "residual_fallbacks")


@dataclass(frozen=True)
class Request:
    """One image to decode; ``key`` is the caller's handle, returned with the result."""

    prompt: str
    seed: int
    key: Any = None


@dataclass
class Generation:
    """One decoded image body plus everything the records need.

    ``prefill_s`` / ``decode_s`` (device-synchronised seconds) are per-image latencies only at batch 1;
    in a batch images share every forward, so they are None there (``batched``).
    """

    tokens: torch.Tensor
    nfe: int
    stats: dict[str, int]
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    prefill_s: float | None
    decode_s: float | None
    batched: bool = False

    @property
    def step_compression(self) -> float:
        return self.tokens.numel() / max(self.nfe, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Image:
    """Decoding state of one image in a batch slot (host ints, device tensors)."""

    request: Request
    generator: torch.Generator
    body: torch.Tensor
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    stats: torch.Tensor
    carried: torch.Tensor
    carried_probs: torch.Tensor
    #: Gumbel sharing: one Exp(1) noise vector per body position, reused until that position is committed
    shared: torch.Tensor | None
    times: list[float] = field(default_factory=list)
    #: tree windows: the carried extra candidates ``[S, K-1]`` of the next window's depths ``1 .. S`` (Proactive
    #: Drafting), their recorded ``p`` ``[S, K-1, V]`` and whether each exists
    siblings: torch.Tensor | None = None
    sibling_probs: torch.Tensor | None = None
    sibling_valid: torch.Tensor | None = None
    n: int = 0
    iteration: int = 0


@dataclass
class _Window:
    """One image's window of an iteration: ``rows`` target rows, its drafts and their recorded ``p``."""

    rows: int
    drafts: torch.Tensor
    draft_probs: torch.Tensor
    ids: torch.Tensor


@dataclass
class _TreeWindow:
    """One image's tree window (``csd.tree``): per node its candidate index, recorded ``p``, whether the
    candidate exists, whether its position is forced, and its model input id (node 0: the anchor)."""

    tree: Tree
    mask: TreeMask
    grid: tuple[torch.Tensor, torch.Tensor]
    grid_of: dict[int, tuple[int, int]]
    tokens: torch.Tensor
    probs: torch.Tensor
    valid: torch.Tensor
    forced: torch.Tensor
    ids: torch.Tensor


class JacobiEngine:
    """Speculative Jacobi decoding with a pluggable acceptance rule; ``window=1`` is AR.

    ``batch_size`` images are decoded at once (one forward per iteration for all of them); batch 1 is
    the same loop with one slot. ``tree_width = K > 1``: SJD-PAC's tree windows (``csd.tree``; ``tree_depth``
    levels counting the root, ``window`` nodes per forward; batch 1, eager adapters with tree attention),
    ``pac_code_parity``: the released code's sibling drafts and row choice instead of the lossless ones.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        rule: AcceptanceRule,
        window: int = 16,
        init: str = "random",
        pad_window: bool = False,
        coupling: str = "none",
        batch_size: int = 1,
        draft_record: str = "onehot",
        tree_width: int = 1,
        tree_depth: int = 1,
        pac_code_parity: bool = False,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES}, got {init!r}")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS}, got {coupling!r}")
        if draft_record not in DRAFT_RECORDS:
            raise ValueError(f"draft_record must be one of {DRAFT_RECORDS}, got {draft_record!r}")
        if draft_record == "uniform" and init != "random":
            raise ValueError("draft_record='uniform' records the law of init='random' drafts; repeat_left drafts are not drawn from it")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        problem = tree_problem(window, tree_width, tree_depth, coupling, pac_code_parity)
        if problem is None and tree_width > 1:
            if batch_size > 1:
                problem = f"tree windows (method.tree_width={tree_width}) decode one image at a time: engine.batch_size must be 1, got {batch_size}"
            elif pad_window:
                problem = "tree windows run eagerly: engine.compile must be false"
            elif not adapter.tree_attention:
                problem = f"tree windows (method.tree_width={tree_width}) need an adapter with tree attention; {type(adapter).__name__} has none"
        if problem is not None:
            raise ValueError(problem)
        self.adapter, self.rule, self.window, self.init = adapter, rule, window, init
        # maximal (MC-SJD): refreshed drafts are old drafts maximally coupled with their new targets
        # (recorded p = new q); gumbel: every sample for body position n uses the same Exp(1) noise E_n
        self.coupling = coupling
        # compiled path: every multi-token forward has exactly `window` rows (two step shapes in all)
        self.pad_window = pad_window
        self.batch_size = batch_size
        # a fresh random draft is drawn uniformly: recording that law (SJD-PAC's code) is as lossless as a
        # one-hot and accepts with min(1, V q(x)) instead of q(x) (docs/ALGORITHMS.md "Drafting variants")
        self.draft_record = draft_record
        self.tree_width, self.tree_depth, self.pac_code_parity = tree_width, tree_depth, pac_code_parity
        #: per tree shape: the adapter's mask, the verification grid and each internal node's grid cell
        self._trees: dict[tuple[int, tuple[int, ...]], tuple[TreeMask, tuple[torch.Tensor, torch.Tensor], dict]] = {}
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        layout = adapter.layout
        self.device = adapter.device
        self.forced = layout.forced_ids.to(self.device)
        self.is_forced = self.forced >= 0
        self.forced_host = (layout.forced_ids >= 0).tolist()
        self.cols = layout.cols.tolist()
        self.image_ids = adapter.image_token_ids.to(self.device)
        rule.setup(adapter)

    def body_ids(self, idx: torch.Tensor, start: int) -> torch.Tensor:
        """Image-code indices at body positions ``start ..`` -> adapter token ids (forced ids where forced)."""
        end = start + idx.numel()
        return torch.where(self.is_forced[start:end], self.forced[start:end], self.image_ids[idx])

    def fresh_drafts(self, start: int, count: int, left: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
        """``count`` fresh draft indices for positions ``start ..``; ``left`` is the index at ``start - 1``."""
        rand = torch.randint(self.adapter.vocab_size, (count,), generator=gen, device=self.device)
        if self.init == "random" or count == 0:
            return rand
        # repeat_left: copy the left neighbour in the same image row (random at a row start)
        out = []
        for j in range(count):
            left = rand[j] if (self.cols[start + j] <= 0 or left is None) else left
            out.append(left)
        return torch.stack(out)

    def fresh_probs(self, fresh: torch.Tensor) -> torch.Tensor:
        """The recorded ``p`` of fresh drafts ``[count]``: one-hot rows, or the uniform law over the image codes."""
        vocab = self.adapter.vocab_size
        if self.draft_record == "uniform":
            return torch.full((fresh.numel(), vocab), 1.0 / vocab, device=self.device)
        return F.one_hot(fresh, vocab).float()

    @torch.no_grad()
    def generate(self, prompt: str, seed: int) -> Generation:
        """One image (a batch of one request)."""
        ((_, gen),) = self.generate_many([Request(prompt, seed)])
        return gen

    @torch.no_grad()
    def generate_many(self, requests: Iterable[Request]) -> Iterator[tuple[Request, Generation]]:
        """Decode ``requests`` with up to ``batch_size`` in flight; yields ``(request, generation)`` as each
        image finishes (completion order), and the next request takes the freed slot."""
        pending = iter(requests)
        state = self.adapter.start_batch(self.batch_size)
        slots = [self._start(state, slot, next(pending, None)) for slot in range(self.batch_size)]
        while any(image is not None for image in slots):
            for slot in self._iteration(state, slots):
                image = slots[slot]
                yield image.request, self._finish(image)
                slots[slot] = self._start(state, slot, next(pending, None))

    def _start(self, state: Any, slot: int, request: Request | None) -> _Image | None:
        """Prefill ``slot`` with ``request`` (None: the slot stays empty)."""
        if request is None:
            return None
        device, vocab, length = self.device, self.adapter.vocab_size, self.adapter.layout.length
        gen = torch.Generator(device=device).manual_seed(request.seed)
        times = []
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        self.adapter.prefill_slot(state, slot, request.prompt)
        if self.batch_size == 1:
            synchronize(device)
            times.append(time.perf_counter())
        zeros = torch.zeros(length, dtype=torch.long, device=device)
        # Gumbel sharing (docs/ALGORITHMS.md "Drafting variants"): y_n = argmax q_n / E_n with E_n fixed per
        # body position until n is committed; lossless because E_n is independent of everything that
        # decides whether its draft is accepted (the uniforms and residual noise are drawn separately)
        shared = exponential_noise((length, vocab), gen, device) if self.coupling == "gumbel" else None
        return _Image(
            request=request, generator=gen, body=zeros.clone(), commit_iter=zeros.clone(), commit_kind=zeros.clone(),
            entropy=torch.zeros(length, dtype=torch.float32, device=device),
            stats=torch.zeros(len(STAT_KEYS), dtype=torch.long, device=device),
            carried=zeros[:0], carried_probs=torch.zeros((0, vocab), dtype=torch.float32, device=device),
            shared=shared, times=times,
        )

    def _window(self, image: _Image) -> _Window:
        """The image's next window (SJD step 1): carried drafts topped up with fresh ones."""
        length, tail, n = self.adapter.layout.length, self.adapter.layout.jacobi_tail, image.n
        rows = 1 if length - n <= tail else min(self.window, length - n)
        n_drafts = rows - 1
        keep = min(image.carried.numel(), n_drafts)
        left = image.carried[keep - 1] if keep else (image.body[n - 1] if n else None)
        fresh = self.fresh_drafts(n + keep, n_drafts - keep, left, image.generator)
        drafts = torch.cat([image.carried[:keep], fresh])
        draft_probs = torch.cat([image.carried_probs[:keep], self.fresh_probs(fresh)])
        # column 0 is the anchor: the last committed token (the adapter puts the prompt tail there when n = 0)
        anchor = self.body_ids(image.body[n - 1 : n], n - 1) if n else self.image_ids[:1]
        return _Window(rows, drafts, draft_probs, torch.cat([anchor, self.body_ids(drafts, n)]))

    def _iteration(self, state: Any, slots: list[_Image | None]) -> list[int]:
        """One forward for every image in flight; returns the slots whose image is now complete."""
        if self.tree_width > 1:
            return self._tree_iteration(state, slots)
        device, vocab = self.device, self.adapter.vocab_size
        windows = [None if image is None else self._window(image) for image in slots]
        rows = max(w.rows for w in windows if w is not None)
        fed = self.window if (self.pad_window and rows > 1) else rows
        # padding repeats a window's last token (an empty slot: any token); its outputs are dropped and rolled back
        ids = torch.stack([
            self.image_ids[:1].expand(fed) if w is None else torch.cat([w.ids, w.ids[-1:].expand(fed - w.rows)])
            for w in windows
        ])
        active = [w is not None for w in windows]
        raw = self.adapter.forward_batch(state, ids, [w is not None and image.n == 0 for image, w in zip(slots, windows, strict=True)], active)
        target = self.pipeline(raw[:, :, :rows])
        target_ent = entropy(target)

        # each image draws its window's random numbers from its own generator, exactly as at batch 1;
        # windows shorter than the batch's are padded (padding is never accepted nor committed)
        noise = WindowNoise(target.new_ones((len(slots), rows, vocab)), target.new_zeros((len(slots), rows - 1)),
                            target.new_ones((len(slots), vocab)))
        drafts = torch.zeros((len(slots), rows - 1), dtype=torch.long, device=device)
        draft_probs = F.one_hot(drafts, vocab).float()
        forced = torch.zeros((len(slots), rows - 1), dtype=torch.bool, device=device)
        for b, (image, w) in enumerate(zip(slots, windows, strict=True)):
            if w is None:
                continue
            shared = None if image.shared is None else image.shared[image.n : image.n + w.rows].unsqueeze(0)
            own = WindowNoise.draw(1, w.rows, vocab, image.generator, device, shared)
            noise.samples[b, : w.rows], noise.uniforms[b, : w.rows - 1], noise.residual[b] = own.samples[0], own.uniforms[0], own.residual[0]
            drafts[b, : w.rows - 1], draft_probs[b, : w.rows - 1] = w.drafts, w.draft_probs
            forced[b, : w.rows - 1] = self.is_forced[image.n : image.n + w.rows - 1]
        n_drafts = to_device([0 if w is None else w.rows - 1 for w in windows], device)
        result, samples = verify_window(self.rule, target, target_ent, drafts, draft_probs, forced, noise, n_drafts)
        kind = torch.full((len(slots), rows), COMMIT_SAMPLED, dtype=torch.long, device=device)
        kind[:, : rows - 1] = torch.where(
            result.accepted, torch.where(result.relaxed, COMMIT_RELAXED, COMMIT_ACCEPTED), COMMIT_SAMPLED
        )
        iteration_stats = self._iteration_stats(result, n_drafts, forced)
        refreshed = samples
        if self.coupling == "maximal":
            refreshed = torch.stack([
                samples[b] if w is None or w.rows == 1 else torch.cat(
                    [couple_drafts(target[b, : w.rows - 1], w.drafts, w.draft_probs, slots[b].generator), samples[b, w.rows - 1 :]]
                )
                for b, w in enumerate(windows)
            ])

        committed = (result.n_accepted + 1).tolist()  # the one host synchronisation of the iteration
        self.adapter.rollback_batch(state, [fed - (m if w is not None else 0) for m, w in zip(committed, windows, strict=True)])
        done = []
        for b, (image, w, m) in enumerate(zip(slots, windows, committed, strict=True)):
            if image is None:
                continue
            image.carried, image.carried_probs = refreshed[b, m : w.rows], target[b, m : w.rows]
            if self._advance(image, result.committed[b, :m], kind[b, :m], target_ent[b, :m], iteration_stats[b]):
                done.append(b)
        return done

    def _advance(self, image: _Image, tokens: torch.Tensor, kinds: torch.Tensor, entropies: torch.Tensor,
                 stats: torch.Tensor) -> bool:
        """Commit ``tokens`` (with their kinds and target entropies) and one iteration's counters; True when the
        image's body is complete."""
        span = slice(image.n, image.n + tokens.numel())
        image.body[span] = tokens
        image.commit_iter[span] = image.iteration
        image.commit_kind[span] = kinds
        image.entropy[span] = entropies
        image.stats += stats
        image.n += tokens.numel()
        image.iteration += 1
        return image.n >= self.adapter.layout.length

    def _tree_shape(self, spine: int, widths: tuple[int, ...]) -> tuple[Tree, TreeMask, tuple[torch.Tensor, torch.Tensor], dict]:
        """The tree of ``spine`` chain nodes and ``widths`` candidates per branching depth, its adapter mask and
        verification grid (built once per shape)."""
        tree = Tree.build(spine, widths)
        key = (spine, widths)
        if key not in self._trees:
            nodes, kids = tree.grid()
            grid_of = {v: (x, d) for x, row in enumerate(nodes) for d, v in enumerate(row) if v >= 0}
            depths = len(nodes[0]) if nodes else 0
            grid = (torch.tensor(nodes, dtype=torch.long).view(len(nodes), depths).to(self.device),
                    torch.tensor(kids, dtype=torch.long).view(len(kids), len(nodes), depths).to(self.device))
            self._trees[key] = (tree.mask(self.device), grid, grid_of)
        return (tree, *self._trees[key])

    def _tree_window(self, image: _Image) -> _TreeWindow:
        """The image's next tree window (NEW_METHODS.md 1.1, csd.tree): the spine is the carried drafts topped up with
        fresh ones (SJD step 1); depths ``1 .. D-1`` get ``K - 1`` siblings, carried ones (Proactive Drafting) or
        fresh distinct random tokens; forced depths get none. ``window`` nodes at most, no draft past the body."""
        layout, n, gen = self.adapter.layout, image.n, image.generator
        width, vocab, span = self.tree_width, self.adapter.vocab_size, layout.length - n
        widths: tuple[int, ...] = ()
        spine = 1
        if span > layout.jacobi_tail:
            depths = min(self.tree_depth - 1, span - 1)
            widths = tuple(1 if self.forced_host[n - 1 + d] else width for d in range(1, depths + 1))
            spine = min(span, self.window - branch_nodes(widths))
        tree, mask, grid, grid_of = self._tree_shape(spine, widths)
        n_drafts = spine - 1
        keep = min(image.carried.numel(), n_drafts)
        left = image.carried[keep - 1] if keep else (image.body[n - 1] if n else None)
        fresh = self.fresh_drafts(n + keep, n_drafts - keep, left, gen)
        spine_tokens = torch.cat([image.carried[:keep], fresh])
        spine_probs = torch.cat([image.carried_probs[:keep], self.fresh_probs(fresh)])
        depths = len(widths)
        have = 0 if image.siblings is None else min(image.siblings.shape[0], depths)
        # fresh siblings: distinct random tokens besides the spine's, recorded like fresh drafts (uniform: RRS
        # removes the earlier candidates from it, which is the law they were drawn from; one-hot: lossless as is)
        noise = exponential_noise((depths - have, width - 1, vocab), gen, self.device)
        exclude = F.one_hot(spine_tokens[have:depths], vocab).bool()
        new, new_valid = without_replacement(torch.ones(exclude.shape, device=self.device), noise, exclude)
        sib_tokens, sib_probs, sib_valid = new, self.fresh_probs(new.flatten()).view(*new.shape, vocab), new_valid
        if have:
            sib_tokens = torch.cat([image.siblings[:have], new])
            sib_probs = torch.cat([image.sibling_probs[:have], sib_probs])
            sib_valid = torch.cat([image.sibling_valid[:have], new_valid])
        # candidate table: a placeholder for the root, the spine drafts, then depth by depth the siblings
        dummy = torch.zeros(1, dtype=torch.long, device=self.device)
        cand_tokens = torch.cat([dummy, spine_tokens, sib_tokens.flatten()])
        cand_probs = torch.cat([spine_probs.new_zeros(1, vocab), spine_probs, sib_probs.flatten(0, 1)])
        cand_valid = torch.cat([dummy.bool(), torch.ones(n_drafts, dtype=torch.bool, device=self.device), sib_valid.flatten()])
        index = [0] + [len(b) if b[-1] == 0 else spine + (len(b) - 1) * (width - 1) + b[-1] - 1 for b in tree.branches[1:]]
        index = to_device(index, self.device)
        positions = (n - 1 + mask.depth).clamp_min(0)
        forced = self.is_forced[positions] & (mask.depth > 0)
        tokens = cand_tokens[index]
        anchor = self.body_ids(image.body[n - 1 : n], n - 1) if n else self.image_ids[:1]
        ids = torch.where(forced, self.forced[positions], self.image_ids[tokens])
        ids = torch.cat([anchor, ids[1:]])
        return _TreeWindow(tree, mask, grid, grid_of, tokens, cand_probs[index], cand_valid[index], forced, ids)

    def _tree_iteration(self, state: Any, slots: list[_Image | None]) -> list[int]:
        """One tree window (batch 1; NEW_METHODS.md 1.5, docs/ALGORITHMS.md "SJD-PAC"): forward with tree attention,
        RRS, commit the accepted path plus the residual (or bonus) sample, keep the path's cache entries, refresh."""
        (image,) = slots
        device, vocab = self.device, self.adapter.vocab_size
        w = self._tree_window(image)
        tree, size = w.tree, w.tree.size
        raw = self.adapter.forward_batch(state, w.ids.unsqueeze(0), [image.n == 0], [True], tree=w.mask)
        target = self.pipeline(raw)[0]
        target_ent = entropy(target)
        # the chain's draw order (row samples, uniforms, residual); node j's row sample is for position n + depth(j)
        shared = None if image.shared is None else image.shared[image.n + w.mask.depth].unsqueeze(0)
        noise = WindowNoise.draw(1, size, vocab, image.generator, device, shared)
        samples = sample_race(target, noise.samples[0])
        uniforms = torch.cat([noise.uniforms.new_ones(1), noise.uniforms[0]])
        verdict = verify_tree(self.rule, w.grid, target, target_ent, w.tokens, w.probs, w.valid, w.forced, uniforms)
        filtered = torch.zeros_like(verdict.accepted) if verdict.filter_pass is None else verdict.filter_pass
        flags = torch.stack([verdict.accepted, verdict.relaxed, filtered, w.valid]).tolist()  # the one host sync
        path = tree.path(flags[0], deepest=self.pac_code_parity)
        last = path[-1]
        # all children of the last node rejected: a sample of the final residual; a leaf: the bonus sample of its q
        rejected_all = bool(tree.children[last])
        final = sample_race(verdict.final[w.grid_of[last]], noise.residual[0]) if rejected_all else samples[last]
        self.adapter.keep_batch(state, size, [path])
        accepted = to_device(path[1:], device)
        tokens = torch.cat([w.tokens[accepted], final.view(1)])
        kinds = to_device([COMMIT_RELAXED if flags[1][v] else COMMIT_ACCEPTED for v in path[1:]] + [COMMIT_SAMPLED], device)
        stats = to_device(self._tree_stats(image.n, tree, path, flags, verdict.filter_pass is not None) + [0], device)
        if rejected_all:  # the final residual's fallback flag stays on the device (no extra host sync)
            stats[-1] = verdict.final_fallback[w.grid_of[last]]
        self._tree_refresh(image, w, target, samples, verdict, flags[0], last)
        return [0] if self._advance(image, tokens, kinds, target_ent[to_device(path, device)], stats) else []

    def _tree_stats(self, n: int, tree: Tree, path: list[int], flags: list[list[bool]], filtered: bool) -> list[int]:
        """The iteration's counters (STAT_KEYS) for a tree window, free (unforced, existing) nodes only: proposed =
        every node of the window; verified = the children RRS judged along the committed path (up to the accepted
        one, at the last node all of them); accepted / relaxed = nodes of the path; filter counts over verified."""
        accepted, relaxed, passes, valid = flags

        def free(v: int) -> bool:
            return bool(valid[v]) and not self.forced_host[n - 1 + tree.depth(v)]

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

    def _tree_refresh(self, image: _Image, w: _TreeWindow, target: torch.Tensor, samples: torch.Tensor,
                      verdict, accepted: list[bool], last: int) -> None:
        """The next window's candidates for the depths after the commit (NEW_METHODS.md 1.4-1.5), each recorded with
        its target ``q_j`` of this forward (stale context), along the path's continuation (``Tree.continuation``).

        Candidate 0 (Adaptive Continuation): the old draft maximally coupled with ``q_j`` (``coupling=maximal``; the
        node's row sample where there is no old draft, and for ``coupling=none`` / ``gumbel``). Proactive Drafting:
        for the first ``D - 1`` depths, ``K - 1`` siblings drawn one after the other from ``q_j`` without the earlier
        candidates. ``pac_code_parity``: the released code's candidates instead (:meth:`_code_candidates`).
        """
        tree, gen, vocab, width = w.tree, image.generator, self.adapter.vocab_size, self.tree_width
        heads = tree.continuation(last)[1:]  # heads[j - 1]: the node whose q is the target of new depth j
        olds = [tree.children[t][0] if tree.children[t] else -1 for t in heads]
        law = target[to_device(heads, self.device)]
        depths = min(self.tree_depth - 1, len(heads))
        if self.pac_code_parity:
            first, siblings, valid = self._code_candidates(w, law, verdict, accepted, heads, olds, gen)
        else:
            first = samples[to_device(heads, self.device)]
            coupled = [j for j, o in enumerate(olds) if o >= 0]
            if self.coupling == "maximal" and coupled:
                rows, old = to_device(coupled, self.device), to_device([olds[j] for j in coupled], self.device)
                first = first.index_put((rows,), couple_drafts(law[rows], w.tokens[old], w.probs[old], gen))
            noise = exponential_noise((depths, width - 1, vocab), gen, self.device)
            siblings, valid = without_replacement(law[:depths], noise, F.one_hot(first[:depths], vocab).bool())
        image.carried, image.carried_probs = first, law
        image.siblings, image.sibling_valid = siblings[:depths], valid[:depths]
        image.sibling_probs = law[:depths].unsqueeze(1).expand(-1, width - 1, -1)

    def _code_candidates(self, w: _TreeWindow, law: torch.Tensor, verdict, accepted: list[bool], heads: list[int],
                         olds: list[int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The released code's candidates (NEW_METHODS.md 1.4, code lines 181-220): ``K`` distinct draws from a residual
        ``Res_j``; an old draft that passed its test (same uniform) stays candidate 0 and the first ``K - 1`` draws are
        its siblings, else the ``K`` draws are the candidates. ``Res_j``: ``norm([q_j - p_j]_+)`` where it passed, the
        all-children-rejected residual of its parent where it failed, ``q_j`` where there is no old draft."""
        count, width = len(heads), self.tree_width
        has = to_device([o >= 0 for o in olds], self.device, torch.bool)
        passed = to_device([o >= 0 and bool(accepted[o]) for o in olds], self.device, torch.bool)
        old = to_device([max(o, 0) for o in olds], self.device)
        cell = [w.grid_of.get(t, (0, 0)) for t in heads]
        final = verdict.final[to_device([c[0] for c in cell], self.device), to_device([c[1] for c in cell], self.device)]
        residual = torch.where(passed.unsqueeze(-1), lossless_residual(law, w.probs[old]),
                               torch.where(has.unsqueeze(-1), final, law))
        noise = exponential_noise((count, width, self.adapter.vocab_size), gen, self.device)
        draws, exists = without_replacement(residual, noise, torch.zeros(residual.shape, dtype=torch.bool, device=self.device))
        keep = passed.unsqueeze(-1)
        cands = torch.where(keep, torch.cat([w.tokens[old].unsqueeze(-1), draws[:, :-1]], -1), draws)
        valid = torch.where(keep, torch.cat([keep, exists[:, :-1]], -1), exists)
        return cands[:, 0], cands[:, 1:], valid[:, 1:]

    def _finish(self, image: _Image) -> Generation:
        """The finished image's record (its decode time when it was decoded alone)."""
        synchronize(self.device)
        prefill_s = decode_s = None
        if self.batch_size == 1:
            t0, t1 = image.times
            prefill_s, decode_s = t1 - t0, time.perf_counter() - t1
        return Generation(
            tokens=self.body_ids(image.body, 0).cpu(),
            nfe=image.iteration,
            stats=dict(zip(STAT_KEYS, image.stats.tolist(), strict=True)),
            commit_iter=image.commit_iter.cpu(),
            commit_kind=torch.where(self.is_forced, COMMIT_FORCED, image.commit_kind).cpu(),
            entropy=image.entropy.cpu(),
            prefill_s=prefill_s,
            decode_s=decode_s,
            batched=self.batch_size > 1,
        )

    def _iteration_stats(self, result, n_drafts: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """Device-side counters ``[B, len(STAT_KEYS)]`` in STAT_KEYS order (forced positions excluded)."""
        positions = torch.arange(forced.shape[1], device=forced.device)
        proposed = ((positions < n_drafts.unsqueeze(-1)) & ~forced).sum(-1)
        verified = result.verified.sum(-1)
        zero = proposed * 0
        checks = verified if result.filter_pass is not None else zero
        passes = result.filter_pass.sum(-1) if result.filter_pass is not None else zero
        return torch.stack([proposed, verified, result.accepted.sum(-1), result.relaxed.sum(-1), checks, passes,
                            result.fallback.long()], dim=-1)
