"""PJD, Jacobi chains on several image rows at once (``drafter=pjd``, docs/ALGORITHMS.md "PJD").

With one row in flight (``context >= W``) PJD is the chain drafter, token for token (raster bodies, Lumina-mGPT's and
Emu3's forced end-of-line tokens and AR tail, every coupling and recorded law); every forward's logits equal one
no-cache forward over every entry fed so far by PJD's definition (raster position ids; an entry sees the entries kept
from earlier forwards and, in its own forward, the shared entries and its own row's chain, at positions up to its
own), and the same forwards without the row-causal restriction do not; a batch gives each image its batch-1 tokens;
the records show the row wavefront; every rule runs on the rows; the released code's refresh; refusals in one line.
The law of a tiny grid enumerated from the definition: ``tests/engine/test_pjd_law.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pytest
import torch

from baselines.gsd import GSD
from baselines.lantern import Lantern
from csd.acceptance import CSD, SJD
from csd.adapters.janus import tiny_janus_adapter
from csd.adapters.toy import load_toy_adapter
from csd.drafters.chain import ChainDrafter
from csd.drafters.pjd import Chain, Commits, PJDDrafter, Row
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.ragged import SlotBatch
from csd.records import COMMIT_FORCED
from csd.slot import Request
from csd.validate import validate
from tests.helpers import (
    make_cfg,
    rejecting_anole,
    rejecting_emu3,
    rejecting_janus,
    rejecting_llamagen,
    rejecting_lumina,
)

PROMPT = "a cat"


@pytest.fixture(scope="module")
def janus():
    return rejecting_janus(grid=4, codebook=4)


@pytest.fixture(scope="module")
def lumina():
    return rejecting_lumina(grid=(3, 4), jacobi_tail=2)


@pytest.mark.parametrize("settings", [
    {}, {"coupling": "maximal"}, {"coupling": "gumbel"}, {"init": "repeat_left"}, {"draft_record": "uniform"},
], ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()) or "default")
@pytest.mark.parametrize("model", ["janus", "lumina", "emu3"])
def test_one_row_in_flight_is_the_chain_drafter(model, settings, janus, lumina):
    """``context >= W``: the next row starts only when the top row is complete, which makes it the top row: one chain
    over the raster body, the chain drafter's windows and random numbers, so the same tokens, iterations and counters
    (Lumina-mGPT: a header, end-of-line tokens and an AR tail; Emu3: end-of-line tokens)."""
    adapter = {"janus": janus, "lumina": lumina, "emu3": rejecting_emu3(grid=(3, 3))}[model]
    width = adapter.layout.grid[1]
    for window, seed in ((3, 0), (5, 1)):
        chain = JacobiEngine(adapter, SJD(), ChainDrafter(window=window, **settings)).generate(PROMPT, seed)
        pjd = JacobiEngine(adapter, SJD(), PJDDrafter(window=window, context=width, **settings)).generate(PROMPT, seed)
        assert torch.equal(chain.tokens, pjd.tokens) and torch.equal(chain.commit_iter, pjd.commit_iter)
        assert torch.equal(chain.commit_kind, pjd.commit_kind) and torch.equal(chain.entropy, pjd.entropy)
        assert chain.nfe == pjd.nfe and chain.stats == pjd.stats


def test_rows_decode_in_parallel_and_records_are_in_raster_order():
    """``context = 1`` on a tiny Janus whose targets hardly move with the context (carried drafts pass): a row starts
    once the row above has a cell, so lower rows commit while the rows above are unfinished (the wavefront of
    ``commit_iter``); each row's cells are committed left to right, and the images take fewer forwards than the
    chain drafter's with the same window."""
    adapter = tiny_janus_adapter(grid=6, codebook=4)
    gens = [JacobiEngine(adapter, SJD(), PJDDrafter(window=4, context=1)).generate(PROMPT, seed) for seed in range(3)]
    for gen in gens:
        when = gen.commit_iter.view(6, 6)
        assert all(when[r].tolist() == sorted(when[r].tolist()) for r in range(6))
        assert sum(bool(when[r + 1, 0] <= when[r, -1]) for r in range(5)) >= 2
        assert gen.stats["drafts_accepted"] > 0
    chain = JacobiEngine(adapter, SJD(), ChainDrafter(window=4))
    assert sum(g.nfe for g in gens) < sum(chain.generate(PROMPT, seed).nfe for seed in range(3))


