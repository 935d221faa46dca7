"""``method.code_parity`` for GSD and LANTERN (docs/ALGORITHMS.md "GSD", "LANTERN").

Hand-built cases where the released code and the papers' definitions differ, and a plain transcription of
each released rule (from its description in the design notes) compared with the parity rule on random
cases. The one-step output law of both parity rules is checked with every rule in ``test_acceptance.py``.
"""

from __future__ import annotations

import pytest
import torch

from baselines.gsd import GSD
from baselines.lantern import Lantern
from csd.acceptance import entropy, lossless_residual
from csd.compose import build_rule, method_params
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.validate import validate
from tests.helpers import count_host_reads, one_row_iterations, rejecting_janus
from tests.pipeline.test_config import make_cfg

V = 16


class EmbeddingStub:
    """``token_embeddings()`` / ``codebook()`` of ``V`` codes (GSD's embedding filter, LANTERN's neighbours)."""

    device = torch.device("cpu")

    def __init__(self, vectors: torch.Tensor) -> None:
        self.vectors = vectors

    def token_embeddings(self) -> torch.Tensor:
        return self.vectors

    def codebook(self) -> torch.Tensor:
        return self.vectors


def ranked_q() -> torch.Tensor:
    """A target whose ranking is the token index (token 0 has the largest ``q``), all values distinct."""
    q = 0.8 ** torch.arange(V, dtype=torch.float32)
    return q / q.sum()


def gsd_b(rule: GSD, q: torch.Tensor, p: torch.Tensor, x: int) -> float:
    return float(rule.accept_prob(q[None], p[None], torch.tensor([x]), entropy(q[None])).accept_prob[0])


def wide_gsd(code_parity: bool) -> GSD:
    """Group size 14 (the code's window) with filters that keep every candidate: only the window matters."""
    rule = GSD(group_size=14, prob_threshold=1.0, embed_threshold=1.0, code_parity=code_parity)
    rule.setup(EmbeddingStub(torch.zeros(V, 2)))
    return rule


def test_gsd_draft_among_the_seven_lowest_falls_back_to_the_sjd_ratio():
    q = ranked_q()
    one_hot = torch.nn.functional.one_hot(torch.tensor(14), V).float()  # x = 14: second-lowest q
    # the code: ascending position 1 < 7, empty slice, plain min(1, q(x)/p(x)) = q(x)
    assert gsd_b(wide_gsd(code_parity=True), q, one_hot, 14) == pytest.approx(float(q[14]))
    # the paper: ranks 14 - 7 .. 15 (clipped at the bottom), Q(C) / P(C) with P(C) = 1
    assert gsd_b(wide_gsd(code_parity=False), q, one_hot, 14) == pytest.approx(float(q[7:].sum()))
    # the eighth-lowest token (x = 8, ascending position 7) has a group again: ranks 2 .. 15
    one_hot8 = torch.nn.functional.one_hot(torch.tensor(8), V).float()
    assert gsd_b(wide_gsd(code_parity=True), q, one_hot8, 8) == pytest.approx(float(q[2:].sum()))


def test_gsd_asymmetric_window_changes_the_group():
    q = ranked_q()
    p = torch.linspace(2.0, 1.0, V)
    p = p / p.sum()
    x = 7
    # the paper: 7 each side, ranks 0 .. 14; the code: 6 higher-ranked (1 .. 6) and 7 lower-ranked (8 .. 14)
    paper = min(1.0, float(q[0:15].sum() / p[0:15].sum()))
    code = min(1.0, float(q[1:15].sum() / p[1:15].sum()))
    assert paper != pytest.approx(code)
    assert gsd_b(wide_gsd(code_parity=False), q, p, x) == pytest.approx(paper)
    assert gsd_b(wide_gsd(code_parity=True), q, p, x) == pytest.approx(code)


