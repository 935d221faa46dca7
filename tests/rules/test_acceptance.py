"""Single-step maths of every acceptance rule (docs/ALGORITHMS.md).

For one draft ``x ~ p`` judged against ``q``, the committed token must follow
``P(y) = p(y) b(y) + sum_x p(x) (1 - b(x)) r_x(y)`` (``r_x = norm([q - p]_+)`` for every rule but
LANTERN, whose residual depends on the neighbours of ``x``). We draw many independent windows in one
batched call of the engine's own ``verify_window`` and compare with that analytic law.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from scipy import stats

from baselines.cool_sd import CoolSD
from baselines.entropy_sjd import EntropySJD
from baselines.gsd import GSD
from baselines.lantern import Lantern, nearest_neighbours
from baselines.relaxed import Addition, Amplify
from csd.acceptance import CSD, SJD, AcceptanceRule, entropy, lossless_residual, total_variation
from csd.verify import verify_window

V = 6
N = 200_000


class CodebookStub:
    """The two model facts GSD and LANTERN need: image-token embeddings and VQ codebook vectors."""

    device = torch.device("cpu")

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.vectors = torch.randn(V, 3, generator=g) * 0.4

    def token_embeddings(self) -> torch.Tensor:
        return self.vectors

    def codebook(self) -> torch.Tensor:
        return self.vectors


RULES = {
    "sjd": lambda: SJD(),
    "addition": lambda: Addition(c=0.2),
    "amplify": lambda: Amplify(factor=3.0),
    "csd": lambda: CSD(lam=0.3, delta=0.9),
    "csd_log_support": lambda: CSD(lam=0.5, delta=1.0, entropy_norm="log_support"),
    "gsd": lambda: GSD(group_size=4, prob_threshold=0.3, embed_threshold=1.0),
    "gsd_code_parity": lambda: GSD(group_size=4, prob_threshold=0.3, embed_threshold=1.0, code_parity=True),
    "lantern": lambda: Lantern(neighbours=3, budget=0.3),
    "lantern_code_parity": lambda: Lantern(neighbours=3, budget=0.3, code_parity=True),
    "entropy_sjd": lambda: EntropySJD(),
    "entropy_sjd_steep": lambda: EntropySJD(entropy_scale=4.0, entropy_offset=0.0),
    "cool_sd": lambda: CoolSD(anneal_scale=2.0),
}


def random_case(seed: int, one_hot_draft: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    if one_hot_draft:
        p = torch.zeros(V)  # placeholder: one-hot p is built per draft below
    return q, p


def analytic(rule: AcceptanceRule, q: torch.Tensor, p_of: callable, draft_law: torch.Tensor) -> torch.Tensor:
    """``P(y) = sum_x law(x) [b(x) 1{y = x} + (1 - b(x)) r_x(y)]`` with ``p_of(x)`` the recorded p of draft x.

    Each draft ``x`` is the only draft of its own window (``[V, 1, V]`` rows: depth 0, as in :func:`empirical`).
    """
    xs = torch.arange(V)
    ps = torch.stack([p_of(x) for x in range(V)])
    qs = q.expand(V, V)
    b = rule.accept_prob(qs[:, None], ps[:, None], xs[:, None], entropy(qs)[:, None]).accept_prob[:, 0]
    r = rule.residual(qs, ps, xs).probs
    r = r / r.sum(-1, keepdim=True)
    return (draft_law[:, None] * (torch.diag(b) + (1 - b)[:, None] * r)).sum(0)


def empirical(rule: AcceptanceRule, q: torch.Tensor, p_of: callable, draft_law: torch.Tensor, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(draft_law, N, replacement=True, generator=g)
    ps = torch.stack([p_of(x) for x in range(V)])[drafts]
    target = torch.stack([q, torch.full((V,), 1.0 / V)]).expand(N, 2, V)  # row 1 is the bonus row
    result, _ = verify_window(
        rule, target, entropy(target), drafts[:, None], ps[:, None], torch.zeros(N, 1, dtype=torch.bool), g
    )
    return np.bincount(result.committed[:, 0].numpy(), minlength=V)


@pytest.mark.statistical
@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("one_hot", [False, True])
def test_committed_token_follows_analytic_law(name, one_hot):
    rule = RULES[name]()
    rule.setup(CodebookStub())
    q, p = random_case(seed=zlib.crc32(name.encode()) % 1000, one_hot_draft=one_hot)  # stable across processes
    if one_hot:  # a fresh random draft: x uniform, recorded p one-hot on x
        law = torch.full((V,), 1.0 / V)

        def p_of(x: int) -> torch.Tensor:
            return torch.nn.functional.one_hot(torch.tensor(x), V).float()

    else:  # a refreshed draft: x ~ p, recorded p
        law = p

        def p_of(x: int) -> torch.Tensor:
            return p

    expected = analytic(rule, q, p_of, law)
    assert torch.isclose(expected.sum(), torch.tensor(1.0), atol=1e-5)
    counts = empirical(rule, q, p_of, law, seed=7)
    exp = expected.double().numpy()
    pvalue = stats.chisquare(counts, exp / exp.sum() * counts.sum()).pvalue
    assert pvalue > 1e-4, (name, counts / N, expected)
    if rule.lossless:
        assert torch.allclose(expected, q, atol=1e-6)


@pytest.mark.parametrize(
    "name", ["addition", "amplify", "csd", "gsd", "gsd_code_parity", "lantern", "lantern_code_parity", "entropy_sjd", "cool_sd"]
)
def test_relaxed_rules_change_the_distribution(name):
    rule = RULES[name]()
    rule.setup(CodebookStub())
    q, p = random_case(seed=3, one_hot_draft=False)
    assert not torch.allclose(analytic(rule, q, lambda x: p, p), q, atol=1e-3)


def test_csd_formula_and_filter():
    q = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    p = torch.tensor([[0.4, 0.4, 0.2], [0.0, 0.0, 1.0]])
    x = torch.tensor([1, 2])
    rule = CSD(lam=0.1, delta=0.3)
    v = rule.accept_prob(q, p, x, entropy(q))
    h = float(entropy(q[0]))
    assert torch.allclose(total_variation(p, q), torch.tensor([0.1, 0.8]))
    assert v.filter_pass.tolist() == [True, False]
    assert torch.allclose(v.accept_prob, torch.tensor([min(1.0, 0.3 / 0.4 + 0.1 * h), 0.2]))
    assert torch.allclose(v.lossless_prob, torch.tensor([0.75, 0.2]))


def test_csd_entropy_norms():
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    h = entropy(q)
    assert torch.allclose(CSD(entropy_norm="log_vocab").normalised_entropy(q, h), h / np.log(4))
    assert torch.allclose(CSD(entropy_norm="log_support").normalised_entropy(q, h), torch.tensor([1.0]))


def test_lossless_residual_is_normalised_positive_part():
    q, p = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(lossless_residual(q, p), torch.tensor([1.0, 0.0, 0.0]))


def test_lantern_neighbours_exclude_self_and_are_sorted():
    cb = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    assert nearest_neighbours(cb, 2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]


def test_lantern_relaxed_target_and_residual():
    rule = Lantern(neighbours=2, budget=0.25)
    rule.neighbours_table = torch.tensor([[1, 2], [0, 2], [1, 0]])
    q = torch.tensor([[0.5, 0.2, 0.3]])
    p = torch.tensor([[0.0, 1.0, 0.0]])
    v = rule.accept_prob(q, p, torch.tensor([1]), entropy(q))
    # neighbours of 1 are (0, 2): s_1 = 0.5 > 0.25, so J = 0 and q~(1) = q(1)
    assert torch.allclose(v.accept_prob, torch.tensor([0.2]))
    rule.budget = 0.6  # now J = 1: q~(1) = 0.2 + 0.5; residual zeroes q(0)
    assert torch.allclose(rule.accept_prob(q, p, torch.tensor([1]), entropy(q)).accept_prob, torch.tensor([0.7]))
    assert torch.allclose(rule.residual(q, p, torch.tensor([1])).probs, torch.tensor([[0.0, 0.0, 1.0]]))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: CSD(lam=-1), "lam"),
        (lambda: CSD(delta=1.5), "delta"),
        (lambda: CSD(entropy_norm="bits"), "entropy_norm"),
        (lambda: Addition(c=-0.1), "c"),
        (lambda: Amplify(factor=0.5), "factor"),
        (lambda: Lantern(budget=2.0), "budget"),
        (lambda: EntropySJD(entropy_scale=0.0), "entropy_scale"),
        (lambda: EntropySJD(entropy_offset=-0.1), "entropy_offset"),
        (lambda: CoolSD(anneal_scale=0.5), "anneal_scale"),
        (lambda: CoolSD(anneal_decay=-1.0), "anneal_decay"),
    ],
)
def test_rules_reject_bad_hyper_parameters(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()
