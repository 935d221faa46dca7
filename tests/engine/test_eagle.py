"""The EAGLE drafter (csd/drafters/eagle.py): SJD with a head's chain of drafts is exactly lossless (chi-square
against the enumerated AR law, and the same test detects a head that samples from another law than it records);
batched decoding equals batch 1; the head's forwards are counted; bad settings get one line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from csd.acceptance import SJD
from csd.compose import build_drafter
from csd.drafters.eagle import EagleDrafter, EagleHead, head_config, save_head
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.slot import Request
from tests.helpers import (
    chi_square_pvalue,
    decode_counts,
    exact_sequence_distribution,
    rejecting_emu3,
    rejecting_janus,
    rejecting_lumina,
)

PROMPT = "a cat"
N_SAMPLES = 2000


def random_head(adapter, path: Path, seed: int = 0, scale: float = 1.0) -> str:
    """A seeded untrained head for ``adapter`` saved at ``path``; ``scale`` multiplies its output projection."""
    torch.manual_seed(seed)
    head = EagleHead(head_config(adapter.decoder().config))
    with torch.no_grad():
        head.layer.mlp.down_proj.weight.mul_(scale)
    save_head(head, path, {"model": "random"})
    return str(path)


class SharpenedDrafter(EagleDrafter):
    """A wrong drafter for the negative control: records the head's law ``p`` but samples from ``p^3`` renormalised."""

    def sample_drafts(self, probs, slots, wanted):
        sharp = probs**3
        return super().sample_drafts(sharp / sharp.sum(-1, keepdim=True), slots, wanted)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    # the model of tests/engine/test_lossless.py: 2x2 tokens over 3 codes (81 sequences), targets that move with the
    # previous token
    adapter = rejecting_janus(grid=2, codebook=3, head_scale=12.0, guidance_scale=2.0, seed=1)
    head = random_head(adapter, tmp_path_factory.mktemp("head") / "head.pt", scale=30.0)
    return adapter, head, exact_sequence_distribution(adapter, PROMPT)


def sample_counts(adapter, drafter, offset: int) -> Counter:
    engine = JacobiEngine(adapter, SJD(), drafter, batch_size=16)
    requests = [Request(PROMPT, offset + s) for s in range(N_SAMPLES)]
    return Counter(tuple(gen.tokens.tolist()) for _, gen in engine.generate_many(requests))


@pytest.mark.statistical
@pytest.mark.slow
def test_sjd_with_the_head_is_lossless(setup):
    adapter, head, probs = setup
    assert chi_square_pvalue(sample_counts(adapter, EagleDrafter(window=3, head=head), 30_000), probs) > 1e-3


@pytest.mark.statistical
@pytest.mark.slow
def test_a_head_sampling_another_law_than_it_records_is_detected(setup):
    adapter, head, probs = setup
    assert chi_square_pvalue(sample_counts(adapter, SharpenedDrafter(window=3, head=head), 40_000), probs) < 1e-6


def test_the_head_drafts_get_accepted_and_rejected(setup):
    """The lossless test has power only if the head's drafts are accepted and rejected; every draft costs one head
    forward (``drafter_forwards``)."""
    adapter, head, _ = setup
    engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=3, head=head))
    with decode_counts(engine) as counts:
        gens = [engine.generate(PROMPT, seed=s) for s in range(30)]
    accepted = sum(g.stats["drafts_accepted"] for g in gens)
    assert accepted > 10 and counts.rejections > 10
    assert all(g.stats["drafter_forwards"] == g.stats["drafts_proposed"] > 0 for g in gens)


@pytest.mark.slow
def test_batch_4_equals_batch_1(tmp_path):
    adapter = rejecting_janus()
    head = random_head(adapter, tmp_path / "head.pt", scale=30.0)
    requests = [Request(prompt, seed) for prompt in ("a cat", "a dog on a red sofa") for seed in range(4)]
    one = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head))
    four = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head), batch_size=4)
    with decode_counts(four) as counts:
        batched = {(r.prompt, r.seed): g for r, g in four.generate_many(requests)}
    assert counts.uneven > 0 and counts.uneven_windows > 0
    for r in requests:
        ref = one.generate(r.prompt, r.seed)
        assert batched[r.prompt, r.seed].tokens.tolist() == ref.tokens.tolist()
        assert batched[r.prompt, r.seed].stats == ref.stats


def test_bad_settings_get_one_line(tmp_path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter", "window": 4,
                            "head": str(tmp_path / "missing.pt")})
    with pytest.raises(ConfigError, match=r"drafter.head=.*missing.pt: no such file; train one with"):
        build_drafter(cfg)
    assert "engine.compile=false" in EagleDrafter(window=4).problem(1, compiled=True)
    assert EagleDrafter(window=4).problem(4, compiled=False) is None
    with pytest.raises(ValueError, match="ships no EAGLE head"):
        JacobiEngine(rejecting_janus(), SJD(), EagleDrafter(window=4))


def test_a_model_without_a_shipped_head_is_refused_before_it_loads(tmp_path):
    from csd.api import compose_config

    with pytest.raises(ConfigError, match=r"^drafter.head=null: JanusAdapter ships no EAGLE head; train one with"):
        compose_config("janus_pro_7b", "sjd", {"drafter": "eagle"})
    head = tmp_path / "head.pt"
    torch.save({}, head)  # a checkpoint file (its weights are read when the model loads)
    assert compose_config("janus_pro_7b", "sjd", {"drafter": "eagle", "drafter.head": str(head)}).drafter.name == "eagle"


@pytest.mark.parametrize("make", [rejecting_lumina, rejecting_emu3], ids=["lumina", "emu3"])
def test_forced_tokens_and_batches_on_lumina_and_emu3(tmp_path, make):
    """Structural tokens (end-of-line, end tokens) stay in place where the head drafts over them, and a batch of 3
    gives batch 1's tokens (Lumina-mGPT's unconditional row has an empty prompt)."""
    adapter = make()
    head = random_head(adapter, tmp_path / "head.pt")
    requests = [Request("a cat", seed) for seed in range(4)]
    batched = {r.seed: g for r, g in JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head),
                                                  batch_size=3).generate_many(requests)}
    one = JacobiEngine(adapter, SJD(), EagleDrafter(window=4, head=head))
    forced = adapter.layout.forced_ids >= 0
    for r in requests:
        gen = one.generate(r.prompt, r.seed)
        assert torch.equal(gen.tokens[forced], adapter.layout.forced_ids[forced])
        assert gen.tokens.tolist() == batched[r.seed].tokens.tolist()
        assert gen.stats["drafter_forwards"] > 0