def released_gsd(logits: torch.Tensor, p: torch.Tensor, x: int, emb: torch.Tensor, half: int,
                 p_thr: float, d_thr: float) -> float:
    """The released rule for one draft, written from its description (design notes, ALGORITHMS.md "GSD"):
    ascending sort of the logits, Python slice ``[i - half, i + half)``, both filters on the slice, and the
    plain ``min(1, q/p)`` when the slice is empty (there the code raises inside its ``try``)."""
    q = torch.softmax(logits, -1)
    ascending = torch.sort(logits).indices
    i = int((ascending == x).nonzero())
    candidates = ascending[i - half : i + half]
    if candidates.numel() == 0:
        return min(1.0, float(q[x] / p[x]))
    dist2 = (emb[candidates] - emb[x]).pow(2).sum(-1)
    keep = ((q[candidates] - q[x]).abs() < p_thr) & (dist2 < d_thr)
    return min(1.0, float((q[candidates] * keep).sum() / (p[candidates] * keep).sum()))


@pytest.mark.parametrize("group_size", [14, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gsd_parity_matches_the_released_rule(group_size, seed):
    """Ranking by ``q`` reproduces the code's ranking by logits: softmax keeps the order of distinct logits."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(V, 3, generator=g) * 0.4
    rule = GSD(group_size=group_size, code_parity=True)  # the released thresholds 0.15, 0.5
    rule.setup(EmbeddingStub(emb))
    logits = torch.randn(V, generator=g) * 2.0
    q = torch.softmax(logits, -1)
    refreshed = torch.softmax(torch.randn(V, generator=g) * 2.0, -1)
    for x in range(V):
        for p in (refreshed, torch.nn.functional.one_hot(torch.tensor(x), V).float()):
            expected = released_gsd(logits, p, x, emb, group_size // 2, 0.15, 0.5)
            assert gsd_b(rule, q, p, x) == pytest.approx(expected, abs=1e-6), (x, p)


def test_gsd_parity_with_group_size_zero_is_sjd():
    q, p = ranked_q(), torch.full((V,), 1.0 / V)
    rule = wide_gsd(code_parity=True)
    rule.group_size = 0
    assert all(gsd_b(rule, q, p, x) == pytest.approx(min(1.0, float(q[x] * V))) for x in range(V))


def line_lantern(k: int, delta: float, code_parity: bool) -> Lantern:
    """Codes on a line at 0, 1, 3, 6, 10, ...: the neighbours of code 0 are 1, 2, 3, ... in that order."""
    rule = Lantern(neighbours=k, budget=delta, code_parity=code_parity)
    rule.setup(EmbeddingStub(torch.tensor([[v * (v + 1) / 2] for v in range(V)])))
    return rule


def test_lantern_parity_table_has_one_neighbour_more():
    assert line_lantern(3, 0.1, code_parity=False).neighbours_table.shape == (V, 3)
    assert line_lantern(3, 0.1, code_parity=True).neighbours_table.shape == (V, 4)
    assert line_lantern(3, 0.1, code_parity=True).neighbours_table[0].tolist() == [1, 2, 3, 4]
    assert line_lantern(V, 0.1, code_parity=True).neighbours_table.shape == (V, V - 1)  # capped at every other code


def test_lantern_rejection_after_fewer_than_k_plus_one_neighbours():
    q = ranked_q()
    p = torch.nn.functional.one_hot(torch.tensor(0), V).float()
    x = torch.tensor([0])
    delta = float(q[1]) + 1e-4  # s_1 = q(1) <= delta < s_2: J = 1 of k = 3
    paper, code = line_lantern(3, delta, code_parity=False), line_lantern(3, delta, code_parity=True)
    # the same decision: b = min(1, (q(0) + q(1)) / p(0))
    for rule in (paper, code):
        b = rule.accept_prob(q[None], p[None], x, entropy(q[None])).accept_prob
        assert float(b) == pytest.approx(float(q[0] + q[1]))
    # the paper zeroes the one neighbour used, the code the first k + 1 = 4 (tokens 1 .. 4)
    zeroed_paper, zeroed_code = q.clone(), q.clone()
    zeroed_paper[1] = 0
    zeroed_code[1:5] = 0
    expected_paper = (zeroed_paper - p).clamp_min(0) / (zeroed_paper - p).clamp_min(0).sum()
    expected_code = (zeroed_code - p).clamp_min(0) / (zeroed_code - p).clamp_min(0).sum()
    assert torch.allclose(paper.residual(q[None], p[None], x).probs[0], expected_paper)
    assert torch.allclose(code.residual(q[None], p[None], x).probs[0], expected_code)
    assert not torch.allclose(expected_paper, expected_code)


def test_lantern_no_neighbour_used_zeroes_nothing_in_both():
    q = ranked_q()
    p = torch.full((V,), 1.0 / V)
    x = torch.tensor([0])
    for code_parity in (False, True):
        rule = line_lantern(3, float(q[1]) / 2, code_parity)  # s_1 > delta: J = 0
        assert torch.allclose(rule.residual(q[None], p[None], x).probs[0], lossless_residual(q, p))


def released_lantern_residual(q: torch.Tensor, p: torch.Tensor, x: int, nbrs: torch.Tensor, k: int,
                              delta: float) -> torch.Tensor:
    """The released rejection branch for one draft, from its description (design notes, "LANTERN"): if the
    last index with cumulative neighbour mass <= delta exists, zero the first ``k + 1`` neighbours; then
    ``[q' - p]_+``, normalised, or the uniform law where it has no mass (``torch.ones_like``)."""
    cumsum = q[nbrs[x, :k]].cumsum(0)
    target = q.clone()
    if bool((cumsum <= delta).any()):
        target[nbrs[x, : k + 1]] = 0
    diff = (target - p).clamp_min(0)
    if float(diff.sum()) == 0:
        diff = torch.ones_like(diff)
    return diff / diff.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lantern_parity_matches_the_released_residual(seed):
    g = torch.Generator().manual_seed(seed)
    rule = Lantern(neighbours=4, budget=0.3, code_parity=True)
    rule.setup(EmbeddingStub(torch.randn(V, 3, generator=g)))
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    xs = torch.arange(V)
    got = rule.residual(q.expand(V, V), p.expand(V, V), xs).probs
    for x in range(V):
        assert torch.allclose(got[x], released_lantern_residual(q, p, x, rule.neighbours_table, 4, 0.3), atol=1e-6)
    # p = q (a refreshed draft): q' <= p everywhere, every residual is empty and both draw uniformly
    empty = rule.residual(q.expand(V, V), q.expand(V, V), xs)
    assert bool(empty.fallback.all())
    for x in range(V):
        assert torch.allclose(empty.probs[x], released_lantern_residual(q, q, x, rule.neighbours_table, 4, 0.3), atol=1e-6)


def test_code_parity_flows_from_the_config_and_is_recorded():
    for method, cls in (("gsd", GSD), ("lantern", Lantern)):
        cfg = make_cfg(f"method={method}", "method.code_parity=true")
        validate(cfg)
        rule = build_rule(cfg.method)
        assert isinstance(rule, cls) and rule.code_parity
        assert method_params(cfg)["code_parity"] is True
        default = make_cfg(f"method={method}")
        assert not build_rule(default.method).code_parity
        assert "code_parity" not in method_params(default)  # runs made before the option stay comparable
    with pytest.raises(ConfigError, match="method.code_parity='yes' must be true or false"):
        validate(make_cfg("method=gsd", "method.code_parity=yes"))


@pytest.mark.parametrize("rule", [GSD(code_parity=True), Lantern(neighbours=8, budget=0.2, code_parity=True)], ids=lambda r: r.name)
def test_parity_rules_run_in_the_engine_with_one_host_sync_per_iteration(rule, monkeypatch):
    adapter = rejecting_janus()  # 16 codes: windows end in rejections and roll back
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=5))
    calls, one_row = count_host_reads(monkeypatch), one_row_iterations(monkeypatch)
    gen = engine.generate("two red circles", seed=0)
    monkeypatch.undo()
    assert len(calls) == gen.nfe - len(one_row) + 1, calls  # one-row windows (the AR tail) read nothing
    assert gen.tokens.shape == (16,) and int(gen.tokens.max()) < 16
    assert gen.stats["drafts_verified"] > gen.stats["drafts_accepted"] > 0
