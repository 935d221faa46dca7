"""No sampler ever draws from a law with no mass; a rule whose residual can be empty says what it draws instead.

docs/ALGORITHMS.md, "Acceptance rules" and "LANTERN": the lossless residual ``norm([q - p]_+)`` and LANTERN's
paper residual ``norm([q' - p]_+)`` have mass wherever a rejection can happen, and fall back to ``q`` where they
do not (rounding, or a window position whose residual is computed but unused). LANTERN's code-parity residual
zeroes ``k + 1`` neighbours, more than the acceptance used, and can be empty after a real rejection: the released
code then draws uniformly over the vocabulary, and the records count those commits (``residual_fallbacks``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baselines.lantern import Lantern
from csd.acceptance import SJD, Residual, lossless_residual
from csd.adapters.janus import tiny_janus_adapter
from csd.drafters.chain import ChainDrafter
from csd.drafters.pac_tree import PacTreeDrafter
from csd.engine import STAT_KEYS, JacobiEngine
from csd.verify import WindowNoise, sample_race, verify_window
from tests.helpers import chi_square_pvalue

V = 8


def law(entries: dict[int, float]) -> torch.Tensor:
    probs = torch.zeros(V)
    for token, mass in entries.items():
        probs[token] = mass
    return probs


def lantern(k: int, delta: float, code_parity: bool) -> Lantern:
    """A LANTERN rule on ``V = 8`` codes whose neighbours of code 7 are 4, then 5, then 6 (others: any)."""
    rule = Lantern(neighbours=k, budget=delta, code_parity=code_parity)
    table = torch.tensor([[(v + j) % V for j in range(1, V)] for v in range(V)])
    table[7] = torch.tensor([4, 5, 6, 0, 1, 2, 3])
    rule.neighbours_table = table[:, : (k + 1 if code_parity else k)]
    return rule


def replacements(rule, q: torch.Tensor, p: torch.Tensor, x: int, n: int, seed: int = 0):
    """``n`` independent one-draft windows with draft ``x`` against ``q``: the replacement after each rejection."""
    g = torch.Generator().manual_seed(seed)
    noise = WindowNoise.draw(n, 2, V, g, torch.device("cpu"))
    result, _ = verify_window(
        rule, torch.stack([q, q]).expand(n, 2, V), torch.zeros(n, 2), torch.full((n, 1), x), p.expand(n, 1, V),
        torch.zeros(n, 1, dtype=torch.bool), noise,
    )
    rejected = result.n_accepted == 0
    return result.committed[rejected, 0], result.fallback[rejected], result.fallback[~rejected]


def test_sampler_refuses_a_law_with_no_mass():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(RuntimeError, match="no mass"):
        sample_race(probs, torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="no mass"):
        sample_race(torch.full((3,), float("nan")), torch.ones(3))
    assert sample_race(probs[:1], torch.ones(1, 3)).tolist() == [0]


def test_lossless_residual_falls_back_to_q_and_says_so():
    q = law({1: 0.5, 2: 0.5})
    empty = SJD().residual(q[None], q[None], torch.tensor([1]))  # q <= p everywhere: no mass in [q - p]_+
    assert isinstance(empty, Residual)
    assert torch.equal(empty.probs[0], q) and empty.fallback.tolist() == [True]
    p = law({1: 1.0})
    full = SJD().residual(q[None], p[None], torch.tensor([1]))
    assert torch.equal(full.probs[0], law({2: 1.0})) and full.fallback.tolist() == [False]
    assert torch.equal(lossless_residual(q, q), q)


@pytest.mark.statistical
def test_parity_residual_with_no_mass_draws_uniformly_over_the_codes():
    """The one-position case: q = {4: .6, 5: .4}, fresh one-hot draft 7 (q(7) = 0), k = 1, delta = 0.6. J = 1,
    b = 0.6; a rejection zeroes neighbours 4 and 5, so q' = 0: the released code draws uniformly."""
    q, p = law({4: 0.6, 5: 0.4}), F.one_hot(torch.tensor(7), V).float()
    rule = lantern(k=1, delta=0.6, code_parity=True)
    assert float(rule.accept_prob(q[None], p[None], torch.tensor([7]), torch.zeros(1)).accept_prob) == pytest.approx(0.6)
    tokens, fallback, _ = replacements(rule, q, p, 7, 20000)
    assert 7000 < tokens.numel() < 9000 and bool(fallback.all())
    counts = torch.bincount(tokens, minlength=V)
    assert chi_square_pvalue({(v,): int(c) for v, c in enumerate(counts)}, {(v,): 1 / V for v in range(V)}) > 1e-4


