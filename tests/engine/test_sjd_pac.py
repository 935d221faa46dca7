"""SJD-PAC's tree windows (docs/ALGORITHMS.md "SJD-PAC: tree windows").

Lossless: recursive rejection sampling commits exactly ``q`` (one step, 200 000 trees), and tree windows with
RRS, Adaptive Continuation and Proactive Drafting give AR's law of a body prefix (chi-square against the
enumerated law of a tiny Janus, like tests/engine/test_lossless.py); the released code's variant
(``pac_code_parity``) is detected as biased. Tree attention: every node's logits are those of a plain
forward over its root-to-node path, and the kept path's cache continues like a chain's. Counters, errors and
the pipeline end to end.

Every tree has fewer candidates per depth than codes (``K < V``): with ``K >= V`` a fresh depth holds every code
and RRS always accepts one, so nothing is rejected. The tiny models (``tests.helpers.rejecting_*``) have targets
that move with the previous tokens; the lossless cases count (``decode_counts``) and assert rejected siblings and
depths whose every candidate was rejected.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import open_dict
from scipy import stats

from csd.acceptance import CSD, SJD, entropy
from csd.adapters.janus import tiny_janus_adapter
from csd.adapters.toy import load_toy_adapter
from csd.drafters.pac_tree import PacTreeDrafter
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.fast import CompiledStep
from csd.pipeline import generate_run
from csd.processors import TargetPipeline
from csd.ragged import SlotBatch, reference_logits
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED, load_records
from csd.tree import Tree, tree_nodes, verify_tree, without_replacement
from csd.validate import validate
from csd.verify import exponential_noise, sample_race
from tests.helpers import chi_square_pvalue, decode_counts, make_cfg, rejecting_janus, rejecting_lumina

PROMPT = "a cat"
N_SAMPLES = 2000


@torch.no_grad()
def exact_prefix_distribution(adapter, prompt: str, length: int) -> dict[tuple[int, ...], float]:
    """AR's law of the first ``length`` body tokens (no forced positions), by enumeration."""
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    out = {}
    for combo in itertools.product(range(adapter.vocab_size), repeat=length):
        ids = adapter.image_token_ids[torch.tensor(combo)]
        q = pipeline(reference_logits(adapter, prompt, ids[:-1]))
        out[combo] = float(torch.prod(q[torch.arange(length), torch.tensor(combo)]))
    return out


@pytest.fixture(scope="module")
def models():
    """Tiny Janus with a 3x3 body (9 tokens, so windows are refreshed and carried several times) over 3 and 5 codes,
    and over 5 codes with top-k 3; the tests compare the law of the first 4 (3 codes: 81 cells) or 3 (5 codes: 125
    cells) tokens with AR's. Target entropy 0.4 nats over 3 codes (head_scale 16: at 12, 0.75 nats, the released
    code's bias shows only at p = 0.1 with these samples), 1.2 over 5."""
    out = {}
    for name, codes, prefix, top_k, head in ((3, 3, 4, 0, 16.0), (5, 5, 3, 0, 12.0), ("5_top3", 5, 3, 3, 12.0)):
        adapter = rejecting_janus(grid=3, codebook=codes, head_scale=head, guidance_scale=2.0, seed=1, top_k=top_k)
        out[name] = (adapter, prefix, exact_prefix_distribution(adapter, PROMPT, prefix))
    return out


def prefix_pvalue(models, codes: int | str, offset: int = 60_000, rule=None, least: tuple[int, int] = (0, 0),
                  n_samples: int = N_SAMPLES, **engine_args) -> float:
    """The chi-square p-value of the first body tokens of ``n_samples`` images against AR's law; the run must reject
    at least ``least`` = (rejected sibling candidates, windows ending at a branching depth whose candidates were all
    rejected)."""
    adapter, prefix, probs = models[codes]
    engine = JacobiEngine(adapter, rule or SJD(), PacTreeDrafter(**engine_args))
    with decode_counts(engine) as exercised:
        counts = Counter(tuple(engine.generate(PROMPT, seed=offset + s).tokens[:prefix].tolist()) for s in range(n_samples))
    assert exercised.sibling_rejections >= least[0] and exercised.rejected_branchings >= least[1], exercised
    return chi_square_pvalue(counts, probs)


