"""Every sampler's support: no zero-probability token, even when the uniforms hit exactly 0.

``torch.rand`` returns values in ``[0, 1)``; ``U = 0`` (probability ``2^-24`` per float32 entry)
once gave ``E = 0`` noise, ``0 / 0 = NaN`` in the exponential race and a forbidden token from
``argmax``. Here the uniforms are forced to 0 on a large share of entries, and every sampler of
the engine (row samples, residual, maximal coupling, Gumbel sharing, the whole decode loop) must
still return only tokens with positive probability. GSD's grouping must not depend on tie order.
"""

from __future__ import annotations

import pytest
import torch

from baselines.gsd import GSD
from csd.acceptance import SJD, lossless_residual
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.processors import classifier_free_guidance
from csd.verify import couple_drafts, exponential_noise, sample, sample_race, verify_window
from tests.helpers import decode_counts, rejecting_janus

V = 64
TOP = 4


@pytest.fixture
def zero_uniforms(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.rand`` with every third entry set to exactly 0 (the rare event made common)."""
    real_rand = torch.rand

    def rand(*args, **kwargs):
        u = real_rand(*args, **kwargs)
        flat = u.view(-1)
        flat[::3] = 0.0
        return u

    monkeypatch.setattr(torch, "rand", rand)


def top_k_probs(batch: int, seed: int) -> torch.Tensor:
    """``[batch, V]`` distributions with mass on ``TOP`` random tokens and exact zeros elsewhere."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, V, generator=g)
    kth = torch.topk(logits, TOP, dim=-1).values[:, -1:]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)


def in_support(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) > 0


def test_race_never_picks_a_zero_probability_entry():
    # the reproduction: zero noise on a zero-probability entry
    assert int(sample_race(torch.tensor([0.5, 0.0, 0.3, 0.2]), torch.tensor([1.0, 0.0, 1.0, 1.0]))) != 1
    # zero noise on a positive entry makes it win, as the limit E -> 0 does
    assert int(sample_race(torch.tensor([0.5, 0.0, 0.3, 0.2]), torch.tensor([1.0, 1.0, 0.0, 1.0]))) == 2


def test_exponential_noise_is_strictly_positive(zero_uniforms):
    noise = exponential_noise((1000, V), torch.Generator().manual_seed(0), torch.device("cpu"))
    assert bool((noise > 0).all()) and bool(torch.isfinite(noise).all())


def test_row_samples_stay_in_the_support(zero_uniforms):
    probs = top_k_probs(5000, seed=1)
    tokens = sample(probs, torch.Generator().manual_seed(0))
    assert bool(in_support(probs, tokens).all())


def test_residual_and_coupling_stay_in_the_support(zero_uniforms):
    q, p = top_k_probs(5000, seed=2), top_k_probs(5000, seed=3)
    g = torch.Generator().manual_seed(0)
    drafts = sample(p, g)
    # verify_window with one draft per window: a rejection is replaced from norm([q - p]_+)
    result, samples = verify_window(
        SJD(), torch.stack([q, q], 1), torch.zeros(5000, 2), drafts[:, None], p[:, None],
        torch.zeros(5000, 1, dtype=torch.bool), g,
    )
    residual = lossless_residual(q, p)
    rejected = result.n_accepted == 0
    assert bool(rejected.any())
    assert bool(in_support(residual[rejected], result.committed[rejected, 0]).all())
    assert bool(in_support(q, samples[:, 0]).all())
    coupled = couple_drafts(q, drafts, p, g)
    assert bool(in_support(q, coupled).all())


@pytest.mark.parametrize("coupling", ["none", "maximal", "gumbel"])
def test_engine_commits_only_top_k_tokens(zero_uniforms, monkeypatch, coupling):
    """Whole decode loop, top-k 2 of 16 codes: every committed token has positive target probability, also the
    residual samples after rejected carried drafts (whose older target's top 2 moved)."""
    adapter = rejecting_janus(top_k=2)
    engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4, coupling=coupling))
    real_verify, checked = verify_window, []

    def checking_verify(rule, target_probs, *args, **kwargs):
        result, samples = real_verify(rule, target_probs, *args, **kwargs)
        committed = result.committed[0, : int(result.n_accepted[0]) + 1]
        checked.append(bool(in_support(target_probs[0, : committed.numel()], committed).all()))
        return result, samples

    monkeypatch.setattr("csd.drafters.chain.verify_window", checking_verify)
    with decode_counts(engine) as exercised:
        for seed in range(3):
            engine.generate("two red circles", seed=seed)
    assert checked and all(checked)
    # measured (none, maximal, gumbel): 33, 19, 19 rejections, 27, 9, 11 of a carried draft (the head-scaled Janus
    # without input_gain: 10 to 13, none carried)
    assert exercised.rejections >= 8 and exercised.carried_rejections >= 4, exercised


def test_gsd_groups_break_ties_by_token_index():
    """Tied target probabilities (the zeros outside the top-k) rank by token index, on every device.

    Ranking by ``q``: 3, 17, 29, then the zeros 0, 1, 2, 4, 5, ... in index order. The draft ``x = 1``
    sits at rank 4, so with ``G = 6`` its group is ranks 1..7 = {17, 29, 0, 1, 2, 4, 5}:
    ``Q(C) = 0.5``, ``P(C) = 0.8``, ``b = 0.625``. An unstable sort puts other zeros in the group.
    """
    vocab = 40
    rule = GSD(group_size=6, prob_threshold=1.0, embed_threshold=1.0)
    rule.embeddings = torch.zeros(vocab, 2)  # every token is an embedding neighbour of every other
    q = torch.zeros(vocab)
    q[[3, 17, 29]] = torch.tensor([0.5, 0.3, 0.2])
    p = torch.zeros(vocab)
    p[[1, 2, 5, 21, 33]] = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])
    batch = 8  # the same case in several rows: every row must give the same answer
    out = rule.accept_prob(q.expand(batch, -1), p.expand(batch, -1), torch.full((batch,), 1), torch.zeros(batch))
    torch.testing.assert_close(out.accept_prob, torch.full((batch,), 0.625))


def test_cfg_in_log_probability_space_gives_the_same_target():
    """Why there is no ``cfg_space`` option: log-softmax shifts each row by a constant, which CFG keeps."""
    logits = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0)) * 3
    as_logits = torch.softmax(classifier_free_guidance(3.0)(logits), -1)
    as_logprobs = torch.softmax(classifier_free_guidance(3.0)(torch.log_softmax(logits, -1)), -1)
    torch.testing.assert_close(as_logits, as_logprobs, atol=1e-6, rtol=1e-5)
