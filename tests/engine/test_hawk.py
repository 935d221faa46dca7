"""drafter=hawk (csd/drafters/hawk.py): Hawk's spatial-pool tree windows.

Lossless by chi-square against AR's enumerated law of a body prefix on a tiny Janus (3 codes), with the stand-in heads
(the target's own law) and with test-local heads implementing the ``SpatialHeadsLike`` protocol (seeded random logits
that depend on the token); a negative control (a verifier that resamples from ``q`` after a rejection) is detected;
cell offsets map to body positions with and without end-of-line columns; a batch of images decodes each image's
tokens exactly as alone.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from csd.acceptance import SJD, Residual
from csd.adapters.base import BodyLayout
from csd.drafters.hawk import HawkDrafter, TargetLawHeads, cell_positions, split_offsets
from csd.engine import JacobiEngine
from csd.slot import Request
from tests.engine.test_sjd_pac import exact_prefix_distribution
from tests.helpers import chi_square_pvalue, make_cfg, rejecting_janus, rejecting_lumina

PROMPT = "a cat"
#: images per chi-square run (prefix of 5 tokens over 3 codes: 243 cells, rare ones pooled; the negative control
#: is rejected at p ~ 1e-15 with 400, so 700 leaves a wide margin)
N_SAMPLES = 700
PREFIX = 5


class RandomHeads:
    """Test heads of the protocol: seeded random logits per (offset, token), scaled by the feature's mean (so the law
    moves with the context as a trained head's would); horizontal ``+1, +2``, vertical ``+W, +2W``."""

    def __init__(self, raw_vocab: int, width: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.offsets = (1, 2, width, 2 * width)
        self.table = torch.randn((raw_vocab, len(self.offsets), raw_vocab), generator=gen) * 3.0
        self.calls = 0

    def __call__(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        scale = 1.0 + feature.mean(-1).tanh()
        return self.table.to(feature.device)[token] * scale[..., None, None]


class ResampleFromTarget(SJD):
    """A deliberately biased verifier: after a rejection it resamples from the running target itself instead of
    ``norm([q - p]_+)`` (the drafted code gets its mass twice)."""

    lossless = False

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor) -> Residual:
        return Residual(target_probs, torch.zeros(target_probs.shape[:-1], dtype=torch.bool, device=target_probs.device))


@pytest.fixture(scope="module")
def model():
    """Tiny Janus, 3x3 body over 3 codes (target entropy 0.4 nats), and AR's law of its first 5 tokens: cells 3 and 4
    have a vertical law from the row above in the pool."""
    adapter = rejecting_janus(grid=3, codebook=3, head_scale=16.0, guidance_scale=2.0, seed=1)
    return adapter, exact_prefix_distribution(adapter, PROMPT, PREFIX)


def raw_vocab(adapter) -> int:
    return int(adapter.head(torch.zeros(1, adapter.decoder().config.hidden_size)).shape[-1])


def engine_with(adapter, rule=None, heads: str = "standin", batch_size: int = 8, **args) -> JacobiEngine:
    engine = JacobiEngine(adapter, rule or SJD(), HawkDrafter(**args), batch_size=batch_size)
    if heads == "random":
        engine.drafter.use_heads(RandomHeads(raw_vocab(adapter), adapter.layout.grid[1]))
    return engine


def prefix_pvalue(model, engine: JacobiEngine, offset: int = 70_000, samples: int = N_SAMPLES) -> float:
    adapter, probs = model
    requests = [Request(PROMPT, offset + s) for s in range(samples)]
    counts = Counter(tuple(gen.tokens[:PREFIX].tolist()) for _, gen in engine.generate_many(requests))
    return chi_square_pvalue(counts, probs)


CASES = {
    "standin_k2_d3": dict(heads="standin", window=7, width=2, depth=3),
    "random_k3_d2_top": dict(heads="random", window=7, width=3, depth=2, draw="top"),
    "random_k2_d3": dict(heads="random", window=9, width=2, depth=3),
}


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("case", list(CASES))
def test_hawk_is_lossless(model, case):
    """The first 5 tokens of 700 images follow AR's law (batch 8)."""
    assert prefix_pvalue(model, engine_with(model[0], **CASES[case])) > 1e-3


@pytest.mark.slow
@pytest.mark.statistical
def test_biased_verifier_is_detected(model):
    """Negative control: the same test rejects a verifier whose residual is the target itself."""
    engine = engine_with(model[0], rule=ResampleFromTarget(), heads="random", window=9, width=2, depth=3)
    assert prefix_pvalue(model, engine) < 1e-6


def test_cells_map_to_positions_with_and_without_eol():
    """Raster: cell ``c`` is position ``c``; with one end-of-line token after each row (Lumina-mGPT) and a header, the
    cell below is ``W + 1`` positions on, and forced positions have no cell."""
    raster, cell_of = cell_positions(BodyLayout.raster(3, 4))
    assert raster == list(range(12)) and cell_of == list(range(12))
    lumina = rejecting_lumina().layout
    height, width = lumina.grid
    position, cell_of = cell_positions(lumina)
    forced = (lumina.forced_ids >= 0).tolist()
    assert len(position) == height * width and all(not forced[p] for p in position)
    assert all(cell_of[p] == c for c, p in enumerate(position))
    assert all(cell_of[p] == -1 for p in range(lumina.length) if forced[p])
    assert all(position[c + width] - position[c] == width + 1 for c in range(width * (height - 1)))
    assert split_offsets((1, 2, 3, 4, 8), 4) == ([0, 1, 2], [3, 4])
    with pytest.raises(ValueError, match="not horizontal"):
        split_offsets((1, 3, 4), 4)


def test_pool_reads_the_vertical_law_of_the_cell_above():
    """On Lumina's layout (end-of-line columns) every cell below row 0 that a window drafts finds the vertical law
    cached for it (from the cell above, ``W`` cells and ``W + 1`` body positions back) in its pool; the stand-in's
    offsets end with ``W, 2W``."""
    adapter = rejecting_lumina()
    engine = engine_with(adapter, batch_size=1, window=7, width=2, depth=3)
    drafter, seen = engine.drafter, []
    pool = drafter.pool

    def spy(state, cell):
        laws = pool(state, cell)
        seen.append((cell, state.ring_cell[cell % drafter.ring_size][0] == cell, len(laws)))
        return laws

    drafter.pool = spy
    gen = engine.generate(PROMPT, 3)
    width = adapter.layout.grid[1]
    below = [(c, has, n) for c, has, n in seen if c >= width]
    assert below and all(has and n >= 1 for c, has, n in below)
    assert isinstance(drafter.net, TargetLawHeads) and drafter.net.offsets[-2:] == (width, 2 * width)
    assert gen.tokens.numel() == adapter.layout.length


@pytest.mark.parametrize("name", ["janus", "lumina"])
def test_batch_decodes_each_image_as_alone(name):
    """Batch 3 over 5 images (refills, ragged windows): every image's tokens and forwards equal batch 1's; the heads
    are called once per iteration for the whole batch."""
    adapter = rejecting_janus() if name == "janus" else rejecting_lumina()
    requests = [Request(PROMPT, s) for s in range(5)]
    alone = {r.seed: engine_with(adapter, heads="random", batch_size=1, window=7, width=2, depth=3).generate(PROMPT, r.seed)
             for r in requests}
    batched = engine_with(adapter, heads="random", batch_size=3, window=7, width=2, depth=3)
    out = {r.seed: g for r, g in batched.generate_many(requests)}
    for seed, gen in alone.items():
        assert out[seed].tokens.tolist() == gen.tokens.tolist() and out[seed].nfe == gen.nfe
    assert sum(g.stats["drafts_accepted"] for g in out.values()) > 0


def test_config_and_checks(tmp_path):
    """method=hawk composes drafter=hawk with SJD's rule; a missing heads file and a tree larger than the window are
    refused in one line."""
    cfg = make_cfg("method=hawk")
    assert (cfg.drafter.name, cfg.method.name, cfg.method._target_) == ("hawk", "hawk", "csd.acceptance.SJD")
    with pytest.raises(ValueError, match="no such file"):
        HawkDrafter(heads=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="cannot hold"):
        HawkDrafter(window=4, width=2, depth=3)
    assert HawkDrafter().problem(4, compiled=True) is not None and HawkDrafter().problem(4, compiled=False) is None


def test_head_forwards_are_counted():
    """``drafter_forwards``: one per image per batched call of trained heads (each call carries every image with a
    committed cell); the stand-in heads are the target's own law, no forward of the drafter's own."""
    adapter = rejecting_janus()
    engine = engine_with(adapter, heads="random", batch_size=1, window=7, width=2, depth=3)
    gen = engine.generate(PROMPT, 3)
    assert gen.stats["drafter_forwards"] == engine.drafter.net.calls > 0
    batched = engine_with(adapter, heads="random", batch_size=3, window=7, width=2, depth=3)
    out = [g for _, g in batched.generate_many([Request(PROMPT, s) for s in range(5)])]
    assert batched.drafter.net.calls <= sum(g.stats["drafter_forwards"] for g in out) <= 3 * batched.drafter.net.calls
    standin = engine_with(adapter, batch_size=1, window=7, width=2, depth=3).generate(PROMPT, 3)
    assert standin.stats["drafter_forwards"] == 0


def test_the_heads_time_counts_as_the_drafters():
    """``drafter_s`` (batch 1) covers the refresh step too, where Hawk's heads run: heads that take 20 ms a call add at
    least 20 ms per call to it."""
    import time

    class SlowHeads(RandomHeads):
        def __call__(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            time.sleep(0.02)
            return super().__call__(feature, token)

    adapter = rejecting_janus()
    engine = engine_with(adapter, batch_size=1, window=7, width=2, depth=3)
    engine.drafter.use_heads(SlowHeads(raw_vocab(adapter), adapter.layout.grid[1]))
    gen = engine.generate(PROMPT, 3)
    assert engine.drafter.net.calls > 0 and gen.drafter_s >= 0.02 * engine.drafter.net.calls