#: every case has K < V; ``n_samples`` 1200 images except the case whose mutation control needs 2000
LOSSLESS = {
    # K = 2, D = 2, spine of 2: PD only (candidate 0 = the row sample), one-hot fresh drafts
    "k2_d2_pd": (3, dict(window=3, width=2, depth=2, coupling="none", draft_record="onehot", n_samples=1200)),
    # K = 2, D = 3 (the Cartesian tree below both depth-1 candidates), AC + PD (a mutation that keeps the old
    # draft instead of coupling it is detected here, p < 1e-6)
    "k2_d3_pac": (3, dict(window=7, width=2, depth=3, coupling="maximal", draft_record="onehot", n_samples=2000)),
    # K = 3, D = 3 over 5 codes, uniform records: SJD-PAC's configuration on a small window
    "k3_d3_pac": (5, dict(window=13, width=3, depth=3, coupling="maximal", draft_record="uniform", n_samples=1200)),
    # K = 4 over 5 codes, top-k 3: a carried depth's siblings are drawn from q's 3 codes, so its 4th candidate
    # never exists (invalid siblings are never accepted); a fresh depth's 4 candidates can miss one of q's codes
    "k4_d2_topk": ("5_top3", dict(window=5, width=4, depth=2, coupling="maximal", draft_record="onehot",
                                  n_samples=1200)),
    # Gumbel sharing for candidate 0
    "k2_d3_gumbel": (3, dict(window=7, width=2, depth=3, coupling="gumbel", draft_record="uniform", n_samples=1200)),
}


@pytest.mark.statistical
@pytest.mark.parametrize("case", list(LOSSLESS))
def test_tree_windows_are_lossless(models, case):
    """Measured over the 1200 images of a case (2000 for k2_d3_pac): 2290 to 6590 rejected siblings, 940 to 5060
    windows that ended at a branching depth whose candidates were all rejected (K = 4 over these 3 codes: none in
    200 images)."""
    codes, args = LOSSLESS[case]
    assert prefix_pvalue(models, codes, least=(1000, 500), **args) > 1e-3


@pytest.mark.statistical
def test_code_parity_is_detected(models):
    """Negative control: the released code's candidates (siblings from the residual ``(q - p)_+``, AC inside the tree
    from the all-siblings residual) and its longest-run row choice move the law away from AR's."""
    args = dict(window=7, width=2, depth=3, coupling="maximal", draft_record="onehot", code_parity=True)
    assert prefix_pvalue(models, 3, **args) < 1e-6


@pytest.mark.slow
def test_csd_on_trees_with_lam_zero_is_sjd(models):
    """CSD's relaxation enters the tree through the rule only: ``lam = 0`` gives SJD's tokens, ``lam > 0`` relaxes."""
    adapter = models[5][0]
    args = dict(window=13, width=3, depth=3, coupling="maximal", draft_record="uniform")
    sjd, csd0, csd = (JacobiEngine(adapter, rule, PacTreeDrafter(**args)) for rule in (SJD(), CSD(lam=0.0), CSD(lam=2.0, delta=1.0)))
    relaxed = 0
    for seed in range(30):
        a, b, c = sjd.generate(PROMPT, seed), csd0.generate(PROMPT, seed), csd.generate(PROMPT, seed)
        assert a.tokens.tolist() == b.tokens.tolist() and a.nfe == b.nfe
        assert b.stats | {"filter_checks": 0, "filter_passes": 0} == a.stats
        assert c.stats["filter_checks"] == c.stats["drafts_verified"]
        relaxed += c.stats["relaxed_accepts"]
    assert relaxed > 0


