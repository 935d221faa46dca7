"""The EAGLE drafter's static trees (``drafter.tree``, csd/drafters/eagle.py; docs/ALGORITHMS.md "EAGLE: a trained draft
head", Static trees): SJD with a tree of the head's drafts is exactly lossless (chi-square of the whole image against
the enumerated AR law), and the same test detects EAGLE-style greedy children (the head's top-k) recorded with the
head's law; the tree code on a chain-shaped tree gives the chain's tokens and counters exactly; counters per node and
per head forward; forced positions; bad settings get one line."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from omegaconf import OmegaConf

from csd.acceptance import SJD
from csd.compose import build_drafter
from csd.drafters.eagle import STATIC_TREES, EagleDrafter, static_tree
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.fast import CompiledStep
from tests.engine.test_eagle import random_head
from tests.helpers import (
    chi_square_pvalue,
    decode_counts,
    exact_sequence_distribution,
    rejecting_janus,
    rejecting_lumina,
)

PROMPT = "a cat"


class GreedyTreeDrafter(EagleDrafter):
    """A wrong drafter for the negative control: each node's children are its head law's top-k codes (EAGLE's
    deterministic trees), recorded with the head's law as if they had been drawn from it."""

    def draw_children(self, law, width, gen):
        top = law.topk(width, dim=-1)
        return top.indices, top.values > 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    # tests/engine/test_eagle.py's model: 2x2 tokens over 3 codes (81 images), targets that move with the previous
    # token; the binary tree (2 < 3 children per node) leaves codes out, so whole levels get rejected
    adapter = rejecting_janus(grid=2, codebook=3, head_scale=12.0, guidance_scale=2.0, seed=1)
    head = random_head(adapter, tmp_path_factory.mktemp("head") / "head.pt", scale=30.0)
    return adapter, head


def image_pvalue(adapter, drafter, n: int, offset: int) -> float:
    engine = JacobiEngine(adapter, SJD(), drafter)
    with decode_counts(engine) as exercised:
        counts = Counter(tuple(engine.generate(PROMPT, seed=offset + s).tokens.tolist()) for s in range(n))
    # measured at 400 images: ~270 rejected and ~90 accepted siblings, ~270 windows whose last level was all rejected
    assert exercised.sibling_rejections > n / 4 and exercised.sibling_accepts > n / 20, exercised
    assert exercised.rejected_branchings > n / 4, exercised
    return chi_square_pvalue(counts, exact_sequence_distribution(adapter, PROMPT))


@pytest.mark.statistical
@pytest.mark.slow
def test_sjd_on_a_static_tree_is_lossless(setup):
    """600 images (p = 0.60 measured at 400)."""
    adapter, head = setup
    assert image_pvalue(adapter, EagleDrafter(window=3, head=head, tree="binary"), 600, 50_000) > 1e-3


@pytest.mark.statistical
@pytest.mark.slow
def test_greedy_children_recorded_with_the_head_law_are_detected(setup):
    """Negative control: top-k children recorded with ``p`` (measured: p = 3e-10 at 400 images)."""
    adapter, head = setup
    assert image_pvalue(adapter, GreedyTreeDrafter(window=3, head=head, tree="binary"), 400, 50_000) < 1e-6


@pytest.mark.parametrize("make", [rejecting_janus, rejecting_lumina], ids=["janus", "lumina"])
def test_a_chain_shaped_tree_gives_the_chain_exactly(tmp_path, monkeypatch, make):
    """The tree path (level-by-level head forwards with the tree's mask and positions, RRS) on a tree of one child per
    node draws the same random numbers as the chain and gives its tokens and counters exactly, with Lumina-mGPT's
    forced tokens too: ``tree=chain`` decoding is unchanged and the tree code's head inputs are the chain's."""
    adapter = make()
    head = random_head(adapter, tmp_path / "head.pt", scale=30.0)
    chain = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head))
    monkeypatch.setitem(STATIC_TREES, "binary", ())
    tree = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head, tree="binary"))
    for seed in range(2):
        a, b = chain.generate(PROMPT, seed), tree.generate(PROMPT, seed)
        assert a.tokens.tolist() == b.tokens.tolist() and a.nfe == b.nfe and a.stats == b.stats
        assert a.stats["drafts_accepted"] < a.stats["drafts_verified"]  # rejections happened