@dataclass(frozen=True)
class Entry:
    """A window entry by PJD's definition: its token id, body position (-1: the prompt's last token), forward, group
    (0: shared) and whether the cache kept it after its forward."""

    token: int
    position: int
    forward: int
    group: int
    kept: bool


def record_forwards(adapter, drafter: PJDDrafter, monkeypatch, prompt: str, seed: int) -> tuple[list[Entry], torch.Tensor]:
    """Decode one image, recording every entry (:class:`Entry`) and its raw logits ``[rows, E, V]`` in feeding order."""
    entries: list[Entry] = []
    logits: list[torch.Tensor] = []
    propose, verify, forward = PJDDrafter.propose, PJDDrafter.verify, SlotBatch.forward

    def recording_propose(self, slots):
        cached = slots[0].draft.cached
        proposal = propose(self, slots)
        t = len(logits)
        for j, (token, shift, group) in enumerate(zip(proposal.ids[0].tolist(), proposal.shift[0].tolist(),
                                                      proposal.groups[0].tolist(), strict=True)):
            entries.append(Entry(token, shift + cached + j - 1, t, group, False))
        return proposal

    def recording_verify(self, rule, slots, proposal, target, target_entropy):
        verified = verify(self, rule, slots, proposal, target, target_entropy)
        first = len(entries) - proposal.fed
        for j in verified.keep[0]:
            entries[first + j] = replace(entries[first + j], kept=True)
        return verified

    def recording_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        logits.append(out[0])
        return out

    monkeypatch.setattr(PJDDrafter, "propose", recording_propose)
    monkeypatch.setattr(PJDDrafter, "verify", recording_verify)
    monkeypatch.setattr(SlotBatch, "forward", recording_forward)
    JacobiEngine(adapter, SJD(), drafter).generate(prompt, seed)
    monkeypatch.undo()
    return entries, torch.cat(logits, dim=1)


@torch.no_grad()
def reference_logits(adapter, prompt: str, entries: list[Entry], row_causal: bool = True) -> torch.Tensor:
    """Raw logits ``[rows, E, V]`` of every entry by PJD's definition: one no-cache forward per CFG row over the prompt
    and every entry (position id: prompt length + body position), where entry ``k`` is visible to entry ``j`` iff its
    position is at most ``j``'s and it was kept from an earlier forward, or is in ``j``'s forward and shared or of
    ``j``'s group (any group: ``row_causal=False``, the negative control)."""
    assert entries[0].position == -1 and entries[0].forward == 0  # the prompt's last token anchors the first window
    body = adapter.body_inputs(torch.tensor([e.token for e in entries[1:]], device=adapter.device).view(1, -1))[0]
    out = []
    for row in adapter.prompt_inputs(prompt):
        n = row.shape[0]
        # an empty prompt row has a placeholder anchor that predicts nothing: its first prediction is the first row's
        own = entries if n else entries[1:]
        position = torch.tensor(list(range(n)) + [n + e.position for e in entries[1:]])
        forward = torch.tensor([-1] * (n - 1) + [e.forward for e in own])
        group = torch.tensor([0] * (n - 1) + [e.group for e in own])
        kept = torch.tensor([True] * (n - 1) + [e.kept for e in own])
        same = forward[None, :] == forward[:, None]
        shared = (group[None, :] == 0) | (group[None, :] == group[:, None]) if row_causal else torch.ones_like(same)
        visible = (position[None, :] <= position[:, None]) & (
            ((forward[None, :] < forward[:, None]) & kept[None, :]) | (same & shared))
        mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
        logits = adapter.decode_step(torch.cat([row, body])[None], None, position[None], mask[None, None])[0]
        out.append(logits[n - 1 :] if n else torch.cat([out[0][:1], logits]))
    return torch.stack(out)


