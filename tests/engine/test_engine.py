"""The engine on the tiny Janus: window/rollback exactness, AR == HF generate, CSD degenerates to SJD.

The Janus is ``tests.helpers.rejecting_janus`` (16 codes, targets that move with the previous tokens), so the
token-identity tests run through rejected carried drafts and rollbacks, which they count and require.
"""

from __future__ import annotations

import pytest
import torch

from baselines.gsd import GSD
from baselines.lantern import Lantern
from baselines.relaxed import Addition, Amplify
from csd.acceptance import CSD, SJD
from csd.adapters.janus import TINY_BOI, TINY_BOS, TINY_PAD, tiny_byte_encoder
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.fast import CompiledStep
from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_SAMPLED
from tests.helpers import OneImage, count_host_reads, decode_counts, one_row_iterations, rejecting_janus

PROMPT = "two red circles"


@pytest.fixture(scope="module")
def adapter():
    return rejecting_janus()  # 4x4 tokens, 16 codes


def test_window_logits_equal_step_by_step(adapter):
    ids = torch.randint(16, (6,), generator=torch.Generator().manual_seed(0))
    ctx = OneImage(adapter, PROMPT)
    window = ctx.forward(ids[:5], with_prompt_tail=True)
    ctx = OneImage(adapter, PROMPT)
    steps = [ctx.forward(ids[:0], with_prompt_tail=True)]
    steps += [ctx.forward(ids[i : i + 1]) for i in range(5)]
    assert window.shape == (2, 6, 16)
    torch.testing.assert_close(window, torch.cat(steps, dim=1), atol=1e-5, rtol=1e-5)


def test_rollback_is_exact(adapter):
    ids = torch.arange(8) % 16
    ctx = OneImage(adapter, PROMPT)
    first = ctx.forward(ids[:4], with_prompt_tail=True)
    ctx.rollback(3)  # keep the prompt tail and ids[0]
    again = ctx.forward(ids[1:6])
    assert ctx.batch.cache.filled == [len(tiny_byte_encoder(PROMPT)) + 6] * 2  # both CFG rows
    torch.testing.assert_close(again[:, :3], first[:, 2:5], atol=1e-5, rtol=1e-5)


def test_greedy_ar_equals_hf_generate():
    adapter = rejecting_janus(top_k=1)
    ours = JacobiEngine(adapter, SJD(), ChainDrafter(window=1)).generate(PROMPT, seed=0).tokens
    model = adapter.model
    model.generation_config.pad_token_id = TINY_PAD
    model.generation_config.bos_token_id = TINY_BOS
    model.generation_config.generation_kwargs = {"boi_token_id": TINY_BOI}
    ids = tiny_byte_encoder(PROMPT).unsqueeze(0)
    ref = model.generate(
        ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False, guidance_scale=5.0
    )
    assert ours.tolist() == ref[0].tolist()
    # greedy speculative decoding commits exactly the greedy AR sequence
    assert JacobiEngine(adapter, SJD(), ChainDrafter(window=6)).generate(PROMPT, seed=5).tokens.tolist() == ours.tolist()


@pytest.mark.parametrize("csd", [CSD(lam=0.0, delta=0.9), CSD(lam=2.0, delta=0.0)])
@pytest.mark.parametrize("init", ["random", "repeat_left"])
def test_csd_degenerates_to_sjd_token_for_token(adapter, csd, init):
    sjd = JacobiEngine(adapter, SJD(), ChainDrafter(window=5, init=init))
    with decode_counts(sjd) as exercised:
        for seed in range(4):
            ref = sjd.generate(PROMPT, seed=seed)
            got = JacobiEngine(adapter, csd, ChainDrafter(window=5, init=init)).generate(PROMPT, seed=seed)
            assert got.tokens.tolist() == ref.tokens.tolist()
            assert got.nfe == ref.nfe and got.stats["relaxed_accepts"] == 0
    # measured: random 25 rejections (15 carried), repeat_left 18 (10)
    assert exercised.rejections >= 8 and exercised.carried_rejections >= 4