def test_counters_of_a_static_tree(setup):
    """Per window of depth ``d`` (``min(window, N - n) - 1``; 0 for the first, an AR step): ``drafts_proposed`` = the
    tree's nodes but the root, ``drafter_forwards`` = ``d`` head forwards (the ingest and one per level but the last);
    one sampled token per forward."""
    adapter, head = setup
    engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head, tree="binary"))
    length = adapter.layout.length
    for seed in range(8):
        gen = engine.generate(PROMPT, seed)
        iters = gen.commit_iter.tolist()
        depths = [0 if n == 0 else min(4, length - n) - 1 for n in (iters.index(i) for i in range(gen.nfe))]
        assert gen.stats["drafts_proposed"] == sum(static_tree((2, 2), d).size - 1 for d in depths)
        assert gen.stats["drafter_forwards"] == sum(depths)
        assert gen.stats["drafts_accepted"] + gen.nfe == length
        assert gen.stats["drafts_accepted"] <= gen.stats["drafts_verified"] <= gen.stats["drafts_proposed"]
    assert static_tree((4, 2), 2).size == 1 + 4 + 8 and static_tree((2, 2), 4).size == 1 + 2 + 4 + 4 + 4


def test_forced_positions_get_no_siblings(tmp_path):
    """Lumina-mGPT's end-of-line tokens: a forced depth has one child (the forced id, always accepted, no draft)."""
    adapter = rejecting_lumina()
    head = random_head(adapter, tmp_path / "head.pt")
    engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=5, head=head, tree="binary"))
    forced = adapter.layout.forced_ids >= 0
    with decode_counts(engine) as exercised:
        gens = [engine.generate(PROMPT, seed) for seed in range(3)]
    for gen in gens:
        assert torch.equal(gen.tokens[forced], adapter.layout.forced_ids[forced])
        assert gen.stats["drafter_forwards"] > 0
    assert exercised.sibling_rejections > 0


def test_bad_settings_get_one_line(tmp_path):
    cfg = OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter", "window": 4, "head": None,
                            "tree": "bushy"})
    with pytest.raises(ConfigError, match=r"^drafter.tree='bushy' must be one of \['chain', 'binary', 'wide'\]$"):
        build_drafter(cfg)
    drafter = EagleDrafter(window=4, tree="binary")
    assert drafter.problem(1, compiled=False) is None
    assert "set engine.batch_size=1, got 2" in drafter.problem(2, compiled=False)
    assert "engine.compile=false" in drafter.problem(1, compiled=True)
    adapter = rejecting_janus()
    head = random_head(adapter, tmp_path / "head.pt")
    with pytest.raises(ValueError, match="engine.batch_size=1"):
        JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head, tree="wide"), batch_size=2)
    with pytest.raises(ValueError, match="engine.compile=false"):
        JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head, tree="wide"),
                     compiled=CompiledStep(adapter, backend="eager"))
    from csd.api import compose_config

    with pytest.raises(ConfigError, match=r"^drafter=eagle with drafter.tree=wide \(a tree window\) decodes one image"):
        compose_config("toy", "sjd", {"drafter": "eagle", "drafter.tree": "wide", "engine.batch_size": 2})
    # chain runs record what they did before static trees (records, run-directory fingerprints)
    assert EagleDrafter(window=4).params() == {"drafter": "eagle", "window": 4, "head": None}
    assert EagleDrafter(window=4, tree="wide").params()["tree"] == "wide"


@pytest.mark.slow
def test_the_shipped_toy_head_drafts_a_tree():
    """``drafter=eagle drafter.tree=binary model=toy``: the shipped head's tree windows commit more than one token per
    forward."""
    from csd import Decoder

    _, gen = Decoder("toy", "sjd", drafter="eagle", **{"drafter.tree": "binary"}).generate("two red circles", seed=0)
    assert gen.tokens.numel() / gen.nfe > 1.5 and gen.stats["drafter_forwards"] > 0