# ----------------------------------------------------------------------------------- RRS, one step, exactly

def star_commits(rule, q: torch.Tensor, cands: torch.Tensor, laws: torch.Tensor, seed: int) -> torch.Tensor:
    """The committed token of ``n`` independent one-level trees (root target ``q``, children ``cands [n, K]`` with
    recorded laws ``laws [n, K, V]``) through :func:`csd.tree.verify_tree`: the first accepted child in sibling
    order, else a sample of the final residual."""
    n, width = cands.shape
    vocab = q.numel()
    g = torch.Generator().manual_seed(seed)
    size = n * (1 + width)
    children = n + torch.arange(n * width).view(n, width)
    target = q.expand(size, vocab).contiguous()
    tokens = torch.cat([torch.zeros(n, dtype=torch.long), cands.flatten()])
    probs = torch.cat([torch.zeros(n, vocab), laws.flatten(0, 1)])
    grid = (torch.arange(n).view(n, 1), children.T.reshape(width, n, 1))
    none = torch.zeros(size, dtype=torch.bool)
    verdict = verify_tree(rule, grid, target, entropy(target), tokens, probs, ~none, none, torch.rand(size, generator=g))
    accepted = verdict.accepted[n:].view(n, width)
    first = accepted.int().argmax(-1)
    residual = sample_race(verdict.final[:, 0], exponential_noise((n, vocab), g, q.device))
    return torch.where(accepted.any(-1), cands.gather(1, first[:, None])[:, 0], residual)


def law_pvalue(tokens: torch.Tensor, q: torch.Tensor) -> float:
    counts = np.bincount(tokens.numpy(), minlength=q.numel())
    expected = q.double().numpy()
    return float(stats.chisquare(counts, expected / expected.sum() * tokens.numel()).pvalue)


def random_law(g: torch.Generator, vocab: int = 6) -> torch.Tensor:
    return torch.softmax(torch.randn(vocab, generator=g) * 1.5, -1)


N_STARS = 200_000


@pytest.mark.statistical
@pytest.mark.parametrize("width", [2, 3, 5])
def test_rrs_without_replacement_is_exact(width):
    """Candidates drawn one after the other from ``p`` without the earlier ones (Proactive Drafting), all recorded
    with ``p``: the committed token is distributed as ``q`` (RRS)."""
    g = torch.Generator().manual_seed(width)
    q, p = random_law(g), random_law(g)
    vocab = q.numel()
    noise = exponential_noise((N_STARS, width, vocab), g, q.device)
    cands, valid = without_replacement(p.expand(N_STARS, vocab), noise, torch.zeros(N_STARS, vocab, dtype=torch.bool))
    assert bool(valid.all()) and bool((cands[:, :, None] != cands[:, None, :]).sum((1, 2)).eq(width * (width - 1)).all())
    committed = star_commits(SJD(), q, cands, p.expand(N_STARS, width, vocab), seed=100 + width)
    assert law_pvalue(committed, q) > 1e-3


@pytest.mark.statistical
def test_rrs_mixed_records_are_exact():
    """Candidate 0 carried (law ``p``), fresh siblings distinct uniform tokens recorded uniform or one-hot: still ``q``."""
    g = torch.Generator().manual_seed(7)
    q, p = random_law(g), random_law(g)
    vocab, width = q.numel(), 3
    first = sample_race(p.expand(N_STARS, vocab), exponential_noise((N_STARS, vocab), g, q.device))
    noise = exponential_noise((N_STARS, width - 1, vocab), g, q.device)
    siblings, _ = without_replacement(torch.ones(N_STARS, vocab), noise, F.one_hot(first, vocab).bool())
    cands = torch.cat([first[:, None], siblings], 1)
    uniform = torch.full((N_STARS, width - 1, vocab), 1.0 / vocab)
    for sibling_laws in (uniform, F.one_hot(siblings, vocab).float()):
        laws = torch.cat([p.expand(N_STARS, 1, vocab), sibling_laws], 1)
        assert law_pvalue(star_commits(SJD(), q, cands, laws, seed=8), q) > 1e-3