def test_relaxed_csd_relaxes_and_records_it(adapter):
    gens = [JacobiEngine(adapter, CSD(lam=1.0, delta=1.0), ChainDrafter(window=6)).generate(PROMPT, seed=s) for s in range(6)]
    relaxed = sum(g.stats["relaxed_accepts"] for g in gens)
    assert relaxed > 0
    assert relaxed == sum(int((g.commit_kind == COMMIT_RELAXED).sum()) for g in gens)
    assert all(g.stats["filter_passes"] <= g.stats["filter_checks"] == g.stats["drafts_verified"] for g in gens)


@pytest.mark.parametrize(
    "rule", [SJD(), CSD(), Addition(c=0.1), Amplify(factor=3.0), GSD(), Lantern(neighbours=8, budget=0.2)], ids=lambda r: r.name
)
def test_every_rule_generates_a_consistent_record(adapter, rule):
    gen = JacobiEngine(adapter, rule, ChainDrafter(window=5)).generate(PROMPT, seed=1)
    length = adapter.layout.length
    assert gen.tokens.shape == (length,) and int(gen.tokens.max()) < 16
    assert gen.nfe == int(gen.commit_iter.max()) + 1
    assert gen.step_compression == length / gen.nfe
    accepted = int(((gen.commit_kind == COMMIT_ACCEPTED) | (gen.commit_kind == COMMIT_RELAXED)).sum())
    assert accepted == gen.stats["drafts_accepted"]
    assert int((gen.commit_kind == COMMIT_SAMPLED).sum()) == gen.nfe  # one sampled token per forward
    assert gen.stats["drafts_accepted"] <= gen.stats["drafts_verified"] <= gen.stats["drafts_proposed"]
    # iterations commit positions in order
    assert torch.all(gen.commit_iter[1:] >= gen.commit_iter[:-1])


def test_ar_is_window_one(adapter):
    gen = JacobiEngine(adapter, SJD(), ChainDrafter(window=1)).generate(PROMPT, seed=0)
    assert gen.nfe == adapter.layout.length and gen.stats["drafts_proposed"] == 0


@pytest.mark.slow
def test_padded_window_gives_identical_tokens(adapter):
    """The compiled path's fixed-shape windows (drafts padded to L, fixed cache; traced with the ``eager`` backend)
    change nothing but the shapes."""
    engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=6), compiled=CompiledStep(adapter, backend="eager"))
    with decode_counts(engine) as exercised:
        for seed in range(3):
            ref = JacobiEngine(adapter, SJD(), ChainDrafter(window=6)).generate(PROMPT, seed=seed)
            padded = engine.generate(PROMPT, seed=seed)
            assert padded.tokens.tolist() == ref.tokens.tolist()
    # measured: 19 rollbacks (12 of a carried draft), the longest 5 (the whole window's drafts)
    assert exercised.rollbacks >= 8 and exercised.carried_rejections >= 4 and exercised.longest_rollback == 5


def test_engine_rejects_bad_settings(adapter):
    with pytest.raises(ValueError, match="window"):
        JacobiEngine(adapter, SJD(), ChainDrafter(window=0))
    with pytest.raises(ValueError, match="init"):
        JacobiEngine(adapter, SJD(), ChainDrafter(init="zeros"))
    with pytest.raises(ValueError, match="coupling"):
        JacobiEngine(adapter, SJD(), ChainDrafter(coupling="gumble"))


@pytest.mark.parametrize(
    "rule", [SJD(), CSD(lam=0.5, delta=0.9), Amplify(factor=3.0), GSD(), Lantern(neighbours=8, budget=0.2)], ids=lambda r: r.name
)
def test_one_host_sync_per_iteration(adapter, rule, monkeypatch):
    """Reading a device value on the host (``item``, ``int``, ``bool``, ``tolist``, ...) happens once per
    iteration (the number of committed tokens; none when the window has one row), plus one read of the counters after
    the loop."""
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=5))
    calls, one_row = count_host_reads(monkeypatch), one_row_iterations(monkeypatch)
    gen = engine.generate(PROMPT, seed=0)
    monkeypatch.undo()
    assert len(calls) == gen.nfe - len(one_row) + 1, calls  # one-row windows (the AR tail) read nothing