@pytest.mark.parametrize(("build", "prompt", "context", "seed"), [
    (lambda: rejecting_janus(grid=4, codebook=4), PROMPT, 1, 2),
    (lambda: rejecting_janus(grid=4, codebook=4), PROMPT, 2, 2),
    (lambda: rejecting_lumina(grid=(3, 4), jacobi_tail=2), PROMPT, 1, 2),
    (lambda: rejecting_emu3(grid=(3, 5)), PROMPT, 1, 2),
    (lambda: rejecting_anole(grid=(3, 5)), PROMPT, 1, 2),
    (lambda: rejecting_llamagen("c2i"), "7", 1, 2),
    (lambda: tiny_janus_adapter(grid=8, codebook=64, head_scale=20.0), PROMPT, 1, 1),
], ids=["janus-c1", "janus-c2", "lumina", "emu3", "anole", "llamagen", "janus_pro_tiny-left-out"])
def test_every_forward_equals_the_no_cache_forward_of_its_definition(build, prompt, context, seed, monkeypatch):
    """Raster bodies with proxies (Janus-Pro; Anole: CFG rows of different prompt lengths; LlamaGen: 2-D rotary from
    the position ids) and bodies with forced end-of-line anchors and completed rows' last tokens (Lumina-mGPT, Emu3);
    a forward that feeds a left-out row's latest cell as context for the row below (``model=janus_pro_tiny``'s shape):
    every entry's logits, 5e-5 (fp32 sums in another order); without the row-causal restriction they differ."""
    adapter = build()
    entries, recorded = record_forwards(adapter, PJDDrafter(window=3, context=context), monkeypatch, prompt, seed)
    assert len({e.group for e in entries if e.group > 0}) > 1  # several rows shared forwards
    expected = reference_logits(adapter, prompt, entries)
    assert torch.allclose(recorded, expected, atol=5e-5, rtol=0)
    assert not torch.allclose(recorded, reference_logits(adapter, prompt, entries, row_causal=False), atol=5e-5, rtol=0)


@pytest.mark.parametrize("model", ["janus", "lumina"])
def test_a_batch_gives_each_image_its_batch_1_tokens(model, janus, lumina):
    """Three slots at different points of their schedules (different rows in flight, padded windows), refilled as
    images finish; maximal coupling draws from each image's generator in its own order."""
    adapter = {"janus": janus, "lumina": lumina}[model]
    requests = [Request(prompt, seed, seed) for seed, prompt in enumerate(["a cat", "a dog", "red", "a cat", "sky"])]
    drafter = {"window": 3, "context": 1, "coupling": "maximal"}
    batched = dict(JacobiEngine(adapter, SJD(), PJDDrafter(**drafter), batch_size=3).generate_many(requests))
    one = JacobiEngine(adapter, SJD(), PJDDrafter(**drafter))
    for request, gen in batched.items():
        alone = one.generate(request.prompt, request.seed)
        assert torch.equal(gen.tokens, alone.tokens) and torch.equal(gen.commit_iter, alone.commit_iter)
        # the entropies only up to a batch's rounding of the matrix products (csd/ragged.py)
        assert torch.allclose(gen.entropy, alone.entropy, atol=1e-4) and gen.nfe == alone.nfe and gen.stats == alone.stats


def test_forced_tokens_are_committed_once_at_their_positions(lumina):
    """Lumina-mGPT's header and end-of-line tokens: a lower row's first commit brings the end-of-line token it was
    anchored on; every body position committed exactly once, the forced ones recorded as forced."""
    gen = JacobiEngine(lumina, SJD(), PJDDrafter(window=3, context=1)).generate(PROMPT, 4)
    forced = lumina.layout.forced_ids >= 0
    assert torch.equal(gen.tokens[forced], lumina.layout.forced_ids[forced])
    assert bool((gen.commit_kind[forced] == COMMIT_FORCED).all()) and not bool((gen.commit_kind[~forced] == COMMIT_FORCED).any())
    image_ids = set(lumina.image_token_ids.tolist())
    assert all(t in image_ids for t in gen.tokens[~forced].tolist())


@pytest.mark.parametrize("rule", [SJD(), CSD(lam=0.3, delta=0.9), GSD(group_size=3), Lantern(neighbours=2, budget=0.5)],
                         ids=["sjd", "csd", "gsd", "lantern"])
