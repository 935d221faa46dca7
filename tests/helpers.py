"""Shared test helpers: offline environment, tiny models, exact distributions and chi-square tests."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from csd.adapters.anole import AnoleAdapter, tiny_anole_adapter  # noqa: E402
from csd.adapters.base import ModelAdapter
from csd.adapters.emu3 import Emu3Adapter, tiny_emu3_adapter  # noqa: E402
from csd.adapters.janus import JanusAdapter, tiny_janus_adapter  # noqa: E402
from csd.adapters.llamagen import LlamaGenAdapter, tiny_llamagen_adapter  # noqa: E402
from csd.adapters.lumina import LuminaAdapter, tiny_lumina_adapter  # noqa: E402
from csd.engine import JacobiEngine  # noqa: E402
from csd.processors import TargetPipeline  # noqa: E402
from csd.ragged import SlotBatch, reference_logits
from csd.tree import Tree  # noqa: E402


def make_cfg(*overrides: str) -> Any:
    """The run config of ``conf/`` with ``overrides`` (Hydra's compose API, as ``run.py`` builds it)."""
    from hydra import compose, initialize_config_dir

    from csd.presets import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


# --------------------------------------------------------------------------- tiny models that reject drafts
# Seeded, fp32 tiny models whose targets have moderate entropy and move with the previous tokens, so that the
# engine tests see rejected carried drafts, rollbacks and uneven batches (checked with decode_counts). Measured
# over 8 images (SJD, window 5, batch 4; "moves": mean total variation between the targets of one position after
# two prefixes that differ in the previous token only):
#   rejecting_janus()   16 codes, 4x4: target entropy 1.3 nats (log 16 = 2.8), moves 0.54, 43 % of verified
#                       drafts rejected; the shipped head_scale=20 alone: 0.06 nats, moves 0.00 (the image is fixed
#                       by the prompt, only fresh random drafts are rejected)
#   rejecting_lumina()  8 codes, 3x3 + EOL: 1.2 nats (log 8 = 2.1), moves 0.60, 49 % rejected (head_scale 3, the
#                       old test setting: 2.0 nats, nearly uniform)
#   rejecting_emu3()    8 codes, 2x3 + EOL: 1.4 nats, moves 0.44, 51 % rejected (head_scale 3: 2.0 nats)
#   rejecting_llamagen() 16 codes, 4x4, text-conditional: 1.5 nats, moves 0.77 (tests/engine/test_tiny_models.py)
#   rejecting_anole()   8 codes, 3x3 raster: 1.4 nats, moves 0.53
# A new tiny model gets a rejecting_* builder here and a row in tests/engine/test_tiny_models.py.


def rejecting_janus(grid: int = 4, codebook: int = 16, head_scale: float = 10.0, **overrides: Any) -> JanusAdapter:
    """A tiny Janus whose image tokens feed back into the targets (``input_gain``, csd/adapters/janus.py)."""
    return tiny_janus_adapter(grid=grid, codebook=codebook, head_scale=head_scale, input_gain=300.0, **overrides)


def rejecting_lumina(grid: tuple[int, int] = (3, 3), **overrides: Any) -> LuminaAdapter:
    """A tiny Lumina-mGPT with moderately peaked targets (its image tokens already feed back at random init)."""
    return tiny_lumina_adapter(grid=grid, **{"head_scale": 10.0, **overrides})


def rejecting_emu3(grid: tuple[int, int] = (2, 3), **overrides: Any) -> Emu3Adapter:
    """A tiny Emu3 with moderately peaked targets (its image tokens already feed back at random init)."""
    return tiny_emu3_adapter(grid=grid, **{"head_scale": 12.0, **overrides})


def rejecting_llamagen(kind: str = "t2i", **overrides: Any) -> LlamaGenAdapter:
    """A tiny LlamaGen with moderately peaked targets (its image tokens feed back at random init)."""
    return tiny_llamagen_adapter(kind, **{"head_scale": 0.5, **overrides})


def rejecting_anole(grid: tuple[int, int] = (3, 3), **overrides: Any) -> AnoleAdapter:
    """A tiny Anole with moderately peaked targets (the tiny Chameleon's image tokens already feed back)."""
    return tiny_anole_adapter(grid=grid, **{"head_scale": 10.0, **overrides})


@torch.no_grad()
def exact_sequence_distribution(adapter: ModelAdapter, prompt: str) -> dict[tuple[int, ...], float]:
    """P(body) = prod_n q_n(x_n | x_<n) for every free-token sequence, by enumeration (forced tokens fixed)."""
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    layout = adapter.layout
    free = (layout.forced_ids < 0).tolist()
    n_free = sum(free)
    out = {}
    for combo in itertools.product(range(adapter.vocab_size), repeat=n_free):
        it = iter(combo)
        idx = [next(it) if f else 0 for f in free]
        ids = torch.where(layout.forced_ids >= 0, layout.forced_ids, adapter.image_token_ids[torch.tensor(idx)])
        q = pipeline(reference_logits(adapter, prompt, ids[:-1]))  # no cache: the full sequence of each CFG row
        prob = 1.0
        for pos, is_free in enumerate(free):
            if is_free:
                prob *= float(q[pos, idx[pos]])
        out[combo] = prob
    return out


def chi_square_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float], min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells with small expected counts are pooled into one."""
    total = sum(counts.values())
    keys = sorted(probs, key=lambda k: -probs[k])
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key in keys:
        e = probs[key] * total
        if e >= min_expected:
            obs.append(counts.get(key, 0))
            exp.append(e)
        else:
            pool_o += counts.get(key, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp_arr = np.array(exp) * (sum(obs) / sum(exp))
    return float(stats.chisquare(np.array(obs), exp_arr).pvalue)


def random_body(adapter: ModelAdapter, seed: int) -> torch.Tensor:
    """A body of random image ids with the forced structural tokens in place."""
    gen = torch.Generator().manual_seed(seed)
    forced = adapter.layout.forced_ids
    free = adapter.image_token_ids[torch.randint(adapter.vocab_size, forced.shape, generator=gen)]
    return torch.where(forced >= 0, forced, free)


def count_host_reads(monkeypatch) -> list[str]:
    """Record every host read of a device value (``item``, ``int``, ``bool``, ``tolist``, ...) until undone."""
    calls: list[str] = []
    for name in ("item", "__int__", "__bool__", "__float__", "__index__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def one_row_iterations(monkeypatch) -> list[int]:
    """Record every iteration whose windows all have one row (AR, the AR tail) until undone: each commits one token per
    slot, known without reading the device (``csd.drafters.chain.sample_rows``)."""
    import csd.drafters.chain as chain

    calls: list[int] = []
    sample_rows = chain.sample_rows

    def counted(*args, **kwargs):
        calls.append(1)
        return sample_rows(*args, **kwargs)

    monkeypatch.setattr(chain, "sample_rows", counted)
    return calls


def host_reads_per_batched_run(engine, requests, monkeypatch) -> tuple[int, int]:
    """(host reads of device values, iterations with drafts + finished images) while ``engine`` decodes ``requests``:
    the engine's contract is one read per iteration (the committed counts; none when every window has one row) plus
    one per finished image."""
    calls = count_host_reads(monkeypatch)
    one_row = one_row_iterations(monkeypatch)
    iterations = []
    step = engine._iteration

    def counting(state, slots):
        iterations.append(1)
        return step(state, slots)

    monkeypatch.setattr(engine, "_iteration", counting)
    gens = [gen for _, gen in engine.generate_many(requests)]
    monkeypatch.undo()
    return len(calls), len(iterations) - len(one_row) + len(gens)


@contextlib.contextmanager
def active_slots_per_forward() -> Iterator[list[int]]:
    """The number of active slots of every ``SlotBatch.forward`` call made inside the block."""
    calls: list[int] = []
    forward = SlotBatch.forward

    def counting(self, ids, from_prompt, active, **kwargs):
        calls.append(sum(active))
        return forward(self, ids, from_prompt, active, **kwargs)

    SlotBatch.forward = counting
    try:
        yield calls
    finally:
        SlotBatch.forward = forward


class OneImage:
    """One image on the engine's cache (a :class:`SlotBatch` of one slot) with the calls the tests make:
    ``forward(ids, with_prompt_tail)`` (raw logits ``[rows, K(+1), V]``; with the tail, the prompt's last token
    is prepended as the anchor) and ``rollback(n)``."""

    def __init__(self, adapter: ModelAdapter, prompt: str, compiled=None) -> None:
        self.adapter = adapter
        self.batch = SlotBatch(adapter, 1, compiled)
        self.batch.prefill(0, prompt)

    def forward(self, ids: torch.Tensor, with_prompt_tail: bool = False) -> torch.Tensor:
        ids = ids.to(self.adapter.device).view(-1)
        if with_prompt_tail:  # column 0 stands for the anchor, which the batch replaces by the prompt's last token
            ids = torch.cat([self.adapter.image_token_ids[:1].to(ids.device), ids])
        return self.batch.forward(ids.unsqueeze(0), [with_prompt_tail], [True])[0]

    def rollback(self, n: int) -> None:
        self.batch.rollback([n])


def prefilled_batch(adapter: ModelAdapter, prompts: list[str] | tuple[str, ...]) -> SlotBatch:
    """A batch with ``prompts[i]`` prefilled into slot ``i``."""
    batch = SlotBatch(adapter, len(prompts))
    for slot, prompt in enumerate(prompts):
        batch.prefill(slot, prompt)
    return batch


def check_windows_against_reference(adapter: ModelAdapter, prompts: Sequence[str], refill: str, seed: int = 0,
                                    **tolerance: float) -> bool:
    """Drive a 3-slot :class:`SlotBatch` as the engine does and compare every slot's logits, all columns, with the
    no-cache forward of its prompt and kept entries (``reference_logits``): windows of different lengths (shrinking
    as at the end of an image, a first window of one token), random rollbacks, slot 2 refilled with ``refill`` before
    step 3, slot 1 inactive at step 4 (its output ignored, its cache not advanced). Returns whether the refill grew
    the cache."""
    gen = torch.Generator().manual_seed(seed)
    prompts = list(prompts[:3])
    batch = prefilled_batch(adapter, prompts)
    kept: list[list[torch.Tensor]] = [[], [], []]  # per slot: the body ids its cache holds after the prompt
    from_prompt = [True] * 3
    for step, k in enumerate((4, 4, 3, 4, 1, 4)):
        if step == 3:
            prompts[2], capacity = refill, batch.cache.capacity
            batch.prefill(2, refill)
            grew = batch.cache.capacity > capacity
            kept[2], from_prompt[2] = [], True
        active = [True, step != 4, True]
        ids = adapter.image_token_ids[torch.randint(0, adapter.vocab_size, (3, k), generator=gen)]
        logits = batch.forward(ids, from_prompt, active)
        assert logits.shape[:3] == (3, 2 if adapter.uses_cfg else 1, k)
        # rollback: at most the window's drafts on a first window (the engine always commits its anchor)
        n = [int(torch.randint(0, k + (not first), (), generator=gen)) for first in from_prompt]
        for slot in range(3):
            if active[slot]:
                window = ids[slot, 1:] if from_prompt[slot] else ids[slot]
                ref = reference_logits(adapter, prompts[slot], torch.cat([*kept[slot], window]))[:, -k:]
                torch.testing.assert_close(logits[slot], ref, **tolerance)
                kept[slot].append(window[: k - n[slot] - from_prompt[slot]])
                from_prompt[slot] = False
        batch.rollback(n)
    return grew


@dataclass
class DecodeCounts:
    """What an engine run exercised (:func:`decode_counts`); a test asserts minimums so that it fails once its
    model or settings stop producing rejections, rollbacks or uneven batches.

    ``rejections``: drafts verified but not accepted (``drafts_verified - drafts_accepted`` of the finished
    images' stats). ``rollbacks``: (image, iteration) pairs whose window ended in a rejection, so that its tail
    was dropped from the cache (a chain: fewer tokens committed than window rows; a tree: every candidate below
    the kept path's last node rejected); ``longest_rollback``: the most window entries one of them dropped.
    ``carried_rejections``: those whose rejected draft (tree: candidate 0 of the rejected depth) was carried from
    the previous iteration, a sample of an earlier target that SJD rejects only when the newly committed tokens
    moved its target (a model whose targets ignore the image prefix has none). ``batched``: iterations with two
    or more images in flight; ``uneven``: those where the images committed different counts; ``uneven_windows``:
    those where their windows had different lengths (the shorter ones padded). ``sibling_rejections`` /
    ``sibling_accepts`` (tree windows): the extra candidates of a depth (branch index > 0, existing) that RRS
    judged and rejected / accepted; ``rejected_branchings``: tree windows that ended at a depth with two or more
    candidates, all rejected (never when ``K >= V``: the candidates then cover every code).
    """

    images: int = 0
    iterations: int = 0
    rejections: int = 0
    rollbacks: int = 0
    longest_rollback: int = 0
    carried_rejections: int = 0
    batched: int = 0
    uneven: int = 0
    uneven_windows: int = 0
    sibling_rejections: int = 0
    sibling_accepts: int = 0
    rejected_branchings: int = 0


@contextlib.contextmanager
def decode_counts(engine: JacobiEngine) -> Iterator[DecodeCounts]:
    """Count, while ``engine`` decodes inside the block, the rejections, rollbacks and uneven advances of its
    iterations (:class:`DecodeCounts`). Wraps the engine's per-iteration steps; changes no token."""
    counts = DecodeCounts()
    steps = {name: getattr(engine, name) for name in ("_iteration", "_advance", "_finish")}
    drafter_window = engine.drafter._window
    # per image in flight, in slot order: window rows (tree: nodes), drafts carried from the previous iteration,
    # committed tokens; a tree window also records whether its path ended in a rejection
    rows: list[int] = []
    carried: list[int] = []
    committed: list[int] = []
    trees: list[tuple[Any, bool]] = []
    tree_path = Tree.path

    def iteration(state, slots):
        for seen in (rows, carried, committed, trees):
            seen.clear()
        done = steps["_iteration"](state, slots)
        counts.iterations += 1
        ended = [m < k for k, m in zip(rows, committed, strict=True)] if not trees else [trees[0][1]]
        for k, c, m, rejected in zip(rows, carried, committed, ended, strict=True):
            if rejected:  # m - 1 drafts accepted: the m-th was rejected
                counts.rollbacks += 1
                counts.longest_rollback = max(counts.longest_rollback, k - m)
                counts.carried_rejections += m <= c
        if len(committed) > 1:
            counts.batched += 1
            counts.uneven += len(set(committed)) > 1
            counts.uneven_windows += len(set(rows)) > 1
        return done

    def window(slot):
        w = drafter_window(slot)
        if hasattr(w, "tree"):  # a tree window (drafter=pac_tree, or drafter=eagle's static trees: nothing carried)
            rows.append(w.tree.size)
            carried.append(min(getattr(slot.draft, "carried", w.tokens[:0]).numel(), w.tree.spine - 1))
            trees.append((w, False))
        else:
            rows.append(w.rows)  # a drafter without carried drafts (drafter=eagle) carries none
            carried.append(min(getattr(slot.draft, "carried", w.drafts[:0]).numel(), w.rows - 1))
        return w

    def advance(image, tokens, *args, **kwargs):
        committed.append(tokens.numel())
        return steps["_advance"](image, tokens, *args, **kwargs)

    def finish(image):
        gen = steps["_finish"](image)
        counts.images += 1
        counts.rejections += gen.stats["drafts_verified"] - gen.stats["drafts_accepted"]
        return gen

    def path(tree, accepted, deepest=False):
        kept = tree_path(tree, accepted, deepest)
        if trees and trees[-1][0].tree is tree:
            valid = trees[-1][0].valid.tolist()
            trees[-1] = (trees[-1][0], bool(tree.children[kept[-1]]))
            counts.rejected_branchings += len(tree.children[kept[-1]]) > 1
            for i, node in enumerate(kept):
                kids = tree.children[node]
                judged = kids[: kids.index(kept[i + 1]) + 1] if i + 1 < len(kept) else kids
                for kid in judged:
                    if tree.branches[kid][-1] > 0 and valid[kid]:
                        counts.sibling_accepts += bool(accepted[kid])
                        counts.sibling_rejections += not accepted[kid]
        return kept

    wrappers = dict(_iteration=iteration, _advance=advance, _finish=finish)
    for name, wrapper in wrappers.items():
        setattr(engine, name, wrapper)
    engine.drafter._window = window
    Tree.path = path
    try:
        yield counts
    finally:
        Tree.path = tree_path
        del engine.drafter._window
        for name in wrappers:
            delattr(engine, name)


def forced_token_run(adapter: ModelAdapter, rule, prompt: str, seeds: int = 3) -> tuple[Any, DecodeCounts]:
    """Decode ``seeds`` images of a model with forced structural tokens (window 5): every forced position holds its
    token and every free one an image code; returns the last generation and what the run exercised."""
    from csd.drafters.chain import ChainDrafter
    from csd.engine import JacobiEngine

    forced = adapter.layout.forced_ids
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=5))
    with decode_counts(engine) as exercised:
        for seed in range(seeds):
            out = engine.generate(prompt, seed=seed)
            assert torch.equal(out.tokens[forced >= 0], forced[forced >= 0])
            assert torch.isin(out.tokens[forced < 0], adapter.image_token_ids).all()
    return out, exercised
