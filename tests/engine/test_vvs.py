"""VVS verification skipping on the EAGLE drafter (``drafter.skip``, csd/drafters/skip.py; docs/ALGORITHMS.md "VVS:
verification skipping"): ``skip=none`` decodes token for token as before; the uniform schedule skips exactly every
interval-th drafting round and never two in a row; a skipped round commits the drafted path cut to the mean accepted
length; the similarity schedule's depth weights and threshold; every skip saves one target forward; batches; bad
settings get one line."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from csd.acceptance import SJD
from csd.compose import build_drafter
from csd.drafters.eagle import EagleDrafter
from csd.drafters.skip import SkipSchedule, SkipState, depth_weights, path_similarity, reused_features
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.slot import Request
from tests.engine.test_eagle import random_head
from tests.helpers import rejecting_janus

PROMPT = "a cat"
#: tokens and target forwards of seeds 0-2 at window 4 on ``setup``'s model, decoded before skipping existed
BEFORE = {
    "chain": [([11, 1, 1, 1, 6, 1, 1, 1, 1, 14, 11, 1, 14, 14, 7, 6], 12),
              ([11, 1, 1, 1, 1, 1, 1, 1, 14, 1, 6, 14, 14, 6, 1, 1], 11),
              ([7, 1, 1, 1, 1, 14, 14, 1, 1, 1, 1, 14, 14, 14, 1, 6], 12)],
    "binary": [([11, 1, 1, 1, 14, 11, 1, 14, 14, 0, 13, 6, 1, 1, 6, 1], 11),
               ([11, 1, 1, 1, 8, 1, 14, 14, 1, 14, 7, 6, 14, 1, 14, 14], 10),
               ([7, 1, 14, 1, 6, 1, 0, 5, 14, 10, 14, 14, 7, 1, 14, 1], 13)],
}


class Logged(EagleDrafter):
    """Keeps each finished image's skip record and every skipped chain: ``(n, model ids, floor(tau), drafts)``."""

    def bind(self, adapter, body, pad):
        super().bind(adapter, body, pad)
        self.logs, self.chains = [], []

    def _start_skip(self, slot, ids):
        w = slot.draft.window
        drafts = w.rows - 1 if self.tree == "chain" else max(w.tree.depth(v) for v in range(w.tree.size))
        self.chains.append((slot.request.seed, slot.n, ids.tolist(), slot.draft.skip.mean_accepted(), drafts))
        super()._start_skip(slot, ids)

    def finish(self, slot):
        self.logs.append((slot.request.seed, slot.draft.skip))
        super().finish(slot)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    adapter = rejecting_janus()
    return adapter, random_head(adapter, tmp_path_factory.mktemp("head") / "head.pt", scale=30.0)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """6 x 6 tokens: room for several skips per image."""
    adapter = rejecting_janus(grid=6)
    return adapter, random_head(adapter, tmp_path_factory.mktemp("head") / "head.pt", scale=30.0)


@pytest.mark.parametrize("tree", ["chain", "binary"])
def test_skip_none_decodes_as_before(setup, tree):
    adapter, head = setup
    drafter = EagleDrafter(window=4, head=head, tree=tree, skip="none", skip_interval=2)
    engine = JacobiEngine(adapter, SJD(), drafter)
    for seed, (tokens, nfe) in enumerate(BEFORE[tree]):
        gen = engine.generate(PROMPT, seed)
        assert (gen.tokens.tolist(), gen.nfe, gen.stats["skipped"]) == (tokens, nfe, 0)
    assert "skip" not in drafter.params()  # records and run fingerprints as before


