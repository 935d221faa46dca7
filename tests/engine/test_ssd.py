"""SSD (drafter=ssd, csd/drafters/ssd.py; heads: csd/drafters/spatial_heads.py): the heads' offsets, shapes and file
round trip; one correction round's per-position law against the analytic one (and a negative control); the block
schedule's forward count per r; tokens independent of the batch."""

from __future__ import annotations

import pytest
import torch

from csd.acceptance import SJD
from csd.adapters.toy import load_toy_adapter
from csd.drafters.spatial_heads import SpatialHeads, load_spatial_heads, save_spatial_heads
from csd.drafters.ssd import SSDDrafter, correct_block
from csd.engine import JacobiEngine
from csd.errors import MissingWeightsError
from csd.slot import Request


def tiny_heads(vocab: int = 11, hidden: int = 8) -> SpatialHeads:
    torch.manual_seed(0)
    embed, lm = torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, vocab)
    return SpatialHeads(hidden, width=4, k_h=3, k_v=2, ffn=6, embed=embed, readout=lm)


def test_heads_offsets_shapes_and_file_round_trip(tmp_path):
    heads = tiny_heads()
    assert heads.offsets == (1, 2, 3, 4, 8)  # +1 .. +k_h, then +W, +2W (W = 4 cells)
    feature, token = torch.randn(2, 7, 8), torch.randint(11, (2, 7))
    assert heads(feature, token).shape == (2, 7, 5, 11)
    with torch.no_grad():  # W0 = [I 0] and a zero SwiGLU output: an untrained head predicts its own cell's feature
        assert torch.allclose(heads.predict(feature, token), feature[..., None, :].expand(2, 7, 5, 8))
        heads.down.normal_()
    save_spatial_heads(heads, tmp_path / "h.pt", {"note": "test"})
    loaded = load_spatial_heads(tmp_path / "h.pt")
    assert loaded.offsets == heads.offsets and loaded.meta == {"note": "test"}
    loaded._frozen.update(embed=heads.embed, readout=heads.readout)
    assert torch.allclose(loaded(feature, token), heads(feature, token))
    with pytest.raises(MissingWeightsError, match="train_drafter --kind spatial"):
        load_spatial_heads(tmp_path / "missing.pt")


def laws(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, p = torch.rand(vocab, generator=gen) ** 2, torch.rand(vocab, generator=gen) ** 2
    return q / q.sum(), p / p.sum()


def test_a_round_is_per_position_speculative_sampling():
    """Analytic law of one position after a round: drafts ``x ~ p`` accepted with ``min(1, q/p)``, else replaced from
    ``norm(max(0, q - p))``, give exactly ``q``; with ``p = q`` nothing is rejected. Many independent positions of one
    call stand for many draws. Negative control: the uncorrected drafts (r = 0's commit) follow ``p``, which the same
    statistic tells from ``q``."""
    vocab, n = 4, 40_000
    q, p = laws(vocab, 3)
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(p, n, replacement=True, generator=gen)
    free = torch.ones(n, dtype=torch.bool)
    out, accepted, _, _ = correct_block(SJD(), q.expand(n, -1), p.expand(n, -1), drafts, torch.zeros(n), free, gen)
    freq = torch.bincount(out, minlength=vocab) / n
    raw = torch.bincount(drafts, minlength=vocab) / n
    tol = 4 * (0.25 / n) ** 0.5
    assert (freq - q).abs().max() < tol
    assert (raw - q).abs().max() > 10 * tol  # negative control: without the round the committed law is p
    assert abs(accepted.float().mean() - torch.minimum(p, q).sum()) < tol  # acceptance rate = 1 - TV(p, q)
    same, accepted_same, _, _ = correct_block(SJD(), q.expand(n, -1), q.expand(n, -1), drafts, torch.zeros(n), free, gen)
    assert accepted_same.all() and torch.equal(same, drafts)
    forced = torch.zeros(n, dtype=torch.bool)  # forced positions are never replaced
    kept, _, _, _ = correct_block(SJD(), q.expand(n, -1), p.expand(n, -1), drafts, torch.zeros(n), forced, gen)
    assert torch.equal(kept, drafts)


@pytest.fixture(scope="module")
def toy_heads(tmp_path_factory):
    adapter = load_toy_adapter()
    torch.manual_seed(0)
    heads = SpatialHeads(adapter.decoder().config.hidden_size, 16, k_h=5, k_v=2, ffn=16)
    path = tmp_path_factory.mktemp("ssd") / "heads.pt"
    save_spatial_heads(heads, path)
    return adapter, str(path)


@pytest.mark.parametrize(("rounds", "k_v", "nfe"), [(0, 2, 12), (1, 2, 23), (2, 1, 1 + 3 * (3 + 15))])
def test_blocks_cost_r_plus_one_forwards_and_tokens_do_not_depend_on_the_batch(toy_heads, rounds, k_v, nfe):
    """The toy's 16 x 16 grid: one AR step, three horizontal blocks of 5 in row 0, then blocks of ``k_v`` rows; each
    block costs ``r + 1`` forwards. An image's tokens are the same alone and in a batch of 2."""
    adapter, path = toy_heads
    requests = [Request("a red circle", seed, key=seed) for seed in range(2)]
    out = {}
    for batch in (1, 2):
        engine = JacobiEngine(adapter, SJD(), SSDDrafter(k_h=5, k_v=k_v, rounds=rounds, heads=path), batch_size=batch)
        out[batch] = {req.key: gen for req, gen in engine.generate_many(requests)}
    for key in out[1]:
        assert torch.equal(out[1][key].tokens, out[2][key].tokens)
        assert out[1][key].nfe == out[2][key].nfe == nfe
        stats = out[1][key].stats
        assert stats["drafts_proposed"] == 255 and stats["drafts_verified"] == rounds * 255
        assert stats["drafts_accepted"] <= stats["drafts_verified"]


def test_the_toy_ships_heads_that_load_and_decode():
    """``drafter.heads=null`` on the toy: csd/toy/assets/spatial_heads.pt (k_h = 5, k_v = 2, under 5 MB) decodes."""
    adapter = load_toy_adapter()
    assert adapter.spatial_heads.stat().st_size <= 5_000_000
    assert load_spatial_heads(adapter.spatial_heads, adapter).offsets == (1, 2, 3, 4, 5, 16, 32)
    engine = JacobiEngine(adapter, SJD(), SSDDrafter(k_v=1, rounds=0))
    assert engine.generate("a red circle", seed=0).nfe == 1 + 3 + 15