def test_every_rule_verifies_the_rows(rule, janus):
    """Any rule judges each row's chain; a relaxed rule accepts more than SJD on the same images."""
    sjd = JacobiEngine(janus, SJD(), PJDDrafter(window=4, context=1))
    engine = JacobiEngine(janus, rule, PJDDrafter(window=4, context=1))
    gens = [engine.generate(PROMPT, seed) for seed in range(3)]
    assert all(g.tokens.numel() == 16 for g in gens)
    if not isinstance(rule, SJD):
        assert sum(g.stats["drafts_accepted"] for g in gens) >= sum(sjd.generate(PROMPT, s).stats["drafts_accepted"]
                                                                    for s in range(3))


def test_code_parity_keeps_a_later_draft_while_its_ratio_exceeds_one_half(janus):
    """The released code's refresh, on hand-made values: after the first rejection (draft 1), draft 2 with
    ``min(1, q/p) = 0.6`` stays with its old law, draft 3 with 0.4 is replaced by the row sample and its ``q``; the
    top row commits two tokens, so the carried drafts start at draft 2."""
    from csd.drafters.base import Verified
    from csd.drafters.chain import ChainWindow

    drafter = PJDDrafter(window=5, context=1, code_parity=True)
    drafter.bind(janus, JacobiEngine(janus, SJD(), drafter).body, False)
    v = janus.vocab_size
    drafts = torch.tensor([0, 1, 2, 3])
    draft_probs = torch.nn.functional.one_hot(drafts, v).float()
    assert v == 4
    target = torch.full((1, 5, v), 0.25)
    target[0, 2], target[0, 3] = torch.tensor([0.1, 0.1, 0.6, 0.2]), torch.tensor([0.2, 0.2, 0.2, 0.4])
    samples = torch.tensor([[3, 3, 0, 1, 2]])
    window = ChainWindow(5, drafts, draft_probs, torch.zeros(5, dtype=torch.long))
    chain = Chain(0, torch.Generator(), Row(0, 0, drafts[:0], draft_probs[:0]), 0, True, False, window)
    result = Verified([2], samples, samples, target[..., 0], torch.zeros(1, 8, dtype=torch.long), None, samples)
    ((tokens, laws),) = drafter._carried(Commits([chain], [2], result, target))
    assert tokens.tolist() == [2, 1, 2]
    assert torch.equal(laws[0], draft_probs[2]) and torch.equal(laws[1], target[0, 3]) and torch.equal(laws[2], target[0, 4])