@pytest.mark.parametrize("tree", ["chain", "binary"])
def test_uniform_skips_every_interval_th_round(big, tree):
    """Round ``k`` (1-based) is skipped iff ``k % interval == 0`` where a skip is possible past the warm-up; the
    ``skipped`` counter counts them; a target forward per round that was not skipped."""
    adapter, head = big
    drafter = Logged(window=4, head=head, tree=tree, skip="uniform", skip_interval=3, skip_warmup=2)
    engine = JacobiEngine(adapter, SJD(), drafter)
    gens = [engine.generate(PROMPT, seed) for seed in range(3)]
    for gen, (_, state) in zip(gens, drafter.logs, strict=True):
        for k, (n, possible, skipped) in enumerate(state.log, start=1):
            assert skipped == (possible and n >= 2 and k % 3 == 0)
        assert gen.stats["skipped"] == sum(s for _, _, s in state.log) > 0
        assert gen.nfe == len(state.log) - gen.stats["skipped"]


def test_never_two_skips_in_a_row():
    """With every round wanting a skip (uniform interval 2 after an odd round, or similarity >= -1), a skipped round
    is always followed by a verified one (drafted after it, in the same target forward)."""
    for policy in ("uniform", "similarity"):
        schedule, state = SkipSchedule(policy, 2, -1.0, 0.9, 1), SkipState()
        state.rounds = 1
        decisions = [schedule.skip(state, 10, 2, True, 1.0) for _ in range(4)]
        assert decisions == [True] * 4 and [d for _, _, d in state.log] == [True, False] * 4
        assert state.rounds == 9 and [n for n, _, _ in state.log][:2] == [10, 12]
    state = SkipState()
    assert not SkipSchedule("uniform", 2, 0.7, 0.9, 6).skip(state, 5, 2, True) and state.rounds == 1  # warm-up


@pytest.mark.parametrize("tree", ["chain", "binary"])
def test_skipped_tokens_are_the_drafted_path_cut_to_the_mean_accepted_length(big, tree):
    """A skipped chain is ``min(L_path, floor(tau))`` drafts of the round, committed as they are; every committed
    token is a skipped one, an accepted draft or one sample per target forward."""
    adapter, head = big
    drafter = Logged(window=4, head=head, tree=tree, skip="uniform", skip_interval=2, skip_warmup=2)
    engine = JacobiEngine(adapter, SJD(), drafter)
    gens = {seed: engine.generate(PROMPT, seed) for seed in range(3)}
    assert drafter.chains
    for seed, n, ids, tau, drafts in drafter.chains:
        assert len(ids) == min(drafts, tau) >= 1
        assert gens[seed].tokens[n : n + len(ids)].tolist() == ids
    for seed, gen in gens.items():
        skipped = sum(len(ids) for s, _, ids, _, _ in drafter.chains if s == seed)
        assert gen.tokens.numel() == gen.nfe + gen.stats["drafts_accepted"] + skipped


def test_skip_verify_judges_the_skipped_chain(big):
    """``skip_verify=true``: the skipped chain is judged with the drafts after it, so some of it gets rejected; every
    committed token is an accepted draft or one sample per target forward."""
    adapter, head = big
    drafter = Logged(window=4, head=head, skip="uniform", skip_interval=2, skip_warmup=2, skip_verify=True)
    engine = JacobiEngine(adapter, SJD(), drafter)
    gens = [engine.generate(PROMPT, seed) for seed in range(4)]
    assert sum(g.stats["skipped"] for g in gens) > 0
    assert all(g.tokens.numel() == g.nfe + g.stats["drafts_accepted"] for g in gens)
    assert sum(g.stats["drafts_verified"] - g.stats["drafts_accepted"] for g in gens) > 0