def test_parity_residual_empty_but_q_prime_not_zero_does_not_recommit_the_draft():
    """q' = {7: .2, 3: .1} after the parity zeroing of 4 and 5, and p = {7: .8, 3: .2} >= q' everywhere: the
    residual is empty (falling back to q' re-commits the rejected 7 two times in three)."""
    q, p = law({4: 0.3, 5: 0.4, 7: 0.2, 3: 0.1}), law({7: 0.8, 3: 0.2})
    rule = lantern(k=1, delta=0.3, code_parity=True)
    tokens, fallback, _ = replacements(rule, q, p, 7, 20000)
    assert bool(fallback.all())
    share_7 = float((tokens == 7).float().mean())
    assert share_7 == pytest.approx(1 / V, abs=0.02)


def test_paper_residual_has_mass_after_every_rejection():
    """Paper mode zeroes only the J neighbours the acceptance used: the replacements follow ``norm([q' - p]_+)``
    and never fall back (a rejection needs ``p(x) > q(x) + s_J``, which leaves ``[q' - p]_+`` some mass)."""
    q, p = law({4: 0.3, 5: 0.4, 7: 0.2, 3: 0.1}), law({7: 0.8, 3: 0.2})
    tokens, fallback, _ = replacements(lantern(k=1, delta=0.3, code_parity=False), q, p, 7, 4000)
    assert tokens.numel() > 1000 and not bool(fallback.any())
    assert set(tokens.tolist()) == {5}  # q' = {5: .4, 7: .2, 3: .1}, [q' - p]_+ = {5: .4}


def test_paper_residual_with_every_neighbour_used_falls_back_to_q():
    """delta = 1, k = 2: J = 2 uses all of q's mass, b = 1, and the residual (computed, never drawn after an
    acceptance) would be zero: it is ``q``, as docs/ALGORITHMS.md states."""
    q, p = law({4: 0.6, 5: 0.4}), F.one_hot(torch.tensor(7), V).float()
    residual = lantern(k=2, delta=1.0, code_parity=False).residual(q[None], p[None], torch.tensor([7]))
    assert torch.allclose(residual.probs[0], q) and residual.fallback.tolist() == [True]
    _, rejected_fallback, accepted_fallback = replacements(lantern(k=2, delta=1.0, code_parity=False), q, p, 7, 100)
    assert rejected_fallback.numel() == 0 and not bool(accepted_fallback.any())  # b = 1: nothing drawn, nothing counted


def committed_with_q(engine: JacobiEngine, monkeypatch, seeds: range) -> tuple[int, int, int]:
    """Over ``seeds``: (sampled tokens committed with q = 0, fallback replacements, the records' residual_fallbacks).

    Sampled = the replacement or bonus token of a window (LANTERN may also *accept* a draft with ``q(x) = 0``
    through its neighbours' mass: that is its relaxation, not a sampling error)."""
    real_verify = verify_window
    zero_q, flagged = [], []

    def checking_verify(rule, target_probs, *args, **kwargs):
        result, samples = real_verify(rule, target_probs, *args, **kwargs)
        last = result.n_accepted[0]
        zero_q.append(int(target_probs[0, last, result.committed[0, last]] == 0))
        flagged.append(int(result.fallback[0]))
        return result, samples

    monkeypatch.setattr("csd.drafters.chain.verify_window", checking_verify)
    recorded = sum(engine.generate("two red circles", seed=s).stats["residual_fallbacks"] for s in seeds)
    monkeypatch.undo()
    return sum(zero_q), sum(flagged), recorded


def test_engine_counts_every_fallback_commit_and_paper_mode_commits_none_outside_q(monkeypatch):
    """The engine case: top-k 4 of 64 codes, 8-row windows. Parity mode commits zero-probability codes only as
    counted fallback draws (uniform, so most of them); paper mode never commits one."""
    assert "residual_fallbacks" in STAT_KEYS
    adapter = tiny_janus_adapter(grid=8, codebook=64, head_scale=20.0, top_k=4)
    parity = JacobiEngine(adapter, Lantern(neighbours=1000, budget=0.1, code_parity=True), ChainDrafter(window=8))
    zero_q, flagged, recorded = committed_with_q(parity, monkeypatch, range(10))
    assert flagged > 0 and recorded == flagged
    assert 0 < zero_q <= flagged
    paper = JacobiEngine(adapter, Lantern(neighbours=1000, budget=0.1, code_parity=False), ChainDrafter(window=8))
    zero_q, flagged, recorded = committed_with_q(paper, monkeypatch, range(10))
    assert zero_q == 0 and flagged == 0 and recorded == 0


def test_tree_windows_count_fallback_commits_too():
    """SJD-PAC's tree windows draw the final residual after recursive rejection: parity LANTERN's empty residuals
    are counted there as well, and the paper residual never falls back."""
    adapter = tiny_janus_adapter(grid=4, codebook=16, head_scale=20.0, top_k=2)
    counts = {}
    for code_parity in (True, False):
        engine = JacobiEngine(adapter, Lantern(neighbours=15, budget=0.1, code_parity=code_parity), PacTreeDrafter(window=12, coupling="none", draft_record="onehot", width=3, depth=2))
        counts[code_parity] = sum(engine.generate("two red circles", seed=s).stats["residual_fallbacks"] for s in range(6))
    assert counts[True] > 0 and counts[False] == 0