@pytest.mark.statistical
def test_rrs_detects_siblings_from_another_law():
    """The same test rejects siblings drawn with replacement, or from the residual ``(q' - p)_+`` of another target
    (the released code's siblings), while recorded as draws from ``p`` without replacement."""
    g = torch.Generator().manual_seed(3)
    q, p, other = random_law(g), random_law(g), random_law(g)
    vocab, width = q.numel(), 3
    noise = exponential_noise((N_STARS, width, vocab), g, q.device)
    none = torch.zeros(N_STARS, vocab, dtype=torch.bool)
    first = sample_race(p.expand(N_STARS, vocab), noise[:, 0])
    replaced, _ = without_replacement(p.expand(N_STARS, vocab), noise[:, 1:], none)
    residual = (other - p).clamp_min(0)
    from_residual, _ = without_replacement(residual.expand(N_STARS, vocab), noise[:, 1:], F.one_hot(first, vocab).bool())
    for siblings in (replaced, from_residual):
        cands = torch.cat([first[:, None], siblings], 1)
        assert law_pvalue(star_commits(SJD(), q, cands, p.expand(N_STARS, width, vocab), seed=4), q) < 1e-6


# ------------------------------------------------------------------------------------ tree attention, cache

ADAPTERS = {
    "janus": (rejecting_janus, "a cat", 1e-5),
    "toy": (load_toy_adapter, "two red circles", 1e-4),  # the toy's matmuls round by row count: up to 2e-5
    "lumina": (rejecting_lumina, "a cat", 1e-5),
}