def test_similarity_weights_and_threshold(big):
    """``w_l = decay^l / sum``; identical paths have ``S = 1``, orthogonal codes ``S = 0``, and the schedule skips iff
    ``S >= threshold``; on the model, a threshold of -1 skips every round it can (a verified round after each)."""
    w = depth_weights(4, 0.9)
    assert torch.allclose(w, torch.tensor([1, 0.9, 0.81, 0.729]) / 3.439) and torch.allclose(w[1:] / w[:-1], torch.tensor(0.9))
    paths = torch.zeros((3, 4), dtype=torch.long)
    same = torch.randn(4, 8).expand(3, 4, 8)
    assert path_similarity(paths, same, 0.9) == pytest.approx(1.0)
    assert path_similarity(paths, torch.eye(3)[:, None, :].expand(3, 4, 3), 0.9) == pytest.approx(0.0)
    mixed = torch.eye(3)[None].expand(2, 3, 3).clone()
    mixed[1, 0] = torch.tensor([0.0, 1.0, 0.0])  # the paths differ at depth 0 only: S = 1 - w_0
    assert path_similarity(paths[:2, :3], mixed, 0.5) == pytest.approx(1 - 4 / 7)
    assert path_similarity(paths[:1], same[:1], 0.9) == 0.0  # one path: nothing to compare (the code's 0)
    schedule = SkipSchedule("similarity", 5, 0.7, 0.9, 1)
    assert schedule.skip(SkipState(), 3, 2, True, 0.7) and not schedule.skip(SkipState(), 3, 2, True, 0.69)
    adapter, head = big
    drafter = Logged(window=4, head=head, tree="binary", skip="similarity", skip_threshold=-1.0, skip_warmup=2)
    gen = JacobiEngine(adapter, SJD(), drafter).generate(PROMPT, 0)
    ((_, state),) = drafter.logs
    for n, possible, skipped in state.log:
        assert skipped == (possible and n >= 2)
    assert not any(a[2] and b[2] for a, b in zip(state.log, state.log[1:], strict=False))
    assert gen.stats["skipped"] > 0


def test_reused_features_are_the_latest():
    recent = torch.arange(6.0).view(1, 3, 2)
    assert reused_features(recent, 2).tolist() == [[[2.0, 3.0], [4.0, 5.0]]]
    assert reused_features(recent, 4)[0, 3].tolist() == [4.0, 5.0]


def test_batch_4_equals_batch_1(big):
    """The one engine at batch 4 (continuous refill, windows of different lengths after a skip) gives each image
    its batch-1 tokens, counters and forwards."""
    adapter, head = big
    requests = [Request(prompt, seed) for prompt in ("a cat", "a dog on a red sofa") for seed in range(3)]

    def drafter():
        return EagleDrafter(window=4, head=head, skip="uniform", skip_interval=2, skip_warmup=2)

    one = JacobiEngine(adapter, SJD(), drafter())
    four = JacobiEngine(adapter, SJD(), drafter(), batch_size=4)
    batched = {(r.prompt, r.seed): g for r, g in four.generate_many(requests)}
    assert sum(g.stats["skipped"] for g in batched.values()) > 0
    for r in requests:
        ref = one.generate(r.prompt, r.seed)
        got = batched[r.prompt, r.seed]
        assert (got.tokens.tolist(), got.nfe, got.stats) == (ref.tokens.tolist(), ref.nfe, ref.stats)


def test_bad_settings_get_one_line():
    def cfg(**keys):
        return OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter", "window": 4, "head": None,
                                 **keys})

    with pytest.raises(ConfigError, match=r"^drafter.skip='sometimes' must be one of \['none', 'uniform', 'similarity'\]$"):
        build_drafter(cfg(skip="sometimes"))
    with pytest.raises(ConfigError, match=r"^drafter.skip_interval=1 must be an integer >= 2$"):
        build_drafter(cfg(skip="uniform", skip_interval=1))
    with pytest.raises(ConfigError, match=r"^drafter.skip_threshold=2 must be in \[-1.0, 1.0\]$"):
        build_drafter(cfg(skip="similarity", tree="binary", skip_threshold=2))
    with pytest.raises(ConfigError, match=r"^drafter.skip=similarity compares a tree's candidate paths"):
        build_drafter(cfg(skip="similarity"))
    from csd.api import compose_config

    with pytest.raises(ConfigError, match=r"^drafter.skip_warmup=0 must be an integer >= 1$"):
        compose_config("toy", "sjd", {"drafter": "eagle", "drafter.skip": "uniform", "drafter.skip_warmup": 0})
    assert EagleDrafter(window=4, skip="uniform").params()["skip_interval"] == 5
