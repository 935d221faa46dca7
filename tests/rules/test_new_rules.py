"""Entropy-informed SJD and COOL-SD (docs/ALGORITHMS.md "Entropy-aware SJD (`entropy_sjd`) and COOL-SD (`cool_sd`)").

The one-step law at depth 0 is checked with every rule in ``test_acceptance.py``; here: the formulas,
COOL-SD's schedule along the window (also through the engine's ``verify_window``), and that the residual
``norm([q - p b]_+)`` of both rules is the lossless one, which the engine computes without the depth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from baselines.cool_sd import CoolSD
from baselines.entropy_sjd import EntropySJD
from csd.acceptance import entropy, lossless_residual
from csd.verify import verify_window

V = 6


def random_rows(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``q``, ``p`` ``[rows, V]`` and drafts ``x ~ p``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(rows, V, generator=g) * 2.0, -1)
    p = torch.softmax(torch.randn(rows, V, generator=g) * 2.0, -1)
    return q, p, torch.multinomial(p, 1, generator=g)[:, 0]


def test_entropy_sjd_formula():
    q = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    p = torch.tensor([[0.2, 0.6, 0.2], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    x = torch.tensor([1, 1, 0])
    h = entropy(q)
    v = EntropySJD(entropy_scale=9.0, entropy_offset=0.0).accept_prob(q, p, x, h)
    s = float(h[0]) / 9.0
    # s = 0 where H = 0: a token with q(x) = 0 is still never accepted, one with q(x) > 0 always
    assert torch.allclose(v.accept_prob, torch.tensor([min(1.0, 0.5 / s), 0.0, 1.0]))
    assert torch.allclose(v.lossless_prob, torch.tensor([0.5, 0.0, 1.0]))
    confident = torch.tensor([[0.9, 0.05, 0.05]])  # H = 0.39: s = 0.094 with the default offset, b = 0.53
    one_hot = torch.tensor([[0.0, 1.0, 0.0]])
    default = EntropySJD().accept_prob(confident, one_hot, x[:1], entropy(confident)).accept_prob
    assert torch.allclose(default, 0.05 / (entropy(confident) / 9.0 + 0.05))
    assert float(default) < 1.0


def test_entropy_sjd_scale_is_clamped_to_one():
    rule = EntropySJD(entropy_scale=1.0, entropy_offset=0.5)
    assert torch.allclose(rule.uniform_scale(torch.tensor([0.0, 0.25, 3.0])), torch.tensor([0.5, 0.75, 1.0]))


def test_entropy_sjd_bias_matches_closed_form():
    """TV(O, q) = sum_{q(y) < p(y)} (min(p(y), q(y)/s) - q(y)) for O = p b + (1 - sum p b) r (section 2.4)."""
    q, p, _ = random_rows(seed=1, rows=1)
    rule = EntropySJD(entropy_scale=4.0, entropy_offset=0.1)
    xs = torch.arange(V)
    h = entropy(q).expand(V)
    b = rule.accept_prob(q.expand(V, V), p.expand(V, V), xs, h).accept_prob
    out = p[0] * b + (1 - (p[0] * b).sum()) * rule.residual(q[0], p[0], xs[0]).probs
    s = float(rule.uniform_scale(h[0]))
    below = q[0] < p[0]
    bias = (torch.minimum(p[0], q[0] / s) - q[0])[below].sum()
    assert torch.isclose(0.5 * (out - q[0]).abs().sum(), bias, atol=1e-6)


def test_cool_sd_weights_decrease_to_one():
    w = CoolSD(anneal_scale=2.0, anneal_decay=0.7).weights(5)
    expected = [max(1.0, 2.0 * math.exp(-0.7 * d)) for d in range(5)]
    assert torch.allclose(w, torch.tensor(expected))
    assert w[0] == 2.0 and w[-1] == 1.0 and bool((w[1:] <= w[:-1]).all())
    assert torch.equal(CoolSD(anneal_scale=1.0).weights(4), torch.ones(4))


def test_cool_sd_depth_is_the_window_position():
    q = torch.tensor([0.2, 0.3, 0.5]).expand(2, 3, 3)
    p = torch.tensor([0.5, 0.3, 0.2]).expand(2, 3, 3)
    x = torch.zeros(2, 3, dtype=torch.long)
    rule = CoolSD(anneal_scale=2.0, anneal_decay=0.5)
    v = rule.accept_prob(q, p, x, entropy(q))
    w = [2.0, 2.0 * math.exp(-0.5), 1.0]  # 2 e^-1 < 1: floored
    assert torch.allclose(v.accept_prob, torch.tensor([min(1.0, wd * 0.4) for wd in w]).expand(2, 3))
    assert torch.allclose(v.lossless_prob, torch.full((2, 3), 0.4))


@pytest.mark.parametrize("rule", [EntropySJD(), EntropySJD(entropy_scale=2.0, entropy_offset=0.0),
                                  CoolSD(anneal_scale=3.0, anneal_decay=0.2)],
                         ids=["entropy_sjd", "entropy_sjd_scale2_offset0", "cool_sd"])
def test_residual_is_the_optimal_one(rule):
    """``norm([q - p b]_+) = norm([q - p]_+)`` at every depth because ``b >= min(1, q/p)`` (COOL-SD Prop. 1)."""
    q, p, _ = random_rows(seed=2, rows=4)
    xs = torch.arange(V)
    qs, ps = q[:, None].expand(4, V, V), p[:, None].expand(4, V, V)
    # draft x at window depth d, for d = 0..3: b[d, x] over every token x
    b = rule.accept_prob(qs.transpose(0, 1), ps.transpose(0, 1), xs[:, None].expand(V, 4),
                         entropy(qs.transpose(0, 1))).accept_prob.T
    optimal = (q - p * b).clamp_min(0.0)
    optimal = optimal / optimal.sum(-1, keepdim=True)
    assert torch.allclose(rule.residual(q, p, xs[:4]).probs, optimal, atol=1e-6)


@pytest.mark.statistical
def test_cool_sd_second_draft_follows_its_weight():
    """Through ``verify_window``: with the first draft forced, the second one (depth 1) commits
    ``p b_1 + (1 - sum p b_1) norm([q - p]_+)`` with ``b_1 = min(1, w_1 q/p)``."""
    n = 200_000
    q, p, _ = random_rows(seed=5, rows=1)
    q, p = q[0], p[0]
    rule = CoolSD(anneal_scale=4.0, anneal_decay=0.5)
    w1 = 4.0 * math.exp(-0.5)
    b = (w1 * q / p).clamp(max=1.0)
    expected = p * b + (1 - (p * b).sum()) * lossless_residual(q, p)
    g = torch.Generator().manual_seed(11)
    second = torch.multinomial(p, n, replacement=True, generator=g)
    drafts = torch.stack([torch.zeros(n, dtype=torch.long), second], 1)
    uniform = torch.full((V,), 1.0 / V)
    target = torch.stack([uniform, q, uniform]).expand(n, 3, V)
    forced = torch.tensor([True, False]).expand(n, 2)
    result, _ = verify_window(rule, target, entropy(target), drafts, p.expand(n, 2, V), forced, g)
    assert bool((result.n_accepted >= 1).all())
    counts = np.bincount(result.committed[:, 1].numpy(), minlength=V)
    exp = expected.double().numpy()
    assert stats.chisquare(counts, exp / exp.sum() * n).pvalue > 1e-4, (counts / n, expected)
    depth0 = p * (4.0 * q / p).clamp(max=1.0)
    assert not torch.allclose(expected, depth0 + (1 - depth0.sum()) * lossless_residual(q, p), atol=1e-3)