@pytest.mark.parametrize(("overrides", "message"), [
    (["engine.compile=true"], "drafter=pjd runs eagerly (shifted position ids, row-causal windows): set engine.compile=false"),
    (["method=ar"], "method=ar decodes one token per forward, but drafter=pjd always drafts: use drafter=chain"),
    (["drafter.window=1"], "method=sjd with drafter.window=1 decodes exactly like method=ar"),
    (["drafter.context=0"], "drafter.context=0 must be an integer >= 1"),
    (["drafter.code_parity=true", "drafter.coupling=maximal"],
     "drafter.code_parity=true reproduces the released code's refresh, which replaces the coupling: set drafter.coupling=none"),
])
def test_bad_settings_fail_in_one_line_before_the_model_loads(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate(make_cfg("model=janus_pro_7b", "method=sjd", "drafter=pjd", *overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model", ["toy", "janus_pro_7b", "lumina_mgpt_7b", "emu3_gen", "llamagen_t2i", "anole_7b"])
@pytest.mark.parametrize("method", ["sjd", "csd", "gsd", "lantern", "amplify"])
def test_every_rule_and_model_validates(model, method):
    """Batched PJD validates under every rule on every model; the memory budget is an H200's (``engine.memory_gb``), so
    the answer does not depend on this machine's RAM."""
    validate(make_cfg(f"model={model}", f"method={method}", "drafter=pjd", "engine.batch_size=4", "engine.memory_gb=141"))


@pytest.mark.parametrize(("preset", "model", "methods", "contexts"), [
    ("paper_pjd_lumina", "lumina_mgpt_7b", "ar,sjd,gsd_g25,pjd_c16,pjd_c11", {"pjd_c16": 16, "pjd_c11": 11}),
    ("paper_pjd_llamagen", "llamagen_t2i", "ar,gsd_g25,pjd_c6", {"pjd_c6": 6}),
    ("paper_janus_pro_7b", "janus_pro_7b", "ar,sjd,sjd_l32,gsd,addition,amplify,csd,entropy_sjd,cool_sd,sjd_pac,pjd_c6",
     {"pjd_c6": 6}),
])
def test_paper_presets_compose_and_validate(preset, model, methods, contexts):
    """PJD's published settings: the model, SJD's protocol for PJD's own tables, every swept method validates, and the
    PJD rows are SJD's rule on drafter=pjd with the paper's window 8 and context."""
    from hydra import compose, initialize_config_dir

    from csd.presets import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    assert cfg.model.name == model and cfg.hydra.sweeper.params.method == methods and cfg.logger.group == preset
    if preset.startswith("paper_pjd"):
        assert cfg.eval.protocol == "sjd" and cfg.dataset.caption_rule == "sjd"
    for method in methods.split(","):
        run = make_cfg(f"experiment={preset}", f"method={method}")
        validate(run)
        if method in contexts:
            assert (run.drafter.name, run.drafter.window, run.drafter.context) == ("pjd", 8, contexts[method])
            assert run.method._target_ == "csd.acceptance.SJD"


def test_the_memory_plan_sizes_a_forward_of_every_row_in_flight():
    """``stage=plan`` sizes a PJD forward as ``min(R, W - c + 1)`` rows of ``L`` entries plus a completion entry (each
    lower row one cell behind the one above); ``c >= W`` is one chain."""
    from csd.plan import config_plan

    for context, entries in ((16, min(48, 48 - 16 + 1) * 8 + 1), (48, 8 + 1)):
        plan, _, _ = config_plan(make_cfg("model=lumina_mgpt_7b", "method=sjd", "drafter=pjd", f"drafter.context={context}"))
        assert plan.window == entries


@pytest.mark.parametrize(("build", "prompt"), [
    (lambda: load_toy_adapter(), "a red circle above a blue square"), (lambda: tiny_janus_adapter(), PROMPT),
    (lambda: rejecting_lumina(), PROMPT), (lambda: rejecting_emu3(), PROMPT), (lambda: rejecting_llamagen("t2i"), PROMPT),
    (lambda: rejecting_llamagen("c2i"), "7"), (lambda: rejecting_anole(), PROMPT),
], ids=["toy", "janus", "lumina", "emu3", "llamagen_t2i", "llamagen_c2i", "anole"])
def test_every_model_decodes_batched_as_alone(build, prompt):
    """Every model family on PJD's rows (context 2, window 4): two images at batch 2 are their batch-1 tokens, every
    free position an image token of the model."""
    adapter = build()
    drafter = {"window": 4, "context": 2}
    requests = [Request(prompt, seed, seed) for seed in range(2)]
    batched = dict(JacobiEngine(adapter, SJD(), PJDDrafter(**drafter), batch_size=2).generate_many(requests))
    one = JacobiEngine(adapter, SJD(), PJDDrafter(**drafter))
    free = adapter.layout.forced_ids < 0
    for request, gen in batched.items():
        assert torch.equal(gen.tokens, one.generate(request.prompt, request.seed).tokens)
        assert set(gen.tokens[free].tolist()) <= set(adapter.image_token_ids.tolist())


def test_one_host_read_per_iteration(janus, monkeypatch):
    """The schedule runs on the host from the one read of every chain's accepted count; nothing else is read back but
    each finished image (batch 3, refills, several rows in flight)."""
    from tests.helpers import host_reads_per_batched_run

    engine = JacobiEngine(janus, SJD(), PJDDrafter(window=3, context=1), batch_size=3)
    requests = [Request(prompt, seed, seed) for seed, prompt in enumerate(["a cat", "a dog", "red", "sky"])]
    reads, expected = host_reads_per_batched_run(engine, requests, monkeypatch)
    assert reads == expected