def chain_logits(adapter, prompt: str, head: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Raw logits of a plain window ``ids`` after a first window ``head`` (whose anchor is the prompt's last token):
    ``[rows, K, V]``, from the no-cache forward."""
    return reference_logits(adapter, prompt, torch.cat([head[1:], ids]))[:, -ids.numel():]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_tree_node_logits_equal_their_path(name):
    """fp32: every node's logits equal those of a plain forward over its root-to-node path, and after keeping a
    non-spine path (KV compaction) the next forward equals the chain's over the same tokens. The logits depend on
    the path: two nodes of one depth with different tokens differ by over 1000 tolerances (measured: Janus 0.47,
    toy 3.2, Lumina 3.8; the Janus without ``input_gain``: 0.002), so a wrong mask cannot pass."""
    build, prompt, tol = ADAPTERS[name]
    adapter = build()
    tree = Tree.build(5, (3, 2))  # spine of 5, 3 candidates at depth 1, 2 at depth 2: 12 nodes
    g = torch.Generator().manual_seed(0)
    free = adapter.image_token_ids
    ids = free[torch.randint(adapter.vocab_size, (tree.size,), generator=g)]
    head = free[torch.randint(adapter.vocab_size, (3,), generator=g)]
    batch = SlotBatch(adapter, 1)
    batch.prefill(0, prompt)
    batch.forward(head[None], [True], [True])
    out = batch.forward(ids[None], [False], [True], tree=tree.mask(adapter.device))[0]
    paths = {}
    for node in range(tree.size):
        path = [node]
        while path[-1] > 0:
            path.append(tree.parent[path[-1]])
        paths[node] = path[::-1]
        ref = chain_logits(adapter, prompt, head, ids[paths[node]])
        assert torch.allclose(out[:, node], ref[:, -1], atol=tol, rtol=0), node
    for a, b in itertools.combinations(range(tree.size), 2):
        if tree.depth(a) == tree.depth(b) and ids[a] != ids[b]:
            assert (out[:, a] - out[:, b]).abs().max() > 1000 * tol, (a, b)
    # keep root -> (2,) -> (2, 1): entries 0, 6, 11 move to the window's front; then a 2-token window
    kept = paths[11]
    assert kept == [0, 6, 11]
    batch.keep(tree.size, [kept])
    nxt = free[torch.randint(adapter.vocab_size, (2,), generator=g)]
    after = batch.forward(nxt[None], [False], [True])[0]
    ref = chain_logits(adapter, prompt, head, torch.cat([ids[kept], nxt]))
    assert torch.allclose(after, ref[:, -2:], atol=tol, rtol=0)


def test_tree_layout_matches_the_released_code():
    """K = 4, D = 3, L = 64: 21 tree nodes (1 + 4 + 16), a spine of 46 (root + 45 drafts), 18 siblings."""
    assert tree_nodes(4, 3) == 21 and tree_nodes(3, 3) == 13
    tree = Tree.build(64 - 18, (4, 4))
    assert tree.size == 64 and tree.spine == 46
    assert [len(tree.children[v]) for v in range(tree.size) if tree.depth(v) == 1] == [4, 4, 4, 4]
    assert all(not tree.children[v] for v in range(tree.spine, tree.size) if tree.depth(v) == 2)
    # the same candidate (branch index) under every parent: 4 distinct branch tuples per depth-1 parent
    assert sorted(tree.branches[c][-1] for c in tree.children[0]) == [0, 1, 2, 3]
    accepted = [False] * tree.size
    for v in (tree.children[0][2], tree.children[0][3], tree.children[tree.children[0][3]][1]):
        accepted[v] = True
    rrs = tree.path(accepted)  # sibling order: the first accepted child (branch 2), a leaf below it
    deepest = tree.path(accepted, deepest=True)  # the code: the longest run (branch 3, then its child 1)
    assert [tree.branches[v] for v in rrs] == [(), (2,)]
    assert [tree.branches[v] for v in deepest] == [(), (3,), (3, 1)]


# ----------------------------------------------------------------------------------------- records, counters

def test_counters_of_tree_windows():
    """Per image: one sampled token per forward (residual or bonus), the accepted nodes are the accepted drafts,
    ``drafts_proposed`` counts every node of every window (K = 2, D = 3, L = 7: 7 nodes while 3 or more body
    positions are left, then 3, then the root alone), verified lies between accepted and proposed."""
    adapter = rejecting_janus()  # 16 codes
    engine = JacobiEngine(adapter, SJD(), PacTreeDrafter(window=7, coupling="maximal", draft_record="uniform", width=2, depth=3))
    length = adapter.layout.length
    nodes = {1: 1, 2: 3}
    total_accepted = 0
    with decode_counts(engine) as exercised:
        gens = [engine.generate(PROMPT, seed) for seed in range(20)]
    for gen in gens:
        kinds, iters = gen.commit_kind.tolist(), gen.commit_iter.tolist()
        assert iters == sorted(iters) and set(iters) == set(range(gen.nfe))
        assert kinds.count(COMMIT_SAMPLED) == gen.nfe
        assert kinds.count(COMMIT_ACCEPTED) + kinds.count(COMMIT_RELAXED) == gen.stats["drafts_accepted"]
        starts = [iters.index(i) for i in range(gen.nfe)]
        assert all(iters.count(i) <= 3 for i in range(gen.nfe))  # at most the spine's 2 drafts + 1
        assert gen.stats["drafts_proposed"] == sum(nodes.get(length - n, 7) - 1 for n in starts)
        assert gen.stats["drafts_accepted"] <= gen.stats["drafts_verified"] <= gen.stats["drafts_proposed"]
        assert gen.step_compression == pytest.approx(length / gen.nfe)
        total_accepted += gen.stats["drafts_accepted"]
    assert total_accepted > 20
    # measured: 106 siblings rejected, 29 accepted; 106 windows ended at a depth whose candidates were all rejected
    assert exercised.sibling_rejections >= 40 and exercised.sibling_accepts >= 10 and exercised.rejected_branchings >= 40


def test_forced_positions_get_no_siblings():
    """Lumina-mGPT's structural tokens (forced, width 1 in the tree) and AR tail: the forced ids land in place and
    count as no draft; its free positions are its only drafts."""
    adapter = rejecting_lumina(jacobi_tail=3)  # 8 codes
    engine = JacobiEngine(adapter, SJD(), PacTreeDrafter(window=13, coupling="maximal", draft_record="uniform", width=3, depth=3))
    forced = adapter.layout.forced_ids
    with decode_counts(engine) as exercised:
        gens = [engine.generate(PROMPT, seed) for seed in range(5)]
    for gen in gens:
        assert torch.equal(gen.tokens[forced >= 0], forced[forced >= 0])
        kinds = gen.commit_kind
        assert bool((kinds[forced >= 0] == COMMIT_FORCED).all()) and not bool((kinds[forced < 0] == COMMIT_FORCED).any())
        free_accepted = int(((kinds == COMMIT_ACCEPTED) | (kinds == COMMIT_RELAXED)).sum())
        assert gen.stats["drafts_accepted"] == free_accepted
    # measured: 14 siblings rejected, 4 accepted, 6 windows ended at a depth whose candidates were all rejected
    assert exercised.sibling_rejections >= 5 and exercised.sibling_accepts >= 1 and exercised.rejected_branchings >= 3


# -------------------------------------------------------------------------------------- errors, pipeline

@pytest.mark.parametrize(("overrides", "message"), [
    (["engine.batch_size=2"], "engine.batch_size=1"),
    (["engine.compile=true"], "engine.compile=false"),
    (["drafter.window=16"], "drafter.window=16 cannot hold the tree"),
    (["method.window=16"], "drafter.window=16 cannot hold the tree"),  # the deprecated key sets the drafter's
    (["drafter.depth=1"], "drafter.depth=1 must be an integer >= 2"),
    (["drafter.code_parity=true", "drafter.coupling=none"], "drafter.coupling='none'"),
])
def test_bad_tree_settings_fail_before_the_model_loads(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(make_cfg("model=janus_pro_7b", "method=sjd_pac", *overrides))
    with pytest.raises(ConfigError, match="method.pac_code_parity is a tree setting: use drafter=pac_tree"):
        validate(make_cfg("method=sjd", "method.pac_code_parity=true"))


def test_engine_refuses_batches_and_the_compiled_path():
    adapter = tiny_janus_adapter(grid=2, codebook=3)
    with pytest.raises(ValueError, match="set engine.batch_size=1"):
        JacobiEngine(adapter, SJD(), PacTreeDrafter(window=21, coupling="none", draft_record="onehot", width=4, depth=3), batch_size=2)
    with pytest.raises(ValueError, match="set engine.compile=false"):
        JacobiEngine(adapter, SJD(), PacTreeDrafter(window=21, coupling="none", draft_record="onehot", width=4, depth=3),
                     compiled=CompiledStep(adapter, backend="eager"))


@pytest.mark.slow
def test_sjd_pac_through_the_pipeline(tmp_path):
    """``python run.py model=toy method=sjd_pac dataset=toy dataset.n_prompts=1`` end to end: records with the tree
    settings, more than one token per forward."""
    cfg = make_cfg("model=toy", "method=sjd_pac", "dataset=toy", "dataset.n_prompts=1", "engine.progress=false",
                   "engine.warmup=0")
    with open_dict(cfg):
        cfg.run_dir = str(tmp_path)
    generate_run(cfg)
    (rec,) = load_records(tmp_path)
    assert rec["method_params"] == {"window": 64, "init": "random", "coupling": "maximal", "draft_record": "uniform",
                                    "tree_width": 4, "tree_depth": 3, "pac_code_parity": False}
    assert len(rec["tokens"]) == 256 and rec["nfe"] < 256 / 2
    assert rec["drafts_accepted"] + rec["nfe"] == 256
    assert (tmp_path / rec["image"]).exists()
